"""NeMo 1's Apex DistributedFusedAdam buckets (``megatron(apex_bucket_mib=...)``), which
DGX Cloud's v25.01 hydra configs run.

Sources: NeMo r2.0.0 megatron_gpt_model.py ``configure_optimizers`` (lines 633-662): one
effective bucket per transformer layer (per model chunk with interleaving), reversed, and
every parameter in none of them (embedding, output layer) added to the last one, the
first layer's. Apex splits each into buckets of ``1024 * 1024 * bucket_cap_mb /
dtype_size`` gradient elements (apex/contrib/optimizers/distributed_fused_adam.py lines
719-726 at apex 25.09); it reduces an effective bucket's buckets in one coalesced NCCL
group (``_start_bucket_grad_sync``), which NCCL spreads over its channels as one call's
traffic (src/enqueue.cc ``scheduleCollTasksToPlan`` at v2.22.3-1), gathers the first
effective bucket's together after the optimizer step (``overlap_first_bucket``) and the
others one Apex bucket at a time (``_try_start_bucket_param_sync``)."""

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
    gradients, Apex buckets of 4,198,497 elements: the last backward reduces layers 4, 3
    and 2 one call each (2 bytes a parameter, coalesced), then layer 1 with both
    vocabulary matrices; the gathers go the other way round, the first layer's with the
    vocabulary first in one call, then layers 2, 3 and 4 in ceil(12,582,912 /
    4,198,497) = 3 calls each. Every parameter is reduced once and gathered once."""
    w = megatron(M, **DP, apex_bucket_mib=THIRD_MIB)
    layer, vocab = M.layer_params, M.vocab * M.hidden
    assert math.ceil(layer / (1024 * 1024 * THIRD_MIB / 2)) == 3
    reduces = _dp_ops(w, "reduce_scatter")
    assert [o.nbytes for o in reduces] == pytest.approx(
        [2 * layer, 2 * layer, 2 * layer, 2 * (layer + 2 * vocab)], rel=1e-12
    )
    gathers = _dp_ops(w, "all_gather")
    assert [o.nbytes for o in gathers] == pytest.approx(
        [2 * (layer + 2 * vocab)] + [2 * layer / 3] * 9, rel=1e-12
    )
    assert sum(o.nbytes for o in reduces) == pytest.approx(2 * M.params, rel=1e-12)
    assert sum(o.nbytes for o in gathers) == pytest.approx(2 * M.params, rel=1e-12)


def test_a_later_buckets_calls_pay_their_latencies_on_a_slow_ring():
    """2 ranks on a ring of 1 ms links and fast wires, one micro-batch: Apex's gathers
    of layers 2-4 in 3 calls each in place of one add at least half a link latency per
    extra call (each 2-rank call crosses a link at least once; half, for what the
    compute may hide), against the same layout in bigger buckets (one call a layer)."""
    graph = ring_graph(2, 1e12, 1e-3)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    kw = {**DP, "global_batch": 2}
    split = run_workload(megatron(M, **kw, apex_bucket_mib=THIRD_MIB), graph)[1].step_s
    whole = run_workload(megatron(M, **kw, apex_bucket_mib=1024.0), graph)[1].step_s
    assert split - whole > 0.5 * (9 - 3) * 1e-3


def test_megatron_buckets_when_not_asked():
    """Without it: Megatron-Core's 40M-parameter bucket closes at the layer reaching it,
    here after all four (4 x 12.6M), so one reduce-scatter and one gather carry every
    parameter."""
    w = megatron(M, **DP)
    reduces = _dp_ops(w, "reduce_scatter")
    assert len(reduces) == 1 and len(_dp_ops(w, "all_gather")) == 1
    assert reduces[0].nbytes == pytest.approx(2 * M.params, rel=1e-12)


def test_interleaved_chunks_are_one_bucket_each():
    """PP 2 x VP 2, 8 layers: each rank's two chunks of 2 layers are an effective bucket
    each (NeMo's virtual-pipeline branch); the embedding joins the first stage's first
    chunk, the output layer the last stage's last."""
    m = Transformer(layers=8, hidden=1024, seq=512, vocab=32000)
    kw = {**DP, "pp": 2, "virtual_stages": 2, "global_batch": 8}
    w = megatron(m, **kw, apex_bucket_mib=THIRD_MIB)
    chunk, vocab = 2 * m.layer_params, m.vocab * m.hidden
    for rank, with_vocab in ((0, 0), (2, 1)):  # stage 0's chunk 0, stage 1's chunk 1
        reduces = _dp_ops(w, "reduce_scatter", rank)
        by_chunk = {c: [o.nbytes for o in reduces if o.id == f"r{rank}.dp.{c}.0"] for c in (0, 1)}
        assert by_chunk[with_vocab] == pytest.approx([2 * (chunk + vocab)], rel=1e-12)
        assert by_chunk[1 - with_vocab] == pytest.approx([2 * chunk], rel=1e-12)
        assert len(reduces) == 2


def test_no_effect_without_a_sharded_optimizer():
    """Apex's optimizer shards over DP: with one replica there is nothing to reduce."""
    one = {**DP, "dp": 1}
    assert [o.id for o in megatron(M, **one, apex_bucket_mib=THIRD_MIB).ops] == [
        o.id for o in megatron(M, **one).ops
    ]


@pytest.mark.parametrize("bad", [0, -50, float("inf"), "100MB", True])
def test_bad_apex_bucket_mib_is_one_clear_error(bad):
    with pytest.raises(CcsimError, match="apex_bucket_mib .* must be a positive number"):
        megatron(M, **DP, apex_bucket_mib=bad)


def test_dgx_cloud_hydra_rows_run_apex_buckets():
    """Every DGX Cloud v25.01 row (NeMo 1 hydra configs, each naming
    distributed_fused_adam) runs Apex's buckets of its model's bucket_cap_mb; no other
    row does."""
    runs, _ = load_runs()
    entries = {e["id"]: e for e in load_data(PUBLISHED, what="runs", trusted=True)}
    hydra = 0
    for run in runs:
        mib = generator_options(run).get("apex_bucket_mib")
        entry = entries[run.id]
        if _dgxc_hydra(entry):
            hydra += 1
            assert mib == DGXC_HYDRA_APEX_BUCKET_MIB[entry["model"]["name"]], run.id
        else:
            assert mib is None, run.id
    assert hydra >= 60


def test_the_steady_shortcut_gives_the_full_step_with_apex_buckets():
    """Interleaved PP 2 x VP 2, TP 2, DP 2 on two DGX H100 with Apex's buckets (a later
    chunk's gathers in several calls): the steady-state shortcut (the short step's
    periodic middle, simulator.workload.steady) gives the full replay's step."""
    from simulator.workload.steady import run_steady

    m = Transformer(layers=8, hidden=2048, seq=2048, vocab=32000)
    options = dict(
        model=m,
        tp=2,
        pp=2,
        dp=2,
        global_batch=32,
        virtual_stages=2,
        replicas=True,
        grad_reduce="bf16",
        apex_bucket_mib=20.0,
    )
    full = run_steady(dict(options), "dgx-h100", nodes=2, shortcut=False)
    short = run_steady(dict(options), "dgx-h100", nodes=2)
    assert short.simulated < full.micro_batches  # the shortcut did run
    assert short.step_s == pytest.approx(full.step_s, rel=1e-9)
