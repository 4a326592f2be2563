"""The search's estimate asks for the fp8 casts the generator builds: the same
``Transformer.fp8_cast_bytes`` calls (recipe, Hopper's transposes, the candidate's
sequence parallelism, under which the gathered norm output is transposed in the
backward), so the two cannot drift apart as the cast terms change."""

import pytest

from simulator.search.space import Candidate, Hardware, estimate
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron
from simulator.workload.model import MODELS, Transformer

H100 = Hardware(8, DEVICES["H100"], 450e9, 50e9)


def _calls(monkeypatch, run) -> set[tuple]:
    seen: set[tuple] = set()
    original = Transformer.fp8_cast_bytes

    def spy(self, tokens, **kwargs):
        seen.add((tokens, tuple(sorted(kwargs.items()))))
        return original(self, tokens, **kwargs)

    monkeypatch.setattr(Transformer, "fp8_cast_bytes", spy)
    run()
    return seen


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_estimate_and_generator_ask_for_the_same_casts(monkeypatch, sequence_parallel):
    model = MODELS["llama3-8b"]
    c = Candidate(4, 1, 2, 1, "none", sequence_parallel=sequence_parallel, precision="fp8")
    estimated = _calls(monkeypatch, lambda: estimate(model, c, 8, H100))
    built = _calls(monkeypatch, lambda: megatron(model=model, global_batch=8, **c.params()))
    assert estimated and built

    def flags(calls):
        # The generator names its defaults (recipe, transpose) where the estimate
        # leaves them to the method's: compare what each call asks for in effect.
        out = set()
        for tokens, kwargs in calls:
            k = {"recipe": "delayed", "transpose": True, **dict(kwargs)}
            out.add((tokens, k["tp"], k.get("backward", False), k["recipe"], k["transpose"],
                     k.get("sequence_parallel", False)))  # fmt: skip
        return out

    assert flags(estimated) == flags(built)
