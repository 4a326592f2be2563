"""Traffic heat-maps per server and per rail (issue 15): bytes conserved, a hand-computed
case, symmetric expansion equal to the per-flow run, the trace's counters and the
command line's ``--heatmap``."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import simulator.collective.run as run_module
import simulator.viz.outputs as outputs
from simulator.algorithms import build_schedule
from simulator.cli import main
from simulator.collective import simulate_collective
from simulator.collective.run import CollectiveResult, build_and_run, rank_layout, run_schedule
from simulator.topology import load_topology, ring_graph
from simulator.viz.heatmap import (
    heatmap_bins,
    rank_capacities,
    traffic_heatmap,
    traffic_heatmaps,
)

# dgx-h100.yaml: NVLink 450 GB/s per GPU per direction, one 400 Gb/s (50 GB/s) NIC per GPU.
NVLINK = 450e9
NIC = 50e9


def one_transfer_result(flows: dict, time_s: float, ranks: int) -> CollectiveResult:
    """A result holding the given transfers only (as a simulator would record them)."""
    columns = {key: np.asarray(value) for key, value in flows.items()}
    return CollectiveResult(
        op="all_reduce",
        algorithm="hand",
        ranks=ranks,
        size_bytes=float(columns["bytes"].sum()),
        time_s=time_s,
        flows=columns,
        links={},
    )


def test_bins_are_1_2_5_steps_giving_200_to_500_columns():
    for extent in np.geomspace(1.3e-6, 7.7, 60):
        bin_s, count = heatmap_bins(extent)
        mantissa = bin_s / 10.0 ** np.floor(np.log10(bin_s))
        assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-9
        assert 200 <= count <= 500
        assert count * bin_s >= extent * (1 - 1e-12) and (count - 1) * bin_s < extent


def test_capacities_are_the_presets_links():
    caps = rank_capacities(load_topology("dgx-h100", 2))
    np.testing.assert_array_equal(caps["scale-up"], np.full(16, NVLINK))
    np.testing.assert_array_equal(caps["scale-out"], np.full(16, NIC))


def test_hand_computed_cells_on_two_servers():
    """Rank 0 sends 3 MB to rank 8 (the other server) from 10.1 us to 40.1 us: 100 GB/s,
    a quarter of server 0's four hundred GB/s of NICs and all of rail 0's two NICs. Rank
    1 sends 450 kB to rank 2 (same server) in the first microsecond: its whole 450 GB/s
    NVLink, 1/8 of the server's. The run lasts 100 us: 500 bins of 0.2 us."""
    graph = load_topology("dgx-h100", 2)
    result = one_transfer_result(
        {
            "src": [0, 1],
            "dst": [8, 2],
            "bytes": [3e6, 450e3],
            "start_s": [10.1e-6, 0.0],
            "sent_s": [40.1e-6, 1e-6],
            "end_s": [41e-6, 1.5e-6],
        },
        time_s=100e-6,
        ranks=16,
    )
    out = np.zeros((2, 500))
    out[0, 50] = out[0, 200] = 0.125  # half of bins [10.0, 10.2) and [40.0, 40.2) us
    out[0, 51:200] = 0.25
    heat = traffic_heatmap(result, graph, by="server", traffic="scale-out")
    assert heat.bin_s == pytest.approx(0.2e-6, rel=1e-12)
    np.testing.assert_allclose(heat.values, out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(heat.capacity_Bps, [8 * NIC, 8 * NIC])
    rails = traffic_heatmap(result, graph, by="rail", traffic="scale-out")
    assert rails.values.shape == (8, 500)
    np.testing.assert_allclose(rails.values[0], 4 * out[0], rtol=0, atol=1e-12)
    assert not rails.values[1:].any()
    up = traffic_heatmap(result, graph, by="server", traffic="scale-up")
    expected = np.zeros((2, 500))
    expected[0, :5] = 1 / 8
    np.testing.assert_allclose(up.values, expected, rtol=0, atol=1e-12)
    rail_up = traffic_heatmap(result, graph, by="rail", traffic="scale-up")
    np.testing.assert_allclose(rail_up.values[1, :5], 0.5, rtol=1e-12)  # 2 GPUs on rail 1
    both = traffic_heatmap(result, graph, by="server", traffic="all")
    np.testing.assert_allclose(both.capacity_Bps, [8 * (NIC + NVLINK)] * 2)
    assert both.bytes == pytest.approx(3e6 + 450e3, rel=1e-12)


def test_bytes_are_conserved_on_a_ring():
    graph = ring_graph(4, 100e9, 1e-6)
    result = simulate_collective(graph, "all_reduce", 4e6, chunks=3)
    total = float(np.sum(result.flows["bytes"]))
    for by in ("server", "rail"):
        heat = traffic_heatmap(result, graph, by=by)
        assert heat.bytes == pytest.approx(total, rel=1e-9)
        assert heat.values.max() <= 1 + 1e-9


def test_scale_up_and_scale_out_add_up_to_every_byte():
    graph = load_topology("dgx-h100", 2)
    result = build_and_run(graph, "hierarchical", "all_reduce", 8e6, chunks=2)
    src, dst = np.asarray(result.flows["src"]), np.asarray(result.flows["dst"])
    nbytes = np.asarray(result.flows["bytes"], dtype=float)
    between = float(nbytes[src // 8 != dst // 8].sum())  # 8 GPUs per server
    maps = {(m.by, m.traffic): m for m in traffic_heatmaps(result, graph)}
    assert set(maps) == {(by, t) for by in ("server", "rail") for t in ("scale-up", "scale-out")}
    for by in ("server", "rail"):
        assert maps[by, "scale-out"].bytes == pytest.approx(between, rel=1e-9)
        assert maps[by, "scale-up"].bytes == pytest.approx(nbytes.sum() - between, rel=1e-9)
    # No NIC or NVLink is busier than it can be.
    assert max(m.values.max() for m in maps.values()) <= 1 + 1e-9


@pytest.mark.parametrize(
    ("algorithm", "copies"),
    [("hierarchical", 1), ("ring", 1)],  # both repeat every server
)
def test_symmetric_expansion_equals_the_per_flow_run(monkeypatch, algorithm, copies):
    """Records of one period's ranks (as kept past EXPAND_FLOWS) give the heat-maps of
    simulating every flow."""
    monkeypatch.setattr(run_module, "DIRECT_QUOTIENT_OPS", 0)
    monkeypatch.setattr(run_module, "EXPAND_FLOWS", 0)
    graph = load_topology("dgx-h100", 4)
    fast = build_and_run(graph, algorithm, "all_reduce", 16e6, chunks=2)
    assert fast.params["flows"] == "representatives"
    assert fast.params["symmetry_period"] == 8 * copies
    schedule = build_schedule(algorithm, "all_reduce", rank_layout(graph), 16e6, chunks=2)
    full = run_schedule(graph, schedule, symmetry="off")
    bins = heatmap_bins(full.time_s)
    expanded = traffic_heatmaps(fast, graph, bins=bins)
    flow_by_flow = traffic_heatmaps(full, graph, bins=bins)
    assert [(m.by, m.traffic) for m in expanded] == [(m.by, m.traffic) for m in flow_by_flow]
    for mine, reference in zip(expanded, flow_by_flow, strict=True):
        np.testing.assert_allclose(mine.values, reference.values, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(mine.capacity_Bps, reference.capacity_Bps)
        if mine.by == "server":
            assert mine.copies == copies
            np.testing.assert_allclose(
                mine.values, np.tile(mine.values[:copies], (4 // copies, 1)), rtol=1e-12
            )
    assert sum(m.bytes for m in expanded if m.by == "server") == pytest.approx(
        float(np.sum(full.flows["bytes"])), rel=1e-9
    )


def read_trace(path):
    with gzip.open(path, "rt") as stream:
        return json.load(stream)


def ranks_trace(folder, nodes: int):
    """A hierarchical 8 MB all-reduce on ``nodes`` dgx-h100, and its trace with the
    ``ranks`` detail as ``ccsim collective --trace`` writes it (read back)."""
    graph = load_topology("dgx-h100", nodes)
    result = build_and_run(graph, "hierarchical", "all_reduce", 8e6)
    path = folder / "t.json.gz"
    outputs.write_collective_outputs(
        result, graph, rows=[], table="", trace=str(path), trace_detail=("ranks",)
    )
    return result, read_trace(path)


def test_a_large_trace_carries_counters_and_one_servers_slices(tmp_path, monkeypatch):
    """Above HEATMAP_RANKS ranks (lowered to 8 here) the trace holds the heat-map rows as
    counters, whose integral gives back the bytes sent, and server 0's slices only."""
    monkeypatch.setattr(outputs, "HEATMAP_RANKS", 8)
    result, trace = ranks_trace(tmp_path, nodes=2)
    events = trace["traceEvents"]
    senders = {e["args"]["src"] for e in events if e["ph"] == "X"}
    assert senders == set(range(8))
    assert "slices of ranks 0-7 only" in trace["otherData"]["heatmap"]
    counters: dict[str, list] = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append((e["ts"], e["args"]["%"]))
    expected = {f"server {s} {t} utilisation" for s in (0, 1) for t in ("scale-up", "scale-out")}
    expected |= {f"rail {r} {t} utilisation" for r in range(8) for t in ("scale-up", "scale-out")}
    assert set(counters) == expected
    src, dst = np.asarray(result.flows["src"]), np.asarray(result.flows["dst"])
    nbytes = np.asarray(result.flows["bytes"], dtype=float)
    out_of_server_1 = float(nbytes[(src // 8 == 1) & (dst // 8 == 0)].sum())
    samples = np.array(counters["server 1 scale-out utilisation"])
    # A step function in percent of 8 NICs; microseconds.
    carried = np.sum(np.diff(samples[:, 0]) * samples[:-1, 1]) / 100 * 8 * NIC * 1e-6
    assert samples[-1, 1] == 0
    assert carried == pytest.approx(out_of_server_1, rel=1e-4)


def test_a_symmetric_trace_writes_the_rows_that_differ(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "HEATMAP_RANKS", 8)
    monkeypatch.setattr(run_module, "DIRECT_QUOTIENT_OPS", 0)
    monkeypatch.setattr(run_module, "EXPAND_FLOWS", 0)
    _, trace = ranks_trace(tmp_path, nodes=4)
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {name.split()[1] for name in names if name.startswith("server")} == {"0"}
    assert len([name for name in names if name.startswith("rail")]) == 16
    assert "every server's counters are server 0's" in trace["otherData"]["heatmap"]


COLLECTIVE = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "2", "--sizes"]


def test_cli_heatmap_writes_a_png_and_large_timelines_are_heatmaps(tmp_path, monkeypatch):
    heat, timeline = tmp_path / "h.png", tmp_path / "t.png"
    argv = [*COLLECTIVE, "4M", "--algo", "hierarchical", "--heatmap", str(heat)]
    assert main(argv) == 0
    data = heat.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1600, 1000)
    # Above HEATMAP_RANKS (lowered to 8) --timeline draws the same heat-map.
    monkeypatch.setattr(outputs, "HEATMAP_RANKS", 8)
    assert main([*argv, "--timeline", str(timeline)]) == 0
    assert timeline.read_bytes() == heat.read_bytes()


@pytest.mark.parametrize(
    ("name", "words"),
    [("h.txt", ["--heatmap", ".png"]), ("missing/h.png", ["--heatmap", "does not exist"])],
)
def test_cli_bad_heatmap_names_fail_before_simulating(tmp_path, capsys, name, words):
    assert main([*COLLECTIVE, "1M", "--heatmap", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert all(word in err for word in words)
