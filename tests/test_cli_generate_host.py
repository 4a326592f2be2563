"""`ccsim generate`'s host and pipeline options (issue 31): --host-op-s, --cuda-graphs and
--overlap-p2p-comm reach the megatron generator as its Python keywords do."""

import json

import pytest

from simulator.cli import main
from simulator.workload.generators import megatron

MOE = ["--model", "mixtral-8x7b", "--tp", "1", "--pp", "1", "--dp", "8", "--ep", "8",
       "--global-batch", "8", "--micro-batch", "1"]  # fmt: skip


def _generate(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["generate", "megatron", *MOE, *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _host_seconds(trace):
    return sum(op["duration"] for op in trace["ops"] if op.get("stream") == "host")


def test_host_time_scales_with_the_per_operation_cost(tmp_path):
    # The host's time is the counted operations times the cost of one: doubling the
    # cost doubles every host op, the default (13.48 us, an x86 DGX's) is 1.348 times
    # 10 us, and 0 leaves the host out.
    base = _host_seconds(_generate(tmp_path, "base.json"))
    ten = _host_seconds(_generate(tmp_path, "ten.json", "--host-op-s", "10us"))
    double = _host_seconds(_generate(tmp_path, "double.json", "--host-op-s", "20us"))
    none = _host_seconds(_generate(tmp_path, "none.json", "--host-op-s", "0"))
    assert ten > 0
    # (Each host op's time is rounded to a multiple of 2**-32 s, generators._dyadic.)
    assert double == pytest.approx(2 * ten, rel=1e-6)
    assert base == pytest.approx(1.348 * ten, rel=1e-6)
    assert none == 0


def test_the_device_sets_the_host_cpu_unless_the_cost_is_given(tmp_path):
    # --device GB200: a Grace host, 37.08 us a launch against 10 us (Transformer Engine
    # issue #2053's measurement) and 2.734 us a framework tensor operation against 10 us
    # x 2.15 / 13.48 = 1.595 (TE issue #2897, NVIDIA/cutlass issue #3275), so between
    # 2.734 / 1.595 and 3.708 times the 10 us trace; H100: an x86 DGX, 13.48 us and
    # 2.15 us, 1.348 times it throughout; --host-op-s wins.
    ten = _host_seconds(_generate(tmp_path, "ten.json", "--host-op-s", "10us"))
    grace = _host_seconds(_generate(tmp_path, "grace.json", "--device", "GB200"))
    x86 = _host_seconds(_generate(tmp_path, "x86.json", "--device", "H100"))
    given = _host_seconds(
        _generate(tmp_path, "given.json", "--device", "GB200", "--host-op-s", "10us")
    )
    assert 2.734 / 1.595 * ten < grace < 3.708 * ten
    as_grace = _host_seconds(_generate(tmp_path, "g.json", "--host-op-s", "37.08us"))
    assert grace == pytest.approx(as_grace, rel=1e-6)
    assert x86 == pytest.approx(1.348 * ten, rel=1e-6)
    assert given == ten


def test_a_full_iteration_graph_leaves_no_host_time_and_attention_graphs_less(tmp_path):
    base = _host_seconds(_generate(tmp_path, "base.json"))
    attn = _host_seconds(_generate(tmp_path, "attn.json", "--cuda-graphs", "attn"))
    full = _host_seconds(_generate(tmp_path, "full.json", "--cuda-graphs", "full_iteration"))
    assert 0 < attn < base
    assert full == 0


def test_the_cli_builds_what_the_python_keywords_build(tmp_path):
    trace = _generate(tmp_path, "k.json", "--host-op-s", "15us", "--cuda-graphs",
                      "attn, moe_router")  # fmt: skip
    api = megatron(model="mixtral-8x7b", tp=1, pp=1, dp=8, ep=8, global_batch=8,
                   micro_batch=1, host_op_s=15e-6, cuda_graphs=("attn", "moe_router"))  # fmt: skip
    api_path = tmp_path / "api.json"
    api.save(str(api_path))
    assert trace["ops"] == json.loads(api_path.read_text())["ops"]


def test_overlap_p2p_comm_reaches_the_interleaved_schedule(tmp_path):
    argv = ["generate", "megatron", "--model", "llama3-8b", "--tp", "1", "--pp", "2",
            "--virtual-stages", "2", "--dp", "2", "--global-batch", "8",
            "--micro-batch", "1"]  # fmt: skip
    outs = {}
    for name, flag in (("on", []), ("off", ["--no-overlap-p2p-comm"])):
        out = tmp_path / f"{name}.json"
        assert main([*argv, *flag, "--out", str(out)]) == 0
        outs[name] = json.loads(out.read_text())["ops"]
    api = megatron(model="llama3-8b", tp=1, pp=2, virtual_stages=2, dp=2, global_batch=8,
                   micro_batch=1, overlap_p2p_comm=False)  # fmt: skip
    api_path = tmp_path / "api.json"
    api.save(str(api_path))
    assert outs["off"] == json.loads(api_path.read_text())["ops"]
    # Megatron's default with interleaving posts receives early: other dependencies.
    assert outs["on"] != outs["off"]


def test_an_unknown_graph_scope_is_one_line_with_exit_code_2(tmp_path, capsys):
    code = main(["generate", "megatron", *MOE, "--cuda-graphs", "attn,bogus",
                 "--out", str(tmp_path / "x.json")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "--cuda-graphs" in err and "bogus" in err and "full_iteration" in err


def test_tp_comm_overlap_model_reaches_the_generator(tmp_path):
    # --tp-comm-overlap-model userbuffers builds what tp_comm_overlap="userbuffers"
    # builds, op for op, and differs from the ideal overlap (its GEMMs run in chunks).
    argv = ["generate", "megatron", "--model", "llama3-8b", "--tp", "2", "--pp", "1",
            "--dp", "1", "--global-batch", "2", "--micro-batch", "1"]  # fmt: skip
    traces = {}
    for name in ("ideal", "userbuffers"):
        out = tmp_path / f"{name}.json"
        assert main([*argv, "--tp-comm-overlap-model", name, "--out", str(out)]) == 0
        traces[name] = json.loads(out.read_text())["ops"]
    api = megatron(model="llama3-8b", tp=2, pp=1, dp=1, global_batch=2, micro_batch=1,
                   tp_comm_overlap="userbuffers")  # fmt: skip
    api_path = tmp_path / "api.json"
    api.save(str(api_path))
    assert traces["userbuffers"] == json.loads(api_path.read_text())["ops"]
    assert traces["userbuffers"] != traces["ideal"]


def test_tp_comm_overlap_model_without_the_overlap_is_one_line_exit_2(tmp_path, capsys):
    argv = ["generate", "megatron", "--model", "llama3-8b", "--tp", "2", "--pp", "1",
            "--dp", "1", "--global-batch", "2", "--no-tp-comm-overlap",
            "--tp-comm-overlap-model", "userbuffers",
            "--out", str(tmp_path / "x.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--no-tp-comm-overlap" in err
