"""Sweep specs: product and explicit points, canonical values, stable keys, and errors
that name the file and the field."""

import doctest
import importlib
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.sweep import SweepError, load_spec

BASE = {"collective": "all_reduce", "size": "1M"}


def spec_of(axes=None, points=None, **scenario):
    data = {"scenario": {**BASE, **scenario}}
    if axes is not None:
        data["axes"] = axes
    if points is not None:
        data["points"] = points
    return load_spec(data, name="t.yaml")


def test_product_order_and_canonical_values():
    spec = spec_of({"server.nic.bandwidth": ["100Gbps", "25GB/s"], "size": ["1K", "1MiB", "1GB"]})
    assert len(spec.points) == 6
    # Cartesian product, last axis fastest; bandwidths in bytes/s, sizes in bytes.
    assert [tuple(p.values.values()) for p in spec.points[:3]] == [
        (12.5e9, 1024),
        (12.5e9, 2**20),
        (12.5e9, 10**9),
    ]
    assert spec.points[3].values["server.nic.bandwidth"] == 25e9
    assert [p.index for p in spec.points] == list(range(6))
    assert spec.label("server.nic.bandwidth", 12.5e9) == "100Gbps"


def test_size_range_string_and_numeric_ranges():
    spec = spec_of({"size": "8:64"})
    assert [p.values["size"] for p in spec.points] == [8, 16, 32, 64]
    spec = spec_of({"server.nic.bandwidth": {"min": "25Gbps", "max": "200Gbps", "factor": 2}})
    assert [p.values["server.nic.bandwidth"] for p in spec.points] == [
        25e9 / 8,
        50e9 / 8,
        100e9 / 8,
        200e9 / 8,
    ]
    spec = spec_of({"chunks": {"min": 1, "max": 7, "step": 2}})
    assert [p.values["chunks"] for p in spec.points] == [1, 3, 5, 7]


def test_explicit_points_are_appended_and_duplicates_dropped():
    spec = spec_of(
        {"algorithm": ["ring", "tree"]},
        points=[{"algorithm": "ring"}, {"algorithm": "direct", "chunks": 4}],
    )
    # ring is already in the product; direct/4 is new; chunks is a column only it sets
    # (empty elsewhere: those points run the default, 1 for an algorithm run as given).
    assert [(p.values["algorithm"], p.values["chunks"]) for p in spec.points] == [
        ("ring", None),
        ("tree", None),
        ("direct", 4),
    ]
    assert spec.duplicates == 1
    assert spec.columns == ["algorithm", "chunks"]


def test_keys_are_stable_and_follow_the_resolved_scenario():
    a = spec_of({"server.nic.bandwidth": ["100Gbps", "200Gbps"]})
    b = spec_of({"server.nic.bandwidth": ["12.5GB/s", "25GBps"]})  # same values, spelled else
    assert [p.key for p in a.points] == [p.key for p in b.points]
    assert len({p.key for p in a.points}) == 2
    c = spec_of({"server.nic.bandwidth": ["100Gbps", "200Gbps"]}, size="2M")  # another base
    assert not {p.key for p in a.points} & {p.key for p in c.points}


def test_preset_file_travels_with_the_point(tmp_path):
    text = Path(__file__).resolve().parents[1].joinpath("topologies", "dgx-a100.yaml").read_text()
    (tmp_path / "box.yaml").write_text(text)
    (tmp_path / "sweep.yaml").write_text(
        "scenario: {collective: all_reduce, size: 1M, topology: box.yaml}\naxes: {nodes: [1, 2]}\n"
    )
    spec = load_spec(tmp_path / "sweep.yaml")  # box.yaml resolves next to the spec
    topology = spec.points[0].params["topology"]
    assert topology["name"] == "box" and topology["data"]["server"]["gpus"] == 8


def test_workload_ranks_all_and_parameters():
    spec = load_spec(
        {
            "scenario": {"workload": {"preset": "ddp-gpt1.5b-16", "ranks": "all"}, "nodes": 2},
            "axes": {"nodes": [2, 4], "workload.bucket_bytes": ["25MiB", "100MiB"]},
        }
    )
    params = spec.points[-1].params
    assert params["workload"]["generator"] == "ddp"
    assert params["workload"]["ranks"] == "all"
    assert params["workload"]["bucket_bytes"] == 100 * 2**20
    assert params["nodes"] == 4


@pytest.mark.parametrize(
    ("data", "where", "words"),
    [
        ({"axes": {"sizes": [1]}}, "t.yaml: axes.sizes", "unknown axis 'sizes'"),
        (
            {"axes": {"server.nic.bandwidth": ["100Gbps", "100Gbs"]}},
            "t.yaml: axes.server.nic.bandwidth[1]",
            "unknown unit 'Gbs'",
        ),
        (
            {"axes": {"server.nic.bandwith": ["100Gbps"]}},
            "t.yaml: axes.server.nic.bandwith[0]",
            "unknown key 'server.nic.bandwith'",
        ),
        ({"axes": {"size": []}}, "t.yaml: axes.size", "empty"),
        ({"axes": {}}, "t.yaml: axes", "no points"),
        ({"axes": {"algorithm": ["rign"]}}, "t.yaml: axes.algorithm[0]", "unknown algorithm"),
        ({"axes": {"nodes": [0]}}, "t.yaml: axes.nodes[0]", "integer >= 1"),
        ({"axes": {"size": "1M"}, "extra": 1}, "t.yaml: extra", "unknown key"),
        ({"axes": {"chunks": 4}}, "t.yaml: axes.chunks", "give a list"),
        ({"axes": {"workload.ranks": [8]}}, "t.yaml: axes.workload.ranks", "collective sweep"),
        ({"points": [{"siz": "1M"}]}, "t.yaml: points[0].siz", "unknown axis"),
    ],
)
def test_errors_name_the_file_and_field(data, where, words):
    with pytest.raises(SweepError) as info:
        load_spec({"scenario": BASE, **data}, name="t.yaml")
    message = str(info.value)
    assert message.startswith(where + ":"), message
    assert words in message
    assert isinstance(info.value, CcsimError)


def test_scenario_errors():
    with pytest.raises(SweepError, match="exactly one of 'collective'"):
        load_spec({"scenario": {"size": "1M"}, "axes": {"nodes": [1]}})
    with pytest.raises(SweepError, match="scenario.size: missing"):
        load_spec({"scenario": {"collective": "all_reduce"}, "axes": {"nodes": [1]}})
    with pytest.raises(SweepError, match="unknown parameter 'bucket' for generator ddp"):
        load_spec({"scenario": {"workload": "ddp-gpt1.5b-16"}, "axes": {"workload.bucket": ["1M"]}})


def test_a_size_axis_stands_in_for_scenario_size():
    """Regression: the README's spec varies size on an axis and gives no scenario.size; it
    failed with 'scenario.size: missing'. An explicit point must then give its own size."""
    scenario = {"collective": "all_reduce"}
    spec = load_spec({"scenario": scenario, "axes": {"size": ["1K", "1M"]}}, name="t.yaml")
    assert [p.params["size"] for p in spec.points] == [1024, 2**20]
    spec = load_spec(
        {"scenario": scenario, "axes": {"size": ["1K"]}, "points": [{"size": "2K", "nodes": 2}]},
        name="t.yaml",
    )
    assert [(p.params["size"], p.params["nodes"]) for p in spec.points] == [(1024, 1), (2048, 2)]
    with pytest.raises(SweepError, match=r"t.yaml: points\[0\]: no size"):
        load_spec(
            {"scenario": scenario, "axes": {"size": ["1K"]}, "points": [{"nodes": 2}]},
            name="t.yaml",
        )


def test_a_value_valid_under_another_fabric_of_the_sweep_passes():
    # single-switch (dgx-a100's) has no oversubscription, leaf-spine does: the value
    # is accepted, and only the single-switch combination fails when it runs.
    spec = spec_of({"fabric": ["single-switch", "leaf-spine"], "fabric.oversubscription": [2]})
    assert len(spec.points) == 2
    with pytest.raises(SweepError, match="unknown key 'fabric.oversubscription'"):
        spec_of({"fabric.oversubscription": [2]})


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("scenario: {collective: all_reduce, size: 1M}\naxes: {size: [1M, 2Q]}\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path}: axes.size[1]" in err and "unknown unit 'Q'" in err
    assert not (tmp_path / "r.csv").exists()  # nothing runs, nothing is written


@pytest.mark.parametrize(
    "name",
    [
        "simulator.sweep",
        "simulator.sweep.spec",
        "simulator.sweep.point",
        "simulator.sweep.store",
        "simulator.sweep.run",
        "simulator.sweep.knee",
        "simulator.sweep.plot",
        "simulator.cli.sweep",
    ],
)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted > 0 and failed == 0


def test_protocol_axis_runs_the_calibrated_model():
    """A protocol axis: "ideal" is the line-rate model (1 GiB ring on one dgx-a100:
    14 steps of 0.6 us + n/(8 x 300 GB/s)), "Simple" the preset's calibrated one (the
    same ring at its NVLink efficiency, plus launch, base and per-step latencies); an
    unknown name is refused up front; specs without the axis keep their points' keys."""
    from simulator.library.protocol import calibration_of
    from simulator.sweep import run_point
    from simulator.topology import load_topology

    spec = spec_of({"protocol": ["ideal", "Simple"]}, size="1GiB", algorithm="ring")
    ideal, simple = (run_point(p.params) for p in spec.points)
    n = 2**30
    assert ideal["time_s"] == pytest.approx(14 * (0.6e-6 + n / (8 * 300e9)), rel=1e-9)
    cal = calibration_of(load_topology("dgx-a100"))
    proto, eff = cal.protocol("Simple"), cal.efficiency["nvlink"]
    expected = cal.launch_s + proto.base_s + 14 * (proto.hop_s["nvlink"] + n / (8 * eff * 300e9))
    assert simple["time_s"] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(SweepError, match="unknown protocol 'LL64'"):
        spec_of({"protocol": ["LL64"]})
    assert [p.key for p in spec_of({"size": ["1M"]}).points] == [
        p.key for p in spec_of({"size": ["1MiB"]}).points
    ]


def test_points_default_to_the_topology_s_library():
    """As every command does, a point that names no algorithm runs what the preset's
    library would (NCCL on dgx-a100: its algorithm, protocol and channels; HCCL on
    ascend-910b), the same numbers as asking for it by name; ring stays available."""
    from simulator.collective import simulate_collective
    from simulator.sweep import run_point

    spec = spec_of({"topology": ["dgx-a100", "ascend-910b"]}, size="64MiB")
    rows = [run_point(p.params) for p in spec.points]
    for row, (topology, library) in zip(
        rows, [("dgx-a100", "nccl"), ("ascend-910b", "hccl")], strict=True
    ):
        named = simulate_collective(topology, "all_reduce", 2**26, library)
        assert row["status"] == "ok" and row["time_s"] == named.time_s
    ring = run_point(spec_of({"algorithm": ["ring"]}, size="64MiB").points[0].params)
    assert ring["time_s"] == simulate_collective("dgx-a100", "all_reduce", 2**26).time_s
    assert ring["time_s"] != rows[0]["time_s"]
    assert [p.values["algorithm"] for p in spec_of({"algorithm": ["nccl", "auto"]}).points] == [
        "nccl",
        "auto",
    ]
