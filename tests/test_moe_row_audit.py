"""Mixture-of-experts rows as their sources ran them (issue 31, session h53i): each check
holds a row's built options to what its source or the recipe at its tag states, read
independently of the loader (the launcher's formulas, the table's labels), and the new
row settings (``mtp_layers``, ``first_stage_layers`` / ``last_stage_layers``,
``moe_token_drop``) reject bad values with one line naming the row and the field."""

import pytest
import yaml

from simulator.errors import CcsimError
from simulator.validate.training import PUBLISHED, generator_options, load_runs

RUNS, SKIPPED = load_runs()
BY_ID = {run.id: run for run in RUNS}
ENTRIES = {entry["id"]: entry for entry in yaml.safe_load(PUBLISHED.read_text())}


@pytest.mark.parametrize(
    ("rid", "pp", "recompute"),
    [
        ("dgxc-v25.05.04-deepseek-v3-gb200-bf16-128", 4, "selective"),
        ("dgxc-v25.05.04-deepseek-v3-gb200-bf16-256", 4, "selective"),
        ("dgxc-v25.05.04-deepseek-v3-gb200-bf16-512", 4, "selective"),
        ("dgxc-v25.05.04-deepseek-v3-h100-bf16-512", 8, "none"),
        ("dgxc-v25.05.04-deepseek-v3-h100-bf16-1024", 16, "none"),
    ],
)
def test_dgx_cloud_deepseek_v3_runs_as_nemo_7a8f1cc_builds_it(rid, pp, recompute):
    """DGX Cloud v25.05.04 checks out NeMo 7a8f1cc (deepseek_v3/pretraining/setup.sh line
    54), whose pretrain_deepseek_v3.py puts 64 // PP - 1 layers on the first stage and
    64 // PP - 2 on the last (lines 76-77), builds pretrain_recipe() with its one MTP
    layer (use_mtp True) on the last stage, drops tokens at capacity factor 1 padded to
    capacity on every GPU over the alltoall dispatcher (lines 40, 80-81; no DeepEP),
    reduces gradients in fp32 (the deepseek trainer's DDP config and bf16_mixed()), and
    recomputes what the launcher passes: core_attn on GB200 (ccsim's selective),
    mla_up_proj on H100 (not modelled: none)."""
    run = BY_ID[rid]
    options = generator_options(run)
    assert run.pp == pp and run.model.layers == 61 + 1
    assert options["first_stage_layers"] == 64 // pp - 1
    assert options["last_stage_layers"] == 64 // pp - 2 + 1
    middle = run.model.layers - options["first_stage_layers"] - options["last_stage_layers"]
    assert middle == (pp - 2) * (64 // pp)
    assert options["moe_dispatcher"] == "alltoall" and options["moe_host_sync"] is False
    assert options["moe_routing"] == "even"
    assert "grad_reduce" not in options and options["sequence_parallel"] is True
    assert options["recompute"] == recompute and options["cross_entropy"] == "te"


def test_deepseek_v3_rows_train_an_mtp_layer_where_the_table_says_so():
    """Megatron-Bridge 25.11's table labels its GB200 DeepSeek-V3 rows "(w/o MTP)" and its
    B200 row "(w/ MTP)"; every Megatron-Bridge DeepSeek-V3 row is built with 61 decoder
    layers where its row says "w/o MTP" and 62 (one MTP layer) where it says "w/ MTP"."""
    labelled = {
        rid: "w/o MTP" not in entry["raw_row"]
        for rid, entry in ENTRIES.items()
        if rid.startswith("bridge-") and "MTP)" in str(entry.get("raw_row"))
    }
    assert sorted(labelled.values()) == [False, False, True]
    for rid, with_mtp in labelled.items():
        assert BY_ID[rid].model.layers == 61 + with_mtp, rid


def test_qwen3_235b_on_b200_in_mxfp8_gathers_parameters_without_overlap_in_25_11():
    """Megatron-Bridge v0.2.0's qwen3_235b_a22b_b200_config turns the distributed
    optimizer's overlapped parameter all-gather off for fp8_mx (scripts/performance/
    configs/qwen3/qwen3_llm_pretrain.py lines 133-136); its bf16 preset keeps it."""
    options = generator_options(BY_ID["bridge-25.11-qwen3-235b-a22b-b200-mxfp8-64"])
    assert options["overlap_param_gather"] is False
    assert options["distributed_optimizer"] is True and options["moe_a2a_overlap"] is True


def test_token_drop_rows_route_every_expert_its_capacity():
    """Token drop padded to capacity (capacity factor 1.0) gives every expert exactly its
    capacity, the mean, whatever the router chose: every row that drops tokens (labelled
    "(tokendrop)" or stating moe_token_drop) is built with even routing and no host
    synchronisation; a dropless row keeps random routing's busiest rank."""
    dropping = [
        rid
        for rid, entry in ENTRIES.items()
        if "(tokendrop)" in str(entry.get("raw_row"))
        or (entry.get("settings") or {}).get("moe_token_drop") is True
    ]
    built = [BY_ID[rid] for rid in dropping if rid in BY_ID]
    assert len(built) >= 12
    for run in built:
        options = generator_options(run)
        assert options["moe_routing"] == "even" and options["moe_host_sync"] is False, run.id
    dropless = generator_options(BY_ID["bridge-25.11-qwen3-30b-a3b-b200-mxfp8-8"])
    assert "moe_routing" not in dropless and "moe_host_sync" not in dropless


def _load_with(tmp_path, **settings):
    entry = dict(ENTRIES["dgxc-v25.05.04-deepseek-v3-gb200-bf16-128"])
    entry["settings"] = {**entry["settings"], **settings}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([entry]))
    return load_runs(path)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"mtp_layers": -1}, "settings.mtp_layers must be a whole number of at least 0"),
        ({"mtp_layers": "one"}, "settings.mtp_layers must be a whole number"),
        ({"first_stage_layers": 0}, "settings.first_stage_layers must be a whole number"),
        ({"last_stage_layers": None}, "give both"),
        ({"first_stage_layers": 14}, "do not split evenly over the 2 middle stages"),
        ({"first_stage_layers": 40, "last_stage_layers": 30}, "leave -9 layers"),
        ({"moe_token_drop": "yes"}, "settings.moe_token_drop must be true"),
    ],
)
def test_bad_row_settings_are_one_line_errors(tmp_path, settings, words):
    """A row's MTP layers, stage ends and token drop are checked where they are read."""
    with pytest.raises(CcsimError, match="published run dgxc-v25.05.04-deepseek-v3-gb200-bf16-128"):
        _load_with(tmp_path, **settings)
    with pytest.raises(CcsimError) as error:
        _load_with(tmp_path, **settings)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_stage_ends_need_pipelining_without_interleaving(tmp_path):
    """Megatron-Core's first / last stage layers are set here only without interleaving."""
    entry = dict(ENTRIES["dgxc-v25.05.04-deepseek-v3-gb200-bf16-128"])
    entry["vp"] = 2
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([entry]))
    with pytest.raises(CcsimError, match="only for pipelining without interleaving"):
        load_runs(path)
