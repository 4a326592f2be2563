"""Tensor-parallel groups that span servers (simulator/workload/servers.py): counted by
hand from the rank order (Megatron-LM's TP varies fastest, so TP group k holds ranks
k*tp .. k*tp + tp - 1, and rank r sits on server r // gpus_per_server), and said on one
warning line by `ccsim generate` and `ccsim run`."""

from __future__ import annotations

import json

import pytest

from simulator.cli.main import main
from simulator.workload.generators import megatron
from simulator.workload.servers import Spread, tp_spread, tp_warning
from simulator.workload.trace import parse_workload


def spanning_by_hand(tp: int, ranks: int, per_server: int) -> int:
    """TP groups of consecutive ranks whose first and last rank sit on different servers."""
    return sum(
        1 for k in range(ranks // tp) if (k * tp) // per_server != (k * tp + tp - 1) // per_server
    )


def tp_trace(tp: int, groups: int) -> dict:
    """A trace of ``groups`` TP groups of ``tp`` consecutive ranks, one 64 MiB all-reduce
    in each (every member issues it). (At 1 KiB NCCL's choice is its tree, which ccsim's
    chain-tree cannot run on a group split 2 + 4 over servers: a separate limitation.)"""
    names = {f"tp.{k}": list(range(k * tp, (k + 1) * tp)) for k in range(groups)}
    ops = [
        {
            "id": f"{name}.r{rank}",
            "rank": rank,
            "kind": "collective",
            "stream": "tp",
            "op": "all_reduce",
            "group": name,
            "bytes": 64 * 2**20,
        }
        for name, members in names.items()
        for rank in members
    ]
    return {
        "format": "ccsim-workload/1",
        "name": f"tp{tp}",
        "ranks": tp * groups,
        "groups": {name: {"kind": "TP", "ranks": members} for name, members in names.items()},
        "ops": ops,
    }


@pytest.mark.parametrize(
    ("tp", "groups", "per_server", "spanning"),
    [(6, 4, 8, 2), (5, 2, 8, 1), (4, 4, 8, 0), (8, 2, 8, 0), (16, 2, 8, 2), (4, 4, 6, 1)],
)
def test_spanning_groups_are_those_counted_by_hand(tp, groups, per_server, spanning):
    workload = parse_workload(tp_trace(tp, groups), origin="test")
    spread = tp_spread(workload, [r // per_server for r in range(tp * groups)])
    assert spread.spanning == spanning == spanning_by_hand(tp, tp * groups, per_server)
    assert (spread.groups, spread.size, spread.gpus_per_server) == (groups, tp, per_server)
    assert (tp_warning(spread) is None) == (spanning == 0)


def test_the_megatron_generator_places_tp_groups_as_counted_by_hand():
    # gpt-1.5b has 25 attention heads: TP 5 splits them; 2 data-parallel replicas.
    workload = megatron("gpt-1.5b", tp=5, pp=1, dp=2, global_batch=2)
    spread = tp_spread(workload, [r // 8 for r in range(workload.ranks)])
    assert (spread.groups, spread.spanning) == (2, spanning_by_hand(5, 10, 8)) == (2, 1)


def test_the_warning_names_the_option_and_the_sizes_that_fit():
    inside = tp_warning(Spread(groups=4, spanning=2, size=6, gpus_per_server=8), option="--tp")
    assert inside.startswith("--tp 6 does not divide the 8 GPUs of a server: 2 of the 4")
    assert inside.endswith("pick --tp 1, 2, 4 or 8")
    over = tp_warning(Spread(groups=2, spanning=2, size=16, gpus_per_server=8))
    assert "tp 16 is more than the 8 GPUs of a server: every TP group spans 2 servers" in over
    assert "keep tp to 1, 2, 4 or 8" in over
    assert tp_warning(Spread(groups=3, spanning=1, size=4, gpus_per_server=None)) == (
        "1 of the 3 TP groups spans servers, so its collectives (several a layer, in the "
        "critical path) cross the network instead of NVLink"
    )


def test_generate_warns_on_one_line_and_still_writes_the_trace(tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = ["generate", "megatron", "--model", "gpt-1.5b", "--pp", "1", "--dp", "2"]
    argv += ["--global-batch", "2", "--out", str(out)]
    assert main([*argv, "--tp", "5"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ccsim: warning: on 8-GPU servers")
    assert "--tp 5 does not divide the 8 GPUs of a server: 1 of the 2 TP groups spans" in err
    assert json.loads(out.read_text())["ranks"] == 10
    assert main([*argv, "--tp", "1"]) == 0  # TP 1 never spans a server
    assert capsys.readouterr().err == ""


def test_generate_still_refuses_a_tp_that_does_not_split_the_heads(tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = ["generate", "megatron", "--model", "gpt3-175b", "--tp", "7", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tp 7 does not split gpt3-175b's 96 attention heads" in err
    assert not out.exists()


def test_run_warns_for_the_topology_it_runs_on(tmp_path, capsys):
    trace = tmp_path / "tp6.json"
    trace.write_text(json.dumps(tp_trace(6, 2)))  # ranks 6-11 span the two DGX A100
    assert main(["run", str(trace), "--topology", "dgx-a100", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "ccsim: warning: tp6 on dgx-a100: tp 6 does not divide the 8 GPUs of a server" in err
    assert "1 of the 2 TP groups spans two servers" in err
    fits = tmp_path / "tp4.json"
    fits.write_text(json.dumps(tp_trace(4, 4)))
    assert main(["run", str(fits), "--topology", "dgx-a100", "--format", "json"]) == 0
    assert capsys.readouterr().err == ""


def test_a_sweep_of_tp_sizes_warns_once_per_size_that_spans(tmp_path, capsys):
    from simulator.cli.sweep import _warn_tp
    from simulator.sweep import load_spec
    from simulator.sweep.point import megatron_tp_spread

    spec = tmp_path / "tp.yaml"
    spec.write_text(
        "scenario:\n"
        "  workload: {generator: megatron, model: gpt3-175b, pp: 1, dp: 4, global_batch: 4}\n"
        "  topology: dgx-a100\n"
        "axes:\n"
        "  workload.tp: [4, 6, 8, 16]\n"
        "  workload.dp: [2, 4]\n"
    )
    loaded = load_spec(spec)
    spreads = {
        (p.values["workload.tp"], p.values["workload.dp"]): megatron_tp_spread(p.params)
        for p in loaded.points
    }
    for (tp, dp), spread in spreads.items():  # 8 GPUs a DGX A100, TP consecutive
        assert spread.spanning == spanning_by_hand(tp, tp * dp, 8)
    _warn_tp(loaded)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2  # TP 6 and TP 16, each once whatever the DP
    assert lines[0].startswith(f"ccsim: warning: {spec}: workload.tp 6 does not divide")
    assert "workload.tp 16 is more than the 8 GPUs of a server" in lines[1]
