"""NCCL settings per communicator (Megatron-Core's ``--nccl-communicator-config-path``):
the channel bound as NCCL's source sets it, the replay running a group's calls on its
communicator's channels, bad input, and the published rows that set it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simulator.cli.main import main
from simulator.errors import CcsimError
from simulator.library.nccl_env import CommConfig, parse_comm_config, parse_nccl_env
from simulator.topology import load_topology
from simulator.validate.training import PUBLISHED, generator_options, load_runs
from simulator.workload import WorkloadReplay, breakdown
from simulator.workload.communicators import (
    GENERATOR_GROUPS,
    communicator_of,
    communicators_from_items,
    parse_communicators,
)
from simulator.workload.generators import megatron
from simulator.workload.trace import parse_workload

GiB = 2**30


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        # connect.cc:503-505 at v2.30.7-1: nChannels = min(MAX_NCHANNELS, n, maxCTAs),
        # then copied up to max(MIN_NCHANNELS, minCTAs): 16 found, config caps at 1.
        ("", CommConfig(min_ctas=1, max_ctas=1), 1),
        # MLPerf v5.0's rows: NCCL_MIN_NCHANNELS=4 is applied after the cap: 4.
        ("NCCL_MIN_NCHANNELS=4", CommConfig(min_ctas=1, max_ctas=1), 4),
        ("NCCL_MIN_NCHANNELS=4", CommConfig(min_ctas=1, max_ctas=8), 8),
        # MLPerf v5.1's rows: NCCL_MIN_CTAS=16 / NCCL_MAX_CTAS=32 replace the config's
        # (envConfigOverride, init.cc:1528-1542 at v2.27.7-1): min(16, 32) -> max(16, 16).
        ("NCCL_MIN_CTAS=16 NCCL_MAX_CTAS=32", CommConfig(min_ctas=1, max_ctas=1), 16),
        # Only the minimum replaced, above the config's maximum: NCCL lowers the minimum to
        # the maximum (init.cc:1590-1593 at v2.27.7-1): 1.
        ("NCCL_MIN_CTAS=16", CommConfig(min_ctas=1, max_ctas=1), 1),
        # A config's minimum above the channels found: copied up to it.
        ("", CommConfig(min_ctas=24, max_ctas=32), 24),
        # No config: NCCL's defaults (1, MAXCHANNELS) leave the 16.
        ("", None, 16),
    ],
)
def test_a_communicators_channels_as_nccl_bounds_them(env, config, expected):
    assert parse_nccl_env(env).with_communicator(config).channels(16) == expected


def test_nvls_channels_follow_the_ctas_only():
    """transport/nvls.cc:198 at v2.27.7-1: nvlsChannels = max(minCTAs, min(maxCTAs, n));
    NCCL_MIN_NCHANNELS does not enter."""
    env = parse_nccl_env("NCCL_MIN_NCHANNELS=4").with_communicator(CommConfig(max_ctas=2))
    assert env.nvls_channels(16) == 2
    assert env.channels(16) == 4


def test_a_communicators_system_on_a_real_topology():
    """The bound reaches NCCL's view of a communicator (NcclPolicy.system): a 2-GPU
    B200 group's channels capped at 1, and the env's MAX_CTAS winning over the config."""
    from simulator.collective.policy import NcclPolicy

    graph = load_topology("hgx-b200", 1)
    default = NcclPolicy().system(graph).channels
    assert default > 8
    capped = NcclPolicy(env=parse_nccl_env("").with_communicator(CommConfig(max_ctas=1)))
    assert capped.system(graph).channels == 1
    env = parse_nccl_env("NCCL_MAX_CTAS=8").with_communicator(CommConfig(max_ctas=1))
    assert NcclPolicy(env=env).system(graph).channels == 8


def _two_rank_gather(nbytes: float):
    """One all-gather of ``nbytes`` on a 2-rank group the megatron generator would call
    a CP group (so the ``cp`` configuration applies to it)."""
    ops = [
        {"id": f"g{r}", "rank": r, "kind": "collective", "op": "all_gather",
         "group": "cp.s0.d0.t0", "bytes": nbytes}
        for r in range(2)
    ]  # fmt: skip
    return parse_workload(
        {"format": "ccsim-workload/1", "ranks": 2,
         "groups": {"cp.s0.d0.t0": {"ranks": [0, 1]}}, "ops": ops}
    )  # fmt: skip


def test_a_gather_on_a_one_cta_communicator_is_one_channels_closed_form():
    """max_ctas 1 on the cp group: the call runs on 1 channel (recorded), exactly as the
    run-wide NCCL_MAX_CTAS=1 runs it (the existing path), and a 2-rank ring all-gather
    of 8 GiB takes the bytes each rank sends, S/2, over its 900 GB/s NVLink at the
    preset's NVLink efficiency (topologies/hgx-b200.yaml; Simple's factor 1.0) within 1%
    (the rest: NCCL's base and hop latencies). ccsim gives one channel the whole link:
    it has no per-CTA copy rate for Simple (README, issue 31)."""
    from simulator.library.protocol import calibration_of

    graph = load_topology("hgx-b200", 1)
    nvlink = 900e9 * calibration_of(graph).efficiency["nvlink"]
    ring = "NCCL_ALGO=Ring NCCL_PROTO=Simple"
    size = 8 * GiB
    per = WorkloadReplay(
        _two_rank_gather(size), graph, nccl=ring, communicators={"cp": CommConfig(max_ctas=1)}
    ).run()
    whole = WorkloadReplay(_two_rank_gather(size), graph, nccl=ring + " NCCL_MAX_CTAS=1").run()
    assert per.choices[0]["channels"] == 1 and per.choices[0]["nccl_config"] == "max_ctas=1"
    assert breakdown(per).step_s == breakdown(whole).step_s
    assert breakdown(per).step_s == pytest.approx(size / 2 / nvlink, rel=0.01)


def test_default_configurations_change_nothing():
    """A configuration that sets nothing on every group the megatron generator builds
    runs the new path (a policy and a communicator per configuration) and must give the
    old path's step and choices to the bit."""
    graph = load_topology("hgx-b200", 1)
    workload = megatron(model="llama3-8b", tp=2, pp=1, cp=2, dp=2, micro_batch=1, global_batch=2)
    plain = WorkloadReplay(workload, graph).run()
    names = {name for _, name in GENERATOR_GROUPS}
    configured = WorkloadReplay(
        workload, graph, communicators={name: CommConfig() for name in names}
    ).run()
    assert breakdown(configured).step_s == breakdown(plain).step_s
    strip = [None if c is None else {k: v for k, v in c.items() if k != "nccl_config"}
             for c in configured.choices]  # fmt: skip
    assert strip == plain.choices


def test_the_generators_groups_have_megatrons_names():
    """Every group the megatron generator builds maps to one of Megatron-Core's process
    groups (a name the generator adds without a mapping would silently escape the
    configuration)."""
    workload = megatron(
        model="llama3-8b", tp=2, pp=2, cp=2, dp=2, micro_batch=1, global_batch=8,
        precision="fp8",
    )  # fmt: skip
    names = {group: communicator_of(group) for group in workload.groups}
    assert None not in names.values(), names
    assert {"tp", "cp", "dp_cp"} <= set(names.values())


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (["cpx:max_ctas=1"], ["'cpx'", "dp_cp"]),
        (["cp:max_cta=1"], ["'max_cta'", "max_ctas"]),
        (["cp:max_ctas=0"], ["max_ctas", "1 to 64"]),
        (["cp:min_ctas=4,max_ctas=2"], ["min_ctas 4", "max_ctas 2"]),
        (["cp:net_name=socket"], ["socket"]),
        (["cp"], ["GROUP:KEY=VALUE"]),
    ],
)
def test_bad_settings_are_one_line_with_exit_code_2(items, words, capsys, tmp_path):
    spec = tmp_path / "cp.yaml"
    spec.write_text(
        "format: ccsim-workload-spec/1\ngenerator: megatron\nmodel: llama3-8b\n"
        "tp: 1\npp: 1\ncp: 2\ndp: 1\nmicro_batch: 1\nglobal_batch: 1\n"
    )
    argv = ["run", str(spec), "--topology", "hgx-b200"]
    for item in items:
        argv += ["--nccl-comm", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    for word in words:
        assert word in err[0]


def test_a_trace_whose_groups_are_not_megatrons_is_refused():
    graph = load_topology("hgx-b200", 1)
    workload = parse_workload(
        {"format": "ccsim-workload/1", "ranks": 2, "groups": {"g": {"ranks": [0, 1]}},
         "ops": [{"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce",
                  "group": "g", "bytes": 1024} for r in range(2)]}
    )  # fmt: skip
    with pytest.raises(CcsimError, match="megatron generator's groups"):
        WorkloadReplay(workload, graph, communicators={"cp": CommConfig(max_ctas=1)})


def test_the_yaml_file_and_the_items_agree(tmp_path):
    """Megatron-Core's YAML (the layout of MLPerf's conf/nccl/custom_communicator_cta.yaml)
    read from a file gives the same configurations as the same keys on the command line."""
    path = tmp_path / "comm.yaml"
    path.write_text("cp:\n  cga_cluster_size: 1\n  min_ctas: 1\n  max_ctas: 1\n"
                    "dp_cp:\n  max_ctas: 8\n")  # fmt: skip
    items = ["cp:cga_cluster_size=1,min_ctas=1,max_ctas=1", "dp_cp:max_ctas=8"]
    assert communicators_from_items([str(path)]) == communicators_from_items(items)


def test_a_rows_bad_field_names_the_row_the_group_and_the_valid_keys(tmp_path):
    rows = [{"id": "r1", "nccl_communicators": {"cp": {"max_cta": 1}}}]
    path = tmp_path / "runs.yaml"
    path.write_text(json.dumps(rows))
    with pytest.raises(CcsimError) as error:
        load_runs(path)
    message = str(error.value)
    assert "run r1" in message and "group cp" in message and "max_ctas" in message
    rows = [{"id": "r2", "nccl": {"NCCL_ALGO": "Ring"}}]
    path.write_text(json.dumps(rows))
    with pytest.raises(CcsimError, match="run r2: nccl: NCCL_ALGO is not a channel bound"):
        load_runs(path)


def test_parse_comm_config_refuses_what_nccl_refuses():
    """parseCommConfig (init.cc:1686-1693 at v2.27.7-1): minCTAs, maxCTAs at least 1 and
    minCTAs not above maxCTAs."""
    with pytest.raises(CcsimError, match="min_ctas 9 is above max_ctas 8"):
        parse_comm_config({"min_ctas": 9, "max_ctas": 8}, "x")
    with pytest.raises(CcsimError, match="from 1 to 64"):
        parse_comm_config({"max_ctas": True}, "x")
    assert parse_communicators(None, "x") == {}


# --- the published rows -----------------------------------------------------------------

RUNS, _ = load_runs(PUBLISHED)


def test_every_row_whose_config_sets_nccl_cfg_path_carries_it():
    """The MLPerf v5.0 / v5.1 rows whose configs export NCCL_CFG_PATH (their sources
    were read for it, simulator/data/training/published-runs.yaml's nccl_source) carry
    the YAML; the v5.1 ones whose config_common.sh exports NCCL_MIN_CTAS=16 /
    NCCL_MAX_CTAS=32 (lines 85-86) carry those, Cisco's and v5.0's do not."""
    set_ = [run for run in RUNS if run.communicators]
    assert len(set_) == 30
    for run in set_:
        assert run.communicators["cp"] == CommConfig(1, 1, 1)
        assert run.communicators["dp_cp"] == CommConfig(1, 8, 4)
        overridden = run.id.startswith("mlperf-v5.1") and "-h100-" not in run.id
        assert ("NCCL_MAX_CTAS=32" in run.nccl) == overridden, run.id
        assert "NCCL_MIN_NCHANNELS=4" in run.nccl


@pytest.mark.parametrize(
    ("rid", "cp_channels"),
    [
        # v5.1: the env replaces the file's cap: 16 to 32 channels, so the found 32.
        ("mlperf-v5.1-llama31-8b-b200-fp8-32", 32),
        # v5.0: the file's cap of 1 raised to NCCL_MIN_NCHANNELS=4.
        ("mlperf-v5.0-llama31-405b-h100-fp8-512", 4),
    ],
)
def test_the_rows_cp_communicator_resolves_as_nccl_does(rid, cp_channels):
    run = next(r for r in RUNS if r.id == rid)
    env = parse_nccl_env(run.nccl).with_communicator(run.communicators["cp"])
    assert env.channels(32) == cp_channels


@pytest.mark.parametrize("index", range(0, 300, 30))
def test_rows_without_the_field_build_as_before(index):
    """Rows without the fields: no NCCL settings handed down, and the generator's
    options hold nothing new (the step they build is the one built before)."""
    plain = [run for run in RUNS if not run.communicators and not run.nccl]
    run = plain[index % len(plain)]
    options = generator_options(run)
    assert not any("nccl" in key or "communicator" in key for key in options)
    assert dataclasses.replace(run, nccl="", communicators={}) == run
