"""An unpipelined FSDP step from a shorter step's periodic middle layers
(simulator.workload.layers) against the full step's replay, the reference: the step
equal to float rounding of the clock, the short step's ops before the added layers the
full step's to the bit and those after shifted by the added periods, and the full
replay whenever the check fails."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from simulator.errors import CcsimError
from simulator.workload import layers, steady
from simulator.workload.generators import megatron, megatron_step_memory
from simulator.workload.model import Transformer
from simulator.workload.steady import STEP_TOLERANCE, run_steady

#: 12 x 8192^2 / 2 = 403M parameters a layer a TP rank: Megatron-FSDP prefetches two
#: more (500M, half its 1e9 communication unit), so windows of 4 units, short steps of 16.
WIDE = Transformer(layers=40, hidden=8192, seq=2048, vocab=32000, heads=16)


def _options(micro: int, **more) -> dict:
    """TP 2 x DP 4 on one DGX H100, as validate --training builds it (TP masters, one
    replica standing for all where it can), ``micro`` micro-batches a replica."""
    return {
        "model": WIDE,
        "tp": 2,
        "pp": 1,
        "dp": 4,
        "micro_batch": 1,
        "global_batch": 4 * micro,
        "fsdp": True,
        "sequence_parallel": True,
        "replicas": True,
        "shadows": True,
        "precision": "bf16",
        **more,
    }


def _times(run) -> dict[str, tuple[float, float]]:
    records = run.records
    return {
        op.id: (float(records.start_s[op.index]), float(records.end_s[op.index]))
        for op in run.workload.ops
    }


@pytest.mark.parametrize("micro", [1, 2])
def test_short_step_is_the_full_step(micro: int):
    options = _options(micro)
    short = run_steady(options, "dgx-h100", nodes=1)
    full = run_steady(options, "dgx-h100", nodes=1, shortcut=False)
    # The shortcut ran: 16 of 40 layers, a period for each pass (forward and backward of
    # every micro-batch).
    assert short.layers == layers.short_layers(options) == 16
    assert len(short.layer_periods_s) == 2 * micro
    assert full.layers is None
    assert short.step_s == pytest.approx(full.step_s, rel=STEP_TOLERANCE)
    # The model's memory, not the short step's.
    assert short.workload.memory == megatron(**options).memory
    assert short.workload.memory == megatron_step_memory(**options)


def test_ops_before_the_added_layers_are_the_full_steps_and_after_shifted():
    """The short step is the full one with 24 units fewer in the middle of each pass:
    the first forward units run at the very same instants; the last backward units
    (backward unit k of 16, k + 24 of 40) run later by 24 periods of each pass."""
    options = _options(1)
    short = run_steady(options, "dgx-h100", nodes=1)
    full = run_steady(options, "dgx-h100", nodes=1, shortcut=False)
    mine, theirs = _times(short.run), _times(full.run)
    unit = re.compile(r"\.([fb])0\.unit(\d+)(?=\.|$)")
    added = 40 - 16
    shift = added * sum(short.layer_periods_s)
    early = late = 0
    for name, (start, end) in mine.items():
        found = unit.search(name)
        if found is None:
            continue
        kind, k = found.group(1), int(found.group(2))
        if kind == "f" and k < 4:
            assert theirs[name] == (start, end), name  # to the bit
            early += 1
        elif kind == "b" and k >= 12:
            other = name.replace(f".b0.unit{k}", f".b0.unit{k + added}")
            assert theirs[other] == pytest.approx((start + shift, end + shift), rel=1e-12)
            late += 1
    assert early > 0 and late > 0


def test_a_refused_check_replays_the_full_step(monkeypatch):
    """With a tolerance no repeat meets, every pass is refused: the step is the full
    replay's, to the bit, and says why."""
    options = _options(1)
    monkeypatch.setattr(steady, "PERIOD_TOLERANCE", -1.0)
    refused = run_steady(options, "dgx-h100", nodes=1)
    monkeypatch.undo()
    full = run_steady(options, "dgx-h100", nodes=1, shortcut=False)
    assert refused.layers is None
    assert "16 of 40 layers replayed" in refused.why and "not periodic" in refused.why
    assert refused.step_s == full.step_s
    assert len(refused.run.workload.ops) == len(full.run.workload.ops)


def test_scope():
    """Only unpipelined FSDP steps of dense models with layers to spare."""
    assert layers.layer_scope(_options(1)) == ""
    assert layers.layer_scope(_options(1, fsdp=False)).startswith("not an FSDP step")
    assert layers.layer_scope(_options(1, pp=2)) == "pipelined"
    few = Transformer(layers=20, hidden=8192, seq=2048, vocab=32000, heads=16)
    assert "too few" in layers.layer_scope(_options(1, model=few))


def test_optimizer_layers_keeps_the_models_optimizer():
    """A step of 16 layers told the model has 40 steps the optimizer over the 40 layers'
    shard: the same bytes, to the bit, as the 40-layer step's optimizer."""
    short = Transformer(layers=16, hidden=8192, seq=2048, vocab=32000, heads=16)
    options = _options(1)

    def optimizer_bytes(step) -> list[float]:
        return [op.mem_bytes for op in step.ops if op.id.endswith(".opt")]

    full = optimizer_bytes(megatron(**options))
    kept = optimizer_bytes(megatron(**{**options, "model": short, "optimizer_layers": 40}))
    own = optimizer_bytes(megatron(**{**options, "model": short}))
    assert full and kept == full
    assert own != full
    with pytest.raises(CcsimError, match="optimizer_layers"):
        megatron(**{**options, "pp": 2, "optimizer_layers": 40})
    assert np.all(np.asarray(own) < np.asarray(full))


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_a_step_without_fsdp_is_built_per_bucket_not_per_layer(distributed_optimizer: bool):
    """Why the shortcut is FSDP's alone: without FSDP (gradients all-reduced, or
    reduce-scattered and the parameters all-gathered by the distributed optimizer, both
    overlapped bucket by bucket) a model of 20 layers in buckets of 5 and one of 40 in
    buckets of 10 build the very same ops, 4 buckets each: the step's ops do not grow
    with its layers, so a step of fewer layers would replay as many. With FSDP, one
    unit a layer, the 40-layer step has more."""

    def step(n: int, per_bucket: int, **more) -> list:
        model = Transformer(layers=n, hidden=8192, seq=2048, vocab=32000, heads=16)
        # Megatron closes a bucket at the first layer that reaches bucket_size: just
        # under per_bucket layers' parameters (a TP rank's) closes it at per_bucket.
        size = math.floor(per_bucket * model.layer_params / 2) - 1
        plain = {
            "fsdp": False,
            "distributed_optimizer": distributed_optimizer,
            "overlap_grad_reduce": True,
            "overlap_param_gather": distributed_optimizer,
        }
        options = _options(2, model=model, bucket_size=size, **{**plain, **more})
        return megatron(**options).ops

    def shape(ops: list) -> list:
        return [(op.id, op.rank, op.kind, op.op, op.group, op.stream) for op in ops]

    short, full = step(20, 5), step(40, 10)
    assert shape(short) == shape(full)
    # The last backward's pieces (micro-batch 1 of 2): one a bucket.
    last = re.compile(r"r0\.b1\.bucket\d")
    pieces = [op.id for op in full if op.kind == "compute" and last.fullmatch(op.id)]
    assert pieces == [f"r0.b1.bucket{k}" for k in range(4)]
    # The middle buckets' gradients: twice the layers, twice the bytes.
    reduced = {op.id: op.nbytes for op in short if op.id.startswith("r0.dp.1")}
    assert reduced and all(op.nbytes == 2 * reduced[op.id] for op in full if op.id in reduced)
    fsdp = dict.fromkeys(("distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"))
    fsdp["fsdp"] = True
    assert len(step(40, 10, **fsdp)) > len(step(20, 5, **fsdp))
