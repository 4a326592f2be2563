"""MLPerf Training v5.0 and v5.1 Llama 3.1 405B and 8B rows of the published runs (issue 31):
what each row states is self-consistent (GPUs, batch, the per-run medians its step time is
the mean of), the runs build as their configs say, the H200 rows train on the HGX H200
preset, and the NVFP4 rows are read and skipped. None is fitted: all are held-out."""

import re
import statistics

import pytest
import yaml

from simulator.validate.training import PUBLISHED, generator_options, load_runs, run_topology

ENTRIES = [e for e in yaml.safe_load(PUBLISHED.read_text()) if e["id"].startswith("mlperf-v5")]
RUNS, SKIPPED = load_runs()
BY_ID = {run.id: run for run in RUNS}


def test_the_rows_are_there_and_held_out():
    """19 Llama 3.1 405B and 21 8B rows; every one that builds is held-out, and the
    NVFP4 ones (NVIDIA's v5.1 GB200 405B submissions, several 8B ones) are skipped for
    their precision."""
    ids = [e["id"] for e in ENTRIES]
    assert len(ids) == len(set(ids)) == 40
    assert sum("-405b-" in i for i in ids) == 19 and sum("-8b-" in i for i in ids) == 21
    built = [BY_ID[i] for i in ids if i in BY_ID]
    assert len(built) == 30 and all(run.use == "held-out" for run in built)
    skipped = dict(SKIPPED)
    fp4 = [i for i in ids if "nvfp4" in i]
    assert len(fp4) == 10 and all(skipped[i] == "precision nvfp4 is not modelled" for i in fp4)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["id"])
def test_each_row_is_self_consistent(entry):
    """GPUs = TP x PP x CP x DP; the mllog's global batch is DP x micro-batch x gradient
    accumulation; the step time is the mean of the per-run medians the row lists (as
    printed, 4 decimals), and the derived tokens/s per GPU is GBS x 8192 over step x GPUs."""
    e = entry
    assert e["gpus"] == e["tp"] * e["pp"] * e["cp"] * e["dp"]
    assert e["global_batch"] == e["dp"] * e["micro_batch"] * e["grad_accum"]
    measured = e["measured"]
    medians = [
        float(x) for x in re.search(r"\[([^]]*)\]", measured["step_time_kind"]).group(1).split(",")
    ]
    assert len(medians) == (3 if "-405b-" in e["id"] else 10)
    assert statistics.mean(medians) == pytest.approx(measured["step_time_s"], abs=1e-4)
    tokens = e["global_batch"] * e["model"]["seq"] / (measured["step_time_s"] * e["gpus"])
    assert e["derived"]["tokens_per_s_per_gpu"]["value"] == pytest.approx(tokens, abs=0.05)
    assert e["model"]["seq"] == 8192


def test_runs_build_as_their_configs_say():
    """Llama 3.1 405B's 126 layers on PP 8 x VP 8 with the embedding and the loss counted
    as layers (ASYM_PP_EMBED/ASYM_PP_LOSS) make 128 / 64 = 2 a chunk: the 8 virtual stages
    stay; v5.0 runs fp8 with the config's default delayed recipe, the University of
    Florida's v5.1 runs tensorwise (FP8_RECIPE=tensorwise); every row reduces gradients in
    bf16 (pretrain.py's grad_reduce_in_fp32=False) and keeps fp8 weights; the 8B runs of
    v5.1 fuse the loss with Transformer Engine's kernel (CE_FUSION_IMPL=te)."""
    h100 = generator_options(BY_ID["mlperf-v5.0-llama31-405b-h100-fp8-512"])
    assert (126 + 2) % (8 * 8) == 0
    assert h100["virtual_stages"] == 8 and h100["account_for_embedding_in_pipeline_split"]
    assert (h100["tp"], h100["pp"], h100["cp"], h100["dp"]) == (8, 8, 2, 4)
    assert h100["fp8_recipe"] == "delayed" and h100["cross_entropy"] == "fused"
    uf = generator_options(BY_ID["mlperf-v5.1-llama31-405b-b200-fp8-448"])
    assert uf["fp8_recipe"] == "tensorwise" and uf["tp_comm_overlap"] is False
    assert uf["dp"] == 448 // (4 * 8 * 2) == 7
    for run in RUNS:
        if run.id.startswith("mlperf-v5"):
            options = generator_options(run)
            assert options["grad_reduce"] == "bf16" and options["fp8_param_gather"], run.id
    eight = generator_options(BY_ID["mlperf-v5.1-llama31-8b-gb200-fp8-512"])
    assert eight["cross_entropy"] == "te" and eight["sequence_parallel"] is True
    assert (eight["tp"], eight["cp"], eight["dp"], eight["micro_batch"]) == (2, 4, 64, 1)


def test_h200_rows_train_on_the_hgx_h200_preset():
    """Nebius's v5.0 rows (8x H200-SXM-141GB a node): 512 GPUs are 64 HGX H200 servers."""
    run = BY_ID["mlperf-v5.0-llama31-405b-h200-fp8-512"]
    assert run.gpu == "H200"
    assert run_topology(run) == ("hgx-h200", 64)
