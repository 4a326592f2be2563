"""Perfetto traces: slices that nest on every thread, gzip, what a trace holds
(--trace-detail, --trace-ranks), the size warning and the command line's options."""

import gzip
import json
from collections import defaultdict

import numpy as np
import pytest

import simulator
from simulator.cli import main
from simulator.topology import load_topology
from simulator.viz import perfetto
from simulator.viz.collective import collective_timeline
from simulator.viz.perfetto import DETAILS, save_trace, trace_events
from simulator.viz.records import Timeline


@pytest.fixture(scope="module")
def pipelined():
    """NCCL's choice at 1 MiB on 2x dgx-a100 is a pipelined tree (chain-tree, 16 channels):
    its reduce and copy phases overlap, and so do the sends of one rank's channel."""
    graph = load_topology("dgx-a100", 2)
    result = simulator.simulate_collective(graph, "all_reduce", 2**20, "nccl")
    return collective_timeline(result, graph)


def slices_by_thread(events):
    threads = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            threads[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    return threads


def assert_nested(events):
    """On each thread, a slice that starts inside another ends inside it too (a stack),
    to the picosecond the times are rounded to."""
    for thread, slices in slices_by_thread(events).items():
        stack = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"thread {thread}: slices cross"
            stack.append(end)


def test_overlapping_phases_go_to_lanes_that_nest():
    t = Timeline.from_spans(
        [("rank 0", 0.0, 1e-6, "copy")],
        phases=[("reduce", 0.0, 2e-6), ("copy", 1e-6, 3e-6), ("tail", 2e-6, 4e-6)],
    )
    events = list(trace_events(t))
    phases = [(e["name"], e["tid"]) for e in events if e.get("cat") == "phase"]
    assert phases == [("reduce", 1), ("copy", 2), ("tail", 1)]  # first lane that is free
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 1
    }
    assert names == {1: "phases", 2: "phases #2"}
    assert_nested(events)


def test_every_thread_of_a_pipelined_collective_nests(pipelined):
    events = list(trace_events(pipelined))
    assert len({e["tid"] for e in events if e.get("cat") == "phase"}) == 2
    assert_nested(events)


def test_gz_trace_is_gzip_json_with_the_same_events(tmp_path, pipelined):
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    assert save_trace(pipelined, plain) == save_trace(pipelined, packed)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    with gzip.open(packed, "rt", encoding="utf-8") as stream:
        data = json.load(stream)
    assert data == json.loads(plain.read_text(encoding="utf-8"))
    assert data["traceEvents"] == list(trace_events(pipelined))
    assert packed.stat().st_size < plain.stat().st_size / 5
    # The same trace gives the same bytes (no time or name in the gzip header).
    first = packed.read_bytes()
    save_trace(pipelined, packed)
    assert packed.read_bytes() == first


def kinds(events):
    """What a trace holds, by event: phase and span slices by category, counters."""
    found = set()
    for e in events:
        if e["ph"] == "C":
            found.add("counters")
        elif e["ph"] == "X":
            found.add({"phase": "phases", "link": "links"}.get(e["cat"], "ranks"))
    return found


@pytest.mark.parametrize(
    "detail", [["phases"], ["ranks"], ["links"], ["counters"], ["phases", "ranks"], DETAILS]
)
def test_detail_keeps_only_the_event_kinds_asked_for(pipelined, detail):
    events = list(trace_events(pipelined, detail=detail))
    assert kinds(events) == set(detail)
    assert_nested(events)
    # Every thread that is named has slices; no empty rows.
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert named == set(slices_by_thread(events))


def test_rank_filter_keeps_only_those_ranks(pipelined):
    events = list(trace_events(pipelined, detail=DETAILS, ranks=[(1, 2), (9, 9)]))
    transfers = [e for e in events if e["ph"] == "X" and e["cat"] in ("copy", "reduce")]
    assert {e["args"]["src"] for e in transfers} == {1, 2, 9}
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    streams = {name.split(" ch ")[0] for name in threads if name.startswith("rank")}
    assert streams == {"rank 1", "rank 2", "rank 9"}
    # Links are those out of or into the three ranks' GPUs (s0/gpu1, s1/gpu1...).
    links = [name for name in threads if "→" in name]
    assert links and all(
        any(end in {"s0/gpu1", "s0/gpu2", "s1/gpu1"} for end in name.split("→")) for name in links
    )
    counters = {e["name"].split(" ")[0] for e in events if e["ph"] == "C"}
    assert counters <= set(links)
    with pytest.raises(simulator.CcsimError, match="no rank"):
        list(trace_events(pipelined, ranks=[(100, 200)]))


def test_warning_with_the_estimated_size_past_the_threshold(tmp_path, pipelined, capsys):
    path = tmp_path / "t.json"
    save_trace(pipelined, path)
    assert capsys.readouterr().err == ""
    real = path.stat().st_size
    perfetto.WARN_BYTES = 1000
    try:
        save_trace(pipelined, path)
    finally:
        perfetto.WARN_BYTES = 500_000_000
    err = capsys.readouterr().err
    assert "warning" in err and str(path) in err
    estimate = float(err.split("about ")[1].split(" MB")[0]) * 1e6
    assert estimate == pytest.approx(real, rel=0.2)


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_size_estimate_is_close(tmp_path, pipelined, name):
    layout = perfetto._Layout(pipelined)
    estimate = perfetto._estimate(layout, compressed=name.endswith(".gz"))
    save_trace(pipelined, tmp_path / name)
    assert estimate == pytest.approx((tmp_path / name).stat().st_size, rel=0.3)


def test_args_as_before_whole_floats_as_ints_no_infinity():
    t = Timeline.from_spans(
        [
            ("r", 0.0, 1e-6, "copy", "", {"bytes": 64.0, "GBps": np.inf, "x": 0.25}),
            ("r", 1e-6, 2e-6, "copy", "", {"bytes": 1.5, "GBps": 2.0, "x": np.nan}),
        ]
    )
    args = [e["args"] for e in trace_events(t) if e["ph"] == "X"]
    assert args == [{"bytes": 64, "x": 0.25}, {"bytes": 1.5, "GBps": 2}]
    assert type(args[0]["bytes"]) is int


def test_collective_cli_trace_options(tmp_path):
    path = tmp_path / "x.json.gz"
    argv = ["collective", "all_reduce", "--nodes", "2", "--sizes", "1M", "--trace", str(path)]
    assert main([*argv, "--trace-ranks", "0-1,8"]) == 0
    with gzip.open(path, "rt") as stream:
        events = json.load(stream)["traceEvents"]
    assert kinds(events) == {"phases", "ranks"}  # the default detail
    assert {e["args"]["src"] for e in events if e["ph"] == "X" and "src" in e["args"]} == {
        0,
        1,
        8,
    }
    assert main([*argv, "--trace-detail", "links,counters"]) == 0
    with gzip.open(path, "rt") as stream:
        assert kinds(json.load(stream)["traceEvents"]) == {"links", "counters"}


@pytest.mark.parametrize(
    "option", [["--trace-detail", "phases,bogus"], ["--trace-ranks", "3-1"], ["--trace-ranks", "x"]]
)
def test_bad_trace_options_are_one_line_errors(tmp_path, capsys, option):
    argv = ["collective", "all_reduce", "--sizes", "1M", "--trace", str(tmp_path / "t.json")]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, *option])
    assert exit_.value.code == 2
    assert option[0] in capsys.readouterr().err


def thread_names(events):
    return [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"]


def test_a_few_overlapping_lanes_stay_as_they_were(pipelined):
    """Traces within MAX_LANES lanes per track are not touched: same events, no note."""
    assert perfetto.cap_lanes(pipelined) is pipelined
    events = list(trace_events(pipelined))
    assert any(" #2" in name for name in thread_names(events))  # its overlaps keep lanes
    assert not [e for e in events if e["name"] == "process_labels"]


def test_hundreds_of_concurrent_sends_become_one_slice_per_step():
    """A rank sending to 300 peers at once (a hierarchical all-reduce's inter-server step
    at scale) is one thread with one slice per step, carrying how many transfers and
    bytes it stands for, rather than 300 threads."""
    spans = [
        ("rank 0", 0.0, 1e-3 + k * 1e-9, "copy", "step 0", {"bytes": 1000}) for k in range(300)
    ]
    spans += [("rank 0", 2e-3, 3e-3, "copy", "step 1", {"bytes": 7})]
    spans += [("rank 1", k * 1e-6, (k + 2) * 1e-6, "copy", "", {}) for k in range(3)]
    events = list(trace_events(Timeline.from_spans(spans)))
    names = thread_names(events)
    assert names == ["rank 0", "rank 1", "rank 1 #2"]  # rank 1's two lanes stay
    rank0 = [e for e in events if e["ph"] == "X" and e["tid"] == 1 and e["pid"] == 1]
    assert [(e["name"], e["args"]) for e in rank0] == [
        ("step 0", {"bytes": 300_000, "spans": 300}),
        ("step 1", {"bytes": 7}),
    ]
    assert rank0[0]["dur"] == pytest.approx(1e3 + 299e-3)  # first start to last end, us
    (label,) = [e["args"]["labels"] for e in events if e["name"] == "process_labels"]
    assert "rank 0: spans overlapping more than 16 deep merged" in label
    assert_nested(events)


def test_overlaps_of_different_labels_merge_when_labels_are_not_enough():
    spans = [("r", 0.0, 1.0, "copy", f"flow {k}", {"bytes": 1}) for k in range(40)]
    merged = perfetto.cap_lanes(Timeline.from_spans(spans))
    ((_, start, end, _, label, args),) = merged.spans()
    assert (start, end, label, args) == (
        0.0,
        1.0,
        "40 overlapping spans",
        {"bytes": 40, "spans": 40},
    )
    assert "per overlap (args" in merged.meta["lanes"]


def test_a_symmetric_collective_at_scale_has_few_threads_and_says_why(tmp_path):
    """Hierarchical all-reduce on 64 DGX H100 (512 ranks; the trace keeps server 0's):
    each rank sends to 63 other servers at once. The trace holds one thread per rank
    shown (not 64), says which ranks it shows and what it merged, and its slices stand
    for every transfer of those ranks, bytes included."""
    graph = load_topology("dgx-h100", 64)
    result = simulator.simulate_collective(graph, "all_reduce", 2**26, "hierarchical")
    timeline = collective_timeline(result, graph)
    _, lanes = timeline.lanes()
    assert lanes.max() > perfetto.MAX_LANES  # what the trace had to cope with
    path = tmp_path / "t.json"
    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "64"]
    argv += ["--algo", "hierarchical", "--sizes", "64M", "--trace", str(path)]
    assert main(argv) == 0
    events = json.loads(path.read_text())["traceEvents"]
    names = [name for name in thread_names(events) if name.startswith("rank")]
    assert names == [f"rank {r}" for r in range(8)]
    (label,) = [e["args"]["labels"] for e in events if e["name"] == "process_labels"]
    assert "slices of ranks 0-7 only" in label and "merged into one slice" in label
    slices = [e for e in events if e["ph"] == "X" and e["pid"] != 1]  # pid 1: phases
    streams = [track.section == "streams" and track.rank in range(8) for track in timeline.tracks]
    shown = np.array(streams)[timeline.track]
    assert sum(e["args"].get("spans", 1) for e in slices) == shown.sum()
    total = np.nansum(timeline.args["bytes"][shown])
    assert sum(e["args"].get("bytes", 0) for e in slices) == pytest.approx(total)
    assert_nested(events)


def test_symmetric_rows_are_explained_on_the_first_process():
    note = "symmetric ranks simulated once: rank r does what rank r mod 8 does"
    t = Timeline.from_spans(
        [("rank 0", 0, 1e-6, "copy"), ("rank 1", 0, 1e-6, "copy")],
        tracks=[("rank 0", "server 0", "streams", "", 0), ("rank 1", "server 0", "streams", "", 1)],
        meta={"symmetry": note},
    )
    events = list(trace_events(t))
    labels = [(e["pid"], e["args"]["labels"]) for e in events if e["name"] == "process_labels"]
    assert labels == [(1, note)]
