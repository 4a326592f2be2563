"""An MoE forward as a two-machine flow shop (simulator/workload/generators.py,
``_moe_flow_shop``): the host launches each step, the GPU runs it after its launch, and
at each layer's synchronisation the host waits for the GPU. Checked against timelines
worked by hand and against a layer-by-layer recurrence written here, independent of the
replay."""

import pytest

from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.generators import _Builder, _moe_flow_shop, megatron
from simulator.workload.host import Launch, moe_forward_launches, moe_layer_ops
from simulator.workload.model import Transformer


def _replay(layers: int, before, after, gpu_s: dict[str, float], sync_s: float) -> float:
    """Step time of ranks running only the flow shop, GPU steps of fixed duration."""
    b = _Builder("flow", 2, "flow shop", trusted=True)
    for r in range(2):  # two ranks alike (the smallest topology)
        _moe_flow_shop(
            b, r, "f0", [], (tuple(before), tuple(after)),
            lambda kind, k: {"duration": k * gpu_s[kind]},
            group=None, layers=layers, a2a_layer=0.0, sync_s=sync_s, label="mb 0",
        )  # fmt: skip
    graph = ring_graph(2, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    _, result = run_workload(b.build(), graph, algorithm="ring")
    return result.step_s


def _recurrence(layers: int, before, after, gpu_s: dict[str, float], sync_s: float) -> float:
    """The same forward layer by layer: host clock h, GPU clock g; a step's launches
    take the host its time, its GPU work starts when both its launch and the GPU's
    previous work are done; at the synchronisation the GPU idles sync_s after both
    machines are done, and the host resumes then."""
    h = g = 0.0
    for _ in range(layers):
        for launch in before:
            h += launch.host_s
            if launch.gpu in gpu_s:  # (no all-to-alls without an EP group)
                g = max(g, h) + gpu_s[launch.gpu]
        g = max(g, h) + sync_s
        h = g
        for launch in after:
            h += launch.host_s
            if launch.gpu in gpu_s:  # (no all-to-alls without an EP group)
                g = max(g, h) + gpu_s[launch.gpu]
    return max(g, h)


BEFORE = [Launch(1.0, "dense"), Launch(2.0, None)]
AFTER = [Launch(3.0, "dispatch"), Launch(1.0, "experts"), Launch(1.0, "combine")]
GPU = {"dense": 4.0, "experts": 6.0}


def test_two_layers_follow_the_hand_timeline():
    """By hand (seconds): layer 1, host attention 0-1, GPU dense 1-5, host rest 1-3, sync
    5-5.5; host dispatch 5.5-8.5, experts 8.5-9.5, GPU experts 9.5-15.5, host combine
    9.5-10.5; layer 2, host attention 10.5-11.5 (while the GPU runs the experts), GPU
    dense 15.5-19.5, host rest 11.5-13.5, sync 19.5-20; host dispatch 20-23, experts
    23-24, GPU experts 24-30. A max(host, GPU) per layer would give 2 x 11 = 22 s."""
    assert _replay(2, BEFORE, AFTER, GPU, 0.5) == pytest.approx(30.0)
    assert _recurrence(2, BEFORE, AFTER, GPU, 0.5) == pytest.approx(30.0)


@pytest.mark.parametrize("layers", [1, 3, 7])
@pytest.mark.parametrize(
    ("before", "after", "gpu"),
    [
        (BEFORE, AFTER, GPU),
        # host-bound: the GPU waits for every launch
        ([Launch(5.0, "dense"), Launch(4.0, None)],
         [Launch(6.0, "experts"), Launch(3.0, None)], {"dense": 1.0, "experts": 2.0}),
        # GPU-bound: the host waits at each synchronisation
        ([Launch(0.5, "dense"), Launch(0.25, None)],
         [Launch(0.5, "experts")], {"dense": 9.0, "experts": 7.0}),
        # the flex dispatchers' order: the synchronisation after the dispatch
        ([Launch(1.0, "dense"), Launch(2.0, None)],
         [Launch(0.0, None), Launch(3.0, "experts"), Launch(2.0, None)],
         {"dense": 2.5, "experts": 1.5}),
    ],
)  # fmt: skip
def test_aggregated_layers_equal_the_layer_by_layer_flow_shop(layers, before, after, gpu):
    """The replay builds the middle layers as one segment with every step that many
    times as long; its makespan is the layer-by-layer one."""
    want = _recurrence(layers, before, after, gpu, 0.25)
    assert _replay(layers, before, after, gpu, 0.25) == pytest.approx(want, rel=1e-12)


def test_launches_are_the_counted_operations_in_megatron_cores_order():
    """Every counted forward operation is in one step (the totals agree), the alltoall
    dispatcher's permute before its synchronisation, the flex dispatchers' dispatch
    before theirs, and a graphed part is its one replay."""
    for dispatcher in ("alltoall", "deepep", "hybridep"):
        ops = moe_layer_ops(local_experts=8, ep=8, dispatcher=dispatcher, recipe="mxfp8",
                            shared_experts=1, graphs=["attn", "moe_router"])  # fmt: skip
        before, after = moe_forward_launches(ops, 1.0, dispatcher=dispatcher, tensor_op_s=0.0)
        assert sum(s.host_s for s in (*before, *after)) == ops.forward()
        # the experts' framework tensor operations go with their grouped GEMMs' launches
        with_tensors = moe_forward_launches(ops, 1.0, dispatcher=dispatcher, tensor_op_s=0.25)
        steps = [*with_tensors[0], *with_tensors[1]]
        assert sum(s.host_s for s in steps) == ops.forward() + 0.25 * ops.forward_tensors()
        pairs = zip(steps, (*before, *after), strict=True)
        grown = [a.gpu for a, b in pairs if a.host_s != b.host_s]
        assert grown == ["experts"]
        assert before[0] == Launch(1.0, "dense")  # the attention's graph replay
        kinds = [s.gpu for s in before]
        assert ("dispatch" in kinds) == (dispatcher != "alltoall")
    ops = moe_layer_ops(local_experts=8, ep=8)
    before, after = moe_forward_launches(ops, 1.0, tensor_op_s=0.0)
    # preprocess's 8 kernels and 6 host copies, the router's 8, the permute's 4
    assert before[1] == Launch(8 + 6 + 8 + 4, None)


# 2 MoE layers of 16 SwiGLU experts, 2 routed a token; s 256, h 256 (as in
# test_moe_host.py).
SMALL = Transformer(
    layers=2, hidden=256, seq=256, vocab=0, heads=4, gated=True, experts=16, top_k=2, moe_ffn=512
)


def _step(**options) -> float:
    step = megatron(SMALL, tp=1, pp=1, dp=2, ep=2, micro_batch=1, global_batch=6,
                    recompute="none", overlap_grad_reduce=False, **options)  # fmt: skip
    graph = ring_graph(2, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    return result.step_s


def test_synchronised_forward_serialises_host_and_gpu():
    """At a per-operation cost that makes a layer's forward launches about as long as
    its GPU work, the flow shop's step is longer than both the GPU alone and the host
    running ahead (the larger of the two), and no longer than the host's launches and
    the GPU's work end to end."""
    gpu = _step(host_op_s=0.0, moe_host_sync=True)
    ops = moe_layer_ops(local_experts=8, ep=2)
    launches = 3 * 2 * (ops.forward() + ops.backward())
    cost = gpu / launches
    ahead = _step(host_op_s=cost, moe_host_sync=False)
    synced = _step(host_op_s=cost, moe_host_sync=True)
    assert gpu < synced and ahead < synced
    assert synced <= gpu + launches * cost
