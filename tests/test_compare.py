"""``ccsim compare``, ``--algo auto`` / ``--chunks auto`` and the AutoTuner."""

import json
import subprocess
import sys

import networkx as nx
import pytest

from simulator.algorithms import algorithm_names, get_algorithm
from simulator.cli import main
from simulator.collective.compare import compare
from simulator.collective.tuner import AutoTuner, size_bucket, topology_key
from simulator.errors import CcsimError
from simulator.viz.tables import compare_table

CCSIM = [sys.executable, "-m", "simulator"]
B, A = 100e9, 1e-6

# dgx-a100 preset figures: GPU-NVSwitch-GPU 2 x 0.3 us at 300 GB/s; between servers
# GPU -PCIe 0.5 us- NIC -0.5 us switch- NIC -PCIe 0.5 us- GPU, 200 Gb/s = 25 GB/s NICs.
NV_A, NV_B = 0.6e-6, 300e9
NET_A, NET_B = 1.5e-6, 25e9


def mesh(p: int) -> nx.Graph:
    graph = nx.Graph()
    for rank in range(p):
        graph.add_node(rank, kind="gpu", rank=rank, server=0)
    for i in range(p):
        for j in range(i + 1, p):
            graph.add_edge(i, j, bandwidth=B, latency=A, link="nvlink")
    return graph


def run(*args):
    return subprocess.run([*CCSIM, *args], capture_output=True, text=True, check=False)


def test_compare_rows_match_closed_forms_and_pick_the_winner():
    """Full mesh of 4 GPUs (100 GB/s, 1 us per link), all-reduce, n = 1 KiB and 64 MiB:
    ring 2(p-1)(a + n/(pB)) (each ring hop has its own link), direct 2(a + n/(pB))
    (every pair its own link), halving-doubling 2 log2(p) a + 2 (p-1)/p n/B. Direct is
    fastest at both sizes; busbw = n/T x 2(p-1)/p / 1e9."""
    p = 4
    rows = compare(
        mesh(p),
        "all_reduce",
        [1024, 64 * 2**20],
        ["ring", "direct", "halving-doubling"],
        chunks=1,
        ideal=True,
    )
    assert len(rows) == 6
    for row in rows:
        n = row["size_bytes"]
        expected = {
            "ring": 2 * (p - 1) * (A + n / (p * B)),
            "direct": 2 * (A + n / (p * B)),
            "halving-doubling": 4 * A + 1.5 * n / B,
        }[row["algorithm"]]
        assert row["time_us"] == pytest.approx(expected * 1e6, rel=1e-9)
        assert row["busbw_GBps"] == pytest.approx(n / expected * 1.5 / 1e9, rel=1e-9)
        assert row["winner"] == (row["algorithm"] == "direct")
        assert row["chunks"] == 1
    table = compare_table(rows, title="t")
    lines = [line for line in table.splitlines() if not line.startswith("#")]
    assert len(lines) == 2 and all(line.endswith("direct (1 ch, chunks 1)") for line in lines)
    assert "halving-doubling" in table.splitlines()[2]


def test_compare_on_dgx_a100_shows_the_crossover(tmp_path):
    """2 x dgx-a100, all-reduce. At 1 KiB latency rules: the double tree's 2 ceil(log2 16)
    = 8 hops beat the ring's 30 and hierarchical's 2(g-1) + 2(N-1) = 16 steps. At 1 GiB
    bandwidth rules and pipelined wins. Hierarchical (chunks fixed to 1 in the second
    run) takes 2(g-1)(0.6 us + n/(g 300 GB/s)) + 2(N-1)(1.5 us + n/(gN 25 GB/s)):
    the NVSwitch ring, then one rail ring per local GPU through its own NIC."""
    png = tmp_path / "out.png"
    code = main(
        [
            "compare", "all_reduce", "--topology", "dgx-a100", "--nodes", "2",
            "--algos", "ring,hierarchical,pipelined,tree", "--sizes", "1K,1G",
            "--plot", str(png), "--out", str(tmp_path / "table.txt"),
        ]
    )  # fmt: skip
    assert code == 0
    rows = [
        line.split()
        for line in (tmp_path / "table.txt").read_text().splitlines()
        if not line.startswith("#")
    ]
    assert [row[0] for row in rows] == ["1024", str(2**30)]
    assert rows[0][5] == "tree" and rows[1][5] == "pipelined"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.png", "table.txt"]

    out = tmp_path / "rows.json"
    code = main(
        [
            "compare", "all_reduce", "--topology", "dgx-a100", "--nodes", "2",
            "--algos", "hierarchical", "--sizes", "64M", "--chunks", "1",
            "--format", "json", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    (row,) = json.loads(out.read_text())
    n, g, N = 64 * 2**20, 8, 2
    expected = 2 * (g - 1) * (NV_A + n / (g * NV_B)) + 2 * (N - 1) * (NET_A + n / (g * N * NET_B))
    assert row["time_us"] == pytest.approx(expected * 1e6, rel=1e-9)
    assert row["winner"] is True and row["chunks"] == 1


def test_compare_csv_has_the_documented_keys(capsys):
    """One row per (size, algorithm): 2 sizes x 2 algorithms = 4 rows plus a header.
    Direct all-gather on the dgx-a100 NVSwitch takes a + (p-1)/p n/B: each GPU's 7
    sends share its 300 GB/s port (NCCL has no direct all-gather: the ideal model, said
    so in its row); the ring runs as NCCL forced to it, with its protocol."""
    args = "compare all_gather --algos ring,direct --sizes 1M,8M --chunks 1 --format csv"
    assert main(args.split()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "op,algorithm,ranks,size_bytes,model,protocol,chunks,channels,time_us,algbw_GBps,"
        "busbw_GBps,winner"
    )
    assert len(lines) == 5
    direct = next(line.split(",") for line in lines if ",direct,8,8388608," in line)
    assert direct[4:6] == ["ideal", "-"]
    assert float(direct[8]) == pytest.approx((NV_A + 7 / 8 * 2**23 / NV_B) * 1e6, rel=1e-9)
    ring = next(line.split(",") for line in lines if ",ring,8,8388608," in line)
    assert ring[4] == "NCCL_ALGO=Ring" and ring[5] in ("LL", "LL128", "Simple")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["compare", "all_to_all", "--algos", "ring,direct"],
            "algorithms that can: direct, nccl-p2p, pairwise",
        ),
        (["compare", "all_reduce", "--algos", "ring,nope"], "unknown algorithm 'nope'"),
        (
            ["collective", "all_to_all", "--algo", "tree"],
            "algorithms that can: direct, nccl-p2p, pairwise",
        ),
        (["collective", "all_reduce", "--chunks", "0"], "positive integer or 'auto'"),
        (["collective", "all_reduce", "--channels", "many"], "positive integer or 'auto'"),
        (["collective", "broadcast", "--algo", "tree", "--root", "9"], "root must be a rank"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    """Exit code 2 (usage) and a single line naming what to fix."""
    done = run(*args, "--sizes", "1K")
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr


def test_algo_auto_on_one_dgx_a100(capsys):
    """One dgx-a100: every GPU has one 300 GB/s port into the NVSwitch. Direct all-reduce
    moves the same (p-1)/p n per port and direction as the ring in each half but in
    2 latency steps instead of 2(p-1): T = 2(0.6 us + 7/8 n / 300 GB/s). Auto (with
    --chunks 1) picks it at both sizes."""
    args = "collective all_reduce --algo auto --sizes 8,256M --format json"
    assert main(args.split()) == 0
    rows = json.loads(capsys.readouterr().out)
    for row, n in zip(rows, (8, 256 * 2**20), strict=True):
        assert row["algorithm"] == "direct"
        assert row["time_us"] == pytest.approx(2 * (NV_A + 7 / 8 * n / NV_B) * 1e6, rel=1e-9)


def test_chunks_auto_picks_the_largest_useful_count(capsys):
    """Chain broadcast over 8 GPUs on the NVSwitch, n = 64 MiB: T(K) = 7(a + τ) + (K-1)τ
    with τ = n/(KB), i.e. 7a + (6 + K) n/(KB). Doubling K saves 3n/(KB), a fraction
    3/(K+6) of T (bandwidth terms), more than the latency K adds below K = 294, so the
    time falls at every candidate and auto takes the largest, 64:
    T = 7 x 0.6 us + 70/64 x 64 MiB / 300 GB/s = 248.9 us."""
    args = "collective broadcast --algo ring --chunks auto --sizes 64M"
    assert main(args.split()) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].split() == [
        "#",
        str(64 * 2**20),
        "ring",
        "chunks",
        "64",
        "channels",
        "1",
    ]
    row = next(line.split() for line in out.splitlines() if not line.startswith("#"))  # time: $6
    assert float(row[5]) == pytest.approx((7 * NV_A + 70 / 64 * 2**26 / NV_B) * 1e6, abs=0.006)


def test_tuner_caches_per_bucket_and_belongs_to_its_caller():
    """Two candidates x one chunk count for the first choice: direct, whose lower bound is
    smaller, is simulated first, 2(a + n/(pB)); the ring's bound, its chain of 2(p-1) = 6
    steps of at least a each, is already slower, so it is pruned, not simulated. Sizes in
    the same power-of-two bucket (1000 and 1023 are in [512, 1024)) reuse the choice;
    1024 is a new bucket. A second tuner is independent: its own cache, its own count."""
    graph = mesh(4)
    tuner = AutoTuner(algorithms=["ring", "direct"], chunk_candidates=(1,))
    first = tuner.choose(graph, "all_reduce", 1000)
    assert first.algorithm == "direct"
    assert (tuner.simulations, tuner.pruned) == (1, 1)
    assert tuner.choose(graph, "all_reduce", 1023) is first
    assert tuner.simulations == 1
    tuner.choose(graph, "all_reduce", 1024)
    assert (tuner.simulations, tuner.pruned) == (2, 2)
    # Exact-size times are cached too: 1000 was timed while choosing (direct,
    # 2(a + n/(pB))); 700 takes one simulation of the chosen algorithm, then none.
    assert tuner.time_s(graph, "all_reduce", 1000) == pytest.approx(2 * (A + 1000 / (4 * B)))
    assert tuner.simulations == 2
    tuner.time_s(graph, "all_reduce", 700)
    tuner.time_s(graph, "all_reduce", 700)
    assert tuner.simulations == 3
    other = AutoTuner(algorithms=["ring"], chunk_candidates=(1,))
    assert other.choose(graph, "all_reduce", 1000).algorithm == "ring"
    assert other.simulations == 1 and tuner.choose(graph, "all_reduce", 1000) is first
    # The cache key is the graph's content, not the object.
    assert topology_key(mesh(4)) == topology_key(graph) != topology_key(mesh(5))
    assert size_bucket(1000) == size_bucket(1023) == 9 != size_bucket(1024)


def test_chunk_search_stops_where_builds_are_refused(monkeypatch):
    """Direct all-reduce on a 4-GPU mesh, n = 8 MiB, with its dependency limit lowered to
    72 = K p (p-1)^2 at K = 2: K = 4 is refused, so the search keeps K = 2, whose time
    is a + max(2Kτ, (K+1)τ + a) with τ = n/(pKB) (see test_algorithms_timing)."""
    import simulator.algorithms.direct as direct

    monkeypatch.setattr(direct, "_MAX_DEPENDENCIES", 72)
    n, p, k = 8 * 2**20, 4, 2
    result, chunks = AutoTuner(chunk_candidates=(1, 2, 4)).best_chunks(
        mesh(p), "all_reduce", n, "direct"
    )
    tau = n / (p * k * B)
    assert chunks == k
    assert result.time_s == pytest.approx(A + max(2 * k * tau, (k + 1) * tau + A), rel=1e-9)


def test_simulate_collective_auto_picks_the_compare_winner():
    """The API's algorithm="auto" agrees with a direct search over the registered
    algorithms and chunk counts (both by simulation): on 2 dgx-a100 at 256 MiB the
    pipelined two-level all-reduce beats the NIC-bound flat ring."""
    import simulator

    result = simulator.simulate_collective("dgx-a100", "all_reduce", 2**28, "auto", nodes=2)
    best = min(
        (
            simulator.simulate_collective(
                "dgx-a100", "all_reduce", 2**28, name, nodes=2, chunks=k
            ).time_s,
            name,
        )
        for name in ("ring", "hierarchical", "pipelined", "tree", "halving-doubling")
        for k in (1, 2, 4, 8, 16)
    )
    assert result.time_s <= best[0] * 1.01
    assert result.algorithm == best[1]


def test_compare_draws_the_winner_at_the_last_size(tmp_path):
    """--timeline and --trace show the fastest algorithm at the last size: the trace's
    transfers end exactly when the table says that run ends."""
    import json

    from simulator.cli import main

    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    out = tmp_path / "rows.json"
    assert (
        main(
            [
                "compare",
                "all_reduce",
                "--nodes",
                "2",
                "--algos",
                "ring,hierarchical",
                "--sizes",
                "1M,16M",
                "--chunks",
                "2",
                "--format",
                "json",
                "--out",
                str(out),
                "--timeline",
                str(png),
                "--trace",
                str(trace),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())
    last = [row for row in rows if row["size_bytes"] == 16 * 2**20]
    winner = min(last, key=lambda row: row["time_us"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [e for e in events if e.get("ph") == "X"]
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(winner["time_us"], rel=1e-6)


def test_channels_auto_spreads_a_ring_over_the_nics():
    """2 x dgx-a100, 1 GiB ring: one channel leaves each server through one 25 GB/s NIC,
    C channels through C of the 8 NICs (rail by rail). The search doubles the count while
    it pays, so it reaches at least 8; on one server every channel shares the same
    NVSwitch links, so more channels gain nothing and it stays at 1."""
    from simulator.collective.simulate import simulate_collective

    one = simulate_collective("dgx-a100", "all_reduce", 2**30, "ring", nodes=2)
    auto = simulate_collective("dgx-a100", "all_reduce", 2**30, "ring", nodes=2, channels="auto")
    assert auto.params["channels"] >= 8
    assert auto.busbw_GBps > 7 * one.busbw_GBps
    single = simulate_collective("dgx-a100", "all_reduce", 2**30, "ring", channels="auto")
    assert single.params["channels"] == 1


def test_channels_must_be_positive_or_auto():
    with pytest.raises(CcsimError, match="channels must be a positive integer or 'auto'"):
        AutoTuner(channels=0)


@pytest.mark.parametrize(
    "op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
)
def test_compare_ideal_runs_every_algorithm_that_can(op, capsys):
    """With --ideal and no --algos, compare takes the library's choice and every
    algorithm that can run OP here: on one dgx-a100, none that lacks OP, and not nvls (no
    reducing NVSwitch there), multipath (its NICs reach no switch on one server),
    nvls-tree, collnet-direct or collnet-chain (they join servers: one server has none
    to join, and no SHARP switch)."""
    argv = ["compare", op, "--sizes", "1M", "--chunks", "1", "--format", "json", "--ideal"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    expected = {
        name
        for name in algorithm_names()
        if op in get_algorithm(name).ops
        and name not in ("nvls", "multipath", "nvls-tree", "collnet-direct", "collnet-chain")
    }
    assert {row["algorithm"] for row in rows} == expected | {"nccl"}
    assert {row["model"] for row in rows if row["algorithm"] != "nccl"} == {"ideal"}


def test_compare_by_default_runs_what_nccl_would():
    """The issue's case: all-reduce on 4 DGX H100. By default the columns are NCCL's
    choice and NCCL forced to each algorithm it has there (Tree, Ring, NVLSTree; no
    single-server NVLS). The ring runs on NCCL's 16 channels at 1 GiB, near the 381 GB/s
    busbw NCCL measures (issue 33), not the one-channel ideal ring's 50 GB/s; at 1 GiB
    NCCL picks the ring itself, so both columns agree there."""
    from simulator.topology import load_topology

    graph = load_topology("dgx-h100", 4)
    from simulator.collective.compare import library_algorithms

    names = library_algorithms(graph, "all_reduce", 1024)
    assert names == ["nccl", "chain-tree", "ring", "nvls-tree"]
    rows = {row["algorithm"]: row for row in compare(graph, "all_reduce", [2**30], names)}
    assert rows["ring"]["model"] == "NCCL_ALGO=Ring" and rows["ring"]["channels"] == 16
    assert rows["ring"]["busbw_GBps"] == pytest.approx(381, rel=0.1)
    assert rows["ring"]["time_us"] == rows["nccl"]["time_us"]
    ideal = compare(graph, "all_reduce", [2**30], ["ring"], chunks=1, ideal=True)[0]
    assert ideal["channels"] == 1 and ideal["busbw_GBps"] < rows["ring"]["busbw_GBps"] / 4


def test_auto_keeps_the_fastest_chunk_count_however_small_the_gain(capsys):
    """Direct all-reduce of 128 MiB on one dgx-a100: 2 chunks are faster than 1 by less
    than 1% (783.54 us against 784.14); auto keeps the faster (a 1% threshold kept 1
    chunk while --help said "the fastest"). Its search stops at the first count no
    faster than the one before, so the kept count is the fastest of those simulated."""
    from simulator.topology import load_topology

    graph = load_topology("dgx-a100")
    tuner = AutoTuner(algorithms=["direct"])
    result, chunks = tuner.best_chunks(graph, "all_reduce", 2**27, "direct")
    times = {k: tuner.run(graph, "all_reduce", 2**27, "direct", k).time_s for k in (1, 2, 4)}
    assert times[2] < times[1] < times[2] * 1.01  # under 1% apart
    assert chunks == 2 and result.time_s == min(times.values())
    assert tuner.simulations == 3  # 1, 2, then 4, no faster: the search stops there
    args = "collective all_reduce --algo direct --chunks auto --sizes 128M"
    assert main(args.split()) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[2:5] == ["direct", "chunks", "2"]


def test_compare_runs_an_algorithm_listed_twice_once(capsys):
    """--algos ring,ring is one ring column with its winner, not two that hide it."""
    assert main(["compare", "all_reduce", "--algos", "ring,ring", "--sizes", "1M"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    size, _busbw, *winner = table[-1].split()
    assert size == str(2**20) and winner[0] == "ring"  # one column, a winner
    rows = compare(mesh(4), "all_gather", [4e6], ["ring", "direct", "ring"], chunks=1)
    assert [row["algorithm"] for row in rows] == ["ring", "direct"]
    assert sum(row["winner"] for row in rows) == 1


def test_auto_protocol_skips_only_protocols_that_cannot_win():
    """With --proto auto the tuner simulates protocols most promising first and skips one
    whose lower bound is already slower than a protocol it ran: the time it keeps is the
    fastest of all three, as run_schedule's "auto" finds by running each."""
    from simulator.algorithms import build_schedule
    from simulator.collective.run import rank_layout, run_schedule
    from simulator.topology import load_topology

    graph = load_topology("dgx-a100", 2)
    for size in (2**10, 2**20, 2**28):
        tuner = AutoTuner(protocol="auto")
        mine = tuner.run(graph, "all_reduce", float(size), "ring", 2, channels=4)
        schedule = build_schedule(
            "ring", "all_reduce", rank_layout(graph), size, chunks=2, channels=4
        )
        every = run_schedule(graph, schedule, protocol="auto")
        assert mine.time_s == every.time_s
        assert mine.params["protocol"] == every.params["protocol"]
        assert tuner.simulations + tuner.pruned == 3


def test_collective_rows_say_how_each_size_ran(capsys):
    """--format csv carries what the table prints below it: NCCL's algorithm, protocol,
    channels and chunks, the same as the policy's own choice for that size."""
    from simulator.collective.policy import NcclPolicy
    from simulator.topology import load_topology

    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "2"]
    assert main([*argv, "--sizes", "1M,1G", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(",library_algorithm,protocol,channels,chunks")
    graph = load_topology("dgx-h100", 2)
    for line, size in zip(lines[1:], (2**20, 2**30), strict=True):
        choice = NcclPolicy().choose(graph, "all_reduce", size)
        assert line.split(",")[-4:-1] == [choice.algorithm, choice.protocol, str(choice.channels)]
