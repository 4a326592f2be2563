"""The same sweep on a real Dask LocalCluster, through --scheduler, and on the local
default pool gives the same rows."""

import pytest

from simulator.cli import main
from simulator.sweep import read_results, run_sweep

distributed = pytest.importorskip("distributed")

SPEC = {
    "scenario": {"collective": "all_reduce", "size": "1M", "nodes": 2},
    "axes": {
        "size": ["64K", "16M"],
        "algorithm": ["ring", "tree", "pairwise"],  # pairwise fails: an error row
        "server.nic.bandwidth": ["100Gbps", "400Gbps"],
    },
}


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        yield cluster


def test_dask_cluster_and_local_pool_give_identical_rows(cluster, tmp_path):
    with distributed.Client(cluster) as client:
        assert len(client.nthreads()) == 2
        on_dask = run_sweep(SPEC, tmp_path / "dask.csv", client=client, records=True)
    local = run_sweep(SPEC, tmp_path / "local.csv", workers=2, records=True)
    assert on_dask == local
    assert len(local) == 12
    assert [row["status"] for row in local].count("error") == 4
    # The files hold the same rows, whatever order they completed in.
    dask_lines = sorted((tmp_path / "dask.csv").read_text().splitlines())
    assert dask_lines == sorted((tmp_path / "local.csv").read_text().splitlines())


def test_cli_scheduler_option_runs_on_the_cluster(cluster, tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("scenario: {collective: all_gather, size: 1M}\naxes: {size: [64K, 1M, 16M]}\n")
    out = tmp_path / "r.csv"
    argv = ["sweep", str(spec), "--out", str(out), "--scheduler", cluster.scheduler_address]
    assert main(argv) == 0
    assert "3 run now" in capsys.readouterr().err
    assert read_results(out, spec, records=True) == run_sweep(spec, workers=1, records=True)
    assert main([*argv, "--workers", "2"]) == 2  # a cluster has its own workers
    assert "workers applies to the local pool" in capsys.readouterr().err
