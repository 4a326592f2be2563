"""Several jobs on one cluster (issue 34): placement, exactness alone vs together,
max-min shares on an oversubscribed fabric computed by hand, bytes per job, the CLI.

The hand-computed cases use a cluster of four one-GPU servers with 100 Gb/s NICs
(12.5 GB/s), two servers under each leaf of a 2:1 leaf-spine: a leaf's two downlinks
(25 GB/s) share one 12.5 GB/s uplink to the single spine. Every latency is 0 and GPUs
reduce at an infinite rate, so a 2-rank ring all-reduce of S bytes is two steps of S/2
bytes each way at the path's rate.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cli import main
from simulator.topology import load_topology
from simulator.topology.builders import cluster_graph
from simulator.workload import WorkloadReplay, load_workload
from simulator.workload.generators import megatron
from simulator.workload.jobs import Job, job_runs, merge_jobs, run_jobs, slowdown_over_seeds
from simulator.workload.placement import PlacementError, place_jobs

NIC = 12.5e9  # 100 Gb/s in bytes/s
MS = 1e-3


def oversubscribed(servers: int = 4):
    """One-GPU servers, 2 under each leaf, 2:1 leaf-spine, no latency."""
    server = {
        "gpus": 1,
        "nic": {"bandwidth": "100Gbps", "latency": 0, "pcie": {"bandwidth": "1TB/s", "latency": 0}},
    }
    fabric = {"type": "leaf-spine", "servers_per_leaf": 2, "oversubscription": 2, "latency": 0}
    return cluster_graph(server, servers, fabric=fabric)


def all_reduce_step(nbytes: float, compute_ms: float = 1.0, name: str = "ar"):
    """Two ranks: compute, then an all-reduce of ``nbytes``."""
    ops = [
        {"id": f"c{r}", "rank": r, "kind": "compute", "duration": f"{compute_ms}ms"} for r in (0, 1)
    ]
    ops += [
        {"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce", "group": "dp",
         "bytes": nbytes, "deps": [f"c{r}"]}
        for r in (0, 1)
    ]  # fmt: skip
    return load_workload(
        {
            "format": "ccsim-workload/1",
            "name": name,
            "ranks": 2,
            "ops": ops,
            "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}},
        }
    )


def interleaved_pair(nbytes: float):
    """Two all-reduce jobs of ``nbytes`` interleaved on the 2:1 leaf-spine (A on servers 0
    and 2, B on 1 and 3), by ring: each ring step crosses the leaves both ways."""
    step = all_reduce_step(nbytes)
    return run_jobs(
        [Job("A", step, "ranks=0,2"), Job("B", step, "ranks=1,3")],
        oversubscribed(),
        algorithm="ring",
    )


# -- placement -----------------------------------------------------------------------------
SERVERS = [s for s in range(4) for _ in range(4)]  # 4 servers of 4 GPUs


def placed(sizes, policies):
    return [
        p.tolist()
        for p in place_jobs(SERVERS, sizes, policies, names=["A", "B", "C"][: len(sizes)])
    ]


def test_packed_fills_servers_in_order():
    assert placed([6, 4], ["packed", "packed"]) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]


def test_scattered_spreads_whole_servers():
    # Two jobs of two servers each interleave: A on servers 0 and 2, B on 1 and 3.
    assert placed([8, 8], ["scattered", "scattered"]) == [
        [0, 1, 2, 3, 8, 9, 10, 11],
        [4, 5, 6, 7, 12, 13, 14, 15],
    ]
    # One server's worth: the first free one; a second job of 3 servers gets the rest.
    assert placed([4, 12], ["scattered", "scattered"])[1] == list(range(4, 16))


def test_rail_takes_the_same_local_gpus_on_every_server():
    a, b = placed([4, 8], ["rail", "rail"])
    assert a == [0, 4, 8, 12]  # local GPU 0 of each server
    assert b == [1, 2, 5, 6, 9, 10, 13, 14]  # local GPUs 1-2, consecutive ranks in a server


def test_explicit_ranks_are_placed_first():
    a, b = placed([4, 4], ["packed", "ranks=0-1,4-5"])
    assert b == [0, 1, 4, 5]
    assert a == [2, 3, 6, 7]


@pytest.mark.parametrize(
    ("sizes", "policies", "words"),
    [
        ([4, 4], ["ranks=0-3", "ranks=3-6"], "both use GPU 3"),
        ([12, 8], ["packed", "packed"], "need 20 GPUs"),
        ([4], ["diagonal"], "unknown placement 'diagonal'"),
        ([8], ["ranks=0-3"], "has 8 ranks but its placement gives 4"),
        ([4], ["ranks=14-17"], "GPU 16 is not in the cluster"),
        ([6], ["rail"], "multiple of 4"),
        ([4], ["ranks=3-1"], "not a number or a range"),
    ],
)
def test_bad_placements(sizes, policies, words):
    with pytest.raises(PlacementError, match=words):
        placed(sizes, policies)


# -- exactness and shares ------------------------------------------------------------------
def test_identical_jobs_on_a_non_blocking_fabric_keep_their_step_exactly():
    # Two Megatron jobs (TP 4 inside a server, DP 2 across two servers) on the same two
    # DGX A100 by rail: each job's NICs are its own, the single switch is non-blocking,
    # so neither job can slow the other and its step together is its step alone, to the
    # last bit.
    step = megatron("llama3-8b", tp=4, pp=1, dp=2, micro_batch=1, global_batch=2)
    graph = load_topology("dgx-a100", 2)
    result = run_jobs([Job("A", step, "rail"), Job("B", step, "rail")], graph)
    assert [job.gpus.tolist() for job in result.jobs] == [
        [0, 1, 2, 3, 8, 9, 10, 11],
        [4, 5, 6, 7, 12, 13, 14, 15],
    ]
    for job in result.jobs:
        assert job.step_together_s == job.step_alone_s
        assert job.slowdown == 1.0
    assert result.shared == []
    # Alone is what the ordinary replay gives for the job on those GPUs.
    alone = WorkloadReplay(merge_jobs([step], [result.jobs[0].gpus], ["A"], 16), graph).run()
    assert float(np.nanmax(alone.records.end_s)) == result.jobs[0].step_alone_s


def test_one_replica_standing_for_each_jobs_replicas_changes_nothing():
    # Jobs given by one data-parallel replica each are merged with one shift moving each
    # job's replicas among its own GPUs; the steps are those of every replica built.
    def step(replicas):
        return megatron(
            "llama3-8b", tp=8, pp=1, dp=2, micro_batch=1, global_batch=2, replicas=replicas
        )

    graph = load_topology("dgx-a100", 4)
    one = run_jobs([Job("A", step(True), "scattered"), Job("B", step(True), "scattered")], graph)
    every = run_jobs(
        [Job("A", step(False), "scattered"), Job("B", step(False), "scattered")], graph
    )
    assert one.together.replicas == {"count": 2, "simulated": 1}
    assert every.together.replicas == {}
    for a, b in zip(one.jobs, every.jobs, strict=True):
        assert a.step_alone_s == pytest.approx(b.step_alone_s, rel=1e-12)
        assert a.step_together_s == pytest.approx(b.step_together_s, rel=1e-12)


def test_tp_masters_standing_for_each_jobs_tp_groups_change_nothing():
    # Jobs given by one rank per TP group (megatron(shadows=True)) are merged with one
    # shift moving each job's TP ranks among its own GPUs. Placed scattered under a 2:1
    # leaf-spine with one spine (no ECMP choice), both jobs' pipeline sends and
    # data-parallel calls cross the same leaf uplinks, so they do meet; the steps alone
    # and together, every master op's times and every link's bytes are those of every
    # rank built.
    def step(shadows):
        return megatron(
            "llama3-8b", tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, shadows=shadows
        )

    fabric = {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2, "spines": 1}
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    one = run_jobs([Job("A", step(True), "scattered"), Job("B", step(True), "scattered")], graph)
    every = run_jobs(
        [Job("A", step(False), "scattered"), Job("B", step(False), "scattered")], graph
    )
    assert one.together.shadows == {"count": 4, "simulated": 1}
    assert all(run.shadows == {"count": 4, "simulated": 1} for run in one.alone)
    assert one.shared and len(one.shared) == len(every.shared)  # they meet
    for a, b in zip(one.jobs, every.jobs, strict=True):
        assert a.step_alone_s == b.step_alone_s
        assert a.step_together_s == b.step_together_s
    assert max(job.slowdown for job in every.jobs) > 1.0
    ids = {op.id: op.index for op in every.together.workload.ops}
    for op in one.together.workload.ops:
        j = ids[op.id]
        assert one.together.records.start_s[op.index] == every.together.records.start_s[j]
        assert one.together.records.end_s[op.index] == every.together.records.end_s[j]
    assert np.allclose(one.together.links["bytes"], every.together.links["bytes"], atol=1.0)
    assert len(one.together.workload.ops) * 4 == len(every.together.workload.ops)


def test_stand_ins_found_unlike_alone_are_given_whole_together():
    # Under a 2:1 leaf-spine with one server a leaf, ECMP hashes the TP ranks' pipeline
    # sends onto different spines: run_jobs sees that their pairs have several shortest
    # paths and gives each job every rank from the start (the replay would otherwise
    # find the masters unlike their shadows only after running them), alone and
    # together, with the steps of jobs built whole.
    def step(shadows):
        return megatron(
            "llama3-8b", tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, shadows=shadows
        )

    fabric = {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 1, "routing": "ecmp"}
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    given = step(True)
    one = run_jobs([Job("A", given, "scattered"), Job("B", given, "scattered")], graph)
    whole = run_jobs(
        [Job("A", step(False), "scattered"), Job("B", step(False), "scattered")], graph
    )
    assert all(run.shadows == {} for run in one.alone) and one.together.shadows == {}
    assert all(run.isolated["attempts"] == 1 for run in [*one.alone, one.together])
    for a, b in zip(one.jobs, whole.jobs, strict=True):
        assert a.step_alone_s == b.step_alone_s
        assert a.step_together_s == b.step_together_s


def test_jobs_of_different_tp_sizes_build_every_tp_rank():
    # Shadows of TP 4 and TP 2 cannot share one shift: both are built whole, and the
    # steps are those of jobs built whole from the start.
    def step(tp, shadows):
        return megatron(
            "llama3-8b", tp=tp, pp=1, dp=8 // tp, micro_batch=1, global_batch=8 // tp,
            shadows=shadows,
        )  # fmt: skip

    graph = load_topology("dgx-h100", 2)
    mixed = run_jobs([Job("A", step(4, True), "rail"), Job("B", step(2, True), "rail")], graph)
    whole = run_jobs([Job("A", step(4, False), "rail"), Job("B", step(2, False), "rail")], graph)
    assert mixed.together.shadows == {}
    assert [j.step_together_s for j in mixed.jobs] == [j.step_together_s for j in whole.jobs]


def test_two_jobs_share_an_oversubscribed_uplink_max_min():
    # A on servers 0 and 2, B on 1 and 3: each ring step sends S/2 from leaf 0's side to
    # leaf 1's and back. Alone a flow gets the whole 12.5 GB/s path; together the two
    # jobs' flows share each 12.5 GB/s leaf-spine link: 6.25 GB/s each.
    size = 125e6
    result = interleaved_pair(size)
    alone = 1 * MS + 2 * (size / 2) / NIC  # 11 ms
    together = 1 * MS + 2 * (size / 2) / (NIC / 2)  # 21 ms
    for job in result.jobs:
        assert job.step_alone_s == pytest.approx(alone, rel=1e-12)
        assert job.step_together_s == pytest.approx(together, rel=1e-12)
        assert job.slowdown == pytest.approx(21 / 11, rel=1e-12)
    # They met on the leaf-spine links both ways (each job: S/2 twice each way).
    met = {(link.src, link.dst): link.bytes_by_job for link in result.shared}
    assert set(met) == {("leaf0", "spine0"), ("spine0", "leaf0"), ("leaf1", "spine0"),
                        ("spine0", "leaf1")}  # fmt: skip
    for by_job in met.values():
        assert by_job == pytest.approx({"A": size, "B": size}, rel=1e-12)


def test_unequal_jobs_share_by_max_min():
    # A reduces S, B S/2, both after 1 ms of compute. Both reduce-scatter steps share the
    # uplink at 6.25 GB/s; B's (S/4) ends at t1 = S/4 / 6.25e9 and its all-gather (S/4)
    # shares again with A's remaining S/4: both end at t2 = t1 + S/4 / 6.25e9 = S/12.5e9.
    # A's all-gather (S/2) is then alone at 12.5 GB/s: t3 = t2 + S/2 / 12.5e9.
    size = 100e6
    a, b = all_reduce_step(size, name="big"), all_reduce_step(size / 2, name="small")
    result = run_jobs(
        [Job("A", a, "ranks=0,2"), Job("B", b, "ranks=1,3")], oversubscribed(), algorithm="ring"
    )
    t2 = size / NIC
    t3 = t2 + size / 2 / NIC
    by_name = {job.name: job for job in result.jobs}
    assert by_name["A"].step_together_s == pytest.approx(MS + t3, rel=1e-12)
    assert by_name["B"].step_together_s == pytest.approx(MS + t2, rel=1e-12)
    assert by_name["A"].step_alone_s == pytest.approx(MS + size / NIC, rel=1e-12)
    assert by_name["B"].step_alone_s == pytest.approx(MS + size / 2 / NIC, rel=1e-12)


def test_bytes_are_conserved_per_job():
    # What each job's flows put on every link alone adds up to what the links carried
    # together; each job's NIC uplink carries its ring's S/2 twice.
    size = 100e6
    result = run_jobs(
        [
            Job("A", all_reduce_step(size), "ranks=0,2"),
            Job("B", all_reduce_step(size / 2), "ranks=1,3"),
        ],
        oversubscribed(),
        algorithm="ring",
    )
    assert result.bytes_mismatch < 1e-12
    links = result.together.links
    carried = dict(zip(zip(links["src"], links["dst"], strict=True), links["bytes"], strict=True))
    assert carried[("s0/nic0", "leaf0")] == pytest.approx(size, rel=1e-12)
    assert carried[("s1/nic0", "leaf0")] == pytest.approx(size / 2, rel=1e-12)
    assert carried[("leaf0", "spine0")] == pytest.approx(1.5 * size, rel=1e-12)


def test_job_runs_slice_each_jobs_ops():
    size = 125e6
    step = all_reduce_step(size)
    result = run_jobs([Job("A", step, "ranks=0,2"), Job("B", step, "ranks=1,3")], oversubscribed(),
                      algorithm="ring")  # fmt: skip
    parts = job_runs(result.together)
    assert set(parts) == {"A", "B"}
    assert [op.id for op in parts["B"].workload.ops] == [op.id for op in step.ops]
    assert float(np.nanmax(parts["B"].records.end_s)) == result.jobs[1].step_together_s


def test_ecmp_seeds_decide_collisions_and_give_a_distribution():
    # Non-blocking 1:1 leaf-spine with two spines: each ring flow hashes onto one spine
    # (seeded ECMP). Where both jobs' flows of one direction pick the same spine they
    # share its 12.5 GB/s (21/11 as above); elsewhere neither slows (1).
    size = 125e6
    step = all_reduce_step(size)
    server = {"gpus": 1, "nic": {"bandwidth": "100Gbps", "latency": 0,
                                 "pcie": {"bandwidth": "1TB/s", "latency": 0}}}  # fmt: skip
    graph = cluster_graph(
        server, 4, fabric={"type": "leaf-spine", "servers_per_leaf": 2, "latency": 0}
    )
    jobs = [Job("A", step, "ranks=0,2"), Job("B", step, "ranks=1,3")]
    runs = [run_jobs(jobs, graph, seed=s, algorithm="ring") for s in range(10)]
    for run in runs:
        collided = bool(run.shared)
        for job in run.jobs:
            assert job.step_alone_s == pytest.approx(MS + size / NIC, rel=1e-12)
            assert job.slowdown == pytest.approx(21 / 11 if collided else 1.0, rel=1e-12)
        # Where they met, on spine links only, each job carried its S there.
        for link in run.shared:
            assert "spine" in link.src + link.dst
            assert link.bytes_by_job == pytest.approx({"A": size, "B": size}, rel=1e-12)
    again = run_jobs(jobs, graph, seed=3, algorithm="ring")
    assert [j.step_together_s for j in again.jobs] == [j.step_together_s for j in runs[3].jobs]
    stats = slowdown_over_seeds(runs)
    values = [run.jobs[0].slowdown for run in runs]
    assert stats["A"]["median"] == pytest.approx(float(np.median(values)), rel=1e-12)
    assert stats["A"]["p90"] == pytest.approx(float(np.percentile(values, 90)), rel=1e-12)
    assert stats["A"]["max"] == max(values)


# -- command line --------------------------------------------------------------------------
def write_step(tmp_path, size=125e6):
    path = tmp_path / "ar.json"
    path.write_text(json.dumps(all_reduce_step(size).to_dict()))
    return str(path)


def write_topology(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: tiny\nserver:\n  gpus: 1\n  nic:\n    bandwidth: 100Gbps\n    latency: 0\n"
        "    pcie: {bandwidth: 1TB/s, latency: 0}\n"
        "fabric: {type: leaf-spine, servers_per_leaf: 2, oversubscription: 2, latency: 0}\n"
    )
    return str(path)


def test_cli_jobs_json(tmp_path, capsys):
    step, topo = write_step(tmp_path), write_topology(tmp_path)
    code = main(
        [
            "jobs",
            "--job",
            f"{step}@ranks=0,2",
            "--job",
            f"{step}@ranks=1,3",
            "--topology",
            topo,
            "--nodes",
            "4",
            "--algo",
            "ring",
            "--format",
            "json",
        ]
    )
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    jobs = [row for row in rows if row.get("job")]
    assert [row["job"] for row in jobs] == ["A", "B"]
    for row in jobs:
        assert row["slowdown"] == pytest.approx(21 / 11, rel=1e-12)


def test_cli_jobs_over_seeds_table(tmp_path, capsys):
    step, topo = write_step(tmp_path), write_topology(tmp_path)
    code = main(
        [
            "jobs",
            "--job",
            step,
            "--job",
            step,
            "--placement",
            "scattered",
            "--topology",
            topo,
            "--nodes",
            "4",
            "--algo",
            "ring",
            "--seeds",
            "0-2",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "median" in out and "p90" in out


@pytest.mark.parametrize(
    ("placements", "words"),
    [
        (["ranks=0,2", "ranks=2,3"], "both use GPU 2"),
        (["packed", "packed", "packed"], "need 6 GPUs"),
        (["wherever", "packed"], "unknown placement"),
        (["ranks=0", "packed"], "has 2 ranks but its placement gives 1"),
    ],
)
def test_cli_bad_placement_one_line_exit_2(tmp_path, capsys, placements, words):
    step, topo = write_step(tmp_path), write_topology(tmp_path)
    argv = ["jobs", "--topology", topo, "--nodes", "4", "--algo", "ring"]
    for placement in placements:
        argv += ["--job", f"{step}@{placement}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_cli_jobs_megatron_spec_stand_ins_give_the_full_steps(tmp_path, capsys):
    # A megatron spec given to ccsim jobs is built with one replica and one rank per TP
    # group standing for the rest (as sweeps do); its steps are every rank's.
    from simulator.workload.presets import resolve_workload

    spec = tmp_path / "tp4.yaml"
    spec.write_text(
        "format: ccsim-workload-spec/1\ngenerator: megatron\nmodel: llama3-8b\n"
        "tp: 4\npp: 1\ndp: 2\nmicro_batch: 1\nglobal_batch: 4\n"
    )
    given = resolve_workload(spec, stand_ins=True)
    assert given.shadows is not None and given.replicas is not None
    assert resolve_workload(spec).shadows is None  # ccsim run's build is unchanged
    code = main(
        ["jobs", "--job", str(spec), "--job", str(spec), "--topology", "dgx-h100",
         "--nodes", "2", "--placement", "scattered", "--format", "json"]
    )  # fmt: skip
    assert code == 0
    rows = [row for row in json.loads(capsys.readouterr().out) if "step_alone_s" in row]
    whole = resolve_workload(spec)
    expected = run_jobs(
        [Job("A", whole, "scattered"), Job("B", whole, "scattered")],
        load_topology("dgx-h100", 2),
    )
    assert [row["step_alone_s"] for row in rows] == [j.step_alone_s for j in expected.jobs]
    assert [row["step_together_s"] for row in rows] == [j.step_together_s for j in expected.jobs]
