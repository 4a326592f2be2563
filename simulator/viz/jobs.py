"""Several jobs on one cluster, for people: tables, rows and a timeline grouped by job.

Reads :class:`~simulator.workload.jobs.JobsRun` results; writes nothing itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import networkx as nx
import numpy as np

from ..workload.engine import _ranges as rank_ranges
from ..workload.jobs import SEED_STATISTICS, JobsRun, JobsWorkload, slowdown_over_seeds
from ..workload.placement import PlacementError
from .records import Timeline
from .workload import workload_timeline

#: Shared links a table lists (most bytes first); JSON lists them all.
SHARED_ROWS = 12


def _ranges(values: Sequence[int]) -> str:
    """``0-7,16``: GPUs as short ranges, in ascending order.

    >>> _ranges([3, 0, 1, 2, 8])
    '0-3,8'
    """
    return rank_ranges(sorted(values))


def job_rows(result: JobsRun) -> list[dict[str, Any]]:
    """One row per job: its GPUs, steps alone and together (seconds), slowdown."""
    return [
        {
            "job": job.name,
            "workload": job.workload,
            "gpus": _ranges(job.gpus.tolist()),
            "seed": result.seed,
            "step_alone_s": job.step_alone_s,
            "step_together_s": job.step_together_s,
            "slowdown": job.slowdown,
        }
        for job in result.jobs
    ]


def shared_rows(result: JobsRun) -> list[dict[str, Any]]:
    """One row per link where the jobs met: endpoints, type, bandwidth, bytes per job."""
    return [
        {
            "link": f"{link.src}->{link.dst}",
            "type": link.link,
            "bandwidth_Bps": link.bandwidth,
            **{f"bytes_{name}": nbytes for name, nbytes in link.bytes_by_job.items()},
        }
        for link in result.shared
    ]


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Columns aligned: the first ``left`` (names) to the left, the others (numbers) to
    the right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i >= left else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def jobs_table(result: JobsRun, *, title: str = "") -> str:
    """The jobs' steps alone and together and the links where they met, as text."""
    rows = [
        [job.name, job.workload, _ranges(job.gpus.tolist()), f"{job.step_alone_s * 1e3:.3f}",
         f"{job.step_together_s * 1e3:.3f}", f"{job.slowdown:.4f}"]
        for job in result.jobs
    ]  # fmt: skip
    out = [f"# {title}"] if title else []
    out.append(
        _table(["job", "workload", "GPUs", "alone (ms)", "together (ms)", "slowdown"], rows, 3)
    )
    names = [job.name for job in result.jobs]
    if result.shared:
        out.append(
            f"\n# links where the jobs met: {len(result.shared)} (bytes of more than one job; "
            f"the {min(SHARED_ROWS, len(result.shared))} busiest)"
        )
        links = [
            [f"{link.src}->{link.dst}", link.link, f"{link.bandwidth / 1e9:.2f}",
             *(f"{link.bytes_by_job.get(n, 0.0) / 2**20:.1f}" for n in names)]
            for link in result.shared[:SHARED_ROWS]
        ]  # fmt: skip
        out.append(_table(["link", "type", "GB/s", *(f"{n} (MiB)" for n in names)], links, 2))
    else:
        out.append("\n# the jobs met on no link (no link carried bytes of more than one job)")
    if result.bytes_mismatch > 1e-9:
        out.append(
            f"# warning: bytes per job add up to the links' within {result.bytes_mismatch:.2e}"
        )
    return "\n".join(out) + "\n"


def seeds_rows(runs: Sequence[JobsRun]) -> list[dict[str, Any]]:
    """Per job, its slowdown's median, p90, min and max over the runs' seeds."""
    stats = slowdown_over_seeds(runs)
    return [
        {"job": name, "seeds": len(runs), **{f"slowdown_{k}": v[k] for k in SEED_STATISTICS}}
        for name, v in stats.items()
    ]


def seeds_table(runs: Sequence[JobsRun], *, title: str = "") -> str:
    """Each job's slowdown per seed, then its median, p90, min and max."""
    names = [job.name for job in runs[0].jobs]
    per_seed = [
        [str(run.seed), *(f"{job.slowdown:.4f}" for job in run.jobs), str(len(run.shared))]
        for run in runs
    ]
    out = [f"# {title}"] if title else []
    out.append(_table(["seed", *(f"{n} slowdown" for n in names), "links met"], per_seed))
    stats = slowdown_over_seeds(runs)
    rows = [[n, *(f"{stats[n][k]:.4f}" for k in SEED_STATISTICS)] for n in names]
    out.append(f"\n# slowdown over {len(runs)} ECMP seeds")
    out.append(_table(["job", *SEED_STATISTICS], rows))
    return "\n".join(out) + "\n"


def jobs_timeline(result: JobsRun, graph: nx.Graph | None = None) -> Timeline:
    """The jobs' run together as a timeline with one row group per job: tracks are
    ``"<job> rank r <stream>"`` (the job's own rank), grouped (a Perfetto process each)
    by job, merged by ``"<job> server s <stream>"`` when there are too many to draw."""
    run = result.together
    workload = run.workload
    if not isinstance(workload, JobsWorkload):
        raise PlacementError("jobs_timeline takes the result of run_jobs")
    base = workload_timeline(run, graph)
    owner: dict[int, tuple[str, int]] = {}
    for part in workload.parts:
        for rank, gpu in enumerate(part.gpus.tolist()):
            owner[gpu] = (part.name, rank)
    tracks = []
    for track in base.tracks:
        name, rank = owner[track.rank]
        stream = track.name.split(" ", 2)[2]
        unit = track.group or "ranks"
        tracks.append(
            track._replace(
                name=f"{name}:rank {rank} {stream}",
                group=f"job {name}",
                category=f"{name}:{unit.replace(' ', '-')} {stream}",
            )
        )
    # Rows in job order, then by the job's rank (the base order is by GPU).
    order = sorted(range(len(tracks)), key=lambda i: (tracks[i].group, owner[tracks[i].rank][1]))
    position = {old: new for new, old in enumerate(order)}
    title = " · ".join(
        f"{job.name}: {job.workload} on GPUs {_ranges(job.gpus.tolist())}, step "
        f"{job.step_together_s * 1e3:.3f} ms ({job.slowdown:.3f}x alone)"
        for job in result.jobs
    )
    return dataclasses.replace(
        base,
        tracks=[tracks[i] for i in order],
        track=np.array([position[i] for i in range(len(order))], dtype=np.int64)[base.track],
        title=title,
        meta={**base.meta, "jobs": [job.name for job in result.jobs]},
    )
