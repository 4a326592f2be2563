"""``ccsim bench``: a fixed set of scenarios, timed.

Each scenario runs in its own Python process so that its peak memory (the process's
maximum resident set) is its own. Reported per scenario: wall time of the simulation
(topology, schedule and replay; not interpreter start-up), peak memory, flows simulated
and flows per wall second.

For reference (issue 2): the C++ simulator ASTRA-sim's analytical backend needs 17.5 s
(congestion-unaware) and 24.2 s (congestion-aware) for the 1024-rank ring on this class
of machine, and 786 s at 4096 ranks.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from ..collective import NcclPolicy, simulate_collective
from ..errors import CcsimError, unknown_choice
from ..topology import ring_graph
from ..validate import BUNDLED, case_graph, load_case


@dataclass(frozen=True)
class Scenario:
    """One benchmark case: a ring all-reduce on a 1-D ring or a preset."""

    name: str
    description: str
    ranks: int = 0
    preset: str = ""
    nodes: int = 1
    size_bytes: int = 64 * 2**20
    chunks: int = 4
    channels: int = 1

    #: "ring": one ring all-reduce; "validate": a bundled nccl-tests case, every size as
    #: NCCL would run it (what ``ccsim validate`` does); "auto": the tuner's search of
    #: algorithm, channels and chunks at ``sizes``.
    kind: str = "ring"
    case: str = ""
    sizes: tuple[int, ...] = ()
    #: Wall time the scenario should stay under (the issue's target), or 0 for none.
    target_s: float = 0.0

    def run(self) -> list:
        """The scenario's simulated collectives."""
        if self.kind == "validate":
            case = load_case(BUNDLED / f"{self.case}.yaml")
            graph = case_graph(case)
            policy = NcclPolicy(channels=case.settings.get("channels"))
            op = str(case.settings.get("op", "all_reduce"))
            return [policy.simulate(graph, op, float(size)) for size, _, _ in case.measured]
        if self.kind == "auto":
            return [
                simulate_collective(
                    self.preset, "all_reduce", size, "auto", nodes=self.nodes,
                    chunks="auto", channels="auto", protocol="auto",
                )
                for size in self.sizes
            ]  # fmt: skip
        if self.preset:
            topology = self.preset
        else:
            # 150 GB/s links and 500 ns per hop, as in the 1-D ring case.
            topology = ring_graph(self.ranks, 150e9, 500e-9)
        return [
            simulate_collective(
                topology,
                "all_reduce",
                self.size_bytes,
                nodes=self.nodes if self.preset else None,
                chunks=self.chunks,
                channels=self.channels,
            )
        ]


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("ring-8", "ring all-reduce 64 MiB, 1-D ring of 8 GPUs, 4 chunks", ranks=8),
        Scenario("ring-64", "ring all-reduce 64 MiB, 1-D ring of 64 GPUs, 4 chunks", ranks=64),
        Scenario("ring-512", "ring all-reduce 64 MiB, 1-D ring of 512 GPUs, 4 chunks", ranks=512),
        Scenario(
            "ring-1024", "ring all-reduce 64 MiB, 1-D ring of 1024 GPUs, 4 chunks", ranks=1024
        ),
        Scenario(
            "dgx-a100x4-nic",
            "ring all-reduce 256 MiB, 4x dgx-a100, 16 channels on 8 NICs "
            "(two channels share each NIC), 4 chunks",
            preset="dgx-a100",
            nodes=4,
            size_bytes=256 * 2**20,
            channels=16,
        ),
        Scenario(
            "validate-h100x8",
            "ccsim validate of the bundled 64-GPU case H100-8N-AR-default-clusterB: 14 sizes, "
            "each as NCCL runs it (target 30 s)",
            kind="validate",
            case="H100-8N-AR-default-clusterB",
            target_s=30.0,
        ),
        Scenario(
            "auto-h100x2",
            "--algo auto --channels auto --chunks auto --proto auto on 2x dgx-h100 at 1 MiB, "
            "64 MiB and 1 GiB (target 10 s)",
            kind="auto",
            preset="dgx-h100",
            nodes=2,
            sizes=(2**20, 2**26, 2**30),
            target_s=10.0,
        ),
    )
}

QUICK = ("ring-8", "ring-64", "dgx-a100x4-nic")


def run_scenario(name: str) -> dict:
    """Run one scenario in this process and measure it."""
    scenario = SCENARIOS[name]
    start = time.perf_counter()
    results = scenario.run()
    wall = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    flows = sum(result.stats.flows for result in results)
    last = results[-1]  # several runs: the largest size's figures
    return {
        "scenario": name,
        "ranks": last.ranks,
        "flows": flows,
        "sim_time_us": last.time_us,
        "busbw_GBps": last.busbw_GBps,
        "wall_s": wall,
        "peak_MiB": peak_kib / 1024,
        "flows_per_s": flows / wall,
        "target_s": scenario.target_s or None,
    }


def run_bench(names: list[str]) -> list[dict]:
    """Run each scenario in a fresh process; return one row per scenario."""
    rows = []
    for name in names:
        if name not in SCENARIOS:
            raise unknown_choice("bench scenario", name, SCENARIOS)
        done = subprocess.run(
            [sys.executable, "-m", "simulator.cli.bench", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise CcsimError(f"bench scenario {name} failed: {done.stderr.strip()[-500:]}")
        rows.append(json.loads(done.stdout))
    return rows


def bench_table(rows: list[dict]) -> str:
    """Human-readable table of bench rows."""
    lines = [
        f"{'scenario':<16} {'ranks':>6} {'flows':>10} {'sim time':>11} {'busbw':>8} "
        f"{'wall':>8} {'peak mem':>9} {'flows/s':>11}  target",
        f"{'':<16} {'':>6} {'':>10} {'(us)':>11} {'(GB/s)':>8} {'(s)':>8} {'(MiB)':>9} {'':>11}",
    ]
    for row in rows:
        lines.append(
            f"{row['scenario']:<16} {row['ranks']:>6} {row['flows']:>10} "
            f"{row['sim_time_us']:>11.2f} {row['busbw_GBps']:>8.2f} {row['wall_s']:>8.2f} "
            f"{row['peak_MiB']:>9.0f} {row['flows_per_s']:>11.0f}  {_target(row)}"
        )
    return "\n".join(lines) + "\n"


def _target(row: dict) -> str:
    target = row.get("target_s")
    if not target:
        return ""
    return f"{'met' if row['wall_s'] <= target else 'MISSED'} (< {target:g} s)"


if __name__ == "__main__":  # one scenario per process, see run_bench
    print(json.dumps(run_scenario(sys.argv[1])))
