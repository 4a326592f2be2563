"""Generators' workloads are built without the trace format's per-op checks
(``parse_workload(trusted=True)``): the ops, matched calls and sends must be exactly
those built with every check, and data read from a file is still checked."""

from __future__ import annotations

import pytest

from simulator.workload import generators
from simulator.workload.generators import ddp, megatron, moe, zero3
from simulator.workload.trace import FORMAT, WorkloadError, parse_workload


@pytest.fixture
def builds(monkeypatch):
    """Every workload a generator builds, in order: ``builds(make, trusted)`` runs
    ``make`` with the generators' builders as they are (trusted: ops made directly) or
    made to write the trace format's plain data and parse it with every check."""
    original = generators._Builder.__init__

    def run(make, trusted):
        built = []
        build = generators._Builder.build

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            assert self.trusted  # the generators' builders say so
            self.trusted = trusted

        def recorded(self, replicas=None, shadows=None):
            built.append(build(self, replicas, shadows))
            return built[-1]

        with monkeypatch.context() as patch:
            patch.setattr(generators._Builder, "__init__", init)
            patch.setattr(generators._Builder, "build", recorded)
            make()
        return built

    return run


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
        lambda: megatron(
            "llama3-8b", tp=2, pp=1, dp=4, micro_batch=1, global_batch=8, fsdp=True,
        ),
        lambda: megatron(
            "llama3-8b", tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, precision="fp8",
            overlap_param_gather=True, tp_comm_overlap=True, amax_reduction="stage",
        ),
    ],
)  # fmt: skip
def test_trusted_build_equals_the_checked_one(builds, make):
    fast_builds, checked_builds = builds(make, True), builds(make, False)
    assert len(fast_builds) == len(checked_builds) > 0
    for fast, checked in zip(fast_builds, checked_builds, strict=True):
        assert len(fast.ops) == len(checked.ops) > 0
        assert fast.ops == checked.ops  # every field, deps included
        assert fast.instances == checked.instances
        assert fast.pairs == checked.pairs
        assert fast.groups == checked.groups
        assert (fast.name, fast.ranks, fast.description) == (
            checked.name,
            checked.ranks,
            checked.description,
        )
        assert fast.replicas == checked.replicas and fast.shadows == checked.shadows


def test_trusted_plain_data_equals_the_checked_one():
    """Plain data parsed with ``trusted`` (what a generator's builder once made) gives
    the ops every check gives."""
    data = megatron("llama3-8b", tp=2, pp=2, dp=2, micro_batch=1, global_batch=8).to_dict()
    fast = parse_workload(data, trusted=True)
    checked = parse_workload(data)
    assert fast.ops == checked.ops
    assert fast.instances == checked.instances and fast.pairs == checked.pairs


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


def test_trusted_build_shares_equal_values():
    """A trusted build holds one object per distinct label, tag and non-zero size (issue
    31: a generator makes them anew per op, a few hundred values over millions of ops),
    and is still equal field by field to the checked build of its plain data."""
    step = megatron(
        "llama3-8b", tp=2, pp=2, dp=2, micro_batch=1, global_batch=16, virtual_stages=2,
    )  # fmt: skip
    checked = parse_workload(step.to_dict())
    assert step.ops == checked.ops
    for name in ("label", "tag", "nbytes", "mem_bytes"):
        values = [getattr(op, name) for op in step.ops if getattr(op, name)]
        objects = {id(value) for value in values}
        assert len(values) > len(set(values)) > 0  # values repeat: sharing is tested
        assert len(objects) == len(set(values)), name


def test_trusted_build_lets_the_dependency_names_go(monkeypatch):
    """The builder's lists of dependency names are consumed as the ids are resolved, so
    that a build's peak does not hold both (the ids, in order, are held equal to the
    checked build's above)."""
    kept = []
    build = generators._Builder.build

    def recorded(self, replicas=None, shadows=None):
        workload = build(self, replicas, shadows)
        kept.append(self._deps)
        return workload

    monkeypatch.setattr(generators._Builder, "build", recorded)
    step = megatron("llama3-8b", tp=2, pp=2, dp=2, micro_batch=1, global_batch=8)
    assert any(op.deps for op in step.ops)
    assert kept and all(names is None for deps in kept for names in deps)
