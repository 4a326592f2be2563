"""Megatron-Core's pipeline schedules as data: the order in which one pipeline stage
runs its forward and backward passes (:func:`pipeline_order`), and how many
chunk-passes' activations it holds at its peak (:func:`peak_held`).

1F1B (``forward_backward_pipelining_without_interleaving``): stage s runs p - s - 1
warm-up forwards, then one forward and one backward in turn, then drains. Interleaved
(``forward_backward_pipelining_with_interleaving``, v model chunks a stage): 2(p - s - 1)
+ (v - 1) p warm-up forwards, capped at the m v chunk-passes of the step (Megatron-Core's
``get_pp_rank_microbatches`` in megatron/core/pipeline_parallel/schedules.py, with its
default ``microbatch_group_size_per_vp_stage`` = p); the k-th forward runs chunk
(k mod p v) // p of micro-batch (k // p v) p + k mod p (its ``get_schedule_table``), and
the k-th backward the chunks in reverse.
"""

from __future__ import annotations

from collections.abc import Sequence


def pipeline_steps(
    stage: int, pp: int, micro: int, v: int, extra_warmup: int = 0
) -> list[tuple[tuple[str, int, int], ...]]:
    """The (pass, model chunk, micro-batch) order of one pipeline stage, by step: each
    warm-up forward alone, each steady step's forward and backward together, then each
    cool-down backward. ``extra_warmup`` more warm-up forwards than Megatron's 1F1B or
    interleaved schedule (see the module docstring): Megatron-Core's combined 1F1B
    (``overlap_moe_expert_parallel_comm``) runs one more, so that a steady step's forward
    and backward do not depend on each other (schedules.py, get_pp_rank_microbatches).

    >>> pipeline_steps(0, 1, 3, 1, extra_warmup=1)
    [(('f', 0, 0),), (('f', 0, 1), ('b', 0, 0)), (('f', 0, 2), ('b', 0, 1)), (('b', 0, 2),)]
    """
    total = micro * v
    warmup = pp - stage - 1 if v == 1 else (pp - stage - 1) * 2 + (v - 1) * pp
    warmup = min(warmup + extra_warmup, total)

    def entry(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k % (pp * v)) // pp
        if kind == "b":
            chunk = v - 1 - chunk
        return kind, chunk, (k // (pp * v)) * pp + k % pp

    steps: list[tuple[tuple[str, int, int], ...]] = [(entry("f", k),) for k in range(warmup)]
    steps += [(entry("f", k + warmup), entry("b", k)) for k in range(total - warmup)]
    return steps + [(entry("b", k),) for k in range(total - warmup, total)]


def pipeline_order(
    stage: int, pp: int, micro: int, v: int, extra_warmup: int = 0
) -> list[tuple[str, int, int]]:
    """The (pass, model chunk, micro-batch) order of one pipeline stage: Megatron's 1F1B
    (v = 1: p - s - 1 warm-up forwards, then one forward and one backward in turn) or its
    interleaved schedule (v > 1; see the module docstring); :func:`pipeline_steps`
    flattened.

    >>> pipeline_order(1, 2, 2, 1)
    [('f', 0, 0), ('b', 0, 0), ('f', 0, 1), ('b', 0, 1)]
    >>> [f"{k}{c}.{i}" for k, c, i in pipeline_order(1, 2, 2, 2)]
    ['f0.0', 'f0.1', 'f1.0', 'b1.0', 'f1.1', 'b1.1', 'b0.0', 'b0.1']
    """
    return [e for step in pipeline_steps(stage, pp, micro, v, extra_warmup) for e in step]


def peak_held(stage: int, pp: int, micro: int, chunks: Sequence[int], extra_warmup: int = 0) -> int:
    """The most layers' activations ``stage`` holds at once over its schedule: each
    forward of chunk c keeps ``chunks[c]`` layers' until that chunk's backward of the same
    micro-batch frees them. With even chunks of L / (p v) layers this is Korthikanti et
    al.'s (MLSys 2023, section 5) first-stage count, L (1 + (p - 1)/(p v)) when the
    micro-batches fill the warm-up.

    >>> peak_held(0, 8, 16, [1] * 12)  # 2 x 7 + 11 x 8 warm-up forwards and one more
    103
    >>> peak_held(0, 4, 8, [4])  # 1F1B: p micro-batches of 4 layers
    16
    """
    held = peak = 0
    for kind, chunk, _ in pipeline_order(stage, pp, micro, len(chunks), extra_warmup):
        held += chunks[chunk] if kind == "f" else -chunks[chunk]
        peak = max(peak, held)
    return peak
