"""The one writer and the one loader (``simulator/files.py``), alone and through the CLI.

Regular files are replaced atomically with the mode an ordinary ``open`` gives (or the
mode they had); FIFOs, pipes and symbolic links are written in place and stay what they
are; a path that cannot be written fails before anything is simulated. Loading refuses
binary files, alias bombs and deep nesting with one line naming the file.
"""

from __future__ import annotations

import importlib
import os
import stat
import threading
import time

import pytest
import yaml

import simulator.cli.collective
import simulator.cli.workload
from simulator.cli import main
from simulator.errors import CcsimError
from simulator.files import (
    MAX_ALIASES,
    check_writable,
    load_data,
    parse_data,
    read_text,
    write_file,
    write_with,
)

COLLECTIVE = ["collective", "all_reduce", "--sizes", "1K"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def one_error_line(capsys) -> str:
    _out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccsim: error: "), err
    return lines[0]


# -- writing -----------------------------------------------------------------------------


def test_out_to_a_fifo_stays_a_fifo_and_gets_the_text(tmp_path, capsys):
    fifo = tmp_path / "table"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    assert main([*COLLECTIVE, "--out", str(fifo)]) == 0
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert "all_reduce" in received[0] and "1024" in received[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table"]  # no temporary left


def test_out_to_a_pipe_by_dev_fd_path(capsys):
    """What ``--out >(cat)`` passes: /dev/fd/N, the write end of a pipe."""
    read_end, write_end = os.pipe()
    try:
        assert main([*COLLECTIVE, "--format", "csv", "--out", f"/dev/fd/{write_end}"]) == 0
    finally:
        os.close(write_end)
    with os.fdopen(read_end) as stream:
        text = stream.read()
    assert text.startswith("op,") and "all_reduce" in text


def test_out_to_a_symlink_keeps_the_link_and_writes_its_target(tmp_path, capsys):
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target.name)
    assert main([*COLLECTIVE, "--format", "csv", "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == "real.csv"
    assert target.read_text().startswith("op,")


def test_a_new_file_gets_mode_from_the_umask(tmp_path, capsys, umask_022):
    out = tmp_path / "table.txt"
    assert main([*COLLECTIVE, "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_a_replaced_file_keeps_its_mode(tmp_path, capsys, umask_022):
    out = tmp_path / "table.txt"
    out.write_text("old")
    out.chmod(0o600)
    assert main([*COLLECTIVE, "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "all_reduce" in out.read_text()


def test_write_with_leaves_the_old_file_when_the_writer_fails(tmp_path):
    out = tmp_path / "figure.png"
    out.write_bytes(b"old")

    def half(stream):
        stream.write(b"new")
        raise RuntimeError("drawing failed")

    with pytest.raises(RuntimeError):
        write_with(out, half)
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_write_file_text_and_bytes(tmp_path):
    assert write_file(tmp_path / "a.txt", "é\n").read_bytes() == "é\n".encode()
    assert write_file(tmp_path / "b.bin", b"\0\1").read_bytes() == b"\0\1"


def test_check_writable_names_the_problem(tmp_path):
    with pytest.raises(CcsimError, match="is a folder; give a file name"):
        check_writable(tmp_path, option="--out")
    with pytest.raises(CcsimError, match=r"--out .*folder .* does not exist; create it"):
        check_writable(tmp_path / "no" / "x.csv", option="--out")
    (tmp_path / "file").write_text("")
    with pytest.raises(CcsimError, match="is not a folder"):
        check_writable(tmp_path / "file" / "x.csv")
    with pytest.raises(CcsimError, match="is a file; give a folder name"):
        check_writable(tmp_path / "file", option="--report", folder=True)
    assert check_writable(tmp_path / "new" / "deeper", folder=True) == tmp_path / "new" / "deeper"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(CcsimError, match="not writable"):
            check_writable(folder / "x.csv")
    finally:
        folder.chmod(0o700)


def _boom(*args, **kwargs):
    raise AssertionError("simulated before the output path was checked")


# Each command with an output in a missing folder, and the first step of its work.
BEFORE_SIMULATING = [
    ([*COLLECTIVE, "--out", "{missing}/t.txt"], "cli.collective.load_topology"),
    ([*COLLECTIVE, "--trace", "{missing}/t.json"], "cli.collective.load_topology"),
    ([*COLLECTIVE, "--timeline", "{missing}/t.png"], "cli.collective.load_topology"),
    (["compare", "all_reduce", "--out", "{missing}/c.txt"], "cli.compare.load_topology"),
    (["compare", "all_reduce", "--plot", "{missing}/c.png"], "cli.compare.load_topology"),
    (["compare", "all_reduce", "--trace", "{missing}/c.json"], "cli.compare.load_topology"),
    (["run", "ddp-gpt1.5b-16", "--out", "{missing}/r.txt"], "cli.workload.resolve_workload"),
    (["topology", "show", "dgx-a100", "--png", "{missing}/t.png"], "cli.topology.load_topology"),
    (["validate", "--plot", "{missing}/v.png"], "cli.validate.run_cases"),
    (["bench", "--quick", "--out", "{missing}/b.txt"], "cli.main.run_bench"),
    (["sweep", "spec.yaml", "--out", "{missing}/s.csv"], "sweep.load_spec"),
    (["size", "spec.yaml", "--plot", "{missing}/s.png"], "sweep.load_spec"),
]


@pytest.mark.parametrize(("argv", "entry"), BEFORE_SIMULATING)
def test_a_missing_folder_fails_before_simulating(tmp_path, capsys, monkeypatch, argv, entry):
    module, name = f"simulator.{entry}".rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, _boom)
    missing = tmp_path / "missing"
    argv = [arg.format(missing=missing) for arg in argv]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert "does not exist" in line and str(missing) in line
    assert not missing.exists()


def test_generate_checks_its_out_before_generating(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(simulator.cli.workload.GENERATORS, "ddp", _boom)
    assert main(["generate", "ddp", "--out", str(tmp_path / "no" / "w.json")]) == 2
    assert "does not exist" in one_error_line(capsys)


def test_report_into_a_file_fails_before_simulating(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(simulator.cli.collective, "load_topology", _boom)
    (tmp_path / "taken").write_text("")
    assert main([*COLLECTIVE, "--report", str(tmp_path / "taken")]) == 2
    assert "give a folder name" in one_error_line(capsys)


# -- reading -----------------------------------------------------------------------------


def test_a_binary_workload_file_is_named(tmp_path, capsys):
    path = tmp_path / "work.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    assert main(["run", str(path)]) == 2
    line = one_error_line(capsys)
    assert str(path) in line and "binary" in line


def test_a_latin1_topology_file_is_named(tmp_path, capsys):
    path = tmp_path / "topo.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert main(["topology", "show", str(path)]) == 2
    line = one_error_line(capsys)
    assert str(path) in line and "not UTF-8" in line


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(CcsimError, match=r"nope\.yaml: cannot read the sweep spec: No such"):
        load_data(tmp_path / "nope.yaml", what="sweep spec")


def test_json_and_yaml_by_suffix(tmp_path):
    (tmp_path / "a.json").write_text('{"a": [1, 2]}')
    (tmp_path / "a.yaml").write_text("\ufeffa: [1, 2]\nb: &x {c: 1}\nd: *x\n")
    assert load_data(tmp_path / "a.json") == {"a": [1, 2]}
    assert load_data(tmp_path / "a.yaml") == {"a": [1, 2], "b": {"c": 1}, "d": {"c": 1}}
    assert read_text(tmp_path / "a.json") == '{"a": [1, 2]}'


def test_merge_keys_and_a_few_aliases_still_load():
    text = "base: &b {bandwidth: 1GB/s}\n" + "".join(
        f"l{i}: {{<<: *b, latency: {i}us}}\n" for i in range(MAX_ALIASES)
    )
    data = parse_data(text)
    assert data["l7"] == {"bandwidth": "1GB/s", "latency": "7us"}


def test_too_many_aliases_are_refused():
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(CcsimError, match=f"more than {MAX_ALIASES} aliases"):
        parse_data(text, source="many.yaml")


def test_a_billion_laughs_is_refused_before_it_is_built():
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 10)]
    start = time.process_time()
    with pytest.raises(CcsimError, match="bomb.yaml: refused YAML: expands to more than"):
        parse_data("\n".join(lines), source="bomb.yaml")
    assert time.process_time() - start < 5  # generous: it stops after a few thousand nodes


def test_a_recursive_alias_is_refused():
    with pytest.raises(CcsimError, match="refers to a value that contains it"):
        parse_data("a: &a [1, *a]")


@pytest.mark.parametrize(
    "text",
    ["[" * 10_000, "{a: " * 10_000, "".join(" " * i + "- \n" for i in range(10_000))],
    ids=["flow list", "flow mapping", "block list"],
)
def test_deep_yaml_is_one_error(text):
    with pytest.raises(CcsimError, match="deep.yaml: refused YAML: nested more than 100"):
        parse_data(text, source="deep.yaml")


def test_deep_json_is_one_error():
    with pytest.raises(CcsimError, match="deep.json: not valid JSON: nested too deeply"):
        parse_data("[" * 10_000 + "]" * 10_000, source="deep.json", fmt="json")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: [1, 2", "not valid YAML"),
        ("\x1f", "not allowed"),
        ("d: 2024-13-45", "not valid YAML"),
        ("!!python/object:os.system {}", "not valid YAML"),
    ],
)
def test_bad_yaml_is_one_line(text, words):
    with pytest.raises(CcsimError) as caught:
        parse_data(text, source="x.yaml")
    message = str(caught.value)
    assert words in message and "\n" not in message and message.startswith("x.yaml: ")


def test_the_loader_is_pyyaml_safe_load_on_ordinary_input():
    text = "a: 1\nb: [x, 2.5, null, true]\nc: {d: '1K'}\n"
    assert parse_data(text) == yaml.safe_load(text)


def test_bundled_data_parses_to_the_same_values_trusted_or_not():
    # The bundled published-runs file is parsed by libyaml when trusted: the values must
    # be the ones the limited pure-Python loader (a user's file) builds.
    from simulator.validate.training import PUBLISHED

    text = PUBLISHED.read_text()
    assert parse_data(text, trusted=True) == parse_data(text)


def test_trusted_parsing_still_names_bad_yaml():
    with pytest.raises(CcsimError, match=r"x\.yaml: not valid YAML: .*\(line \d+, column \d+\)"):
        parse_data("a: [1, 2", source="x.yaml", trusted=True)
