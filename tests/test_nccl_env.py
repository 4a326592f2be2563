"""NCCL's environment settings (simulator/library/nccl_env.py): NCCL's own syntax
(parseList, graph/tuning.cc:35-135 at v2.30.7), the policy that honours them, and the
commands that take --nccl."""

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.collective.compare import compare
from simulator.collective.policy import NcclPolicy, library_policy
from simulator.errors import CcsimError
from simulator.library.nccl_env import SUPPORTED, parse_nccl_env
from simulator.sweep import load_spec
from simulator.topology import load_topology
from simulator.validate import log_case
from simulator.validate.nccl_tests import run_case

GiB = 2**30
LOG = Path(__file__).parent / "data" / "nccl-tests" / "oci-a100-2n-all_reduce.log"


@pytest.fixture(scope="module")
def h100():
    return load_topology("dgx-h100")


@pytest.fixture(scope="module")
def h100x2():
    return load_topology("dgx-h100", 2)


# -- parsing -------------------------------------------------------------------------


def test_a_comma_token_without_equals_continues_the_previous_list():
    env = parse_nccl_env("NCCL_ALGO=Ring,Tree,NCCL_PROTO=Simple")
    assert env.settings == (("NCCL_ALGO", "Ring,Tree"), ("NCCL_PROTO", "Simple"))
    assert env.algorithms_for("all_reduce") == ("Tree", "Ring")  # NCCL's order
    assert env.protocols_for("all_gather") == ("Simple",)


def test_repeated_flags_spaces_and_mappings_read_alike():
    text = "NCCL_PROTO=^LL128 NCCL_MAX_CTAS=8"
    assert parse_nccl_env(["NCCL_PROTO=^LL128", "NCCL_MAX_CTAS=8"]).text == text
    assert parse_nccl_env(text).text == text
    assert parse_nccl_env({"NCCL_MAX_CTAS": 8, "NCCL_PROTO": "^LL128"}).text == text
    assert parse_nccl_env(text) == parse_nccl_env(parse_nccl_env(text).text)  # round trip


def test_names_are_case_insensitive_and_caret_excludes():
    """strcasecmp on names; '^' enables every name but the listed ones."""
    env = parse_nccl_env("NCCL_ALGO=nvlstree,RING,NCCL_PROTO=^ll,LL128")
    assert env.algorithms_for("all_reduce") == ("Ring", "NVLSTree")
    assert env.protocols_for("all_reduce") == ("Simple",)
    everything_but_tree = parse_nccl_env("NCCL_ALGO=^tree").algorithms_for("all_reduce")
    assert everything_but_tree == ("Ring", "NVLS", "NVLSTree", "PAT")


def test_per_function_entries_override_the_first_list():
    """The examples of tuning.cc's own comment (lines 43-53): 'LL,Simple;allreduce:^LL'
    enables LL and Simple everywhere but everything except LL for allreduce;
    '^LL128;allreduce:LL128' everything but LL128, and only LL128 for allreduce."""
    env = parse_nccl_env("NCCL_PROTO=LL,Simple;allreduce:^LL")
    assert env.protocols_for("broadcast") == ("LL", "Simple")
    assert env.protocols_for("all_reduce") == ("LL128", "Simple")
    env = parse_nccl_env("NCCL_PROTO=^LL128;allreduce:LL128")
    assert env.protocols_for("reduce_scatter") == ("LL", "Simple")
    assert env.protocols_for("all_reduce") == ("LL128",)
    env = parse_nccl_env("NCCL_ALGO=allreduce:tree,ring;allgather:ring")
    assert env.algorithms_for("all_reduce") == ("Tree", "Ring")
    assert env.algorithms_for("all_gather") == ("Ring",)
    assert env.algorithms_for("broadcast") == ("Tree", "Ring", "NVLS", "NVLSTree", "PAT")
    assert env.algorithms_for("all_to_all") is None  # grouped send/receive, no tuner


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("NCCL_ALGO=Rign", ["NCCL_ALGO", "'Rign'", "Tree, Ring, CollNetDirect", "PAT"]),
        ("NCCL_PROTO=LL256", ["NCCL_PROTO", "'LL256'", "LL, LL128, Simple"]),
        ("NCCL_ALGO=ring;tree", ["NCCL_ALGO", "function prefix", "AllReduce"]),
        ("NCCL_ALGO=ring;allgathr:ring", ["NCCL_ALGO", "'allgathr'", "AllGather"]),
        ("NCCL_FOO=1", ["'NCCL_FOO'", ", ".join(SUPPORTED)]),
        ("Ring", ["NAME=VALUE", "NCCL_ALGO"]),
        ("NCCL_ALGO=", ["NCCL_ALGO is empty"]),
        ("NCCL_ALGO=Ring,NCCL_ALGO=Tree", ["NCCL_ALGO given twice"]),
        ("NCCL_PROTO=^LL,LL128,Simple", ["NCCL_PROTO", "no protocol", "LL, LL128, Simple"]),
        ("NCCL_ALGO=CollNetDirect", ["NCCL_ALGO", "no algorithm", "Tree, Ring, NVLS"]),
        ("NCCL_NVLS_ENABLE=yes", ["NCCL_NVLS_ENABLE", "0, 1, 2"]),
        ("NCCL_MAX_NCHANNELS=65", ["NCCL_MAX_NCHANNELS", "1 to 64"]),
        ("NCCL_MIN_CTAS=0", ["NCCL_MIN_CTAS", "1 to 64"]),
        ("NCCL_MIN_NCHANNELS=two", ["NCCL_MIN_NCHANNELS", "1 to 64"]),
        ("NCCL_MIN_NCHANNELS=16,NCCL_MAX_NCHANNELS=8", ["NCCL_MIN_NCHANNELS=16", "MAX"]),
        ("NCCL_MIN_CTAS=16,NCCL_MAX_NCHANNELS=8", ["NCCL_MIN_CTAS=16", "NCCL_MAX_NCHANNELS"]),
        ("NCCL_COLLNET_ENABLE=2", ["NCCL_COLLNET_ENABLE", "0, 1"]),
        ("NCCL_PXN_DISABLE=1", ["NCCL_PXN_DISABLE", "not modelled", "valid: 0"]),
    ],
)
def test_each_bad_setting_is_one_line_naming_the_variable_and_valid_values(text, needles):
    with pytest.raises(CcsimError) as error:
        parse_nccl_env(text)
    message = str(error.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_settings_that_are_nccls_defaults_are_accepted():
    env = parse_nccl_env("NCCL_COLLNET_ENABLE=0,NCCL_PXN_DISABLE=0,NCCL_NVLS_ENABLE=2")
    assert env.algorithms_for("all_reduce") is None and env.nvls


# -- the policy ----------------------------------------------------------------------


def test_nccl_algo_ring_forces_ring_where_nccl_picks_nvls(h100):
    """NCCL's default for a 1 GiB all-reduce on one DGX H100 is NVLS (the policy's
    choice, checked here first); NCCL_ALGO=Ring leaves it the ring."""
    assert NcclPolicy().choose(h100, "all_reduce", GiB).algorithm == "NVLS"
    assert NcclPolicy(env="NCCL_ALGO=Ring").choose(h100, "all_reduce", GiB).algorithm == "Ring"


def test_nvls_disabled_moves_the_large_all_reduce_off_nvls(h100):
    """NCCL_NVLS_ENABLE=0: no NVLink SHARP (nvls.cc:262), so neither NVLS nor NVLSTree."""
    choice = NcclPolicy(env="NCCL_NVLS_ENABLE=0").choose(h100, "all_reduce", GiB)
    assert choice.algorithm not in ("NVLS", "NVLSTree")
    assert set(algorithm for algorithm, _ in choice.table) <= {"Tree", "Ring", "PAT"}


def test_excluding_ll_and_ll128_leaves_simple_at_small_sizes(h100):
    """At 1 KiB NCCL picks LL by default; ^LL,LL128 leaves only Simple."""
    assert NcclPolicy().choose(h100, "all_reduce", 1024).protocol == "LL"
    policy = NcclPolicy(env="NCCL_PROTO=^LL,LL128")
    assert {policy.choose(h100, "all_reduce", size).protocol for size in (8, 1024)} == {"Simple"}


def test_several_protocols_may_be_forced_at_once(h100):
    policy = NcclPolicy(protocol=["LL128", "Simple"])
    assert policy.choose(h100, "all_reduce", 1024).protocol in ("LL128", "Simple")
    assert {p for _, p in policy.choose(h100, "all_reduce", 1024).table} == {"LL128", "Simple"}


def test_channel_bounds_clamp_the_channels_nccl_runs(h100, h100x2):
    """Two DGX H100s: NCCL runs 16 channels (ring search 8 x2, connect.cc:460); a 1 GiB
    ring all-reduce uses all 16. MIN_NCHANNELS=24 duplicates them to 24 and
    MAX_NCHANNELS=4 keeps 4 (connect.cc:501-505). NVLS's 16 channels on one server obey
    MIN/MAX_CTAS only (nvls.cc:235)."""

    def channels(graph, env, algo="Ring"):
        settings = f"NCCL_ALGO={algo}" + (f",{env}" if env else "")
        plan = NcclPolicy(env=settings).plan(
            NcclPolicy(env=settings).system(graph), "all_reduce", GiB
        )
        return plan.channels

    assert channels(h100x2, "") == 16
    assert channels(h100x2, "NCCL_MIN_NCHANNELS=24") == 24
    assert channels(h100x2, "NCCL_MAX_NCHANNELS=4") == 4
    assert channels(h100x2, "NCCL_MAX_CTAS=8,NCCL_MIN_NCHANNELS=2") == 8
    assert channels(h100, "", "NVLS") == 16
    assert channels(h100, "NCCL_MAX_CTAS=8", "NVLS") == 8
    assert channels(h100, "NCCL_MAX_NCHANNELS=8", "NVLS") == 16


def test_an_op_left_without_algorithm_is_refused_when_it_runs(h100):
    """NCCL runs PAT for all-gather and reduce-scatter only: with nothing else allowed,
    NCCL fails an all-reduce ("No algorithm/protocol available", enqueue.cc:2063)."""
    policy = NcclPolicy(env="NCCL_ALGO=PAT")
    with pytest.raises(CcsimError, match="no algorithm for all_reduce.*NCCL_ALGO=PAT"):
        policy.choose(h100, "all_reduce", GiB)


def test_proto_and_channels_must_agree_with_the_settings():
    with pytest.raises(CcsimError, match="--proto LL disagrees with NCCL_PROTO=Simple"):
        NcclPolicy(protocol="LL", env="NCCL_PROTO=Simple")
    with pytest.raises(CcsimError, match="--channels 8 disagrees with NCCL_MAX_CTAS=4"):
        NcclPolicy(channels=8, env="NCCL_MAX_CTAS=4")
    assert NcclPolicy(protocol="Simple", channels=4, env="NCCL_PROTO=^LL,NCCL_MAX_CTAS=4")


def test_hccl_refuses_nccl_settings():
    with pytest.raises(CcsimError, match="apply to NCCL; HCCL runs here"):
        library_policy("hccl", load_topology("ascend-910b"), nccl="NCCL_ALGO=Ring")


def test_compare_forced_runs_keep_the_users_protocol_but_not_their_algo(h100):
    """compare runs ring as NCCL forced to Ring: with NCCL_ALGO=Tree,NCCL_PROTO=Simple
    the forced ring still runs (forcing replaces NCCL_ALGO) and runs Simple."""
    env = "NCCL_ALGO=Tree,NCCL_PROTO=Simple"
    rows = compare(h100, "all_reduce", [1024], ["nccl", "ring"], nccl=env)
    by = {row["algorithm"]: row for row in rows}
    assert by["ring"]["model"] == "NCCL_ALGO=Ring"
    assert by["ring"]["protocol"] == by["nccl"]["protocol"] == "Simple"


# -- commands ------------------------------------------------------------------------


def test_collective_json_rows_show_protocol_channels_chunks_and_the_settings(capsys):
    argv = ["collective", "all_gather", "--topology", "hgx-b200", "--nodes", "2"]
    argv += ["--nccl", "NCCL_PROTO=Simple", "--sizes", "1M,64M", "--format", "json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["size_bytes"] for row in rows] == [2**20, 64 * 2**20]
    for row in rows:
        assert row["protocol"] == "Simple"
        assert row["nccl_env"] == "NCCL_PROTO=Simple"
        assert row["channels"] >= 1 and row["chunks"] >= 1
        # The ring: PAT needs one GPU a server, NVLS across servers needs CollNet.
        assert row["library_algorithm"] == "Ring"


def test_the_table_header_names_the_settings_and_repeated_flags_merge(capsys):
    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--sizes", "1G"]
    assert main([*argv, "--nccl", "NCCL_ALGO=Ring", "--nccl", "NCCL_MIN_CTAS=32"]) == 0
    out = capsys.readouterr().out
    assert "# nccl: NCCL_ALGO=Ring NCCL_MIN_CTAS=32\n" in out
    assert "Ring Simple channels 32" in out  # 24 channels raised to 32 (connect.cc:505)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["collective", "all_reduce", "--nccl", "NCCL_ALGO=Rign"], "unknown algorithm 'Rign'"),
        (["collective", "all_reduce", "--nccl", "NCCL_X=1"], "supported: NCCL_ALGO"),
        (["collective", "all_reduce", "--algo", "ring", "--nccl", "NCCL_ALGO=Ring"], "--algo"),
        (["collective", "all_reduce", "--proto", "LL", "--nccl", "NCCL_PROTO=Simple"], "--proto"),
        (["collective", "all_reduce", "--channels", "8", "--nccl", "NCCL_MAX_CTAS=4"], "8"),
        (["collective", "all_reduce", "--nccl", "NCCL_COLLNET_ENABLE=on"], "NCCL_COLLNET_ENABLE"),
        (["compare", "all_reduce", "--ideal", "--nccl", "NCCL_ALGO=Ring"], "--ideal"),
        (["run", "ddp-gpt1.5b-16", "--algo", "ring", "--nccl", "NCCL_ALGO=Ring"], "--algo"),
    ],
)
def test_bad_settings_on_the_command_line_exit_2_on_one_line(argv, needle, capsys):
    extra = [] if argv[0] == "run" else ["--sizes", "1K"]
    assert main([*argv, "--topology", "dgx-h100", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_compare_and_run_carry_the_settings(capsys):
    argv = ["compare", "all_reduce", "--topology", "dgx-h100", "--sizes", "1K", "--format"]
    assert main([*argv, "json", "--nccl", "NCCL_NVLS_ENABLE=0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert "nvls" not in {row["algorithm"] for row in rows}  # not in NCCL's line-up now
    assert {row["nccl_env"] for row in rows} == {"NCCL_NVLS_ENABLE=0"}


def test_a_sweep_varies_the_settings_as_an_axis():
    spec = load_spec(
        {
            "scenario": {"collective": "all_reduce", "size": "1K", "topology": "dgx-h100"},
            "axes": {"nccl": ["none", "NCCL_ALGO=Ring", {"NCCL_PROTO": "Simple"}]},
        }
    )
    assert [p.params.get("nccl") for p in spec.points] == [
        None,
        "NCCL_ALGO=Ring",
        "NCCL_PROTO=Simple",
    ]
    plain = {"scenario": {"collective": "all_reduce", "size": "1K"}, "axes": {"nodes": [1]}}
    assert "nccl" not in load_spec(plain).points[0].params  # old specs keep their keys
    forced = load_spec(plain, nccl=["NCCL_PROTO=Simple", "NCCL_ALGO=Ring"])
    assert forced.points[0].params["nccl"] == "NCCL_ALGO=Ring NCCL_PROTO=Simple"
    with pytest.raises(CcsimError, match="no nccl axis"):
        load_spec(
            {"scenario": {"collective": "all_reduce", "size": "1K"}, "axes": {"nccl": ["none"]}},
            nccl=["NCCL_ALGO=Ring"],
        )


def test_validate_applies_the_settings_a_log_reports(tmp_path):
    """NCCL prints 'NCCL INFO NCCL_ALGO set by environment to Ring' (tuning.cc:460) and
    'NCCL_MIN_NCHANNELS set by environment to 24.' (param.cc:100); the case runs under
    them. Settings that do not change NCCL's choice are named and ignored."""
    lines = LOG.read_text().splitlines()
    rows = [line for line in lines if line.strip() and line.split()[0].isdigit()]
    other = [line for line in lines if line not in rows]
    prefix = "nccl-allreduce-job0-mpiworker-0:43:43 [0] NCCL INFO "
    info = [
        prefix + "NCCL_ALGO set by environment to Ring",
        prefix + "NCCL_PROTO set by environment to Simple",
        prefix + "NCCL_MIN_NCHANNELS set by environment to 24.",
        prefix + "NCCL_SOCKET_IFNAME set by environment to eth0",
    ]
    header = max(i for i, line in enumerate(other) if "(B)" in line)
    log = tmp_path / "env.log"
    log.write_text("\n".join(info + other[: header + 1] + [rows[17]] + other[header + 1 :]))
    notes = []
    case = log_case(log, topology="dgx-a100", notify=notes.append)
    assert case.settings["nccl"] == "NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=24"
    assert "ignored: NCCL_SOCKET_IFNAME" in notes[0]
    result = run_case(case)
    # The row is 1 MiB: 24 channels share 2 MiB of traffic, 87,381 bytes each, which NCCL
    # deals out in whole cells of 32 KiB traffic (16 KiB before 2.29), 3 (6) a channel:
    # 64 (128) cells fill 22 channels (enqueue.cc:575-700 at v2.30.7-1).
    assert (result.algorithms, result.protocols, result.channels) == (["Ring"], ["Simple"], [22])


def test_nccl_version_picks_that_versions_send_receive_rules(capsys):
    """2 MiB per rank on 8 H100 is 256 KiB per peer: NCCL 2.28 sends it with LL (up to
    16 KiB x 32 channels per peer), 2.29 and later with Simple (16 KiB x the channels one
    such message uses): src/enqueue.cc of each version, see simulator/library/nccl_p2p.py."""
    rows = {}
    for version in ("2.28.7", None):
        extra = ["--nccl-version", version] if version else []
        code = main(["collective", "all_to_all", "--topology", "dgx-h100", "--sizes", "2M",
                     "--format", "json", *extra])  # fmt: skip
        assert code == 0
        rows[version] = json.loads(capsys.readouterr().out)[0]
    assert rows["2.28.7"]["protocol"] == "LL" and rows[None]["protocol"] == "Simple"
    assert rows["2.28.7"]["nccl_env"] == "version 2.28.7" and "nccl_env" not in rows[None]


def test_a_malformed_nccl_version_is_one_line_and_exit_2(capsys):
    code = main(["collective", "all_to_all", "--topology", "dgx-h100", "--sizes", "2M",
                 "--nccl-version", "two"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "--nccl-version" in err and "2.28.7" in err
