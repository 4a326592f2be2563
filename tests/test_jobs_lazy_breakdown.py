"""``run_jobs`` works each job's breakdowns out only when they are read
(``JobResult.alone`` / ``.together``): the steps it reports without them must be the
breakdowns' steps, and the breakdowns those of each job's part of the runs.

The case is tests/test_jobs.py's hand-computed one: two 2-rank all-reduces of 125 MB
after 1 ms of compute, on a 2:1 leaf-spine of one-GPU servers with 12.5 GB/s NICs,
crossing the same 12.5 GB/s uplink: 11 ms alone, 21 ms together.
"""

from __future__ import annotations

import pytest

from simulator.workload.jobs import job_runs
from simulator.workload.metrics import breakdown
from tests.test_jobs import MS, NIC, interleaved_pair


def test_steps_without_breakdowns_are_the_breakdowns_steps():
    size = 125e6
    result = interleaved_pair(size)
    for job, single in zip(result.jobs, result.alone, strict=True):
        assert "alone" not in vars(job) and "together" not in vars(job)  # not worked out yet
        # Hand-computed (tests/test_jobs.py): 1 ms + two S/2 steps at 12.5 or 6.25 GB/s.
        assert job.step_alone_s == pytest.approx(1 * MS + size / NIC, rel=1e-12)
        assert job.step_together_s == pytest.approx(1 * MS + 2 * size / NIC, rel=1e-12)
        # Read now: each is the breakdown of the job's part of its run, worked out once.
        assert job.alone == breakdown(job_runs(single)[job.name])
        assert job.together == breakdown(job_runs(result.together)[job.name])
        assert job.alone is job.alone
        assert job.alone.step_s == job.step_alone_s
        assert job.together.step_s == job.step_together_s
        # Compute (1 ms) is each rank's; the rest of the step is communication.
        for rank in job.alone.ranks:
            assert rank.compute_s == pytest.approx(1 * MS, rel=1e-12)
