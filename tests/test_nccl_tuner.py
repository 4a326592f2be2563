"""NCCL's example tuner plugin (NCCL_TUNER_CONFIG_FILE): the CSV file is read as the
plugin reads it, its first matching rule whose pair NCCL allows picks the algorithm,
protocol and channels, and a call so tuned runs exactly as the same choice forced
through NCCL_ALGO / NCCL_PROTO and the channel count (an independent route to it)."""

import json

import pytest

from simulator import simulate_collective
from simulator.cli import main
from simulator.errors import CcsimError
from simulator.library.nccl import nccl_choice, nccl_system
from simulator.library.nccl_env import parse_nccl_env
from simulator.library.nccl_tuner import load_tuner_config, parse_tuner_config
from simulator.topology import load_topology


@pytest.fixture(scope="module")
def two_b200():
    graph = load_topology("hgx-b200", 2)
    return graph, nccl_system(graph)


def write(tmp_path, text: str):
    path = tmp_path / "tuner.conf"
    path.write_text(text)
    return path


def test_fields_comments_and_optional_columns_are_read_as_the_plugin_reads_them():
    config = parse_tuner_config(
        "# header\n\n"
        "allreduce,0,65536,tree,simple,2,1,-1,-1,1\n"
        "  allgather , 1 , 99 , NVLS_TREE , LL128 , -1 , 2 , 16\n"
        "reducescatter,131073,4294967295,ring,simple,-1,-1,-1,2\n"
    )
    first, second, third = config.rules
    assert (first.op, first.algorithm, first.protocol, first.channels) == (
        "all_reduce", "Tree", "Simple", 2,
    )  # fmt: skip
    assert (first.nodes, first.ranks, first.pipe_ops, first.registered, first.line) == (
        1, -1, -1, 1, 3,
    )  # fmt: skip
    assert (second.op, second.algorithm, second.protocol, second.nodes, second.ranks) == (
        "all_gather", "NVLSTree", "LL128", 2, 16,
    )  # fmt: skip
    assert (second.pipe_ops, second.registered) == (-1, -1)  # left out: any
    assert (third.op, third.pipe_ops, third.registered) == ("reduce_scatter", 2, -1)


@pytest.mark.parametrize(
    "line, needle",
    [
        ("allreduce,0,10,ring,simple,4,2", "7 fields; a rule has 8 to 10"),
        ("allreduce,0,10,ring,simple,4,2,-1,-1,-1,9", "11 fields"),
        ("alltoall,0,10,ring,simple,4,2,-1", "collective_type 'alltoall' is not one of"),
        ("allreduce,0,10,rign,simple,4,2,-1", "algorithm 'rign' is not one of"),
        ("allreduce,0,10,ring,fast,4,2,-1", "protocol 'fast' is not one of"),
        ("allreduce,0,1e3,ring,simple,4,2,-1", "max_bytes '1e3': expected a whole number"),
        ("allreduce,-1,10,ring,simple,4,2,-1", "min_bytes '-1': expected a whole number, 0"),
        ("allreduce,10,9,ring,simple,4,2,-1", "max_bytes 9 is below min_bytes 10"),
        ("allreduce,0,10,ring,simple,0,2,-1", "channels 0: give a positive number"),
        ("allreduce,0,10,ring,simple,4,2,-1,-1,2", "regBuff 2: expected 0, 1 or -1"),
    ],
)
def test_a_bad_line_is_one_error_naming_the_file_line_and_field(tmp_path, line, needle):
    path = write(tmp_path, f"# ok\n{line}\n")
    with pytest.raises(CcsimError) as error:
        load_tuner_config(path)
    assert str(error.value).startswith(f"{path}:2: ")
    assert needle in str(error.value)


def test_a_missing_or_empty_file_is_refused_not_skipped(tmp_path):
    with pytest.raises(CcsimError, match="cannot read the tuner file"):
        parse_nccl_env(f"NCCL_TUNER_CONFIG_FILE={tmp_path / 'absent.conf'}")
    with pytest.raises(CcsimError, match="no tuner rules"):
        load_tuner_config(write(tmp_path, "# nothing\n\n"))


def test_the_first_matching_rule_with_an_allowed_pair_wins():
    config = parse_tuner_config(
        "allreduce,0,1023,tree,ll,-1,-1,-1\n"  # 1: sizes 0..1023 only
        "allreduce,0,4096,nvls,simple,-1,-1,-1\n"  # 2: NVLS, where NCCL allows it
        "allreduce,0,4096,ring,ll,-1,3,-1\n"  # 3: three nodes only
        "allreduce,0,4096,ring,ll128,-1,-1,16,2\n"  # 4: two pipelined ops: never ccsim's
        "allreduce,0,4096,ring,ll128,-1,-1,16,-1,1\n"  # 5: registered buffers: never
        "allreduce,0,4096,ring,simple,-1,2,16\n"  # 6
    )
    usable = {("Tree", "LL"), ("Ring", "LL"), ("Ring", "LL128"), ("Ring", "Simple")}
    assert config.rule_for("all_reduce", 1023, 2, 16, usable).line == 1  # bounds inclusive
    assert config.rule_for("all_reduce", 1024, 2, 16, usable).line == 6
    assert config.rule_for("all_reduce", 1024, 2, 16, usable | {("NVLS", "Simple")}).line == 2
    assert config.rule_for("all_reduce", 1024, 3, 16, usable).line == 3
    assert config.rule_for("all_reduce", 4096, 2, 8, usable) is None  # nRanks 16 only
    assert config.rule_for("all_reduce", 4097, 2, 16, usable) is None
    assert config.rule_for("all_gather", 1024, 2, 16, usable) is None


def test_a_tuned_choice_is_nccls_choice_forced_to_that_pair(two_b200):
    """A rule with channels -1 gives what NCCL_ALGO / NCCL_PROTO forcing the same pair
    gives: algorithm, protocol, channels, threads and predicted time."""
    _, system = two_b200
    config = parse_tuner_config("allgather,0,4294967295,ring,ll128,-1,-1,-1")
    for size in (2**16, 2**22, 2**28):
        tuned = nccl_choice(system, "all_gather", size, tuner=config)
        forced = nccl_choice(system, "all_gather", size, algorithms=("Ring",), protocols=("LL128",))
        assert (tuned.algorithm, tuned.protocol, tuned.channels, tuned.threads) == (
            forced.algorithm, forced.protocol, forced.channels, forced.threads,
        )  # fmt: skip
        assert tuned.time_us == forced.time_us and tuned.tuner_line == 1
        assert nccl_choice(system, "all_gather", size).tuner_line == 0


def test_the_rules_channels_replace_nccls_within_the_communicators(two_b200):
    _, system = two_b200
    config = parse_tuner_config(
        "allgather,0,4294967295,ring,simple,4,-1,-1\nallreduce,0,4294967295,ring,simple,64,-1,-1"
    )
    big = 2**30
    assert nccl_choice(system, "all_gather", big, tuner=config).channels == 4
    # 64 asked for: the communicator has fewer, and NCCL caps at those.
    assert nccl_choice(system, "all_reduce", big, tuner=config).channels == system.channels < 64
    # A small call: only the channels that get 32 KiB of traffic each (64 KiB: 2).
    assert nccl_choice(system, "all_gather", 2**16, tuner=config).channels == 2


def test_ncclalgo_rules_out_a_pair_and_the_next_rule_applies(tmp_path, two_b200):
    graph, _ = two_b200
    path = write(tmp_path, "allgather,0,4294967295,ring,ll128,-1,-1,-1\n")
    env = parse_nccl_env(f"NCCL_TUNER_CONFIG_FILE={path} NCCL_PROTO=^LL128")
    from simulator.collective.policy import NcclPolicy

    choice = NcclPolicy(env=env).choose(graph, "all_gather", 2**26)
    assert choice.protocol != "LL128" and choice.tuner_line == 0


def test_a_tuned_call_runs_exactly_as_the_same_choice_forced(tmp_path):
    """End to end: the tuner's Ring/Simple on 4 channels for a 2-server all-gather runs
    in exactly the time of NCCL_ALGO=Ring NCCL_PROTO=Simple with 4 channels forced."""
    path = write(tmp_path, "allgather,0,4294967295,ring,simple,4,2,-1\n")
    for size in (2**20, 2**26):
        tuned = simulate_collective(
            "hgx-b200", "all_gather", size, "nccl", nodes=2, nccl=f"NCCL_TUNER_CONFIG_FILE={path}"
        )
        forced = simulate_collective(
            "hgx-b200", "all_gather", size, "nccl", nodes=2, channels=4,
            nccl="NCCL_ALGO=Ring NCCL_PROTO=Simple",
        )  # fmt: skip
        assert tuned.params["nccl_tuner_line"] == 1 and tuned.params["channels"] == 4
        assert tuned.time_s == forced.time_s
        # And the rule is for 2 servers: on 1 it does not apply.
        alone = simulate_collective(
            "hgx-b200", "all_gather", size, "nccl", nccl=f"NCCL_TUNER_CONFIG_FILE={path}"
        )
        assert "nccl_tuner_line" not in alone.params


def test_the_command_line_records_the_rule_and_refuses_a_bad_file(tmp_path, capsys):
    path = write(tmp_path, "allreduce,0,65536,ring,ll,2,-1,-1\n")
    argv = ["collective", "all_reduce", "--topology", "hgx-b200", "--sizes", "64K,64M"]
    assert main([*argv, "--nccl", f"NCCL_TUNER_CONFIG_FILE={path}", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["tuner_line"] for row in rows] == [1, 0]
    assert (rows[0]["library_algorithm"], rows[0]["protocol"], rows[0]["channels"]) == (
        "Ring", "LL", 2,
    )  # fmt: skip
    assert rows[0]["nccl_env"] == f"NCCL_TUNER_CONFIG_FILE={path}"
    bad = write(tmp_path, "allreduce,0,65536,ring,ll,2,-1\n")
    assert main([*argv, "--nccl", f"NCCL_TUNER_CONFIG_FILE={bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:1: 7 fields" in err
