"""NeMo 1's Apex DistributedFusedAdam buckets (``megatron(apex_bucket_mib=...)``), which
DGX Cloud's v25.01 hydra configs run.

Sources: NeMo r2.0.0 megatron_gpt_model.py ``configure_optimizers`` (lines 633-662): one
effective bucket per transformer layer (per model chunk with interleaving), reversed, and
every parameter in none of them (embedding, output layer) added to the last one, the
first layer's; Apex splits each effective bucket into buckets of ``1024 * 1024 *
bucket_cap_mb / dtype_size`` gradient elements (apex/contrib/optimizers/
distributed_fused_adam.py lines 719-726 at apex 25.09) and reduces and gathers each in
its own call."""

import math

import pytest

from simulator.errors import CcsimError
from simulator.files import load_data
from simulator.topology import ring_graph
from simulator.validate.training import (
    DGXC_HYDRA_APEX_BUCKET_MIB,
    PUBLISHED,
    _dgxc_hydra,
    generator_options,
    load_runs,
)
from simulator.workload import run_workload
from simulator.workload.generators import Transformer, megatron

M = Transformer(layers=4, hidden=1024, seq=512, vocab=32000)  # untied: two vocab matrices
DP = dict(
    tp=1,
    pp=1,
    dp=2,
    global_batch=4,
    grad_reduce="bf16",
    distributed_optimizer=True,
    overlap_grad_reduce=True,
    overlap_param_gather=True,
)
# A layer's 12,582,912 parameters in three Apex buckets (a bucket a little over a third).
THIRD_MIB = M.layer_params * 2 / 3 / 2**20 * 1.001


def _dp_ops(workload, op: str, rank: int = 0) -> list:
    return [
        o for o in workload.ops if o.rank == rank and o.kind == "collective" and o.op == op
        if o.stream == "dp"
    ]  # fmt: skip


def test_calls_by_hand_and_the_vocabulary_with_the_first_layer():
    """4 layers of 12,582,912 parameters and two vocabulary matrices of 32,768,000, bf16
    gradients, buckets of 4,198,497 elements: the last backward reduces layers 4, 3 and 2
    in 3 calls each, then layer 1 with both vocabulary matrices (78,118,912 parameters)
    in ceil(78,118,912 / 4,198,497) = 19; the gathers go the other way round, the first
    layer's 19 first. Every parameter's gradient is reduced once (2 bytes each) and
    gathered once."""
    w = megatron(M, **DP, apex_bucket_mib=THIRD_MIB)
    elements = 1024 * 1024 * THIRD_MIB / 2
    first = M.layer_params + 2 * M.vocab * M.hidden
    assert math.ceil(first / elements) == 19
    reduces = _dp_ops(w, "reduce_scatter")
    assert [len([o for o in reduces if o.id.startswith(f"r0.dp.{n}.")]) for n in range(4)] == [
        3,
        3,
        3,
        19,
    ]
    assert sum(o.nbytes for o in reduces) == pytest.approx(2 * M.params, rel=1e-12)
    gathers = _dp_ops(w, "all_gather")
    assert len(gathers) == 19 + 3 * 3
    assert all(o.id.startswith("r0.dp.params.0.0.") for o in gathers[:19])
    assert sum(o.nbytes for o in gathers) == pytest.approx(2 * M.params, rel=1e-12)


def test_megatron_buckets_when_not_asked():
    """Without it: Megatron-Core's 40M-parameter bucket closes at the layer reaching it,
    here after all four (4 x 12.6M), so one reduce-scatter and one gather carry every
    parameter."""
    w = megatron(M, **DP)
    reduces = _dp_ops(w, "reduce_scatter")
    assert len(reduces) == 1 and len(_dp_ops(w, "all_gather")) == 1
    assert reduces[0].nbytes == pytest.approx(2 * M.params, rel=1e-12)


def test_interleaved_chunks_are_one_effective_bucket_each():
    """PP 2 x VP 2, 8 layers: each rank's two chunks of 2 layers are an effective bucket
    each (NeMo's virtual-pipeline branch), split into ceil(2 layers / a third of one) =
    6 calls; the vocabulary joins the first stage's first chunk (the embedding) and the
    last stage's last chunk (the output layer)."""
    m = Transformer(layers=8, hidden=1024, seq=512, vocab=32000)
    kw = {**DP, "pp": 2, "virtual_stages": 2, "global_batch": 8}
    w = megatron(m, **kw, apex_bucket_mib=THIRD_MIB)
    elements = 1024 * 1024 * THIRD_MIB / 2
    chunk = 2 * m.layer_params
    vocab = m.vocab * m.hidden
    for rank, (with_vocab, plain) in ((0, (0, 1)), (2, (1, 0))):  # stage 0, stage 1
        reduces = _dp_ops(w, "reduce_scatter", rank)
        counts = {
            c: len([o for o in reduces if o.id.startswith(f"r{rank}.dp.{c}.")]) for c in (0, 1)
        }
        assert counts[plain] == math.ceil(chunk / elements) == 6
        assert counts[with_vocab] == math.ceil((chunk + vocab) / elements)


def test_split_calls_pay_their_latencies_on_a_slow_ring():
    """2 ranks on a ring of 1 ms links and fast wires, one micro-batch (little compute
    to hide behind): Apex's 28 reduce-scatters and 28 gathers in place of Megatron's 2
    and 1 add at least half a link latency per extra call (each 2-rank call crosses a
    link at least once; half, for what the compute may hide)."""
    graph = ring_graph(2, 1e12, 1e-3)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    kw = {**DP, "global_batch": 2}
    apex = run_workload(megatron(M, **kw, apex_bucket_mib=THIRD_MIB), graph)[1].step_s
    plain = run_workload(megatron(M, **kw), graph)[1].step_s
    extra_calls = (28 + 28) - (2 + 1)
    assert apex - plain > 0.5 * extra_calls * 1e-3


@pytest.mark.parametrize("bad", [0, -50, float("inf"), "100MB", True])
def test_bad_apex_bucket_mib_is_one_clear_error(bad):
    with pytest.raises(CcsimError, match="apex_bucket_mib .* must be a positive number"):
        megatron(M, **DP, apex_bucket_mib=bad)


def test_dgx_cloud_hydra_rows_run_their_yaml_buckets():
    """Every DGX Cloud v25.01 row (NeMo 1 hydra configs) takes its model's
    bucket_cap_mb; no other row gets Apex's buckets."""
    runs, _ = load_runs()
    entries = {e["id"]: e for e in load_data(PUBLISHED, what="runs", trusted=True)}
    hydra = 0
    for run in runs:
        mib = generator_options(run).get("apex_bucket_mib")
        if _dgxc_hydra(entries[run.id]):
            hydra += 1
            assert mib == DGXC_HYDRA_APEX_BUCKET_MIB[entries[run.id]["model"]["name"]], run.id
        else:
            assert mib is None, run.id
    assert hydra >= 60
