"""The Llama 3 paper's Table 4 rows (Dubey et al. 2024, arXiv 2407.21783, section 3.3.2):
what the table states is self-consistent, and the rows build the pipeline the paper's
text describes. None is fitted: all are held-out."""

import pytest
import yaml

from simulator.validate.training import PUBLISHED, generator_options, load_runs
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
