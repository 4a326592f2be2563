"""``ccsim search``: the configurations it enumerates, its estimate against a simulation
whose communication is free, memory filtering, resuming, and its command line."""

import csv
import dataclasses
import io
import subprocess
import sys

import pytest

from simulator.errors import CcsimError
from simulator.search import search
from simulator.search.space import Candidate, Hardware, candidates, estimate, memory_of
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron
from simulator.workload.model import MODELS, Transformer

EVEN = Transformer(layers=8, hidden=1024, seq=512, vocab=0, heads=8)
FREE = Hardware(8, DEVICES["A100"], 1e18, 1e18)  # communication costs nothing


def test_candidates_are_the_splits_megatron_accepts():
    """12 heads, 6 layers, 4 GPUs a server on 8 GPUs, batch 8, micro-batch 1 or 2:
    TP in {1, 2, 4} (divides 4 and 12), PP divides 8 / TP and is at most 6, DP the rest,
    the batch a multiple of mb x DP. Worked out by hand: (tp, pp, dp) = (1,1,8) (1,2,4)
    (2,1,4) (2,2,2) (4,1,2) (4,2,1), and PP 4, which does not divide the 6 layers, with
    middle stages of ceil(6/4) = 2 and the 2 left to the ends: stages 1/2/2/1 at (1,4,2)
    and (2,4,1); with mb 1 or 2 where 8 % (mb x dp) == 0: 1+2+2+2+2+2 + 2+2 = 15."""
    model = Transformer(layers=6, hidden=768, heads=12)
    found = candidates(
        model,
        8,
        8,
        gpus_per_server=4,
        micro_batches=[1, 2],
        recompute=["full"],
        virtual_stages=[1],
    )
    assert len(found) == 15
    assert {(c.tp, c.pp, c.dp) for c in found} == {
        (1, 1, 8),
        (1, 2, 4),
        (2, 1, 4),
        (2, 2, 2),
        (4, 1, 2),
        (4, 2, 1),
        (1, 4, 2),
        (2, 4, 1),
    }
    ends = {(c.first_stage_layers, c.last_stage_layers) for c in found if c.pp == 4}
    assert ends == {(1, 1)}
    assert all(c.first_stage_layers is None for c in found if c.pp != 4)
    assert all(c.sequence_parallel == (c.tp > 1) for c in found)
    assert all(c.distributed_optimizer == (c.dp > 1) for c in found)
    # Interleaving needs whole chunks (6 layers into p v) and micro-batches a multiple of p.
    chunked = candidates(
        model,
        8,
        8,
        gpus_per_server=4,
        micro_batches=[1],
        recompute=["full"],
        virtual_stages=[3],
    )
    assert {(c.pp, c.dp, c.virtual_stages) for c in chunked} == {(2, 4, 3), (2, 2, 3), (2, 1, 3)}


def free_step(model: Transformer, candidate: Candidate, batch: int):
    """The candidate's step (one replica, TP 1) on a ring of A100s whose links cost
    nothing: its workload and breakdown."""
    c = candidate
    workload = megatron(model, global_batch=batch, **c.params())
    graph = ring_graph(max(c.pp * c.cp, 2), 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    return workload, run_workload(workload, graph, algorithm="ring")[1]


@pytest.mark.parametrize(
    ("pp", "v", "recompute", "cp"),
    [(1, 1, "full", 1), (2, 1, "none", 1), (4, 2, "selective", 1), (2, 1, "full", 2)],
)
def test_estimate_matches_a_simulation_with_free_communication(pp, v, recompute, cp):
    """With communication free and stages equal (no vocabulary), the simulated step is
    (m + (p - 1)/v) passes of a stage plus the optimizer: exactly what the estimate adds
    up, from the same kernel times (with CP, each rank's s / cp tokens and its share of
    the causal flash attention)."""
    c = Candidate(1, pp, 1, 1, recompute, v, cp=cp, distributed_optimizer=cp > 1)
    batch = 8
    est = estimate(EVEN, c, batch, FREE)
    workload, result = free_step(EVEN, c, batch)
    assert est.tp_s == pytest.approx(0.0, abs=1e-9) and est.dp_s == pytest.approx(0.0, abs=1e-9)
    # (1e18 B/s transfers still take ~1e-11 s each: rel 1e-6 leaves room for them.)
    assert est.compute_s + est.optimizer_s == pytest.approx(result.step_s, rel=1e-6)
    assert est.memory.total == pytest.approx(workload.memory.total)


def test_estimate_prices_tp_and_dp_at_the_bandwidth_bound():
    """TP 2 at 100 GB/s per GPU: 2 all-reduces per layer forward, 4 backward with full
    recomputation, each 2 (t - 1)/t x b s h x 2 bytes / bandwidth, for every pass; DP 4
    across NICs at 10 GB/s per GPU: 2 (d - 1)/d x (the stage's parameters / t) x 4 bytes
    (fp32 gradients, Megatron-LM's default in bf16); with the distributed optimizer
    (d - 1)/d x (4 bytes of gradients scattered + 2 of bf16 parameters gathered)."""
    hardware = dataclasses.replace(
        FREE, gpus_per_server=2, intra_bandwidth=100e9, inter_bandwidth=10e9
    )
    c = Candidate(2, 1, 4, 1, "full")
    est = estimate(EVEN, c, 8, hardware)
    activation = EVEN.seq * EVEN.hidden * 2
    passes = 8 // 4
    assert est.tp_s == pytest.approx(passes * 8 * 6 * 1.0 * activation / 100e9)
    params = 8 * EVEN.layer_params / 2
    assert est.dp_s == pytest.approx(2 * 3 / 4 * params * 4 / 10e9)
    sharded = estimate(EVEN, dataclasses.replace(c, distributed_optimizer=True), 8, hardware)
    assert sharded.dp_s == pytest.approx(3 / 4 * params * (4 + 2) / 10e9)


def test_search_keeps_what_fits_and_resumes(tmp_path):
    """GPT-3 175B on 8 DGX A100: every kept estimate fits in 80 GiB and every dropped one
    does not; the best estimate is simulated; a second run reads it back."""
    found = search(
        "gpt3-175b",
        "dgx-a100",
        nodes=8,
        global_batch=64,
        simulate=0,
        micro_batches=[1],
        virtual_stages=[1],
    )
    model = MODELS["gpt3-175b"]
    every = candidates(model, 64, 64, gpus_per_server=8, micro_batches=[1], virtual_stages=[1])
    fits = [c for c in every if memory_of(model, c, 64).fits(DEVICES["A100"].memory_bytes)]
    assert found.considered == len(every) and found.fitting == len(fits) > 0
    assert {e.candidate for e in found.estimates} == set(fits)
    steps = [e.step_s for e in found.estimates]
    assert steps == sorted(steps)

    out = tmp_path / "search.csv"
    kwargs = dict(
        nodes=1,
        global_batch=16,
        simulate=2,
        micro_batches=[1, 2],
        recompute=["full"],
        virtual_stages=[1],
        workers=1,
        progress=False,
        out=out,
    )
    first = search("gpt-1.5b", "dgx-a100", **kwargs)
    assert first.ran == 2 and [r["status"] for r in first.rows] == ["ok", "ok"]
    assert first.rows[0]["step_s"] <= first.rows[1]["step_s"]
    again = search("gpt-1.5b", "dgx-a100", **kwargs)
    assert again.ran == 0 and again.resumed == 2
    assert [r["step_s"] for r in again.rows] == [r["step_s"] for r in first.rows]
    best = first.rows[0]
    # TFLOP/s per GPU is Megatron-LM's count (no recomputation) over the simulated step
    # and the 8 GPUs; MFU is that over A100's 312 TFLOP/s bf16 peak.
    flops = MODELS["gpt-1.5b"].step_flops(16, recompute=False)
    assert best["tflops_per_gpu"] == pytest.approx(flops / best["step_s"] / 8 / 1e12)
    assert best["mfu"] == pytest.approx(best["tflops_per_gpu"] / 312)


def test_search_errors_say_what_to_change():
    with pytest.raises(CcsimError, match="takes a global batch of 3"):
        search("gpt3-175b", "dgx-a100", nodes=8, global_batch=3, micro_batches=[2])
    with pytest.raises(CcsimError, match="fits in A100's"):
        search("gpt3-175b", "dgx-a100", nodes=1, global_batch=8, recompute=["none"])
    with pytest.raises(CcsimError, match="unknown model"):
        search("gpt-9", "dgx-a100", global_batch=8)


def _ccsim(*args):
    return subprocess.run(
        [sys.executable, "-m", "simulator", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_ranks_and_exits_2_on_bad_input():
    done = _ccsim(
        "search",
        "gpt-1.5b",
        "--global-batch",
        "16",
        "--simulate",
        "0",
        "--top",
        "3",
        "--format",
        "csv",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [row["rank"] for row in rows] == ["1", "2", "3"]
    estimates = [float(row["estimate_s"]) for row in rows]
    assert estimates == sorted(estimates)
    for bad in (["--recompute", "some"], ["--micro-batches", "0"], ["--global-batch", "x"]):
        args = ["search", "gpt-1.5b", "--global-batch", "16", *bad]
        failed = _ccsim(*args)
        assert failed.returncode == 2 and "Traceback" not in failed.stderr
    failed = _ccsim("search", "gpt3-175b", "--global-batch", "8", "--recompute", "none")
    assert failed.returncode == 2 and "fits in A100's" in failed.stderr


def test_estimate_matches_a_free_simulation_of_an_moe_step():
    """A small mixture-of-experts model (every layer MoE, 4 experts, top-2) on DP 2 with
    EP 2: the estimate's passes (attention, router, the local experts' grouped GEMMs)
    and optimizer (its layers, and half the experts) equal the simulated step when
    communication is free, but for the host: the estimate takes a synchronised MoE
    forward as the longer of the host's launches and the GPU's work, the simulation as
    the two in series between synchronisations (a flow shop), which can only be longer,
    here by under 1%."""
    tiny = Transformer(
        layers=2,
        hidden=256,
        seq=256,
        vocab=0,
        heads=4,
        gated=True,
        experts=4,
        top_k=2,
        moe_ffn=512,
    )
    c = Candidate(1, 1, 2, 1, "none", ep=2)
    est = estimate(tiny, c, 2, FREE)
    step = megatron(tiny, global_batch=2, **c.params())
    graph = ring_graph(2, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    # (1e18 B/s transfers still take ~1e-11 s each: rel 1e-6 leaves room for them.)
    assert est.compute_s + est.optimizer_s <= result.step_s * (1 + 1e-6)
    assert est.compute_s + est.optimizer_s == pytest.approx(result.step_s, rel=1e-2)
    # Without the host's launches the two are the same passes and optimizer.
    step0 = megatron(tiny, global_batch=2, host_op_s=0.0, **c.params())
    _, result0 = run_workload(step0, graph, algorithm="ring", comm_slowdown=0.0)
    launches = estimate(tiny, c, 2, FREE, host_op_s=0.0)
    assert launches.compute_s + launches.optimizer_s == pytest.approx(result0.step_s, rel=1e-6)
    assert est.memory.total == pytest.approx(step.memory.total)
    moe = candidates(tiny, 8, 8, gpus_per_server=8, micro_batches=[1], recompute=["none"],
                     virtual_stages=[1])  # fmt: skip
    assert {c.ep for c in moe if c.tp == 1 and c.pp == 1} == {1, 2, 4}


def test_estimate_matches_a_free_simulation_of_an_fsdp_step():
    """FSDP over DP 2 with PP 2: the optimizer steps half of the layers (the embedding
    whole), and with free communication the step is the passes and that optimizer."""
    c = Candidate(1, 2, 2, 1, "full", fsdp=True)
    est = estimate(EVEN, c, 8, FREE)
    step = megatron(EVEN, global_batch=8, **c.params())
    graph = ring_graph(4, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    # (1e18 B/s transfers still take ~1e-11 s each: rel 1e-6 leaves room for them.)
    assert est.compute_s + est.optimizer_s == pytest.approx(result.step_s, rel=1e-6)
    assert est.memory.total == pytest.approx(step.memory.total)
    both = candidates(EVEN, 4, 8, gpus_per_server=4, micro_batches=[1], recompute=["full"],
                      virtual_stages=[1], shardings=["optimizer", "fsdp"])  # fmt: skip
    sharded = [c for c in both if c.fsdp]
    assert sharded and all(c.dp > 1 and not c.distributed_optimizer for c in sharded)
    # Every split with replicas has an FSDP twin; those without have none.
    assert len(sharded) == len([c for c in both if not c.fsdp and c.dp > 1])


def test_pipeline_sizes_that_do_not_divide_the_layers_get_lighter_end_stages():
    """Llama 3 405B's 126 layers on 16,384 GPUs: PP 8 and 16 do not divide them, so the
    middle stages take ceil(126/p) layers (16, 8) and the first and last share the rest:
    15 and 15 at PP 8 (Meta's own layout, arXiv 2407.21783 section 3.3.2), 7 and 7 at
    PP 16. PP 4 gives 31/32x2/31. Dividing sizes (PP 2, 6, ...) stay even."""
    model = MODELS["llama3-405b"]
    found = candidates(
        model,
        16384,
        2048,
        gpus_per_server=8,
        micro_batches=[1],
        recompute=["none"],
        virtual_stages=[1, 2],
    )
    ends = {c.pp: (c.first_stage_layers, c.last_stage_layers) for c in found if c.tp == 8}
    assert ends[8] == (15, 15) and ends[16] == (7, 7) and ends[4] == (31, 31)
    assert ends[2] == (None, None)
    # Uneven stages are not interleaved.
    assert all(c.virtual_stages == 1 for c in found if c.first_stage_layers is not None)
    label = next(c.label for c in found if c.tp == 8 and c.pp == 8)
    assert label.startswith("TP8 PP8 (first 15 last 15) DP256")


@pytest.mark.parametrize(("pp", "batch", "recompute"), [(4, 8, "full"), (3, 5, "selective")])
def test_uneven_stages_are_estimated_between_the_simulation_and_even_stages(pp, batch, recompute):
    """10 layers on 3 or 4 stages (3/4/3 and 2/3/3/2), communication free: the estimate
    (the first micro-batch through every stage, the others at the heaviest stage's pace)
    is at least the simulated step and below pricing every stage as the heaviest, as
    (m + p - 1) passes of it would (what it was before uneven stages were searched)."""
    model = dataclasses.replace(EVEN, layers=10)
    first, middle, last = {4: (2, 3, 2), 3: (3, 4, 3)}[pp]
    c = Candidate(1, pp, 1, 1, recompute, 1, first_stage_layers=first, last_stage_layers=last)
    est = estimate(model, c, batch, FREE)
    workload, result = free_step(model, c, batch)
    heaviest = dataclasses.replace(model, layers=pp * middle)
    even = estimate(heaviest, Candidate(1, pp, 1, 1, recompute, 1), batch, FREE)
    assert result.step_s <= est.step_s < even.step_s
    assert est.memory.total == pytest.approx(workload.memory.total)


def test_a_search_simulates_uneven_stages_and_resumes_them(tmp_path):
    """LLaMA 13B (40 layers) on 3 DGX A100: the best estimate is TP 4 PP 3 with stages
    of 13/14/13 layers. It is simulated as the megatron generator builds those stages
    (the same step as running that workload directly), and a second search finds it in
    its results file (the uneven counts and the even ones' empty cells read back)."""
    options = dict(
        nodes=3,
        global_batch=24,
        micro_batches=[1],
        recompute=["full"],
        virtual_stages=[1],
        workers=1,
        out=tmp_path / "search.csv",
    )
    first = search("llama-13b", "dgx-a100", simulate=2, **options)
    best = first.estimates[0].candidate
    assert (best.tp, best.pp, best.first_stage_layers, best.last_stage_layers) == (4, 3, 13, 13)
    row = next(r for r in first.rows if r["pp"] == 3)
    assert row["status"] == "ok"
    assert (row["first_stage_layers"], row["last_stage_layers"]) == (13, 13)
    workload = megatron(model="llama-13b", global_batch=24, **best.params())
    _, result = run_workload(workload, "dgx-a100", nodes=3)
    assert row["step_s"] == pytest.approx(result.step_s, rel=1e-12)
    again = search("llama-13b", "dgx-a100", simulate=2, **options)
    assert (again.ran, again.resumed) == (0, 2)
    assert [r["label"] for r in again.rows] == [r["label"] for r in first.rows]


def test_a_search_whose_candidates_are_all_refused_lists_them_and_exits_2(capsys, monkeypatch):
    """Issue 36: every candidate refused by the resource guard (a limit below any of
    them) gives one stderr line per candidate naming it and why, a table of the
    estimates with the reason on each row, no traceback, and exit 2; with the default
    limit the same search simulates them and exits 0."""
    from simulator.cli import main

    argv = ["search", "gpt-1.5b", "--global-batch", "16", "--simulate", "2",
            "--micro-batches", "1", "--recompute", "full", "--virtual-stages", "1",
            "--workers", "1", "--quiet"]  # fmt: skip
    # The topology (33 nodes and links, 495 flows) and the sweep of 2 pass; no candidate
    # (199 and 246 ops of the replicas built, 995 and 1,230 flows).
    monkeypatch.setenv("CCSIM_MAX_FLOWS", "700")
    assert main(argv) == 2
    out, err = capsys.readouterr()
    refused = [line for line in err.splitlines() if line.startswith("ccsim: not simulated:")]
    assert len(refused) == 2 and all("CCSIM_MAX_FLOWS" in line for line in refused)
    assert "none of the 2 candidates" in err and "Traceback" not in err
    table = [line for line in out.splitlines() if "TP1 PP" in line]
    assert len(table) == 2 and all("past the limit of 700" in line for line in table)
    monkeypatch.delenv("CCSIM_MAX_FLOWS")
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "not simulated" not in err and "not simulated" not in out


def test_a_search_prices_moe_host_launches_at_its_gpus_host_cpu():
    """The estimates of an MoE model's candidates on GB200 take Grace's measured 37.08 us
    a host operation, on a DGX H100 the x86 13.48 us (Transformer Engine issue #2053,
    workload/host.py): each estimate equals the estimate made with that figure, and a
    Grace host makes at least one candidate's step longer than an x86 one would."""
    from simulator.topology import load_topology
    from simulator.topology.graph import gpu_nodes
    from simulator.topology.summary import inter_bandwidth, intra_bandwidth
    from simulator.workload.devices import graph_device
    from simulator.workload.host import HOST_OP_S_BY_CPU

    for topology, nodes, cpu in (("gb200-nvl72", 16, "grace"), ("dgx-h100", 8, "x86")):
        graph = load_topology(topology, nodes)
        device = graph_device(graph)
        gpus = len(gpu_nodes(graph))
        batch = 2 * gpus
        found = search(
            "gpt-oss-120b", topology, nodes=nodes, global_batch=batch, simulate=0,
            micro_batches=[1], virtual_stages=[1],
        )  # fmt: skip
        hardware = Hardware(gpus // nodes, device, intra_bandwidth(graph), inter_bandwidth(graph))
        model = MODELS["gpt-oss-120b"]
        own = HOST_OP_S_BY_CPU[cpu]
        for e in found.estimates:
            assert e == estimate(model, e.candidate, batch, hardware, host_op_s=own)
        other = HOST_OP_S_BY_CPU["x86" if cpu == "grace" else "grace"]
        moved = [
            estimate(model, e.candidate, batch, hardware, host_op_s=other).step_s != e.step_s
            for e in found.estimates
        ]
        assert any(moved)
