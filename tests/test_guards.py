"""Resource guards: runaway inputs are refused before anything is built, in one line
with the estimate, the limit and how to raise it (``simulator.collective.guards``).

Each runaway input of issue 13 ran until memory ran out (19 GB in 72 s for
``--chunks 10000000 --sizes 1K``); here each is refused with exit 2, measured in-process
with tracemalloc to stay under 500 MB.
"""

import json
import tracemalloc

import pytest

from simulator.algorithms import algorithm_names, build_schedule, get_algorithm
from simulator.algorithms.base import RankLayout
from simulator.cli import main
from simulator.collective import NcclPolicy, rank_layout
from simulator.collective.guards import (
    ENVIRONMENT,
    GRAPH_ITEM_FLOWS,
    Estimate,
    ResourceError,
    check_flows,
    cluster_of,
    collective_estimate,
    default_max_flows,
    flow_limit,
    transfers,
)
from simulator.errors import CcsimError
from simulator.topology import load_topology
from simulator.units import MAX_SIZES, parse_sizes
from simulator.workload.generators import ddp
from simulator.workload.guards import generator_estimate, workload_estimate

PEAK_BYTES = 500 * 2**20
VALIDATION_CASE = "A100-1N-AR-g8"


def refused(argv, capsys):
    """Run ``ccsim argv`` in this process; return its one-line error and peak memory."""
    tracemalloc.start()
    try:
        code = main(argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2, err
    return err.strip().splitlines()[-1], peak


def trace(ranks):
    return {
        "format": "ccsim-workload/1",
        "name": "wide",
        "ranks": ranks,
        "groups": {"pair": {"kind": "DP", "ranks": [0, 1]}},
        "ops": [
            {"rank": r, "kind": "collective", "op": "all_reduce", "group": "pair", "bytes": "1M"}
            for r in (0, 1)
        ],
    }


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["collective", "all_reduce", "--chunks", "10000000", "--sizes", "1K"], "10000000 chunks"),
        (["collective", "all_reduce", "--chunks", "100000000"], "100000000 chunks"),
        (["collective", "all_reduce", "--nodes", "100000"], "800,000 GPUs (100,000 servers)"),
        (["compare", "all_reduce", "--nodes", "100000"], "800,000 GPUs (100,000 servers)"),
        # An odd number of servers: the ring does not repeat itself (its direction
        # alternates by server), so all 16,008 ranks would be simulated. On 2000 servers
        # one pair of servers stands for all and the run fits (tests/test_symmetry.py).
        (["collective", "all_reduce", "--algo", "ring", "--nodes", "2001"], "16,008 ranks"),
    ],
)
def test_runaway_collectives_are_refused(argv, needle, capsys):
    line, peak = refused(argv, capsys)
    assert needle in line and "past the limit of" in line
    assert "--max-flows N or CCSIM_MAX_FLOWS=N" in line
    assert peak < PEAK_BYTES


def test_a_size_list_too_long_is_refused(capsys):
    """1M:1G:1.00001 is 693,151 sizes; refused before they are listed."""
    line, peak = refused(["collective", "all_reduce", "--sizes", "1M:1G:1.00001"], capsys)
    assert "693,151 sizes, more than 10,000" in line
    assert peak < PEAK_BYTES
    assert len(parse_sizes(",".join(["1K"] * MAX_SIZES))) == MAX_SIZES
    with pytest.raises(CcsimError, match="10,001 sizes"):
        parse_sizes(",".join(["1K"] * (MAX_SIZES + 1)))


def test_a_generator_with_a_hundred_million_ranks_is_refused(tmp_path, capsys):
    out = tmp_path / "ddp.json"
    line, peak = refused(["generate", "ddp", "--ranks", "100000000", "--out", str(out)], capsys)
    assert "ddp on 100,000,000 ranks: 24,100,000,000 ops" in line
    assert peak < PEAK_BYTES and not out.exists()


def test_a_spec_whose_generator_is_that_large_is_refused(tmp_path, capsys):
    spec = tmp_path / "huge.yaml"
    spec.write_text("format: ccsim-workload-spec/1\ngenerator: ddp\nranks: 100000000\n")
    line, peak = refused(["run", str(spec)], capsys)
    assert "ddp on 100,000,000 ranks" in line and peak < PEAK_BYTES


@pytest.mark.parametrize(
    ("suffix", "ranks", "needle"),
    [
        (".json", 10_000_000, "10,000,000 GPUs (1,250,000 servers)"),
        (".json", 1e7, "'ranks' must be a positive integer"),
        (".yaml", "1e7", "'ranks' must be a positive integer"),  # YAML 1.1 reads a string
    ],
)
def test_a_trace_with_ten_million_ranks_is_refused(tmp_path, suffix, ranks, needle, capsys):
    """Two ranks talk, but the trace says ten million: the topology alone is refused."""
    path = tmp_path / f"wide{suffix}"
    text = json.dumps(trace(ranks))
    path.write_text(text.replace('"1e7"', "1e7") if suffix == ".yaml" else text)
    line, peak = refused(["run", str(path)], capsys)
    assert needle in line and peak < PEAK_BYTES


def test_a_sweep_of_21_million_points_is_refused(tmp_path, capsys):
    spec = tmp_path / "huge.yaml"
    spec.write_text(
        "scenario: {collective: all_reduce, size: 1M, topology: dgx-a100}\n"
        "axes:\n"
        "  server.nic.bandwidth: {min: 1, max: 4600, step: 1}\n"
        "  size: {min: 1, max: 4600, step: 1}\n"
    )
    out = tmp_path / "results.csv"
    line, peak = refused(["sweep", str(spec), "--out", str(out), "--quiet"], capsys)
    assert "a sweep of 21,160,000 points" in line and peak < PEAK_BYTES


def test_a_validation_sidecar_with_100000_nodes_is_refused(tmp_path, capsys):
    from simulator.validate.nccl_tests import BUNDLED

    sidecar = (BUNDLED / f"{VALIDATION_CASE}.yaml").read_text()
    (tmp_path / f"{VALIDATION_CASE}.yaml").write_text(sidecar.replace("nodes: 1", "nodes: 100000"))
    csv = (BUNDLED / f"{VALIDATION_CASE}.csv").read_text()
    (tmp_path / f"{VALIDATION_CASE}.csv").write_text(csv)
    line, peak = refused(["validate", "--data", str(tmp_path)], capsys)
    assert "800,000 GPUs (100,000 servers)" in line and peak < PEAK_BYTES


def test_the_limit_comes_from_the_option_then_the_environment(monkeypatch, capsys):
    """--max-flows wins, then CCSIM_MAX_FLOWS, then a quarter of the machine's memory."""
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    assert flow_limit() == (default_max_flows(), flow_limit()[1])
    assert default_max_flows() >= 1_000_000
    argv = ["collective", "all_reduce", "--algo", "ring", "--sizes", "1K"]
    line, _ = refused([*argv, "--max-flows", "100"], capsys)
    assert "past the limit of 100 (--max-flows)" in line
    monkeypatch.setenv(ENVIRONMENT, "100")
    line, _ = refused(argv, capsys)
    assert f"past the limit of 100 ({ENVIRONMENT})" in line
    assert main([*argv, "--max-flows", "1000"]) == 0  # 112 transfers, 33 graph items
    monkeypatch.setenv(ENVIRONMENT, "lots")
    line, _ = refused(argv, capsys)
    assert f"{ENVIRONMENT} must be a positive integer" in line


def test_check_flows_names_the_estimate_the_limit_and_the_way_out():
    with pytest.raises(ResourceError) as error:
        check_flows(Estimate(3_000_000, "a big run"), 1_000_000)
    assert str(error.value) == (
        "a big run: about 3,000,000 flows (1 GiB at 200 B a flow), past the limit of "
        "1,000,000 (--max-flows); ask for less, or raise the limit with --max-flows N or "
        "CCSIM_MAX_FLOWS=N"
    )


@pytest.mark.parametrize("name", algorithm_names())
def test_transfers_match_the_schedules_they_estimate(name):
    """Counted exactly up to 4 servers; fitted beyond, within 5% for 8 servers of 8 (where
    every algorithm's count is a polynomial of degree 2 or less in the servers, or
    close to one)."""
    for op in get_algorithm(name).ops:
        for servers in (3, 8):
            ranks = 8 * servers
            layout = RankLayout(ranks, tuple(r // 8 for r in range(ranks)))
            if get_algorithm(name).unsupported(op, layout):
                continue
            options = {"fraction": 0.5} if name == "multipath" else {}
            try:
                built = build_schedule(name, op, layout, ranks * 2.0**20, **options)
            except Exception:  # needs a topology that is not here; nothing to compare
                continue
            assert transfers(name, op, ranks, 8) == pytest.approx(built.n_ops, rel=0.05)


def test_the_nccl_estimate_is_what_the_policy_builds():
    """On two dgx-h100 the estimate's schedule, chunks and channels at each size are
    those NcclPolicy builds, so its flows are the schedule's (plus the topology's)."""
    graph = load_topology("dgx-h100", 2)
    cluster = cluster_of("dgx-h100", 2)
    policy = NcclPolicy()
    items = cluster.items  # two servers' nodes and links, and the fabric's
    for op in ("all_reduce", "all_gather", "broadcast", "all_to_all"):
        for size in parse_sizes("8:4G:16"):
            schedule, _, _ = policy.schedule(graph, op, float(size))
            estimate = collective_estimate(cluster, op, [size], "nccl", chunks=None, channels=None)
            assert estimate.flows - items * GRAPH_ITEM_FLOWS == pytest.approx(
                schedule.n_ops, rel=0.05
            ), (
                op,
                size,
            )
    assert rank_layout(graph).ranks == cluster.ranks == 16


def test_workload_and_generator_estimates_count_ops_and_transfers():
    """ddp on 8 ranks: 1,928 ops (5 flows each: per rank 48 layers forward and backward,
    each its GEMMs and its memory-bound kernels, 48 gradient buckets and the optimizer,
    241) and 48 equal ring all-reduces of 112 transfers, one schedule kept and one call in
    flight at a time; the generator estimate scales ops per rank to the ranks asked for."""
    assert workload_estimate(ddp(ranks=8)).flows == 1928 * 5 + 2 * 112
    assert generator_estimate("ddp", {"ranks": 8}).flows == 1928 * 5
    assert generator_estimate("ddp", {"ranks": "many"}) is None  # the generator says why


@pytest.mark.parametrize(
    "options",
    [
        {"tp": 8, "pp": 2, "dp": 4, "global_batch": 32},
        {"tp": 8, "pp": 2, "dp": 64, "global_batch": 512, "replicas": True},
        {"tp": 4, "pp": 4, "dp": 8, "global_batch": 64, "virtual_stages": 2, "replicas": True},
        {"tp": 1, "pp": 2, "dp": 8, "global_batch": 16, "replicas": 4},
        {"model": "llama3-8b", "tp": 2, "pp": 2, "dp": 4, "cp": 2, "global_batch": 16},
        {"model": "mixtral-8x7b", "tp": 2, "pp": 2, "dp": 4, "ep": 2, "global_batch": 8,
         "sequence_parallel": True, "replicas": True},
        {"model": "llama3-8b", "tp": 2, "pp": 4, "dp": 2, "global_batch": 48,
         "virtual_stages": 2},
        {"model": "llama3-8b", "tp": 2, "pp": 4, "dp": 2, "cp": 2, "global_batch": 22,
         "recompute": "full", "replicas": True},
        {"model": "mixtral-8x7b", "tp": 1, "pp": 2, "dp": 8, "ep": 4, "global_batch": 80,
         "replicas": True},
    ],
)  # fmt: skip
def test_generator_estimate_counts_the_ops_actually_built(options):
    """Issue 36: the estimate of a Megatron step is the ops its generator builds, exactly:
    those of the one replica (or k) that stand for the rest where ``replicas`` is set
    (a mixture-of-experts model as many as keep its EP groups whole), each running the
    micro-batches a real replica runs (not the whole global batch). Steps of 3 or more
    micro-batches (rounds of ``pp`` when interleaved) are counted from two small steps,
    the count being affine in the micro-batches: still exactly."""
    from simulator.workload.generators import megatron

    built = megatron(**options)
    assert generator_estimate("megatron", options).flows == len(built.ops) * 5


def test_workload_estimate_counts_a_spanning_call_as_its_quotient():
    """One replica standing for 64 runs each data-parallel call as its quotient: 1/64 of
    the ring's 64 x 63 transfers. GPT-3 on TP 8 x DP 64 with the distributed optimizer
    has one reduce-scatter and one all-gather on each of its 8 DP groups (one per TP
    rank): 2 distinct calls kept and 8 lanes each holding its largest, 10 counts in all
    that shrink from 4,032 to 63 transfers."""
    import dataclasses

    from simulator.workload.generators import megatron

    options = {"tp": 8, "pp": 1, "dp": 64, "global_batch": 64, "defaults": "sc21",
               "distributed_optimizer": True}  # fmt: skip
    cluster = cluster_of("dgx-h100", 64)
    one = megatron(**options, replicas=True)
    quotient = workload_estimate(one, "ring", cluster=cluster)
    whole = workload_estimate(dataclasses.replace(one, replicas=None), "ring", cluster=cluster)
    assert "one replica built for 64" in quotient.what
    assert transfers("ring", "reduce_scatter", 64) == 64 * 63
    assert whole.flows - quotient.flows == 10 * (64 * 63 - 63)


def test_ordinary_runs_pass():
    """The README's first command (one dgx-a100, 8 B to 4 GiB) and the same on 64
    servers stay well under the default limit, as NCCL runs them."""
    sizes = parse_sizes("8:4G")
    for nodes, most in ((1, 100_000), (64, 10_000_000)):
        cluster = cluster_of("dgx-a100", nodes)
        estimate = collective_estimate(
            cluster, "all_reduce", sizes, "nccl", chunks=None, channels=None
        )
        assert estimate.flows < most < default_max_flows()


# Issue 33: each of these ate 1-5 GB within a minute (or hung) before it was refused.

#: The default limit on a 24 GiB machine (a quarter of it at 200 B a flow), so that the
#: cases sized near it are refused the same way on any machine.
LIMIT_24_GIB = 24 * 2**30 // 4 // 200
DATA = __import__("pathlib").Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "argv",
    [
        ["topology", "show", "dgx-a100", "--nodes", "100000"],
        ["collective", "all_reduce", "--algo", "hierarchical", "--nodes", "100000"],
        ["search", "gpt3-175b", "--global-batch", "1024", "--nodes", "100000", "--quiet"],
        ["run", "TRACE", "--nodes", "100000"],
    ],
)
def test_a_hundred_thousand_servers_are_refused_before_they_are_built(
    argv, tmp_path, monkeypatch, capsys
):
    """800,000 GPUs: 41 nodes and links a server (33 of its own, 8 of the fabric's),
    4.1 M in all at 15 flows each, counted from the preset's 33 a server (4.95 M items,
    49.5 M flows) before any is built: past a 24 GiB machine's 32 M."""
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(trace(2)))
    monkeypatch.setenv(ENVIRONMENT, str(LIMIT_24_GIB))
    line, peak = refused([str(path) if a == "TRACE" else a for a in argv], capsys)
    assert "dgx-a100: a topology of 800,000 GPUs (100,000 servers)" in line, line
    assert "49,500,000 flows" in line and f"past the limit of {LIMIT_24_GIB:,}" in line
    assert peak < PEAK_BYTES


def test_a_log_on_a_hundred_thousand_servers_is_told_it_does_not_match(capsys):
    log = DATA / "nccl-tests" / "oci-a100-2n-all_reduce.log"
    argv = ["validate", str(log), "--topology", "dgx-a100", "--nodes", "100000"]
    line, peak = refused(argv, capsys)
    assert "16 ranks ran on 2 host(s), but dgx-a100 x 100000 has 800000 GPUs" in line
    assert peak < PEAK_BYTES


def test_a_preset_with_ten_million_gpus_is_refused_from_its_numbers(tmp_path, capsys):
    """gpus: 10,000,000 on an NVSwitch with a NIC each: 10 M GPUs, 1 switch and its 10 M
    links, 10 M NICs and their 10 M links, 40,000,001 items; the guard used to build the
    server to count them."""
    from simulator.topology.presets import preset_files

    text = preset_files()["dgx-h100"].read_text()
    assert "  gpus: 8\n" in text and "gpus_per_nic: 1" in text
    path = tmp_path / "big.yaml"
    path.write_text(text.replace("  gpus: 8\n", "  gpus: 10000000\n"))
    for argv in (["topology", "show", str(path)], ["collective", "all_reduce", "--topology",
                                                   str(path), "--sizes", "1M"]):  # fmt: skip
        line, peak = refused(argv, capsys)
        assert line.startswith("ccsim: error: big.yaml: a topology of 10,000,000 GPUs")
        assert f"about {40_000_001 * GRAPH_ITEM_FLOWS:,} flows" in line and peak < PEAK_BYTES


def test_the_topology_estimate_is_the_graph_built():
    """Nodes plus links of 1, 3 and 7 servers as built, fabric switches included."""
    for name in ("dgx-a100", "dgx-h100", "gb200-nvl72"):
        for nodes in (1, 3, 7):
            graph = load_topology(name, nodes)
            built = graph.number_of_nodes() + graph.number_of_edges()
            assert cluster_of(name, nodes).items == built, (name, nodes)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        (
            "ga",
            100_000_000,
            "2 ranks (all_gpus) x 600,000,000 lines (ga: 100,000,000 micro-batches of 6)",
        ),
        ("all_gpus", 100_000_000, "100,000,000 ranks (all_gpus) x 6 lines"),
    ],
)
def test_an_aicb_header_that_large_is_refused_before_it_is_read(
    field, value, needle, tmp_path, capsys
):
    """aicb_pp2_ga2.txt: 2 ranks, 6 lines holding its 2 micro-batches; ga: 10^8 cannot be
    written out in 6 lines, so one is read as run 10^8 times (a MemoryError traceback
    before), all_gpus: 10^8 runs the 6 lines on each rank. At most 6 ops a line."""
    text = (DATA / "aicb_pp2_ga2.txt").read_text()
    header = {"ga": "ga: 2 ", "all_gpus": "all_gpus: 2 "}[field]
    assert header in text.splitlines()[0]
    path = tmp_path / "huge.txt"
    path.write_text(text.replace(header, f"{field}: {value} ", 1))
    line, peak = refused(["run", str(path)], capsys)
    assert line.startswith(f"ccsim: error: huge.txt: {needle}"), line
    assert "past the limit of" in line and peak < PEAK_BYTES


def test_the_aicb_estimate_bounds_the_ops_built():
    """The estimate's 6 ops a rank and line bound what the bundled files build: 4 to 5.6
    (their lines hold their ga micro-batches written out)."""
    from simulator.workload.aicb import OPS_PER_LINE, load_aicb

    for name in ("aicb_pp2_ga2", "aicb_pp4_ga6", "aicb_simai_example_pp2"):
        text = (DATA / f"{name}.txt").read_text()
        lines = int(text.splitlines()[1])  # the layer count AICB writes on line 2
        workload = load_aicb(DATA / f"{name}.txt")
        assert 4 * workload.ranks * lines <= len(workload.ops)
        assert len(workload.ops) <= OPS_PER_LINE * workload.ranks * lines


@pytest.mark.parametrize(
    ("axis", "needle", "flows"),
    [
        (
            "chunks: [1, 10000000]",
            "the point chunks=10000000: all_reduce on 8 ranks at 1,048,576 B as nccl runs it "
            "(ring, 10000000 chunks, 24 channels)",
            112 * 10_000_000 * 24 + 33 * GRAPH_ITEM_FLOWS,
        ),
        (
            "nodes: [1, 1000000]",
            "the point nodes=1000000: dgx-a100: a topology of 8,000,000 GPUs (1,000,000 servers)",
            33 * 1_000_000 * GRAPH_ITEM_FLOWS,  # counted from the preset, none built
        ),
    ],
)
def test_a_sweep_point_past_the_limit_is_refused_before_any_runs(
    axis, needle, flows, tmp_path, monkeypatch, capsys
):
    """The sweep guard counted points, not each point's flows: 2 points passed, and the
    second (10^7 chunks of a ring on 8 ranks, as NCCL runs it: 24 channels and 112
    transfers a chunk and channel) or a million servers then ran out of memory."""
    monkeypatch.setenv(ENVIRONMENT, str(LIMIT_24_GIB))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"scenario: {{collective: all_reduce, size: 1M, topology: dgx-a100}}\naxes:\n  {axis}\n"
    )
    out = tmp_path / "results.csv"
    line, peak = refused(["sweep", str(spec), "--out", str(out), "--quiet"], capsys)
    assert line.startswith(f"ccsim: error: {spec}: {needle}"), line
    assert f"about {flows:,} flows" in line
    assert peak < PEAK_BYTES and not out.exists()


def test_an_axis_of_40000_values_parses_in_linear_time(monkeypatch):
    """Each value was looked up in the list of those before it: 40,000 took 36 s (7 s of
    them this axis alone). The repeat check now compares a value with at most the few
    earlier ones of its hash, counted here (no clock: a timed test fails under load); a
    repeat is still found, 1.0 as 1 (they are equal)."""
    from pathlib import Path

    from simulator.sweep import spec

    compared = [0]

    class Counted:
        """A value of the repeat check that counts the comparisons made with it."""

        def __init__(self, value):
            self.value = value

        def __hash__(self):
            return hash(self.value)

        def __eq__(self, other):
            compared[0] += 1
            return isinstance(other, Counted) and self.value == other.value

    identity = spec._identity
    monkeypatch.setattr(spec, "_identity", lambda value: Counted(identity(value)))
    parser = spec._Parser("long.yaml", Path("."))
    parser.scenario({"collective": "all_reduce", "topology": "dgx-a100"}, sized=True)
    axis = parser.axis("size", list(range(1000, 41_000)))
    assert compared[0] < 40_000  # a scan of the earlier values makes ~8e8
    assert axis.params[::13_333] == [1000, 14_333, 27_666, 40_999]
    with pytest.raises(CcsimError, match=r"axes.size\[2\]: 1.0 repeats an earlier value"):
        parser.axis("size", [1, 2, 1.0])
