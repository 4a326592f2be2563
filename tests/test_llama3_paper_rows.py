"""The Llama 3 paper's Table 4 rows (Dubey et al. 2024, arXiv 2407.21783, section 3.3.2):
what the table states is self-consistent, and the rows build the pipeline the paper's
text describes. None is fitted: all are held-out."""

import pytest
import yaml

from simulator.validate.training import PUBLISHED, generator_options, load_runs
from simulator.workload.generators import megatron
from simulator.workload.memory import pipeline_chunks

ENTRIES = {
    e["id"]: e for e in yaml.safe_load(PUBLISHED.read_text()) if e["id"].startswith("llama3-paper-")
}
RUNS, _ = load_runs()
BY_ID = {run.id: run for run in RUNS if run.id in ENTRIES}

#: Table 4 (p. 10): GPUs, TP, CP, PP, DP, sequence, batch size per DP group.
TABLE_4 = {
    "llama3-paper-405b-h100-bf16-8192-seq8192": (8192, 8, 1, 16, 64, 8192, 32),
    "llama3-paper-405b-h100-bf16-16384-seq8192": (16384, 8, 1, 16, 128, 8192, 16),
    "llama3-paper-405b-h100-bf16-16384-seq131072": (16384, 8, 16, 16, 8, 131072, 16),
}


@pytest.mark.parametrize("rid", sorted(TABLE_4))
def test_rows_state_table_4(rid):
    """Each row holds its Table 4 line: GPUs = TP x CP x PP x DP, and DP x the batch a DP
    group is the global batch, 16M tokens (2^24 = 16,777,216) at every sequence length."""
    gpus, tp, cp, pp, dp, seq, per_dp = TABLE_4[rid]
    e = ENTRIES[rid]
    assert (e["gpus"], e["tp"], e["cp"], e["pp"], e["dp"]) == (gpus, tp, cp, pp, dp)
    assert gpus == tp * cp * pp * dp
    assert e["model"]["seq"] == seq and e["global_batch"] == dp * per_dp
    assert e["global_batch"] * seq == 2**24
    assert BY_ID[rid].use == "held-out"


@pytest.mark.parametrize("rid", sorted(TABLE_4))
def test_pipeline_is_the_papers(rid):
    """The paper takes one Transformer layer from the first and from the last stage, "so the
    first model chunk on the first stage has only the embedding, and the last model chunk
    on the last stage has only output projection and loss" (p. 11), on an interleaved
    schedule: one-layer chunks, so Llama 3 405B's 126 layers (Table 3) with the embedding
    and the loss make 128 = PP 16 x V 8 of them."""
    run = BY_ID[rid]
    assert run.model.layers == 126 and run.vp == 8
    options = generator_options(run)
    assert options["virtual_stages"] == 8
    chunks = pipeline_chunks(
        126,
        16,
        virtual_stages=8,
        account_for_embedding=options["account_for_embedding_in_pipeline_split"],
        account_for_loss=options["account_for_loss_in_pipeline_split"],
    )
    assert chunks[0] == (0,) + (1,) * 7  # the embedding alone, then a layer a chunk
    assert chunks[-1] == (1,) * 7 + (0,)  # ... the output and loss alone
    assert all(c == (1,) * 8 for c in chunks[1:-1])
    assert sum(map(sum, chunks)) == 126


def test_micro_batches_fill_the_interleaved_schedule():
    """Megatron-Core's interleaved schedule (ccsim's) runs micro-batches in groups of PP:
    the 32 and 16 a DP group of Table 4 divide into them, so none of the rows falls back to
    1F1B (generator_options drops the interleaving where they do not)."""
    for rid, (_, _, _, pp, _, _, per_dp) in TABLE_4.items():
        assert per_dp % pp == 0
        assert generator_options(BY_ID[rid])["virtual_stages"] == 8


def test_cp_row_all_gathers_k_and_v_as_the_paper_states():
    """Section 3.3.2 (p. 11): "our CP implementation adopts an all-gather based method
    where we first all-gather the key (K) and value (V) tensors, and then compute attention
    output for the local query (Q) tensor chunk" -- Transformer Engine's all_gather CP,
    which the CP 16 row runs; the paper's reason, "the communicated K and V tensors are
    much smaller than Q tensor due to the use of GQA": a TP 8 rank's K and V of a layer
    are 2 x 131,072 tokens x 1 key/value head of 128 x 2 bytes = 64 MiB gathered, 4 MiB
    from each of the 16 CP ranks, an eighth of the 32 MiB of its own 8,192 tokens' Q
    (128 / 8 = 16 query heads)."""
    rid = "llama3-paper-405b-h100-bf16-16384-seq131072"
    assert "all-gather the key (K) and value (V)" in ENTRIES[rid]["settings"]["context_parallelism"]
    options = generator_options(BY_ID[rid])
    assert options["cp_comm_type"] == "all_gather"
    assert all("cp_comm_type" not in generator_options(BY_ID[r]) for r in TABLE_4 if r != rid)
    gathered = 2 * 131072 * 1 * 128 * 2
    own_q = 8192 * 16 * 128 * 2
    assert gathered == 64 * 2**20 and gathered / 16 == own_q / 8
    step = megatron(**options)  # (one replica and CP rank built: replicas, shadows)
    gathers = {op.nbytes for op in step.ops if op.group.startswith("cp") and op.op == "all_gather"}
    assert gathers == {gathered}  # one-layer chunks, no recomputation: one gather a pass
