"""``ccsim validate`` at scale (issue 32): a case's sizes spread over ``--jobs`` processes
give the very results one process gives, and the command says how it is going and what it
cost."""

from __future__ import annotations

import dataclasses
import re

from simulator.cli import main
from simulator.cli.validate import _Clock
from simulator.validate import BUNDLED, load_case, run_case
from simulator.validate.nccl_tests import case_parts, join_results, run_cases

FIELDS = (
    "sizes", "measured_us", "measured_busbw", "simulated_us", "simulated_busbw",
    "protocols", "algorithms", "channels",
)  # fmt: skip


def _b200(sizes: tuple[int, ...] = (8, 2**20, 2**26)) -> object:
    """The B200 server run cut to sizes that NCCL runs three ways (Ring/LL, then NVLS)."""
    case = load_case(BUNDLED / "B200-1N-AR-Vultr.yaml")
    return dataclasses.replace(case, measured=[row for row in case.measured if row[0] in sizes])


def test_a_case_cut_into_parts_runs_as_the_whole():
    """Sizes share no state: parts of a case (every size alone, or two parts) simulated
    apart and joined equal the whole case, bit for bit (the reference is the one-process
    path, run_case over every size)."""
    case = _b200()
    whole = run_case(case)
    assert len(set(whole.algorithms)) > 1  # the sizes do not all run alike
    for count in (3, 2):
        parts = case_parts(case, count)
        assert sorted(row for part in parts for row in part.measured) == sorted(case.measured)
        joined = join_results(case, [run_case(part) for part in parts])
        for name in FIELDS:
            assert getattr(joined, name) == getattr(whole, name), (count, name)
        assert joined.fitted == whole.fitted


def test_parts_share_the_largest_sizes_out():
    """Round by size, largest first: with 2 parts of 3 sizes, the largest and the
    smallest go together, the middle one alone; with more parts than sizes, one size
    each."""
    case = _b200()
    sizes = [[row[0] for row in part.measured] for part in case_parts(case, 2)]
    assert sizes == [[8, 2**26], [2**20]]
    assert len(case_parts(case, 8)) == 3


def test_a_part_that_fails_fails_the_case():
    case = _b200()
    parts = case_parts(case, 2)
    ok = run_case(parts[0])
    broken = dataclasses.replace(run_case(parts[1]), error="boom")
    joined = join_results(case, [ok, broken])
    assert joined.error == "boom" and joined.sizes == []


def test_two_processes_give_the_same_results_and_report_each_size():
    case = _b200()
    heard = []
    pooled = run_cases(
        [(case.name, lambda: case)], jobs=2, progress=lambda *call: heard.append(call)
    )
    serial = run_cases([(case.name, lambda: case)])
    for name in FIELDS:
        assert getattr(pooled[0], name) == getattr(serial[0], name), name
    # Every size once, then the case's end once, last.
    sizes = sorted(size for _, size in heard if size is not None)
    assert sizes == sorted(row[0] for row in case.measured)
    assert heard[-1] == (case.name, None) and [s for _, s in heard].count(None) == 1


def test_validate_ends_with_its_wall_and_cpu_time(tmp_path, capsys):
    case = _b200((8,))
    (tmp_path / "one.csv").write_text(
        "bytes,time_us_oop,algbw_oop,busbw_oop,time_us_ip,algbw_ip,busbw_ip\n"
        + "".join(f"{size},{us},0,{bw},{us},0,{bw}\n" for size, us, bw in case.measured)
    )
    (tmp_path / "one.yaml").write_text("preset: hgx-b200\nnodes: 1\nop: all_reduce\n")
    assert main(["validate", "--data", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(
        r"ccsim: validate: 1 case\(s\) in ([\d.]+) s wall, ([\d.]+) s CPU \(all processes\)",
        last,
    )
    assert match, last


def test_progress_lines_say_what_ended_out_of_how_many(capsys):
    report = _Clock().lines("validate --loco", delay=0.0)
    report(3, 42, "fit dgx-a100 without A100-1N-AR-g8")
    line = capsys.readouterr().err
    assert re.fullmatch(
        r"ccsim: validate --loco \[3/42\] fit dgx-a100 without A100-1N-AR-g8 \(\d+ s\)\n", line
    ), line
    quiet = _Clock().lines("validate", delay=3600.0)  # not yet: the bar's delay
    quiet(1, 2, "x")
    assert capsys.readouterr().err == ""


def test_the_rack_cases_are_whole_racks_and_pass_the_guard():
    """Issue 32's 1,440-GPU case and its 2-rack sibling (coreweave/nccl-tests' README):
    72 GPUs a rack, as many ranks as the run printed, each sidecar citing its source,
    and both within the resource guard's default limit (they run, not refused)."""
    from simulator.topology import gpu_nodes
    from simulator.validate.nccl_tests import case_graph, check_case, sidecars

    folder = BUNDLED.parent / "nccl-tests-racks"
    ranks = {}
    for sidecar in sidecars(folder):
        assert ("coreweave/nccl-tests" in sidecar.read_text()) == ("coreweave" in sidecar.stem)
        assert "Source:" in sidecar.read_text()
        case = load_case(sidecar)
        check_case(case)
        ranks[case.name] = len(gpu_nodes(case_graph(case)))
    # Issue 32's 64-GPU all-to-all across two racks (32 GPUs of each) is here for its CPU.
    assert ranks == {
        "GB200-144-AR-coreweave": 144,
        "GB200-1440-AR-coreweave": 1440,
        "GB200-2R16N-A2A-a4x-pedia": 64,
    }
