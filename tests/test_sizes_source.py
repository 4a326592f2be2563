"""Every message size error names where the size came from: the command-line option
(``--sizes``), the sweep spec's file and field, or a validation table's file, line and
column. Each case is one line on stderr, exit 2, naming that source first."""

from __future__ import annotations

import shutil

import pytest

from simulator.cli.main import main
from simulator.errors import CcsimError
from simulator.units import parse_sizes
from simulator.validate import BUNDLED, load_case


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("command", ["collective", "compare"])
@pytest.mark.parametrize(
    ("sizes", "said"),
    [
        ("1Mb", "invalid size '1Mb': 'Mb' could be bits or bytes"),
        ("3", "'3' bytes is less than one 4-byte element"),
        ("1e30", "more than 1 TiB"),
        ("1M:1K", "the maximum is below the minimum"),
        ("", "no sizes given"),
    ],
)
def test_the_option_is_named_first(command, sizes, said, capsys):
    assert main([command, "all_reduce", f"--sizes={sizes}"]) == 2
    err = one_line(capsys)
    assert err.startswith("ccsim: error: --sizes: ") and said in err


def test_python_callers_name_their_own_source():
    with pytest.raises(CcsimError, match=r"^run\.yaml: sizes: invalid size '1Mb'"):
        parse_sizes("1Mb", source="run.yaml: sizes")
    with pytest.raises(CcsimError, match=r"^invalid size '1Mb'"):  # no source: as before
        parse_sizes("1Mb")


@pytest.mark.parametrize(
    ("scenario", "axes", "field"),
    [
        ("{collective: all_reduce}", "{size: [1M, 1Mb]}", "axes.size[1]"),
        ("{collective: all_reduce}", '{size: "1Mb:1G"}', "axes.size"),
        ("{collective: all_reduce, size: 1Mb}", "{nodes: [1, 2]}", "scenario.size"),
        ("{collective: all_reduce}", "{size: [0]}", "axes.size[0]"),
    ],
)
def test_a_sweep_spec_names_its_file_and_field(tmp_path, capsys, scenario, axes, field):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"scenario: {scenario}\naxes: {axes}\n")
    out = tmp_path / "r.csv"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 2
    err = one_line(capsys)
    assert f"ccsim: error: {spec}: {field}: " in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("cell", "said"),
    [
        ("16x", "'16x' is not a whole number of bytes"),
        ("-16", "-16 is not a size from 1 byte to 1 TiB"),
        ("2199023255553", "is not a size from 1 byte to 1 TiB"),  # 2 TiB + 1
    ],
)
def test_a_validation_table_names_its_file_line_and_column(tmp_path, cell, said):
    name = "A100-2N-AR-default-roce"
    for suffix in (".yaml", ".csv"):
        shutil.copy(BUNDLED / f"{name}{suffix}", tmp_path)
    table = tmp_path / f"{name}.csv"
    lines = table.read_text().splitlines()
    first = lines[2].split(",", 1)  # line 3 of the file: the second size
    lines[2] = f"{cell},{first[1]}"
    table.write_text("\n".join(lines) + "\n")
    with pytest.raises(CcsimError, match=f"^{name}.csv:3: bytes: ") as error:
        load_case(tmp_path / f"{name}.yaml")
    assert said in str(error.value)
