"""Every reader, fed garbage through the command line, says what is wrong in one line.

Random bytes, random text, random YAML and valid inputs with random edits go to
``ccsim collective --topology FILE``, ``ccsim topology show FILE`` (a preset, or a
node-link JSON graph), ``ccsim run FILE``, ``ccsim sweep FILE`` and ``ccsim validate
--data DIR``, called in process. Each must exit 0 (the input happened to be valid) or 2
with one ``ccsim: error:`` line: never a traceback. An alias bomb ("billion laughs") and
10,000-deep nesting are refused with exit 2 without building them in memory; an
``OSError``, ``UnicodeDecodeError``, ``RecursionError`` or ``MemoryError`` escaping a
command is one line too.

The examples are derandomized (the same every run), so a failure reproduces; to search
further, raise ``max_examples`` in :data:`FUZZ` locally.
"""

from __future__ import annotations

import copy
import importlib
import json
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli.main import main

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,  # nothing written into the checkout
    derandomize=True,  # the same examples every run: a failure here is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- valid inputs, to edit at random -------------------------------------------------------

PRESET = {
    "name": "tiny",
    "description": "two GPUs on a switch, one NIC each",
    "server": {
        "gpus": 2,
        "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "300GB/s", "latency": "1us"},
        "nic": {"gpus_per_nic": 1, "bandwidth": "200Gbps", "link": "rdma"},
    },
    "fabric": {"type": "single-switch", "link": "rdma", "latency": "0.5us"},
}
WORKLOAD = {
    "format": "ccsim-workload/1",
    "name": "toy",
    "ranks": 2,
    "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}},
    "ops": [
        {"id": "c0", "rank": 0, "kind": "compute", "duration": "1ms"},
        {"id": "c1", "rank": 1, "kind": "compute", "duration": "1ms"},
        {"id": "a0", "rank": 0, "kind": "collective", "op": "all_reduce", "group": "dp",
         "bytes": "1MiB", "deps": ["c0"]},
        {"id": "a1", "rank": 1, "kind": "collective", "op": "all_reduce", "group": "dp",
         "bytes": "1MiB", "deps": ["c1"]},
        {"id": "s0", "rank": 0, "kind": "send", "peer": 1, "bytes": "4KiB"},
        {"id": "r1", "rank": 1, "kind": "recv", "peer": 0, "bytes": "4KiB"},
    ],
}  # fmt: skip
SPEC = {
    "name": "tiny-sweep",
    "scenario": {"collective": "all_reduce", "size": "1K", "topology": "dgx-a100", "nodes": 1},
    "axes": {"algorithm": ["ring", "tree"], "chunks": [1, 2]},
}
GRAPH = {
    "directed": False,
    "graph": {"name": "pair"},
    "nodes": [
        {"id": "gpu0", "kind": "gpu", "rank": 0, "server": 0},
        {"id": "gpu1", "kind": "gpu", "rank": 1, "server": 0},
    ],
    "edges": [{"source": "gpu0", "target": "gpu1", "bandwidth": "100GB/s", "latency": "1us"}],
}
SIDECAR = {"preset": "dgx-a100", "nodes": 1, "op": "all_reduce", "algorithm": "ring"}
TABLE = "bytes,time_us_oop,algbw_oop,busbw_oop\n1024,20.0,0.05,0.09\n1048576,40.0,26.2,45.9\n"

# -- strategies ----------------------------------------------------------------------------

WORDS = [
    "1K",
    "8:4G",
    "1e999",
    "-1",
    "ring",
    "auto",
    "nccl",
    "all_reduce",
    "nvswitch",
    "400Gbps",
    "0.5us",
    "gpu0-7",
    "dp",
    "c0",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 20),  # small: a million GPUs is a valid, slow input, not a malformed one
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(WORDS),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def as_yaml(value: object) -> bytes:
    return yaml.safe_dump(value, allow_unicode=True).encode()


def as_json(value: object) -> bytes:
    return json.dumps(value).encode()


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def edited(draw: Callable, seed: object, dump: Callable[[object], bytes]) -> bytes:
    """``seed`` with up to three values replaced, removed or added, dumped."""
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(value)))
        new = draw(values)
        if not path:
            value = new
            continue
        *head, last = path
        parent = value
        for key in head:
            parent = parent[key]
        action = draw(st.sampled_from(("replace", "remove", "add")))
        if action == "remove":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = new
        else:
            parent[last] = new
    return dump(value)


def inputs(seed: object, dump: Callable[[object], bytes]) -> st.SearchStrategy[bytes]:
    """Random bytes, random text, random values dumped, or ``seed`` edited at random."""
    return st.one_of(
        st.binary(max_size=2048),
        st.text(max_size=400).map(str.encode),
        values.map(dump),
        edited(seed, dump),
    )


# -- the commands ----------------------------------------------------------------------------


def _collective(folder: Path, data: bytes) -> list[str]:
    (folder / "topo.yaml").write_bytes(data)
    return ["collective", "all_reduce", "--topology", str(folder / "topo.yaml"), "--sizes", "1K"]


def _show(folder: Path, data: bytes) -> list[str]:
    (folder / "topo.yaml").write_bytes(data)
    return ["topology", "show", str(folder / "topo.yaml")]


def _show_graph(folder: Path, data: bytes) -> list[str]:
    (folder / "graph.json").write_bytes(data)
    return ["topology", "show", str(folder / "graph.json")]


def _run(folder: Path, data: bytes) -> list[str]:
    (folder / "work.yaml").write_bytes(data)
    return ["run", str(folder / "work.yaml"), "--topology", "dgx-a100"]


def _sweep(folder: Path, data: bytes) -> list[str]:
    (folder / "spec.yaml").write_bytes(data)
    out = str(folder / "results.csv")
    return ["sweep", str(folder / "spec.yaml"), "--out", out, "--workers", "1", "--quiet"]


def _validate(folder: Path, data: bytes, table: bytes = TABLE.encode()) -> list[str]:
    (folder / "case.yaml").write_bytes(data)
    (folder / "case.csv").write_bytes(table)
    return ["validate", "--data", str(folder)]


COMMANDS = {
    "collective": (_collective, PRESET, as_yaml),
    "topology show": (_show, PRESET, as_yaml),
    "topology show graph": (_show_graph, GRAPH, as_json),
    "run": (_run, WORKLOAD, as_yaml),
    "sweep": (_sweep, SPEC, as_yaml),
    "validate": (_validate, SIDECAR, as_yaml),
}


def check(argv: list[str], capsys: pytest.CaptureFixture) -> int:
    """Run ``ccsim argv``: exit 0, or 2 with one short ``ccsim: error:`` line."""
    code = main(argv)
    _out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ccsim: error: "), err
        assert len(lines[0]) < 2100
    return code


def test_the_seeds_are_valid(tmp_path, capsys):
    """The edited inputs start from inputs that run, so edits reach deep checks."""
    for name, (command, seed, dump) in COMMANDS.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        assert check(command(folder, dump(seed)), capsys) == 0, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_random_input_gives_one_line(name, capsys):
    command, seed, dump = COMMANDS[name]

    @FUZZ
    @given(data=inputs(seed, dump))
    def fuzz(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as folder:
            check(command(Path(folder), data), capsys)

    fuzz()


@FUZZ
@given(table=st.one_of(st.binary(max_size=2048), st.text(max_size=400).map(str.encode)))
def test_random_nccl_tests_table_gives_one_line(capsys, table):
    with tempfile.TemporaryDirectory() as folder:
        check(_validate(Path(folder), as_yaml(SIDECAR), table), capsys)


def _bomb(levels: int = 9) -> str:
    """The "billion laughs": each level lists the previous one nine times."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels + 1):
        alias = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{alias}]")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias bomb": _bomb().encode(),
    "deep flow": b"[" * 10_000 + b"]" * 10_000,
    "deep flow, unclosed": b"{a: " * 10_000,
    "deep block": b"- " * 10_000 + b"x\n",
    "deep json": b"[" * 10_000 + b"]" * 10_000,
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_bombs_and_deep_nesting_are_refused_cheaply(tmp_path, capsys, name, hostile):
    command = COMMANDS[name][0]
    suffix = ".json" if hostile == "deep json" or name.endswith("graph") else ".yaml"
    if suffix == ".json" and name in ("sweep", "validate"):
        pytest.skip("sweep specs and sidecars are YAML only")

    def argv(data: bytes) -> list[str]:
        args = command(tmp_path, data)
        for path in tmp_path.glob("*.yaml"):
            path.rename(path.with_suffix(suffix))
        return [arg.replace(".yaml", suffix) for arg in args]

    check(argv(b"x: 1\n"), capsys)  # imports done before memory is counted
    tracemalloc.start()
    try:
        assert check(argv(HOSTILE[hostile]), capsys) == 2
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(13, "Permission denied", "/some/file"),
        OSError(28, "No space left on device"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        RecursionError("maximum recursion depth exceeded"),
        MemoryError(),
    ],
    ids=lambda error: type(error).__name__,
)
def test_the_boundary_turns_system_errors_into_one_line(monkeypatch, capsys, error):
    def fail(args):
        raise error

    monkeypatch.setattr(importlib.import_module("simulator.cli.main"), "_cmd_topologies", fail)
    assert main(["topologies"]) == 2
    _out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccsim: error: ") and "Traceback" not in err


def test_a_broken_pipe_is_not_an_error(monkeypatch, capsys):
    def fail(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(importlib.import_module("simulator.cli.main"), "_cmd_topologies", fail)
    assert main(["topologies"]) == 0
    assert capsys.readouterr().err == ""
