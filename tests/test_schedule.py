"""Schedules are data: JSON round trip, structural checks, replay of an imported file."""

import json

import numpy as np
import pytest

from simulator import Schedule, build_schedule, run_schedule, verify
from simulator.errors import ScheduleError
from simulator.topology import ring_graph


def test_round_trip_preserves_every_field(tmp_path):
    schedule = build_schedule("ring", "all_reduce", 6, 3e6, chunks=2, channels=2)
    path = tmp_path / "ring.json"
    schedule.save(path)
    loaded = Schedule.load(path)
    for name in (
        "src",
        "dst",
        "nbytes",
        "segment",
        "reduce",
        "dep_ptr",
        "dep_idx",
        "dep_sent",
        "segment_owner",
        "channel",
        "step",
        "chunk",
    ):
        assert np.array_equal(getattr(schedule, name), getattr(loaded, name)), name
    assert (loaded.op, loaded.algorithm, loaded.ranks) == ("all_reduce", "ring", 6)
    verify(loaded)


def test_imported_schedule_replays_like_the_original(tmp_path):
    """Replaying the file gives the ring closed form 2(p-1)(a + n/(pB))."""
    p, a, b, n = 6, 1e-6, 100e9, 6e6
    path = tmp_path / "ring.json"
    build_schedule("ring", "all_reduce", p, n).save(path)
    result = run_schedule(ring_graph(p, b, a), Schedule.load(path))
    assert result.time_s == pytest.approx(2 * (p - 1) * (a + n / (p * b)), rel=1e-9)


def test_malformed_files_give_clear_errors(tmp_path):
    data = build_schedule("ring", "all_gather", 3, 1e3).to_dict()
    cases = {
        "not json": "{",
        "wrong format": json.dumps({**data, "format": "other"}),
        "missing field": json.dumps({k: v for k, v in data.items() if k != "dst"}),
        "rank out of range": json.dumps({**data, "dst": [7] * len(data["dst"])}),
        "self send": json.dumps({**data, "dst": data["src"]}),
    }
    messages = {}
    for name, text in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(ScheduleError) as info:
            Schedule.load(path)
        messages[name] = str(info.value)
    assert "dst" in messages["missing field"]
    assert "outside 0..2" in messages["rank out of range"]
    assert "to itself" in messages["self send"]
    assert "ccsim-schedule/1" in messages["wrong format"]


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_successor_lists_invert_the_dependency_lists(algorithm):
    """Each op's successors (waiting for it done, or sent) are exactly the ops that list
    it as a dependency of that kind, in op order: checked op by op in plain Python. A
    ring's ops have at most one of each (the lists are placed without a sort), a tree's
    several."""
    from simulator.algorithms.schedule import successors
    from simulator.collective.run import rank_layout

    schedule = build_schedule(
        algorithm, "all_reduce", rank_layout(ring_graph(8, 1e9, 1e-6)), 2**20, chunks=3
    )
    expected = ({}, {})
    for op in range(schedule.n_ops):
        for j in range(schedule.dep_ptr[op], schedule.dep_ptr[op + 1]):
            kind = int(schedule.dep_sent[j])
            expected[kind].setdefault(int(schedule.dep_idx[j]), []).append(op)
    for (ptr, idx), wanted in zip(successors(schedule), expected, strict=True):
        assert len(ptr) == schedule.n_ops + 1
        for op in range(schedule.n_ops):
            assert idx[ptr[op] : ptr[op + 1]].tolist() == wanted.get(op, [])
