"""Timeline records, the Perfetto trace and the Gantt chart.

Expected times are worked out by hand from link bandwidth and latency (SimPy style: the
exported timeline compared with the expected list), never copied from a run.
"""

import doctest
import importlib
import io
import json
import struct
from itertools import pairwise

import networkx as nx
import numpy as np
import pytest
from PIL import Image

import simulator
from simulator.algorithms.schedule import Schedule
from simulator.topology import load_topology
from simulator.viz import (
    Counter,
    Timeline,
    Track,
    collective_timeline,
    figure_bytes,
    save_timeline,
    save_trace,
    timeline_figure,
    trace_events,
)
from simulator.viz.records import interval_lanes
from simulator.viz.timeline import KIND_COLORS


def two_gpus(bandwidth=1e9, latency=1e-6):
    """GPUs a (rank 0) and b (rank 1) in server 0, one full-duplex link."""
    graph = nx.Graph(name="two-gpus")
    graph.add_node("a", kind="gpu", rank=0, server=0)
    graph.add_node("b", kind="gpu", rank=1, server=0)
    graph.add_edge("a", "b", bandwidth=bandwidth, latency=latency, link="nvlink")
    return graph


def hand_schedule():
    """op0: a->b 1000 B; then, once op0 is done, op1: b->a 2000 B and op2, op3: a->b
    1000 B each (same channel, so they share a->b and overlap on rank 0's stream)."""
    return Schedule(
        op="all_gather",
        algorithm="hand",
        ranks=2,
        size_bytes=2000.0,
        src=[0, 1, 0, 0],
        dst=[1, 0, 1, 1],
        nbytes=[1000, 2000, 1000, 1000],
        segment=[0, 1, 0, 0],
        reduce=[False] * 4,
        dep_ptr=[0, 0, 1, 2, 3],
        dep_idx=[0, 0, 0],
        dep_sent=[False] * 3,
        segment_owner=[0, 1],
        step=[0, 1, 1, 1],
    )


@pytest.fixture(scope="module")
def hand_trace():
    graph = two_gpus()
    result = simulator.run_schedule(graph, hand_schedule())
    return list(trace_events(collective_timeline(result, graph)))


def test_trace_times_are_microseconds_worked_out_by_hand(hand_trace):
    """1 GB/s and 1 us per hop: op0 sends 1000 B in 1 us (ts 0, dur 1) and arrives at
    2 us; op1 (2000 B, alone on b->a) then takes 2 us; op2 and op3 share a->b at
    0.5 GB/s, so their 1000 B take 2 us each."""
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in hand_trace if e["name"] == "thread_name"
    }
    spans = sorted(
        (threads[(e["pid"], e["tid"])], e["ts"], e["dur"], e["args"].get("bytes"))
        for e in hand_trace
        if e["ph"] == "X" and e.get("cat") != "phase"
    )
    assert spans == [
        ("a→b", 0.0, 1.0, 1000),
        ("a→b", 2.0, 2.0, 2000),  # the link carried both 1000 B transfers
        ("b→a", 2.0, 2.0, 2000),
        ("rank 0", 0.0, 1.0, 1000),
        ("rank 0", 2.0, 2.0, 1000),
        ("rank 0 #2", 2.0, 2.0, 1000),
        ("rank 1", 2.0, 2.0, 2000),
    ]


def test_trace_layout_one_process_per_server_threads_per_stream_and_link(hand_trace):
    processes = {e["pid"]: e["args"]["name"] for e in hand_trace if e["name"] == "process_name"}
    assert sorted(processes.values()) == ["phases", "server 0"]
    server = next(pid for pid, name in processes.items() if name == "server 0")
    names = [
        e["args"]["name"] for e in hand_trace if e["name"] == "thread_name" and e["pid"] == server
    ]
    # Streams first (the overlap of op2 and op3 gets a second thread), then links.
    assert names == ["rank 0", "rank 0 #2", "rank 1", "a→b", "b→a"]
    tids = [e["tid"] for e in hand_trace if e["name"] == "thread_name" and e["pid"] == server]
    assert len(set(tids)) == len(tids)
    # Slices of one thread never overlap (trace viewers require nesting).
    by_thread = {}
    for e in hand_trace:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for slices in by_thread.values():
        slices.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(slices))


def test_trace_counters_give_link_utilisation_in_percent(hand_trace):
    counters = {}
    for e in hand_trace:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append((e["ts"], e["args"]["%"]))
    assert counters == {
        "a→b utilisation": [(0.0, 100.0), (1.0, 0.0), (2.0, 100.0), (4.0, 0.0)],
        "b→a utilisation": [(2.0, 100.0), (4.0, 0.0)],
    }


def test_trace_args_carry_bytes_and_bandwidth(hand_trace):
    op1 = next(e for e in hand_trace if e["ph"] == "X" and e["args"].get("src") == 1)
    assert op1["args"]["bytes"] == 2000
    assert op1["args"]["avg_GBps"] == pytest.approx(1.0)  # 2000 B in 2 us
    assert op1["args"]["done_us"] == pytest.approx(5.0)  # sent at 4 us, +1 us latency
    shared = [e for e in hand_trace if e["ph"] == "X" and e["args"].get("step") == 1]
    assert sorted(e["args"]["avg_GBps"] for e in shared) == pytest.approx([0.5, 0.5, 1.0])


def test_trace_file_is_valid_json_with_microsecond_unit(tmp_path):
    graph = two_gpus()
    timeline = collective_timeline(simulator.run_schedule(graph, hand_schedule()), graph)
    path = tmp_path / "trace.json"
    save_trace(timeline, path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["displayTimeUnit"] == "ns"
    assert data["otherData"]["algorithm"] == "hand"
    phases = [e for e in data["traceEvents"] if e.get("cat") == "phase"]
    # One copy phase, from op0's start to op1..op3 done at 4 + 1 us.
    assert [(p["name"], p["ts"], p["dur"]) for p in phases] == [("copy", 0.0, 5.0)]
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_plain_records_make_a_timeline_for_any_engine():
    """The record type a workload engine would use: tuples in, trace events out."""
    t = Timeline.from_spans(
        [
            ("gpu0 compute", 0.0, 3e-3, "compute", "forward", {"flops": 1e12}),
            ("gpu0 comm", 1e-3, 2.5e-3, "comm", "all_reduce", {"bytes": 2**20}),
            ("gpu0 compute", 3e-3, 4e-3, "compute", "backward"),
        ],
        tracks=[Track("gpu0 compute", "node 0"), Track("gpu0 comm", "node 0")],
        phases=[("iteration 0", 0.0, 4e-3)],
    )
    assert [s.label for s in t.spans()] == ["forward", "all_reduce", "backward"]
    xs = [(e["name"], e["ts"], e["dur"]) for e in trace_events(t) if e["ph"] == "X"]
    assert ("forward", 0.0, 3000.0) in xs and ("all_reduce", 1000.0, 1500.0) in xs
    assert timeline_figure(t, width=600, height=300) is not None


def test_bad_records_are_rejected_with_the_track_named():
    with pytest.raises(simulator.CcsimError, match="rank 0"):
        Timeline.from_spans([("rank 0", 2.0, 1.0, "copy")])
    with pytest.raises(simulator.CcsimError, match="section"):
        Timeline.from_spans([], tracks=[Track("x", "", "nowhere")])
    with pytest.raises(simulator.CcsimError, match="at least"):
        timeline_figure(Timeline.from_spans([("r", 0, 1, "copy")]), width=50)


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first chunk, after the signature)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def ring8():
    graph = load_topology("dgx-a100", 1)
    return graph, simulator.simulate_collective(graph, "all_reduce", 2**20)


def test_ring8_png_is_deterministic_and_of_the_requested_size(tmp_path, ring8):
    graph, result = ring8
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for path in paths:  # a fresh timeline and figure each time
        save_timeline(collective_timeline(result, graph), path, width=1234, height=567)
    first, second = (p.read_bytes() for p in paths)
    assert first == second
    assert png_size(first) == (1234, 567)
    assert Image.open(paths[0]).size == (1234, 567)


def test_ring8_svg_is_deterministic(tmp_path, ring8):
    graph, result = ring8
    paths = [tmp_path / "a.svg", tmp_path / "b.svg"]
    for path in paths:
        save_timeline(collective_timeline(result, graph), path, width=800, height=500)
    text = paths[0].read_text()
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert "<dc:date>" not in text and 'width="576pt"' in text  # 800 px at 100 dpi


def test_ring8_picture_shows_reduce_scatter_then_all_gather(ring8):
    """A ring all-reduce reduces for p-1 steps, then copies for p-1 equal steps: the
    reduce colour fills the left half of the stream rows and the copy colour the right."""
    graph, result = ring8
    png = figure_bytes(timeline_figure(collective_timeline(result, graph), width=1000, height=600))
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    pixels = pixels[70:]  # below the title, legend and phase strip

    def columns(color):
        rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
        return np.nonzero(np.all(pixels == rgb, axis=2))[1]

    reduce_x, copy_x = columns(KIND_COLORS["reduce"]), columns(KIND_COLORS["copy"])
    assert len(reduce_x) > 1000 and len(copy_x) > 1000
    middle = (reduce_x.min() + copy_x.max()) / 2
    assert reduce_x.max() < middle + 20 and copy_x.min() > middle - 20
    assert len(reduce_x) == pytest.approx(len(copy_x), rel=0.1)


def test_timeline_rows_of_a_ring8():
    graph = load_topology("dgx-a100", 1)
    result = simulator.simulate_collective(graph, "all_reduce", 2**20, channels=2)
    t = collective_timeline(result, graph)
    streams = [tr.name for tr in t.tracks if tr.section == "streams"]
    assert streams == [f"rank {r} ch {c}" for r in range(8) for c in range(2)]
    links = [tr for tr in t.tracks if tr.section == "links"]
    # Only NVLink carries data on one server: 8 GPU->switch and 8 switch->GPU links.
    assert len(links) == 16 and {tr.category for tr in links} == {
        "nvlink gpu→nvswitch",
        "nvlink nvswitch→gpu",
    }
    assert [p.name for p in t.phases] == ["reduce-scatter", "all-gather"]
    # Each phase has p-1 = 7 steps; every transfer is labelled with its phase and step.
    assert "reduce-scatter step 6" in t.labels and "all-gather step 13" in t.labels


def test_many_rows_merge_by_category_then_into_bins():
    """64 ranks x 2 channels = 128 tracks merge into 64 rank rows; 1024 ranks into 64
    bins of 16 ranks; each merged row says in words what it holds."""
    from simulator.viz.timeline import _rows

    def busy(ranks, channels):
        tracks = [
            Track(f"rank {r} ch {c}", "", "streams", f"rank {r}", r)
            for r in range(ranks)
            for c in range(channels)
        ]
        spans = [(track.name, 0.0, 1e-6, "copy") for track in tracks]
        return Timeline.from_spans(spans, tracks=tracks)

    rows = _rows(busy(64, 2), "streams", 64)
    assert len(rows) == 64 and rows[3].label == "rank 3 (2 channels)"
    assert len(rows[3].members) == 2
    rows = _rows(busy(1024, 1), "streams", 64)
    assert len(rows) == 64 and rows[0].label == "rank 0 … rank 15 (16 ranks)"


def test_stream_tracks_with_nothing_on_them_get_no_row():
    from simulator.viz.timeline import _rows

    tracks = [Track(f"rank {r}", "", "streams", "", r) for r in range(4)]
    t = Timeline.from_spans(
        [("rank 0", 0, 1e-6, "copy"), ("rank 2", 0, 1e-6, "copy")], tracks=tracks
    )
    assert [row.label for row in _rows(t, "streams", 64)] == ["rank 0", "rank 2"]
    fig = timeline_figure(t, width=640, height=320)
    assert [label.get_text() for label in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 2"]


def test_merged_rows_average_exactly_over_pixel_columns():
    from simulator.viz.timeline import _busy_share, _counter_mean

    edges = np.array([0.0, 1.0, 2.0, 4.0])
    # Two tracks: one busy on [0.5, 2.5], the other on [1, 2].
    share = _busy_share(np.array([0.5, 1.0]), np.array([2.5, 2.0]), edges, members=2)
    assert share == pytest.approx([0.25, 1.0, 0.125])
    counter = Counter("l", np.array([0.0, 1.5, 3.0]), np.array([1.0, 0.5, 0.0]))
    assert _counter_mean([counter], edges) == pytest.approx([1.0, 0.75, 0.25])


def test_lanes_keep_overlapping_spans_apart():
    t = Timeline.from_spans(
        [("r", 0, 2, "copy"), ("r", 1, 3, "copy"), ("r", 2, 4, "copy"), ("s", 0, 1, "copy")]
    )
    lane, count = t.lanes()
    assert lane.tolist() == [0, 1, 0, 0] and count.tolist() == [2, 1]


@pytest.mark.parametrize("rounds_max", [4096, 3])
def test_lanes_of_all_tracks_at_once_are_each_tracks_greedy_lanes(monkeypatch, rounds_max):
    """Timeline.lanes partitions every track at once (numpy), or one by one past
    _ROUNDS_MAX spans; either way each track gets interval_lanes' answer: each span in the
    first lane whose last span has ended, in (start, end) order. Integer times make ties
    (a span starting as another ends) common."""
    monkeypatch.setattr("simulator.viz.records._ROUNDS_MAX", rounds_max)
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 200))
        start = rng.integers(0, 20, n).astype(float)
        end = start + rng.integers(0, 5, n)
        track = rng.integers(0, 6, n)
        t = Timeline.from_spans(zip((f"t{k}" for k in track), start, end, ["x"] * n, strict=True))
        lane, count = t.lanes()
        for k in range(len(t.tracks)):
            rows = np.lexsort((t.end_s, t.start_s))
            rows = rows[t.track[rows] == k]
            expected, lanes = interval_lanes(t.start_s[rows], t.end_s[rows])
            assert lane[rows].tolist() == expected.tolist()
            assert count[k] == max(lanes, 1)


@pytest.mark.parametrize(
    "name",
    [
        *(
            f"simulator.viz.{name}"
            for name in ("records", "collective", "links", "timeline", "perfetto", "plots")
        ),
        "simulator.viz.tables",
        "simulator.viz.outputs",
        "simulator.files",  # the atomic writers the viz modules use
    ],
)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted > 0 and failed == 0


def test_validation_plot_ticks_read_as_byte_sizes():
    """nccl-tests' default sweep, 8 B to 8 GiB doubling: ticks at 1 KiB, 1 MiB, 1 GiB
    (not 2^10, 2^20, 2^30), one panel per case that ran, no pyplot figure left open."""
    from simulator.validate.nccl_tests import CaseResult
    from simulator.viz.plots import validation_figure

    sizes = [2**e for e in range(3, 34)]
    busbw = [min(200.0, s / 2**22) for s in sizes]
    cases = [
        CaseResult("a", sizes=sizes, measured_busbw=busbw, simulated_busbw=busbw),
        CaseResult("broken", error="no such preset"),
        CaseResult("b", sizes=sizes[5:20], measured_busbw=busbw[5:20], simulated_busbw=busbw[5:20]),
    ]
    fig = validation_figure(cases)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["a", "b"]
    assert [t.get_text() for t in shown[0].get_xticklabels()] == ["1 KiB", "1 MiB", "1 GiB"]
    # 256 B to 4 MiB: 15 doublings, every fourth labelled.
    assert [t.get_text() for t in shown[1].get_xticklabels()] == [
        "256 B",
        "1 KiB",
        "4 KiB",
        "16 KiB",
        "64 KiB",
        "256 KiB",
        "1 MiB",
        "4 MiB",
    ]
    assert {ax.get_ylabel() for ax in shown} == {"bus bandwidth (GB/s)"}
    assert all("2^" not in t.get_text() for ax in shown for t in ax.get_xticklabels())


def test_a_short_op_in_a_merged_row_stays_visible():
    """A 1 us op per rank of 8 merged ranks in a 1 s timeline is 1e-4 of a pixel
    column's lanes: each is drawn as a sliver of at least MIN_VISIBLE_SHARE of the row."""
    from matplotlib.collections import PolyCollection

    from simulator.viz.timeline import MERGED_NOTE, MIN_VISIBLE_SHARE

    tracks = [Track(f"rank {r} s", "", "streams", f"s{r // 8}", r) for r in range(16)]
    spans = [(f"rank {r} s", 0.0, 1.0, "compute") for r in range(8)]
    spans += [(f"rank {r} s", r / 20, r / 20 + 1e-6, "send") for r in range(8, 16)]
    fig = timeline_figure(Timeline.from_spans(spans, tracks=tracks), width=800, max_rows=4)
    ax = fig.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["s0 (8 ranks)", "s1 (8 ranks)"]
    assert any(text.get_text().endswith(MERGED_NOTE) for text in ax.texts)
    heights = [
        np.ptp(path.vertices[:, 1])
        for collection in ax.collections
        if isinstance(collection, PolyCollection)
        for path in collection.get_paths()
        if path.vertices[:, 1].min() > 0.5  # row 1 (rows grow downwards from 0)
    ]
    assert heights and max(heights) >= 0.76 * MIN_VISIBLE_SHARE - 1e-9
