"""Mixture-of-experts dispatch as Megatron-Core runs it: the flex dispatcher's
deduplicated copies (counted here by enumerating every routing), the host
synchronisation of each MoE layer's forward (its closed-form cost on a timeline with
nothing else to hide it), the dispatcher a published run states, and bad input."""

import itertools

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.validate.training import _moe_options
from simulator.workload import run_workload
from simulator.workload.generators import HOST_SYNC_S, megatron
from simulator.workload.model import Transformer

# 2 MoE layers of 16 SwiGLU experts, 2 routed a token; s 256, h 256.
SMALL = Transformer(
    layers=2, hidden=256, seq=256, vocab=0, heads=4, gated=True, experts=16, top_k=2, moe_ffn=512
)


def _distinct(experts: int, top_k: int, places: int) -> float:
    """Mean number of places (each holding experts / places consecutive experts) a token
    reaches, over every equally likely set of top_k distinct experts: counted."""
    per = experts // places
    sets = list(itertools.combinations(range(experts), top_k))
    return sum(len({e // per for e in chosen}) for chosen in sets) / len(sets)


def test_alltoall_sends_one_copy_per_routed_expert():
    assert SMALL.dispatch_copies(8) == 2
    assert SMALL.dispatch_copies(8, dispatcher="alltoall", domain=4) == 2


def test_flex_dispatch_inside_a_domain_sends_a_token_once_per_rank():
    """EP 8 in one server: 16 experts, 2 per rank; a token's 2 experts are on one rank
    in 8 of the C(16, 2) = 120 pairs, so it goes to 2 - 8/120 ranks on average."""
    assert _distinct(16, 2, 8) == pytest.approx(2 - 8 / 120)
    for dispatcher in ("deepep", "hybridep"):
        copies = SMALL.dispatch_copies(8, dispatcher=dispatcher, domain=8)
        assert copies == pytest.approx(_distinct(16, 2, 8))


def test_flex_dispatch_across_domains_sends_a_token_once_per_domain():
    """EP 16 over two servers of 8: a token is sent once to each server holding one of
    its experts (8 per server): both in 64 of the 120 pairs, so 1 + 64/120 servers; the
    all-to-all's bytes are tokens x hidden x that x 2, of which half cross servers, the
    RDMA copies (once to the other server whenever it holds one of the two: in all but
    the C(8, 2) = 28 pairs inside this server)."""
    copies = SMALL.dispatch_copies(16, dispatcher="deepep", domain=8)
    assert copies == pytest.approx(_distinct(16, 2, 2))
    assert copies == pytest.approx(1 + 64 / 120)
    # (The host's launches off: with them a forward's all-to-alls are split around its
    # synchronisations, test_moe_host_flow.py.)
    step = megatron(SMALL, tp=1, pp=1, dp=16, ep=16, global_batch=16, recompute="none",
                    moe_dispatcher="deepep", ep_domain=8, host_op_s=0.0)  # fmt: skip
    calls = [op.nbytes for op in step.ops if op.op == "all_to_all"]
    # 256 tokens a rank, 2 MoE layers in the pass, bf16.
    assert calls == pytest.approx([2 * 256 * 256 * (1 + 64 / 120) * 2] * len(calls))
    # Half of it (the other server's 8 of 16 ranks) is the RDMA copies.
    assert calls[0] / 2 == pytest.approx(2 * 256 * 256 * 2 * (1 - 28 / 120))


def _step(**options) -> float:
    step = megatron(SMALL, tp=1, pp=1, dp=2, ep=2, micro_batch=1, global_batch=6, **options)
    graph = ring_graph(2, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    return result.step_s


@pytest.mark.parametrize(("recompute", "forwards"), [("none", 1), ("full", 2)])
def test_one_host_sync_per_moe_layer_forward_adds_its_latency(recompute, forwards):
    """3 micro-batches of 2 MoE layers, one pipeline stage: nothing runs beside the
    compute stream's waits, so each synchronisation (one per MoE layer and forward; the
    recomputed forward of full recomputation has its own) lengthens the step by
    HOST_SYNC_S: 3 x 2 x forwards of them (the host's launch time off: it is timed on its
    own in test_moe_host.py)."""
    options = dict(recompute=recompute, overlap_grad_reduce=False, host_op_s=0.0)
    synced = _step(moe_host_sync=True, **options)
    static = _step(moe_host_sync=False, **options)
    assert synced - static == pytest.approx(3 * 2 * forwards * HOST_SYNC_S, rel=1e-6)


def test_host_sync_latency_is_the_cited_difference():
    """NVIDIA's CUDA Graphs post: 9.6 us a kernel with a synchronisation after each,
    3.8 us without."""
    assert pytest.approx(5.8e-6) == HOST_SYNC_S


def test_published_rows_dispatcher_from_their_settings():
    row = {"moe": True, "gpu": "B200-SXM-180GB", "model": {"name": "qwen3-30b-a3b"}}
    # (host_op_s: an x86 DGX's cost per host operation, workload/host.py)
    assert _moe_options(row) == {"moe_dispatcher": "alltoall", "host_op_s": 13.48e-6}
    stated = {**row, "settings": {"moe_dispatcher": "hybridep"}}
    assert _moe_options(stated) == {"moe_dispatcher": "hybridep", "host_op_s": 13.48e-6}
    graphed = {
        **row,
        "settings": {"moe_dispatcher": "hybridep", "cuda_graphs": "full_iteration scope=[]"},
    }
    assert _moe_options(graphed) == {
        "moe_dispatcher": "hybridep",
        "host_op_s": 13.48e-6,
        "moe_host_sync": False,
        "cuda_graphs": ("full_iteration",),
    }
    # DGX Cloud's DeepSeek-V3 rows get no rule of their own: NeMo 7a8f1cc, the commit
    # their launcher checks out, has no DeepEP (the earlier rule read a later script), so
    # without stated settings they run the alltoall dispatcher; the rows state their
    # token drop themselves (tests/test_moe_row_audit.py).
    dgxc = {
        "moe": True,
        "source_kind": "nvidia-dgxc-benchmarking",
        "model": {"name": "deepseek-v3"},
    }
    assert _moe_options({**dgxc, "gpu": "H100-SXM-80GB"}) == {
        "moe_dispatcher": "alltoall",
        "host_op_s": 13.48e-6,
    }
    assert _moe_options({**dgxc, "gpu": "GB200-NVL72"}) == {
        "moe_dispatcher": "alltoall",
        "host_op_s": 37.08e-6,
    }


def test_dispatcher_errors_say_what_to_change():
    with pytest.raises(CcsimError, match="moe_dispatcher 'flex'.*alltoall, deepep, hybridep"):
        megatron(SMALL, tp=1, pp=1, dp=2, ep=2, global_batch=2, moe_dispatcher="flex")
    with pytest.raises(CcsimError, match="ep_domain"):
        megatron(SMALL, tp=1, pp=1, dp=2, ep=2, global_batch=2, ep_domain=0)


def _overlap_step(bandwidth: float, overlap: bool) -> float:
    # (The host's launch time off: this checks the all-to-all overlap alone.)
    options = dict(recompute="none", overlap_grad_reduce=False, moe_a2a_overlap=overlap)
    options["host_op_s"] = 0.0
    step = megatron(SMALL, tp=1, pp=1, dp=2, ep=2, micro_batch=1, global_batch=8, **options)
    graph = ring_graph(2, bandwidth, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    return result.step_s


def test_a2a_overlap_hides_communication_and_conserves_compute():
    """Combined 1F1B with 4 micro-batches: with free links the same kernels run one
    after another on the compute stream whatever the order (the step is the same);
    with slow links a pass's all-to-all runs while the other pass computes, so the
    step is shorter than without overlap, and never shorter than with free links."""
    free = _overlap_step(1e18, False)
    # (1e18 B/s transfers still take ~1e-11 s each: rel 1e-6 leaves room for them.)
    assert _overlap_step(1e18, True) == pytest.approx(free, rel=1e-6)
    slow, hidden = _overlap_step(2e9, False), _overlap_step(2e9, True)
    assert free < hidden < slow


def test_a2a_overlap_order_has_megatron_warmup_plus_one():
    """Megatron-Core's get_pp_rank_microbatches with overlap_moe_expert_parallel_comm:
    (p - s - 1) 2 + (v - 1) p + 1 warm-up forwards; every pass once; each pair's backward
    is of a chunk-micro-batch forwarded before the pair."""
    from simulator.workload.generators import _a2a_overlap_order
    from simulator.workload.pipeline import pipeline_order

    for stage, pp, micro, v in ((0, 4, 8, 2), (3, 4, 8, 2), (1, 2, 6, 3), (0, 1, 5, 1)):
        groups = _a2a_overlap_order(stage, pp, micro, v)
        warmup = (pp - stage - 1) * 2 + (v - 1) * pp + 1 if v > 1 else 1
        assert [len(g) for g in groups[:warmup]] == [1] * warmup
        assert all(g[0][0] == "f" for g in groups[:warmup])
        flat = [entry for group in groups for entry in group]
        assert sorted(flat) == sorted(pipeline_order(stage, pp, micro, v))
        done = set()
        for group in groups:
            for kind, c, i in group:
                if kind == "b":
                    assert ("f", c, i) in done
            done.update(group)


def test_a2a_overlap_needs_what_megatron_needs():
    with pytest.raises(CcsimError, match="moe_a2a_overlap.*virtual stages"):
        megatron(SMALL, tp=1, pp=2, dp=2, ep=2, global_batch=8, moe_a2a_overlap=True)


def test_host_bound_moe_layers_take_the_hosts_time():
    """With the host far slower than the GPU, each MoE layer's forward takes the host's
    moe_host_layer_s and its backward twice that: 3 micro-batches x 2 layers x (1 + 2)
    of them, so one more second a layer forward is 18 s more a step."""
    assert _step(moe_host_layer_s=2.0) - _step(moe_host_layer_s=1.0) == pytest.approx(18.0)
    with pytest.raises(CcsimError, match="moe_host_layer_s"):
        _step(moe_host_layer_s=-1.0)


def test_a2a_overlap_issues_all_to_alls_in_megatron_layer_order():
    """Megatron-Core's combined step (model_chunk_schedule_plan.py, run): on the
    communication stream the backward's combine gradient, the forward's dispatch, the
    backward's dispatch gradient, the forward's combine; the forward's attention first
    and the backward's last on the compute stream, the experts between."""
    step = megatron(SMALL, tp=1, pp=1, dp=2, ep=2, global_batch=6, moe_a2a_overlap=True)
    ep = [op.id for op in step.ops if op.rank == 0 and op.stream == "ep"]
    pair = [op for op in ep if ".f1." in op or ".b0." in op]
    assert pair == ["r0.ep.b0.dispatch0", "r0.ep.f1.dispatch0", "r0.ep.b0.combine0",
                    "r0.ep.f1.combine0"]  # fmt: skip
    compute = [op.id for op in step.ops if op.rank == 0 and op.stream == "compute"]
    pair = [op for op in compute if op.split(".")[1] in ("f1", "b0")]
    assert pair[:2] == ["r0.f1", "r0.f1.sync0"]
    assert pair.index("r0.b0.experts") < pair.index("r0.f1.experts") < pair.index("r0.b0")


def test_the_command_line_sets_the_dispatcher_overlap_and_host_sync(tmp_path, capsys):
    """`ccsim generate megatron --moe-dispatcher ... --ep-domain ... --moe-a2a-overlap
    --no-moe-host-sync` writes the step the Python generator builds with the same
    options (same ops, same all-to-all bytes); a bad domain is one line, exit 2."""
    from simulator.cli.main import main
    from simulator.workload import load_workload

    options = dict(model="mixtral-8x7b", tp=1, pp=2, virtual_stages=2, dp=8, ep=4)
    out = tmp_path / "moe.json"
    argv = ["generate", "megatron", "--model", "mixtral-8x7b", "--tp", "1", "--pp", "2"]
    argv += ["--virtual-stages", "2", "--dp", "8", "--ep", "4", "--global-batch", "16"]
    argv += ["--moe-dispatcher", "deepep", "--ep-domain", "4", "--moe-a2a-overlap"]
    assert main([*argv, "--no-moe-host-sync", "--out", str(out)]) == 0
    written = load_workload(out)
    built = megatron(
        **options,
        global_batch=16,
        moe_dispatcher="deepep",
        ep_domain=4,
        moe_a2a_overlap=True,
        moe_host_sync=False,
    )
    plain = megatron(**options, global_batch=16)

    def a2a_bytes(workload):
        return sum(op.nbytes for op in workload.ops if op.stream == "ep" or "a2a" in op.id)

    assert len(written.ops) == len(built.ops) != len(plain.ops)
    assert a2a_bytes(written) == a2a_bytes(built)
    assert main([*argv, "--ep-domain", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ep_domain" in err[0]
