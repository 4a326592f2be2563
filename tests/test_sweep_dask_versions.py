"""A sweep refuses a Dask cluster whose workers run another ccsim or Python, naming them;
a runner that connects by address prints the Dask dashboard's address.

The cluster is a LocalCluster of two in-process workers; a worker "runs another
version" because the function the check runs on each worker is replaced by one that
answers differently on worker 1 (``client.run`` hands it ``dask_worker``).
"""

import platform
import re
from urllib.parse import urlparse

import pytest

import simulator
from simulator.cli import main
from simulator.sweep import SweepError, run_sweep, runners

distributed = pytest.importorskip("distributed")

SPEC = {"scenario": {"collective": "all_gather", "size": "1M"}, "axes": {"size": ["64K", "1M"]}}


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        yield cluster


def different_on_worker_1(change):
    """An ``environment`` that answers ``change(real answer)`` on worker 1 only."""
    real = runners.environment

    def environment(dask_worker=None):
        theirs = real()
        if dask_worker is not None and dask_worker.name == 1:
            return change(theirs)
        return theirs

    return environment


def test_matching_workers_run_the_sweep(cluster, tmp_path):
    with distributed.Client(cluster) as client:
        rows = run_sweep(SPEC, tmp_path / "r.csv", client=client, records=True)
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert runners.environment() == {
        "ccsim": simulator.__version__,
        "python": platform.python_version(),
    }


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda env: {**env, "ccsim": "0.0.1"}, ["has ccsim 0.0.1, Python"]),
        (lambda env: {**env, "python": "3.9.0"}, ["Python 3.9.0"]),
    ],
)
def test_a_worker_with_another_version_is_refused_by_name(
    cluster, tmp_path, monkeypatch, change, words
):
    monkeypatch.setattr(runners, "environment", different_on_worker_1(change))
    out = tmp_path / "r.csv"
    with distributed.Client(cluster) as client:
        worker = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == 1)
        other = next(a for a in client.scheduler_info()["workers"] if a != worker)
        with pytest.raises(SweepError) as refused:
            run_sweep(SPEC, out, client=client)
    message = str(refused.value)
    assert f"1 of 2 Dask workers differ from this process (ccsim {simulator.__version__}" in message
    assert worker in message and other not in message
    for word in words:
        assert word in message
    assert "same ccsim and Python on every worker" in message and "\n" not in message
    assert not out.exists() or "ok" not in out.read_text()  # no point ran


def test_a_worker_that_cannot_run_ccsim_is_refused(cluster, tmp_path, monkeypatch):
    def broken(env):
        raise ModuleNotFoundError("No module named 'simulator'")

    monkeypatch.setattr(runners, "environment", different_on_worker_1(broken))
    with distributed.Client(cluster) as client, pytest.raises(SweepError) as refused:
        run_sweep(SPEC, client=client)
    assert "cannot run ccsim (ModuleNotFoundError: No module named 'simulator')" in str(
        refused.value
    )


def test_cli_prints_the_dashboard_and_refuses_with_one_line(cluster, tmp_path, monkeypatch, capsys):
    pytest.importorskip("bokeh")  # the scheduler serves a dashboard only with bokeh
    spec = tmp_path / "s.yaml"
    spec.write_text("scenario: {collective: all_gather, size: 1M}\naxes: {size: [64K]}\n")
    argv = ["sweep", str(spec), "--out", str(tmp_path / "r.csv")]
    argv += ["--scheduler", cluster.scheduler_address]
    assert main(argv) == 0
    err = capsys.readouterr().err
    shown = re.search(r"ccsim: Dask dashboard at (\S+)", err)
    assert shown, err
    # The scheduler's own address for it (an in-process client names the host localhost).
    assert urlparse(shown[1]).port == urlparse(cluster.dashboard_link).port
    assert shown[1].startswith("http://") and shown[1].endswith("/status")

    monkeypatch.setattr(
        runners, "environment", different_on_worker_1(lambda env: {**env, "ccsim": "9"})
    )
    argv[3] = str(tmp_path / "again.csv")  # points to run: the check comes first
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("ccsim: Dask dashboard at ")
    assert len(lines) == 2 and "has ccsim 9" in lines[1]
