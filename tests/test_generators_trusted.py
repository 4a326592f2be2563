"""Generators' workloads are built without the trace format's per-op checks
(``parse_workload(trusted=True)``): the ops, matched calls and sends must be exactly
those built with every check, and data read from a file is still checked."""

from __future__ import annotations

import pytest

from simulator.workload import generators
from simulator.workload.generators import ddp, megatron, moe, zero3
from simulator.workload.trace import FORMAT, WorkloadError, parse_workload


@pytest.fixture
def both_ways(monkeypatch):
    """Every workload a generator builds, built again with every check: (fast, checked)
    pairs."""
    built = []
    original = generators._Builder.build

    def build(self, replicas=None, shadows=None):
        assert self.trusted  # the generators' builders say so
        fast = original(self, replicas, shadows)
        self.trusted = False
        checked = original(self, replicas, shadows)
        self.trusted = True
        built.append((fast, checked))
        return fast

    monkeypatch.setattr(generators._Builder, "build", build)
    return built


@pytest.mark.parametrize(
    "make",
    [
        lambda: ddp("gpt-1.5b", ranks=4),
        lambda: zero3("gpt-1.5b", ranks=4),
        lambda: moe(ranks=4, layers=2),
        lambda: megatron("llama3-8b", tp=2, pp=2, dp=2, micro_batch=1, global_batch=8),
        lambda: megatron(
            "llama3-8b", tp=2, pp=2, dp=2, cp=2, micro_batch=1, global_batch=8,
            virtual_stages=2, recompute="selective", precision="fp8", shadows=True,
        ),
        lambda: megatron(
            "mixtral-8x7b", tp=1, pp=2, dp=4, ep=4, micro_batch=1, global_batch=8,
        ),
    ],
)  # fmt: skip
def test_trusted_build_equals_the_checked_one(both_ways, make):
    make()
    assert both_ways
    for fast, checked in both_ways:
        assert len(fast.ops) == len(checked.ops) > 0
        assert fast.ops == checked.ops  # every field, deps included
        assert fast.instances == checked.instances
        assert fast.pairs == checked.pairs
        assert fast.groups == checked.groups


def test_a_file_is_still_checked():
    """Data from outside (a trace file) goes through every check: a cycle is found
    before any replay."""
    data = {
        "format": FORMAT,
        "ranks": 1,
        "ops": [
            {"id": "a", "rank": 0, "kind": "compute", "duration": 1e-6, "deps": ["b"]},
            {"id": "b", "rank": 0, "kind": "compute", "duration": 1e-6, "deps": ["a"]},
        ],
    }
    with pytest.raises(WorkloadError, match="cycle"):
        parse_workload(data, origin="t.json")
