"""Chakra execution traces: reading, writing, and what goes wrong.

The traces read here are written byte by byte from the field numbers of Chakra's
``schema/protobuf/et_def.proto`` (mlcommons/chakra 21585d8f), not with ccsim's schema
module, so a wrong field number there would show. Times are checked against the ring
all-reduce's closed form: on a contention-free 1-D ring of p GPUs with links of
bandwidth B and latency a, an all-reduce of n bytes takes 2 (p - 1) (a + n / (p B)).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from simulator.algorithms import build_schedule
from simulator.cli import main
from simulator.collective import run_schedule
from simulator.errors import CcsimError
from simulator.topology import load_topology, ring_graph
from simulator.workload import run_workload
from simulator.workload.chakra import (
    load_chakra,
    read_chakra_file,
    write_chakra,
    write_chakra_schedule,
)
from simulator.workload.generators import ddp, megatron

B = 50e9  # bytes/s per link and direction
A = 2e-6  # seconds per hop

# -- protobuf wire format by hand (https://protobuf.dev/programming-guides/encoding/) ------

COMP, SEND, RECV, COLL, METADATA = 4, 5, 6, 7, 1  # et_def.proto enum NodeType
ALL_REDUCE, ALL_GATHER, GATHER = 0, 2, 3  # enum CollectiveCommType


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def uint(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value)


def nested(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


def text(number: int, value: str) -> bytes:
    return nested(number, value.encode())


# AttributeProto: name = 1, int32_val = 7, int64_val = 9, int64_list = 10 (Int64List:
# values = 1), bool_val = 27, string_val = 29.
def attr_bool(name: str, value: bool) -> bytes:
    return text(1, name) + uint(27, int(value))


def attr_int64(name: str, value: int) -> bytes:
    return text(1, name) + uint(9, value)


def attr_int32(name: str, value: int) -> bytes:
    return text(1, name) + uint(7, value)


def attr_string(name: str, value: str) -> bytes:
    return text(1, name) + text(29, value)


def attr_int64_list(name: str, values: list[int]) -> bytes:
    return text(1, name) + nested(10, nested(1, b"".join(varint(v) for v in values)))


def node(
    node_id: int,
    name: str,
    node_type: int,
    attrs: list[bytes] = (),
    *,
    data_deps=(),
    ctrl_deps=(),
    duration_us: int = 0,
    inputs: str = "",
) -> bytes:
    """Node: id = 1, name = 2, type = 3, ctrl_deps = 4, data_deps = 5 (packed),
    duration_micros = 7, inputs = 8 (IOInfo: values = 1), attr = 10."""
    body = uint(1, node_id) + text(2, name) + uint(3, node_type)
    if ctrl_deps:
        body += nested(4, b"".join(varint(d) for d in ctrl_deps))
    if data_deps:
        body += nested(5, b"".join(varint(d) for d in data_deps))
    if duration_us:
        body += uint(7, duration_us)
    if inputs:
        body += nested(8, text(1, inputs))
    return body + b"".join(nested(10, a) for a in attrs)


def metadata(version: str = "0.0.4", attrs: list[bytes] = ()) -> bytes:
    """GlobalMetadata: version = 1, attr = 2."""
    return text(1, version) + b"".join(nested(2, a) for a in attrs)


def et_file(*messages: bytes) -> bytes:
    return b"".join(varint(len(m)) + m for m in messages)


def write_ranks(prefix: Path, per_rank: list[list[bytes]], meta: bytes | None = None) -> None:
    for rank, nodes in enumerate(per_rank):
        Path(f"{prefix}.{rank}.et").write_bytes(et_file(meta or metadata(), *nodes))


def coll(node_id: int, comm_type: int, size: int, *extra: bytes, **kw) -> bytes:
    attrs = [attr_bool("is_cpu_op", False), attr_int64("comm_type", comm_type)]
    attrs.append(attr_int64("comm_size", size))
    return node(node_id, "COLL", COLL, [*attrs, *extra], **kw)


def ring_allreduce(p: int, n: float) -> float:
    return 2 * (p - 1) * (A + n / (p * B))


# -- ASTRA-sim's microbenchmark ------------------------------------------------------------


def microbenchmark(prefix: Path, ranks: int, comm_size: int) -> None:
    """Chakra's et_generator one_comm_coll_node_allreduce (src/generator/generator.py at
    ec410904, the last 0.0.4 version): per rank a GlobalMetadata(version "0.0.4") and one
    COMM_COLL_NODE named ALL_REDUCE with is_cpu_op False, comm_type ALL_REDUCE and
    comm_size; the generator's node counter runs across ranks, so rank r's node id is r."""
    for rank in range(ranks):
        attrs = [
            attr_bool("is_cpu_op", False),
            attr_int64("comm_type", ALL_REDUCE),
            attr_int64("comm_size", comm_size),
        ]
        data = et_file(metadata("0.0.4"), node(rank, "ALL_REDUCE", COLL, attrs))
        Path(f"{prefix}.{rank}.et").write_bytes(data)


def test_astra_sim_allreduce_microbenchmark_is_the_ring_closed_form(tmp_path):
    """8 ranks, 1 MiB all-reduce over every rank (no pg_name), run as a ring on a ring:
    14 (2 us + 1 MiB / (8 x 50 GB/s)) = 64.7 us."""
    n = 2**20
    microbenchmark(tmp_path / "allreduce", 8, n)
    workload = load_chakra(tmp_path / "allreduce")
    assert workload.ranks == 8 and len(workload.ops) == 8
    assert workload.groups["world"].ranks == list(range(8))
    _, result = run_workload(workload, ring_graph(8, B, A), algorithm="ring")
    assert result.step_s == pytest.approx(ring_allreduce(8, n), rel=1e-9)
    # The same trace given as its folder, and as prefix.et, is the same workload.
    for source in (tmp_path, tmp_path / "allreduce.et"):
        _, again = run_workload(load_chakra(source), ring_graph(8, B, A), algorithm="ring")
        assert again.step_s == result.step_s


def test_ccsim_run_takes_the_prefix(tmp_path, capsys):
    """The command line finds the trace from its prefix and simulates all 8 ranks; its
    step time is the library's own replay of that trace on the same cluster."""
    microbenchmark(tmp_path / "ar", 8, 2**24)
    code = main(["run", str(tmp_path / "ar"), "--topology", "dgx-a100", "--format", "json"])
    assert code == 0
    (row,) = json.loads(capsys.readouterr().out)
    _, direct = run_workload(load_chakra(tmp_path / "ar"), load_topology("dgx-a100", 1))
    assert row["step_s"] == pytest.approx(direct.step_s, rel=1e-12)
    assert row["step_s"] > 2**24 / 300e9  # more than NVLink's line rate allows


# -- what the nodes mean ---------------------------------------------------------------


def test_process_groups_dependencies_and_compute(tmp_path):
    """4 ranks on a 4-ring. Groups from PyTorch's process_group:init node: "1" = {0, 1},
    "2" = {2, 3}; each rank first computes 30 us (duration_micros), then all-reduces n
    bytes on its pair (a data dependency, through the metadata node for ranks 2 and 3).
    A pair's ring is one link each way: 2 (a + n / (2 B)) after the compute."""
    n = 10_000_000
    groups = json.dumps(
        [{"pg_name": "1", "pg_desc": "a", "ranks": [0, 1]}, {"pg_name": "2", "ranks": [2, 3]}]
    )
    pg_node = node(
        0, "[pytorch|profiler|execution_trace|process_group:init]", METADATA, inputs=f"['{groups}']"
    )
    per_rank = []
    for rank in range(4):
        compute = node(5, "gemm", COMP, [attr_bool("is_cpu_op", False)], duration_us=30)
        pg = attr_string("pg_name", "1" if rank < 2 else "2")
        if rank < 2:
            comm = coll(9, ALL_REDUCE, n, pg, data_deps=[5])
        else:  # through the metadata node, and as a control dependency
            comm = coll(9, ALL_REDUCE, n, pg, data_deps=[0], ctrl_deps=[5])
        per_rank.append([pg_node, compute, comm])
    write_ranks(tmp_path / "pg", per_rank)
    workload = load_chakra(tmp_path / "pg")
    assert sorted(g.ranks for g in workload.groups.values()) == [[0, 1], [2, 3]]
    _, result = run_workload(workload, ring_graph(4, B, A), algorithm="ring")
    assert result.step_s == pytest.approx(30e-6 + 2 * (A + n / (2 * B)), rel=1e-9)


def test_groups_in_global_metadata_and_send_recv(tmp_path):
    """A group given as a GlobalMetadata attribute (a list of ranks named after it) and a
    send/recv pair: rank 0 sends 4 MB to rank 1 (a + n / B), then both all-gather 8 MB on
    group "dp" = {0, 1}: one step of a + (n / 2) / B."""
    meta = metadata("0.0.4", [attr_int64_list("dp", [0, 1])])
    size, gather = 4_000_000, 8_000_000
    p2p = [attr_bool("is_cpu_op", False), attr_int32("comm_src", 0), attr_int32("comm_dst", 1)]
    p2p += [attr_int64("comm_size", size), attr_int32("comm_tag", 7)]
    rank0 = [
        node(1, "send", SEND, p2p),
        coll(2, ALL_GATHER, gather, attr_string("pg_name", "dp"), data_deps=[1]),
    ]
    rank1 = [
        node(1, "recv", RECV, p2p),
        coll(2, ALL_GATHER, gather, attr_string("pg_name", "dp"), data_deps=[1]),
    ]
    write_ranks(tmp_path / "p2p", [rank0, rank1], meta)
    workload = load_chakra(tmp_path / "p2p")
    assert workload.groups["pgdp"].ranks == [0, 1]
    _, result = run_workload(workload, ring_graph(2, B, A), algorithm="ring")
    assert result.step_s == pytest.approx((A + size / B) + (A + gather / 2 / B), rel=1e-9)


def test_pytorch_host_side_and_control_dependencies(tmp_path):
    """As PyTorch's converter writes a call: a CPU-side COMM_COLL_NODE (c10d::allreduce_,
    is_cpu_op, 100 us, no comm_size) launching the kernel's node, whose control dependency
    names the calling op, here absent from the file (older converters). Refused by
    default with a pointer to ctrl_deps=False; with it, 100 us of CPU time then the
    2-rank ring: 2 (a + n / (2 B))."""
    n = 6_000_000
    host = node(10, "c10d::allreduce_", COLL, [attr_bool("is_cpu_op", True)], duration_us=100)
    kernel = coll(11, ALL_REDUCE, n, data_deps=[10], ctrl_deps=[3])
    write_ranks(tmp_path / "pt", [[host, kernel], [host, kernel]])
    with pytest.raises(CcsimError, match=r"node id 11 depends on node id 3.*ctrl_deps=False"):
        load_chakra(tmp_path / "pt")
    workload = load_chakra(tmp_path / "pt", ctrl_deps=False)
    assert [op.stream for op in workload.ops[:2]] == ["cpu", "comm"]
    _, result = run_workload(workload, ring_graph(2, B, A), algorithm="ring")
    assert result.step_s == pytest.approx(100e-6 + 2 * (A + n / (2 * B)), rel=1e-9)


def test_one_file_is_one_rank(tmp_path):
    """A single .et file is a one-rank workload: two dependent compute nodes of 1000 and
    500 us end at 1.5 ms."""
    path = tmp_path / "gpu.et"
    first = node(1, "a", COMP, [attr_bool("is_cpu_op", False)], duration_us=1000)
    second = node(2, "b", COMP, [attr_bool("is_cpu_op", False)], duration_us=500, data_deps=[1])
    path.write_bytes(et_file(metadata(), first, second))
    workload = load_chakra(path)
    assert workload.ranks == 1
    _, result = run_workload(workload, ring_graph(2, B, A))
    assert result.step_s == pytest.approx(1.5e-3, rel=1e-12)


# -- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "workload",
    [
        ddp("gpt-1.5b", ranks=2),
        megatron("llama3-8b", tp=2, pp=2, dp=2, global_batch=8),  # streams, send/recv, tags
    ],
    ids=["ddp", "megatron"],
)
def test_generated_trace_round_trip(tmp_path, workload):
    """ccsim -> Chakra -> ccsim keeps the simulated step (GEMM shapes, streams, tags and
    groups travel in ccsim_* attributes beside Chakra's own)."""
    graph = load_topology("dgx-a100", 1)
    files = write_chakra(workload, tmp_path / "step.et")
    assert [f.name for f in files] == [f"step.{r}.et" for r in range(workload.ranks)]
    back = load_chakra(tmp_path / "step")
    assert back.ranks == workload.ranks and len(back.ops) == len(workload.ops)
    _, before = run_workload(workload, graph)
    _, after = run_workload(back, graph)
    assert after.step_s == pytest.approx(before.step_s, rel=1e-9)
    assert after.exposed_by_kind == pytest.approx(before.exposed_by_kind, rel=1e-9)


def decode(data: bytes) -> list[tuple[int, int, object]]:
    """(field, wire type, value) of a message: varints as ints, others as bytes."""
    fields, pos = [], 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 2:
            size, pos = read_varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        fields.append((number, wire, value))
    return fields


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size, pos = read_varint(data, pos)
        out.append(data[pos : pos + size])
        pos += size
    return out


def test_exported_nodes_are_what_astra_sim_reads(tmp_path, capsys):
    """``ccsim generate --out x.et`` writes per rank a GlobalMetadata "0.0.4", a
    process_group:init node listing the groups, and COMM_COLL_NODEs carrying comm_type,
    comm_size (int64) and pg_name as ASTRA-sim's feeder reads them, decoded here by
    hand; ``ccsim run x.et`` then gives the step of the JSON trace."""
    out = tmp_path / "ddp.et"
    assert main(["generate", "ddp", "--ranks", "2", "--bucket", "100MiB", "--out", str(out)]) == 0
    assert (
        main(
            [
                "generate",
                "ddp",
                "--ranks",
                "2",
                "--bucket",
                "100MiB",
                "--out",
                str(tmp_path / "ddp.json"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    messages = frames((tmp_path / "ddp.1.et").read_bytes())
    assert decode(messages[0])[0] == (1, 2, b"0.0.4")
    pg = dict((f, v) for f, _, v in decode(messages[1]))
    assert pg[3] == METADATA and b"process_group:init" in pg[2]
    listed = json.loads(dict((f, v) for f, _, v in decode(pg[8]))[1].decode()[2:-2])
    assert listed[0]["ranks"] == [0, 1]
    colls = [m for m in messages[2:] if dict((f, v) for f, _, v in decode(m))[3] == COLL]
    assert colls
    attrs = {}
    for number, _, value in decode(colls[0]):
        if number == 10:
            fields = decode(value)
            attrs[fields[0][2].decode()] = fields[1]
    assert attrs["comm_type"] == (9, 0, ALL_REDUCE)  # int64_val
    assert attrs["comm_size"][:2] == (9, 0) and attrs["comm_size"][2] > 0
    assert attrs["pg_name"] == (29, 2, listed[0]["pg_name"].encode())  # string_val
    assert attrs["is_cpu_op"] == (27, 0, 0)  # bool_val
    steps = []
    for source in (out, tmp_path / "ddp.json"):
        assert main(["run", str(source), "--topology", "dgx-a100", "--format", "json"]) == 0
        steps.append(json.loads(capsys.readouterr().out)[0]["step_s"])
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)


def test_schedule_export_replays_the_ring(tmp_path):
    """ccsim's ring all-reduce schedule as per-rank send/recv nodes, run as a workload:
    the closed form again (no reduction time on ring_graph's GPUs)."""
    n = 8e6
    schedule = build_schedule("ring", "all_reduce", 8, n)
    write_chakra_schedule(schedule, tmp_path / "ring")
    workload = load_chakra(tmp_path / "ring")
    assert {op.kind for op in workload.ops} == {"send", "recv"}
    _, result = run_workload(workload, ring_graph(8, B, A))
    assert result.step_s == pytest.approx(ring_allreduce(8, n), rel=1e-9)


def test_ccsim_collective_writes_the_schedule(tmp_path, capsys):
    """``ccsim collective --chakra`` writes the last size's ring: 8 ranks, 2 (p - 1) p =
    112 transfers of n / p bytes each; the library's choice has no one schedule."""
    prefix = tmp_path / "ar"
    args = ["collective", "all_reduce", "--topology", "dgx-a100", "--sizes", "1M,8M"]
    assert main([*args, "--algo", "ring", "--chakra", str(prefix)]) == 0
    workload = load_chakra(prefix)
    assert workload.ranks == 8 and len(workload.pairs) == 112
    assert {workload.ops[s].nbytes for s, _ in workload.pairs} == {8 * 2**20 / 8}
    capsys.readouterr()
    assert main([*args, "--chakra", str(tmp_path / "x")]) == 2
    assert "--algo NAME" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("algorithm", "op"),
    [("halving-doubling", "all_reduce"), ("pairwise", "all_to_all"), ("tree", "all_reduce")],
)
def test_schedule_export_keeps_dependencies(tmp_path, algorithm, op):
    """Schedules whose ops wait on transfers into their receiver (halving-doubling,
    pairwise) replay as ccsim replays the schedule itself: the waits sit on the receive
    nodes. Without latency "sent" and "delivered" coincide, so the times agree."""
    graph = ring_graph(8, B, 0.0)
    schedule = build_schedule(algorithm, op, 8, 4e6)
    write_chakra_schedule(schedule, tmp_path / "s")
    _, result = run_workload(load_chakra(tmp_path / "s"), graph)
    assert result.step_s == pytest.approx(run_schedule(graph, schedule).time_s, rel=1e-9)


def test_in_switch_schedules_are_refused():
    from simulator.algorithms.base import RankLayout

    schedule = build_schedule("nvls", "all_reduce", RankLayout(8, (0,) * 8), 1e6)
    with pytest.raises(CcsimError, match="cannot express"):
        write_chakra_schedule(schedule, "/nonexistent/x")


# -- errors --------------------------------------------------------------------------------


def run_error(capsys, source: Path) -> str:
    assert main(["run", str(source)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ccsim: error: ") and err.count("\n") == 1
    return err


GOOD = coll(3, ALL_REDUCE, 1024)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # a length prefix of eleven continuation bytes
        (et_file(metadata(), GOOD) + b"\xff" * 11, r"bad varint.*message 2.*after node id 3"),
        # the last message cut short
        (
            et_file(metadata(), GOOD, GOOD.replace(b"\x08\x03", b"\x08\x04"))[:-5],
            r"truncated.*message 2.*after node id 3",
        ),
        (et_file(metadata(), node(4, "x", 42)), r"node id 4 has unknown type 42"),
        (
            et_file(metadata(), node(4, "c", COLL, [attr_int64("comm_type", ALL_REDUCE)])),
            r"node id 4 \(COMM_COLL_NODE\): lacks the 'comm_size' attribute",
        ),
        (
            et_file(metadata(), coll(4, ALL_REDUCE, 8, data_deps=[99])),
            r"node id 4 depends on node id 99",
        ),
        (et_file(metadata(), coll(4, GATHER, 8)), r"node id 4.*comm_type 3 \(GATHER\)"),
        (
            et_file(
                metadata(), coll(5, ALL_REDUCE, 8, ctrl_deps=[6]), coll(6, 0, 8, data_deps=[5])
            ),
            r"node ids \[5, 6\] form a cycle.*ctrl_deps=False",
        ),
        (et_file(GOOD), r"first message is not a GlobalMetadata"),
        (b"", r"empty"),
        (et_file(metadata(), b"\x1a\x05\x01"), r"message 1 \(byte \d+\) is not a valid Chakra"),
    ],
    ids=[
        "varint",
        "truncated",
        "type",
        "comm_size",
        "dependency",
        "gather",
        "cycle",
        "no-metadata",
        "empty",
        "garbage",
    ],
)
def test_malformed_traces_exit_2(tmp_path, capsys, data, expected):
    path = tmp_path / "bad.et"
    path.write_bytes(data)
    err = run_error(capsys, path)
    assert "bad.et" in err
    assert re.search(expected, err), err


def test_rank_files_missing_from_a_sequence(tmp_path, capsys):
    for rank in (0, 1, 3):
        Path(tmp_path / f"job.{rank}.et").write_bytes(et_file(metadata(), GOOD))
    err = run_error(capsys, tmp_path / "job")
    assert "job.2.et" in err and "missing" in err
    # One rank of the sequence alone is refused, pointing at the prefix.
    err = run_error(capsys, tmp_path / "job.1.et")
    assert "rank 1 of the 3-file trace" in err and str(tmp_path / "job") in err


def test_mismatched_collectives_name_the_files(tmp_path, capsys):
    """Rank 0 all-reduces 1 KiB, rank 1 2 KiB: ccsim's matching names both nodes."""
    write_ranks(tmp_path / "mm", [[coll(3, ALL_REDUCE, 1024)], [coll(8, ALL_REDUCE, 2048)]])
    err = run_error(capsys, tmp_path / "mm")
    assert "mm.0.et:3" in err and "mm.1.et:8" in err


def test_without_protobuf_one_line_says_how_to_install(tmp_path, capsys, monkeypatch):
    microbenchmark(tmp_path / "ar", 2, 1024)
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    err = run_error(capsys, tmp_path / "ar")
    assert "pip install ccsim[chakra]" in err


def test_export_refuses_stale_rank_files(tmp_path):
    """Files of an earlier, larger export would be read as extra ranks: refused."""
    (tmp_path / "w.2.et").write_bytes(b"")
    with pytest.raises(CcsimError, match=r"w\.2\.et exists"):
        write_chakra(ddp("gpt-1.5b", ranks=2), tmp_path / "w")
    assert not (tmp_path / "w.0.et").exists()


def test_reader_reports_nodes_in_file_order(tmp_path):
    path = tmp_path / "one.et"
    path.write_bytes(et_file(metadata("0.0.4"), GOOD, coll(1, ALL_REDUCE, 8)))
    file = read_chakra_file(path)
    assert file.version == "0.0.4" and [n.id for n in file.nodes] == [3, 1]
