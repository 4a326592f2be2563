"""`ccsim validate --detail` shows NCCL's own predicted time of the pair it picked beside
ccsim's (issue 32, helper h53h), so that a small-message miss NCCL's tuning model shares
can be told from one that is ccsim's. The figures are worked by hand from NCCL's source
at tag v2.30.4-1 (src/graph/tuning.cc; the same constants at v2.30.7-1):

* base latency Ring/LL 6.6 us (line 146); NVLink step LL 0.6 us (line 154); network step
  Ring/LL 2.7 us (line 166);
* a Ring call that spans servers pays (nsteps - nInterSteps) steps at max(NVLink step,
  net overhead) and nInterSteps network steps (lines 379-387); the net overhead is 1 us
  on Intel and other non-AMD hosts (getNetOverhead, lines 222-227); an all-gather has
  nsteps = nRanks - 1 and nInterSteps = nNodes - 1 (lines 276-278, 386);
* above the latency only bytes / bandwidth: LL's ring bus bandwidth is at most llMaxBw,
  39 GB/s for Intel hosts on 2 nodes (lines 174, 312), times nRanks / nsteps.
"""

from __future__ import annotations

import json

from simulator.cli import main
from simulator.validate import load_case, run_case
from simulator.validate.nccl_tests import case_parts, join_results

RANKS, NODES = 16, 2
# 6.6 + (15 - 1) x max(0.6, 1.0) + 1 x 2.7 = 23.3 us
RING_LL_ALL_GATHER_US = 6.6 + (RANKS - 1 - (NODES - 1)) * max(0.6, 1.0) + (NODES - 1) * 2.7
# LL's ring algorithm bandwidth is at most llMaxBw x nRanks / nsteps = 39 x 16 / 15 GB/s;
# a floor of 10 GB/s (far under the ring's channels x >= 20 GB/s x 0.5) bounds it below.
LL_ALGBW_CAP_GBPS = 39.0 * RANKS / (RANKS - 1)
LL_ALGBW_FLOOR_GBPS = 10.0


def _case(tmp_path, sizes, algorithm="nccl"):
    """A 2 x 8 H200 all-gather sidecar (as the A3 Ultra runs ran it) with made-up times:
    the NCCL model column does not depend on them."""
    (tmp_path / "ag.yaml").write_text(
        f"preset: hgx-h200\nnodes: {NODES}\nop: all_gather\nalgorithm: {algorithm}\n"
    )
    rows = "".join(f"{size},30.0,0.1,0.1\n" for size in sizes)
    (tmp_path / "ag.csv").write_text("bytes,time_us_oop,algbw_oop,busbw_oop\n" + rows)
    return load_case(tmp_path / "ag.yaml")


def test_all_gather_across_two_servers_is_priced_at_nccl_s_ring_ll_latency(tmp_path):
    sizes = (1024, 4096, 16384)
    result = run_case(_case(tmp_path, sizes))
    assert result.algorithms == ["Ring"] * 3 and result.protocols == ["LL"] * 3
    for size, model in zip(sizes, result.nccl_model_us, strict=True):
        assert model is not None
        fastest = RING_LL_ALL_GATHER_US + size / (LL_ALGBW_CAP_GBPS * 1e3)
        slowest = RING_LL_ALL_GATHER_US + size / (LL_ALGBW_FLOOR_GBPS * 1e3)
        assert fastest <= model * (1 + 1e-9) and model < slowest


def test_forced_ccsim_algorithm_has_no_nccl_model_time(tmp_path, capsys):
    result = run_case(_case(tmp_path, (1024,), algorithm="ring"))
    assert result.nccl_model_us == [None]
    assert main(["validate", "--data", str(tmp_path), "--detail"]) == 0
    out = capsys.readouterr().out
    header, row = out.split("# ag\n")[1].splitlines()[:2]
    assert header.endswith("channels  nccl model (us)")
    assert row.endswith("-")


def test_detail_json_and_split_runs_carry_the_column(tmp_path, capsys):
    sizes = (1024, 2048, 4096, 8192)
    case = _case(tmp_path, sizes)
    whole = run_case(case)
    # The pooled runner's parts, joined, give the whole run's figures size by size.
    joined = join_results(case, [run_case(part) for part in case_parts(case, 2)])
    assert joined.nccl_model_us == whole.nccl_model_us
    assert main(["validate", "--data", str(tmp_path), "--detail", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert [size["nccl_model_us"] for size in row["sizes"]] == whole.nccl_model_us
