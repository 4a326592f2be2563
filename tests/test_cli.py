"""The ccsim command line: output shape, errors, determinism, help."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main

CCSIM = [sys.executable, "-m", "simulator"]


def run(*args):
    return subprocess.run([*CCSIM, *args], capture_output=True, text=True, check=False)


def test_full_sweep_prints_thirty_rows_and_reaches_the_ring_bound(capsys):
    """8 B to 4 GiB is 30 sizes; on dgx-a100 (300 GB/s per GPU per direction through
    NVSwitch) the ring's busbw approaches 300 GB/s at 4 GiB."""
    argv = ["collective", "all_reduce", "--topology", "dgx-a100", "--sizes", "8:4G"]
    assert main([*argv, "--algo", "ring"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert len(lines) == 30
    size, count, _type, redop, _root, _time_us, algbw, busbw, *_ = lines[-1].split()
    assert int(size) == 4 * 2**30 and int(count) == 2**30 and redop == "sum"
    assert float(busbw) == pytest.approx(300.0, rel=1e-3)
    assert float(algbw) == pytest.approx(float(busbw) * 8 / 14, rel=1e-3)


def test_table_columns_sit_where_nccl_tests_puts_them(capsys):
    """Split on whitespace, a ccsim row has nccl-tests' fields in nccl-tests' places (a
    public all_reduce_perf log is the reference): size, count, type, redop, root, time,
    algbw, busbw, #wrong, then the in-place four, so awk '{print $8}' is busbw in both;
    the column header's names match too."""
    log = Path(__file__).parent / "data" / "nccl-tests" / "oci-a100-2n-all_reduce.log"
    lines = log.read_text().splitlines()
    header = next(line for line in lines if line.split()[1:3] == ["size", "count"])
    real = next(line for line in lines if line.strip().startswith("1048576 "))
    argv = ["collective", "all_reduce", "--topology", "dgx-a100", "--sizes", "1M,2M"]
    assert main(argv) == 0
    text = capsys.readouterr().out.splitlines()
    assert next(line for line in text if "size" in line).split() == header.split()
    rows = [line.split() for line in text if not line.startswith("#")]
    assert main([*argv, "--format", "json"]) == 0
    busbw = [row["busbw_GBps"] for row in json.loads(capsys.readouterr().out)]
    reference = real.split()
    for fields, expected in zip(rows, busbw, strict=True):
        assert len(fields) == len(reference) == 13
        assert fields[2:5] == reference[2:5] == ["float", "sum", "-1"]
        assert float(fields[7]) == pytest.approx(expected, abs=0.005)  # awk '{print $8}'
        assert fields[8] == fields[12] == "N/A" and reference[8] == "0"  # #wrong
        assert fields[5:8] == fields[9:12]  # in-place repeats out-of-place, as said
        assert all(float(value) >= 0 for value in fields[5:8] + reference[5:8])
    assert [int(row[0]) for row in rows] == [2**20, 2**21]
    assert [int(row[1]) for row in rows] == [2**18, 2**19]


def test_all_gather_count_is_per_rank(capsys):
    """nccl-tests prints one rank's element count for all-gather: 1 MiB / 4 B / 8."""
    assert main(["collective", "all_gather", "--sizes", "1M"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if not line.startswith("#"))
    assert row.split()[1] == str(2**20 // 4 // 8)


def test_json_has_exactly_the_documented_keys(capsys):
    assert main(["collective", "reduce_scatter", "--sizes", "1M,64M", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [sorted(row) for row in rows] == [
        sorted(
            ["op", "algorithm", "ranks", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps",
             "library_algorithm", "protocol", "channels", "chunks"]
        )
    ] * 2  # fmt: skip
    assert rows[1]["size_bytes"] == 64 * 2**20 and rows[1]["ranks"] == 8


def test_same_command_twice_is_byte_identical(tmp_path):
    outputs = []
    for name in ("a.json", "b.json"):
        done = run(
            "collective",
            "all_reduce",
            "--nodes",
            "2",
            "--channels",
            "4",
            "--chunks",
            "2",
            "--sizes",
            "1K:16M:8",
            "--format",
            "json",
            "--out",
            str(tmp_path / name),
        )
        assert done.returncode == 0, done.stderr
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1] and len(outputs[0]) > 100


def test_csv_output(capsys):
    assert main(["collective", "all_reduce", "--sizes", "1M", "--format", "csv"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header == (
        "op,algorithm,ranks,size_bytes,time_us,algbw_GBps,busbw_GBps,library_algorithm,protocol,"
        "channels,chunks"
    )
    assert row.startswith("all_reduce,ring,8,1048576,")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["collective", "all_to_none"], ["all_reduce", "all_gather", "reduce_scatter"]),
        (["collective", "all_reduce", "--algo", "magic"], ["ring"]),
        (["collective", "all_reduce", "--topology", "dgx-z900"], ["dgx-a100"]),
        (["collective", "all_reduce", "--sizes", "8:4Q"], ["unit"]),
        (["collective", "all_reduce", "--sizes", "0"], ["positive"]),
        (["collective", "all_reduce", "--sizes", "-8"], ["size"]),
        (["collective", "all_reduce", "--sizes", "64:8"], ["maximum"]),
        (["collective", "all_reduce", "--nodes", "0"], ["positive integer"]),
        (["collective", "all_reduce", "--reduce-bw", "400Gbs"], ["unit"]),
        (["bench", "--scenarios", "nope"], ["ring-8"]),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(args, names):
    done = run(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for name in names:
        assert name in lines[0]


@pytest.mark.parametrize("command", [[], ["collective"], ["topologies"], ["algorithms"], ["bench"]])
def test_help_explains_options_with_units(command):
    done = run(*command, "--help")
    assert done.returncode == 0
    text = done.stdout
    if command == ["collective"]:
        for unit in ("bytes", "microseconds", "GB/s", "count", "1500GB/s"):
            assert unit in text
        for option in (
            "--topology",
            "--nodes",
            "--algo",
            "--sizes",
            "--chunks",
            "--channels",
            "--format",
            "--out",
            "--reduce-bw",
        ):
            assert option in text
    if command == ["bench"]:
        assert "(s)" in text and "MiB" in text


def test_out_file_is_written_whole(tmp_path):
    target = tmp_path / "table.txt"
    assert main(["collective", "all_reduce", "--sizes", "1M", "--out", str(target)]) == 0
    assert target.read_text().startswith("# ccsim all_reduce")
    assert [p.name for p in tmp_path.iterdir()] == ["table.txt"]  # no temporary left over


def test_every_option_of_every_subcommand_has_help():
    """Each subcommand's options all carry a help text (which states the unit)."""
    import argparse

    from simulator.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {
        "collective",
        "compare",
        "run",
        "sweep",
        "size",
        "validate",
        "bench",
        "topology",
        "generate",
    } <= set(sub.choices)
    missing = []
    for name, command in sub.choices.items():
        parsers = [command]
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:
            parsers += list(action.choices.values())
        for each in parsers:
            for action in each._actions:
                if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                    continue
                if not (action.help or "").strip():
                    missing.append(f"{name}: {action.dest}")
    assert missing == []


def _no_constants(name):
    raise ValueError(f"not JSON: {name}")


def test_json_output_never_writes_infinity_or_nan(capsys):
    """JSON has no Infinity or NaN (json.dumps writes them unless allow_nan=False): a
    non-finite number is written as null, and every --format json parses strictly."""
    from simulator.viz.tables import to_json

    text = to_json([{"time_us": 0.0, "busbw_GBps": float("inf"), "x": [float("nan")]}])
    assert json.loads(text, parse_constant=_no_constants) == [
        {"time_us": 0.0, "busbw_GBps": None, "x": [None]}
    ]
    for argv in (
        ["collective", "all_reduce", "--sizes", "8,1M", "--format", "json"],
        ["compare", "all_gather", "--algos", "ring,direct", "--sizes", "1K", "--format", "json"],
    ):
        assert main(argv) == 0
        json.loads(capsys.readouterr().out, parse_constant=_no_constants)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["collective", "all_reduce", "--root", "3"], "--root applies to broadcast and reduce"),
        (["compare", "all_gather", "--root", "1"], "all_gather has no root rank"),
        (["generate", "ddp", "--bucket", "0", "--out", "{tmp}/t.json"], "bucket size"),
        (["generate", "ddp", "--bucket", "0B", "--out", "{tmp}/t.json"], "positive number"),
    ],
)
def test_options_that_would_be_ignored_are_refused(argv, needle, tmp_path, capsys):
    """--root with an operation that has no root, and a DDP bucket of 0 bytes, were
    silently ignored; each is now one line and exit 2, and nothing is written."""
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    assert main([*argv, "--sizes", "1K"] if argv[0] != "generate" else argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not list(tmp_path.iterdir())
    assert main(["collective", "broadcast", "--root", "3", "--sizes", "1K"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["collective", "all_reduce", "--sizes", "1M", "--timeline", "a.png", "--timeline", "b.svg"],
        ["collective", "all_reduce", "--sizes", "1M", "--trace", "a.json", "--trace", "b.json"],
    ],
)
def test_an_output_option_given_twice_is_refused(argv, tmp_path, monkeypatch, capsys):
    """Issue 33: the second --timeline silently replaced the first; nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and not list(tmp_path.iterdir())
    option, first, second = argv[-2], argv[-3], argv[-1]
    assert f"{option} given twice ({first} and {second}); give it once" in capsys.readouterr().err
