"""Fit a preset's ``nccl`` constants to a measured nccl-tests run (``ccsim validate --fit``).

NCCL's tuning constants are a model its tuner ranks protocols with, not a measurement
of a given machine: on real boxes the latencies and the fractions of line rate differ
(shared/reference/README.md lists NCCL's own; the calibration runs show where they
miss). This module fits the few constants that dominate a ring's curve, by coordinate
search on the simulator itself:

* ``efficiency``: one factor on the efficiency of the case's bottleneck link types (those
  busiest in an ideal run of the largest size), capped at 1, set so that the largest
  size takes its measured time: the plateau;
* ``LL.hop``, ``LL128.hop`` and ``Simple.hop``: factors on each protocol's per-hop
  latency for the path class the case's steps cross (nvlink, pcie or network): the
  small and mid sizes;
* ``LL128.bandwidth`` and ``LL.bandwidth``: factors on those protocols' share of the link;
* ``launch``: the host's issue cost per GPU, from the small-message floor of a run whose
  processes drive several GPUs each (nccl-tests reports the mean of back-to-back calls:
  a call costs the larger of the host's issue time and the GPUs' time; see
  :func:`simulator.validate.nccl_tests.run_case`).

The objective is the mean squared log error of the time over the sizes fitted on. To
measure how well the fitted model *predicts*, :func:`fit_case` fits on every other size
and reports the error on the sizes it did not see.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from ..algorithms import build_schedule
from ..collective.policy import NcclPolicy, protocol_model
from ..collective.run import bus_factor, rank_layout, run_schedule
from ..errors import CcsimError
from ..library.nccl import LL_FITTED_TO, NVLS_FITTED_TO
from ..library.nccl_p2p import P2P_FITTED_TO
from ..library.protocol import (
    PROTOCOLS,
    PROXY_FITTED_TO,
    PROXY_GRID_S,
    Calibration,
    calibration_of,
)
from ..network.routing import path_class
from ..topology.builders import fabric_spec
from ..topology.presets import preset_files, preset_graph, read_preset
from ..topology.stacks import TCPXO_FITTED_TO, TCPXO_LATENCY_GRID_S, TCPXO_LATENCY_S
from .nccl_tests import (
    MIB,
    SMALL,
    Case,
    CaseResult,
    case_graph,
    case_topology,
    count_setting,
    run_case,
)
from .pool import Progress, TaskPool

#: Bounds on the fitted protocol bandwidth shares, to keep them physical: LL carries at
#: most 4 data bytes per 8-byte line, LL128 at most 120 of 128 bytes.
BANDWIDTH_BOUNDS = {"LL": (1 / 8, 1 / 2), "LL128": (1 / 2, 120 / 128)}
#: Multiplicative steps tried for each factor, coarse to fine.
STEPS = (0.5, 0.7, 0.85, 0.93, 1.07, 1.18, 1.4, 2.0)
FACTORS = ("efficiency", "Simple.hop", "LL128.hop", "LL.hop", "LL128.bandwidth", "LL.bandwidth")


@dataclass
class Fit:
    """The fitted constants of one case, and the errors before and after."""

    case: str
    preset: str
    path_class: str
    bottleneck: list[str]
    calibration: Calibration
    factors: dict[str, float]
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)

    def nccl_section(self) -> dict[str, Any]:
        """The fitted constants as a preset's ``nccl`` section (see topologies/README.md)."""
        cal = self.calibration
        protocols: dict[str, Any] = {}
        for name in PROTOCOLS:
            proto = cal.protocols[name]
            entry: dict[str, Any] = {
                "hop": {self.path_class: f"{proto.hop_s[self.path_class] * 1e6:.3g}us"},
                "bandwidth": round(float(proto.bandwidth), 3),
            }
            if not proto.enabled:
                entry["enabled"] = False
            protocols[name] = entry
        return {
            "launch": f"{cal.launch_s * 1e6:.3g}us",
            "efficiency": {kind: round(float(v), 3) for kind, v in cal.efficiency.items()},
            "protocols": protocols,
        }


class _CaseModel:
    """Simulated GPU times of a case's sizes under varied constants (cached per protocol)."""

    def __init__(self, case: Case, base: Calibration | None = None):
        self.case = case
        s = case.settings
        self.graph = case_graph(case)
        self.base = base if base is not None else calibration_of(self.graph)
        self.per_process = int(s.get("gpus_per_process", 1))
        self.op = str(s.get("op", "all_reduce"))
        layout = rank_layout(self.graph)
        for key in ("algorithm", "chunks", "channels"):
            if s.get(key) == "auto":
                raise CcsimError(
                    f"{case.sidecar.name}: --fit needs the {key} the run used, not auto "
                    "(force it in the run, as NCCL_ALGO / NCCL_MIN_CTAS do, and say so here)"
                )
        self.ranks = layout.ranks
        self.sizes = np.array([size for size, _, _ in case.measured], dtype=float)
        self.measured_s = np.array([t for _, t, _ in case.measured]) * 1e-6
        #: Per size, the protocol NCCL's policy runs it with (None: the fastest enabled),
        #: and what the plan records (its bandwidth factor).
        self.fixed: list[str | None] = [None] * len(self.sizes)
        self.params: list[dict[str, Any]] = [{} for _ in self.sizes]
        if str(s.get("algorithm", "nccl")) == "nccl":
            # NCCL decides from its own tuning model, not from the constants fitted here,
            # so each size's schedule and protocol stay fixed while they are fitted.
            forced = {key: s[key] for key in ("channels", "chunks") if key in s}
            policy = NcclPolicy(
                protocol=str(s.get("protocol", "auto")),
                channels=forced.get("channels"),
                chunks=forced.get("chunks"),
            )
            planned = [policy.schedule(self.graph, self.op, float(size)) for size in self.sizes]
            self.schedules = [schedule for schedule, _, _ in planned]
            self.fixed = [protocol for _, protocol, _ in planned]
            self.params = [params for _, _, params in planned]
        else:
            self.schedules = [
                build_schedule(
                    str(s.get("algorithm", "ring")),
                    self.op,
                    layout,
                    float(size),
                    chunks=count_setting(case, "chunks"),
                    channels=count_setting(case, "channels"),
                )
                for size in self.sizes
            ]
        largest = run_schedule(self.graph, self.schedules[-1])
        busy = np.array(largest.links["busy_s"])
        kinds = np.array(largest.links["link"])
        self.bottleneck = sorted(set(kinds[busy >= 0.99 * busy.max()].tolist()))
        classes = {"nvlink": 0, "pcie": 1, "network": 2}
        self.path_class = max(
            (path_class([kind]) for kind in set(kinds[busy > 0].tolist())),
            key=classes.__getitem__,
        )
        allowed = self.schedules[0].params.get("protocols") or PROTOCOLS
        self.protocols = [name for name in allowed if name in self.base.enabled()]
        if self.fixed[0] is not None:
            self.protocols = [name for name in PROTOCOLS if name in self.fixed]
        self._cache: dict[tuple, np.ndarray] = {}

    def calibration(self, factors: dict[str, float], launch_s: float) -> Calibration:
        """The base calibration with ``factors`` applied."""
        efficiency = dict(self.base.efficiency)
        for kind in self.bottleneck:
            efficiency[kind] = min(1.0, efficiency.get(kind, 1.0) * factors["efficiency"])
        protocols = dict(self.base.protocols)
        for name in PROTOCOLS:
            proto = protocols[name]
            hop = dict(proto.hop_s)
            hop[self.path_class] *= factors[f"{name}.hop"]
            protocols[name] = dataclasses.replace(proto, hop_s=hop)
        for name, (low, high) in BANDWIDTH_BOUNDS.items():
            proto = protocols[name]
            share = float(np.clip(proto.bandwidth * factors[f"{name}.bandwidth"], low, high))
            protocols[name] = dataclasses.replace(proto, bandwidth=share)
        return Calibration(launch_s, efficiency, protocols, proxy_s=self.base.proxy_s)

    def gpu_times(self, factors: dict[str, float], rows: np.ndarray) -> np.ndarray:
        """GPU time (no launch) of each size in ``rows``: with NCCL's protocol for that
        size, or the fastest enabled protocol where the case does not say."""
        best = np.full(len(rows), np.inf)
        for name in self.protocols:
            relevant = tuple(
                factors[key] for key in FACTORS if key.split(".")[0] in ("efficiency", name)
            )
            key = (name, relevant)
            if key not in self._cache:
                self._cache[key] = np.full(len(self.sizes), np.nan)
            times = self._cache[key]
            mine = [i for i in rows.tolist() if self.fixed[i] in (None, name)]
            todo = [i for i in mine if np.isnan(times[i])]
            if todo:
                self.graph.graph["nccl"] = self.calibration(factors, 0.0)
                for i in todo:
                    proto = protocol_model(self.graph, name, self.params[i])
                    times[i] = run_schedule(self.graph, self.schedules[i], protocol=proto).time_s
            keep = np.array([self.fixed[i] in (None, name) for i in rows.tolist()])
            best = np.where(keep, np.minimum(best, times[rows]), best)
        return best

    def times(self, factors: dict[str, float], launch_s: float, rows: np.ndarray) -> np.ndarray:
        """Reported time of each size in ``rows``: max(host issue, GPU time)."""
        return np.maximum(self.gpu_times(factors, rows), launch_s * self.per_process)

    def loss(self, factors: dict[str, float], launch_s: float, rows: np.ndarray) -> float:
        """Mean squared log error of the time over ``rows``."""
        sim = self.times(factors, launch_s, rows)
        return float(np.mean(np.log(sim / self.measured_s[rows]) ** 2))

    def errors(self, factors: dict[str, float], launch_s: float, rows: np.ndarray) -> dict:
        """Median absolute % errors on ``rows``: busbw (>= 1 MiB) and time (<= 64 KiB)."""
        sim = self.times(factors, launch_s, rows)
        sizes, meas = self.sizes[rows], self.measured_s[rows]
        bus = bus_factor(self.op, self.ranks)
        sim_bw, meas_bw = sizes / sim * bus, sizes / meas * bus
        big, small = sizes >= MIB, sizes <= SMALL
        out = {}
        if big.any():
            out["busbw_median_pct"] = float(np.median(np.abs(sim_bw[big] / meas_bw[big] - 1)) * 100)
        if small.any():
            out["time_median_pct"] = float(np.median(np.abs(sim[small] / meas[small] - 1)) * 100)
        return out


def fit_case(
    case: Case,
    *,
    holdout: bool = True,
    rounds: int = 3,
    base: Calibration | None = None,
    report: bool = True,
) -> Fit:
    """Fit the constants of ``case``'s preset; see the module docstring.

    The search starts from ``base`` (default: the preset's own constants), whose errors
    ``before`` reports. With ``holdout`` the fit uses every other size (from the
    smallest) and ``after`` reports the errors on the others; without it, it fits and
    reports on every size. ``report=False`` leaves ``before`` and ``after`` empty, and
    skips the simulations of the sizes not fitted on that only they need (a
    leave-one-out fold wants the constants alone).
    """
    model = _CaseModel(case, base)
    every = np.arange(len(model.sizes))
    train = every[::2] if holdout else every
    test = every[1::2] if holdout else every
    factors = dict.fromkeys(FACTORS, 1.0)
    # Launch: the host issue time per GPU that the smallest sizes' floor shows, if the
    # GPUs alone would be faster (the base value otherwise).
    smallest = train[np.argsort(model.sizes[train])[:3]]
    floor = float(np.median(model.measured_s[smallest]))
    gpu = float(np.max(model.gpu_times(factors, smallest)))
    # Only a process that drives several GPUs shows its issue cost as a floor that grows
    # with them; with one GPU per process a floor above the simulated GPU time is the
    # GPUs' own latency (fitted by the hops below), not the host's: a 2x A100 run's
    # 36 us floor read as launch had made one 8-GPU process cost 8 x 36 us per call.
    host_bound = floor > gpu and model.per_process > 1
    launch = floor / model.per_process if host_bound else model.base.launch_s
    before = model.errors(factors, model.base.launch_s, test) if report else {}
    # Efficiency: the plateau. Scale the bottleneck links' efficiency until the largest
    # size fitted on takes the measured time (twice: the latency share shifts a little).
    largest = train[np.argmax(model.sizes[train])[None]]
    for _ in range(2):
        ratio = model.gpu_times(factors, largest)[0] / model.measured_s[largest][0]
        factors["efficiency"] = round(float(factors["efficiency"] * ratio), 4)
    best = model.loss(factors, launch, train)
    for _ in range(rounds):
        improved = False
        for key in FACTORS[1:]:
            if key.split(".")[0] not in model.protocols:
                continue  # a protocol the machine does not enable
            for step in STEPS:
                trial = {**factors, key: factors[key] * step}
                if key.endswith("bandwidth"):
                    low, high = BANDWIDTH_BOUNDS[key.split(".")[0]]
                    base = model.base.protocols[key.split(".")[0]].bandwidth
                    trial[key] = float(np.clip(trial[key], low / base, high / base))
                    if trial[key] == factors[key]:
                        continue
                loss = model.loss(trial, launch, train)
                if loss < best * (1 - 1e-4):
                    best, factors, improved = loss, trial, True
        if not improved:
            break
    return Fit(
        case=case.name,
        preset=str(case.settings["preset"]),
        path_class=model.path_class,
        bottleneck=model.bottleneck,
        calibration=model.calibration(factors, launch),
        factors=factors,
        before=before,
        after=model.errors(factors, launch, test) if report else {},
    )


@dataclass(frozen=True)
class _Run:
    """One simulation of a leave-one-out fold: ``case`` with ``calibration`` (None: the
    preset's) and, if given, its NICs' network-stack latency set to ``stack_latency_s``."""

    case: Case
    calibration: Calibration | None = None
    stack_latency_s: float | None = None


def _simulate(run: _Run) -> CaseResult:
    graph = None if run.stack_latency_s is None else stack_graph(run.case, run.stack_latency_s)
    return run_case(run.case, calibration=run.calibration, graph=graph)


def _preset_fold(
    case: Case, others: list[Case], base: Calibration
) -> tuple[Calibration, CaseResult]:
    """A preset fitted to ``case``: its constants fitted on each of ``others`` in turn from
    ``base`` (the preset's unfitted constants), and ``case`` simulated with them."""
    for other in others:
        # Every other size of the other run (as ``--fit`` does): half the cost of
        # fitting on all of them, and the fit sees the whole range of sizes.
        base = fit_case(other, holdout=True, rounds=2, base=base, report=False).calibration
    return base, run_case(case, calibration=base)


def leave_one_case_out(
    cases: list[Case | None],
    results: list[CaseResult],
    *,
    proxy_grid: tuple[float, ...] = PROXY_GRID_S,
    stack_grid: tuple[float, ...] = TCPXO_LATENCY_GRID_S,
    jobs: int = 1,
    progress: Progress | None = None,
) -> None:
    """Predict every run a constant was fitted to without its own measurements; sets
    ``loco`` and ``loco_source`` of the matching results (a run nothing was fitted to
    keeps ``loco`` None: its result is already a prediction). ``results`` are the cases'
    own runs (:func:`~simulator.validate.nccl_tests.run_case` with the preset's
    constants): a fold whose left-out constant takes the value those ran with reuses
    them rather than simulate the same thing again.

    A preset's constants: start from the preset's ``unfitted`` constants (NCCL's own and
    physical figures), fit them on each other run of the same preset in turn, and
    simulate the run with the result. The network proxy's cost (one figure for every
    machine): choose it again among ``proxy_grid`` on the other runs it was fitted to
    (:func:`_choose`); TCPXO's stack latency among ``stack_grid`` likewise. Every
    simulation runs once; with ``jobs`` > 1 they run in that many processes, the preset
    fits (the longest) first and the grid runs beside them. ``progress(done, total,
    label)`` is called as each finishes."""
    folds = []
    for index, (case, result) in enumerate(zip(cases, results, strict=True)):
        if result.error or case is None:
            continue
        calibration = calibration_of(case_graph(case))
        if case.name not in calibration.fitted_to:
            continue
        base = calibration.unfitted if calibration.unfitted is not None else Calibration()
        preset = case.settings.get("preset")
        others = [
            other
            for other, done in zip(cases, results, strict=True)
            if other is not None
            and other.name != case.name
            and other.settings.get("preset") == preset
            and not done.error
        ]
        folds.append((index, case, others, base))
    proxied = _fitted(cases, results, PROXY_FITTED_TO)
    stacked = _fitted(cases, results, TCPXO_FITTED_TO)
    total = len(folds) + len(proxied) * len(proxy_grid) + len(stacked) * len(stack_grid)
    pool = TaskPool(jobs, total, progress)
    try:
        fitting = {
            index: pool.submit(
                _preset_fold, (case, others, base), f"fit {case.settings.get('preset')} "
                f"without {case.name}",
            )
            for index, case, others, base in folds
        }  # fmt: skip
        own: dict[int, Calibration] = {}
        bases: dict[int, Calibration] = {}

        def proxy_run(index: int, value: float) -> _Run | None:
            case = cases[index]
            assert case is not None  # filtered by _fitted
            if index not in own:
                own[index] = calibration_of(case_graph(case))
            base = bases.get(index) or own[index]
            if index not in bases and value == own[index].proxy_s:
                return None  # exactly the run's own simulation
            return _Run(case, dataclasses.replace(base, proxy_s=value))

        def stack_run(index: int, value: float) -> _Run | None:
            case = cases[index]
            assert case is not None  # filtered by _fitted
            return None if value == TCPXO_LATENCY_S else _Run(case, stack_latency_s=value)

        # Grid runs that need no fit's result go to the workers beside the fits.
        stack = _grid_submit(pool, cases, results, stacked, stack_grid, stack_run, "TCPXO")
        proxy = _grid_submit(
            pool, cases, results, [i for i in proxied if i not in fitting], proxy_grid,
            proxy_run, "proxy",
        )  # fmt: skip
        for index, future in fitting.items():
            base, run = pool.get(future)
            bases[index] = base
            others = next(others for i, _, others, _ in folds if i == index)
            results[index].loco = run
            results[index].loco_source = (
                "fitted on " + ", ".join(other.name for other in others)
                if others
                else "the preset's unfitted constants (no other run of this preset)"
            )
        proxy |= _grid_submit(
            pool, cases, results, [i for i in proxied if i in fitting], proxy_grid,
            proxy_run, "proxy",
        )  # fmt: skip
        # The proxy cost over every size (with no other run, the grid's first value: no
        # cost); TCPXO's latency over sizes <= 1 MiB, where latency, not rate, sets the
        # time (with no other run, the preset's).
        every = lambda run: np.ones(len(run.sizes), dtype=bool)  # noqa: E731
        _choose(
            cases, results, proxied, proxy_grid, _resolve(pool, proxy), sizes=every,
            what="network proxy", alone=proxy_grid[0],
        )  # fmt: skip
        _choose(
            cases, results, stacked, stack_grid, _resolve(pool, stack),
            sizes=lambda run: np.array(run.sizes) <= MIB, what="TCPXO stack latency",
            alone=TCPXO_LATENCY_S,
        )  # fmt: skip
    finally:
        pool.close()
    for case, result in zip(cases, results, strict=True):
        if case is not None and case.name in NVLS_FITTED_TO and result.loco is None:
            # Module constants of the library, chosen on a grid outside ccsim: say so
            # rather than call the in-sample result a prediction.
            result.loco_source = (
                "the NVLS thread-block constants were chosen on it; their "
                "leave-one-out errors are in README (not recomputed here)"
            )
        if case is not None and case.name in LL_FITTED_TO and result.loco is None:
            ll = (
                "Blackwell's LL NVLink step and share were chosen on it; their "
                "leave-one-out errors are in README (not recomputed here)"
            )
            result.loco_source = f"{result.loco_source}; {ll}" if result.loco_source else ll
        if case is not None and case.name in P2P_FITTED_TO and result.loco is None:
            result.loco_source = (
                "the all-to-all copy-out, call and LL constants were chosen on it; their "
                "leave-one-out errors are in README (not recomputed here)"
            )


def _fitted(
    cases: list[Case | None], results: list[CaseResult], names: tuple[str, ...]
) -> list[int]:
    """Indices of the runs of ``names`` that loaded and ran."""
    return [
        index
        for index, (case, result) in enumerate(zip(cases, results, strict=True))
        if case is not None and not result.error and case.name in names
    ]


GridRuns = dict[tuple[int, float], "cf.Future | CaseResult"]


def _grid_submit(
    pool: TaskPool,
    cases: list[Case | None],
    results: list[CaseResult],
    fitted: list[int],
    grid: tuple[float, ...],
    make: Callable[[int, float], _Run | None],
    what: str,
) -> GridRuns:
    """Every run of ``fitted`` at every grid value, by (index, value): submitted where
    ``make`` gives a simulation; the run's own result where it gives None (that result
    already is the simulation; counted as done)."""
    runs: GridRuns = {}
    for index in fitted:
        case = cases[index]
        assert case is not None  # filtered by _fitted
        for value in grid:
            run = make(index, value)
            label = f"{case.name}, {what} {value * 1e6:g} us"
            if run is None:
                runs[index, value] = results[index]
                pool.tick(label)
            else:
                runs[index, value] = pool.submit(_simulate, (run,), label)
    return runs


def _resolve(pool: TaskPool, runs: GridRuns) -> dict[tuple[int, float], CaseResult]:
    return {key: pool.get(v) if isinstance(v, cf.Future) else v for key, v in runs.items()}


def _choose(
    cases: list[Case | None],
    results: list[CaseResult],
    fitted: list[int],
    grid: tuple[float, ...],
    runs: dict[tuple[int, float], CaseResult],
    *,
    sizes: Callable[[CaseResult], np.ndarray],
    what: str,
    alone: float,
) -> None:
    """A constant was chosen among ``grid`` on the ``fitted`` runs: the least summed mean
    squared log time error over the sizes ``sizes(run)`` keeps. For each of them, choose
    again on the others only and predict the run with that value (``alone`` with no
    other). ``runs`` has every run at every grid value."""
    loss = _losses(runs, fitted, grid, sizes)
    for row, index in enumerate(fitted):
        names = [cases[i].name for i in fitted if i != index]  # type: ignore[union-attr]
        others = np.delete(loss, row, axis=0).sum(axis=0)
        value = grid[int(np.argmin(others))] if names else alone
        result = results[index]
        result.loco = runs[index, value]
        source = result.loco_source + "; " if result.loco_source else ""
        result.loco_source = source + (
            f"{what} {value * 1e6:g} us, chosen on " + ", ".join(names)
            if names
            else f"{what} {value * 1e6:g} us (no other run to choose it on)"
        )


def _losses(
    runs: dict[tuple[int, float], CaseResult],
    fitted: list[int],
    grid: tuple[float, ...],
    sizes: Callable[[CaseResult], np.ndarray],
) -> np.ndarray:
    """Mean squared log time error of each run (rows) at each grid value (columns), over
    the sizes ``sizes(run)`` keeps."""
    loss = np.zeros((len(fitted), len(grid)))
    for row, index in enumerate(fitted):
        for column, value in enumerate(grid):
            run = runs[index, value]
            keep = sizes(run)
            ratio = np.array(run.simulated_us)[keep] / np.array(run.measured_us)[keep]
            loss[row, column] = np.mean(np.log(ratio) ** 2)
    return loss


def stack_graph(case: Case, latency_s: float) -> nx.Graph:
    """The topology of ``case`` with its NICs' network-stack latency set to
    ``latency_s`` (what a grid fit of :data:`~simulator.topology.stacks.TCPXO_LATENCY_S`
    tries)."""
    topology, nodes = case_topology(case)
    data = read_preset(_preset_file(topology))
    data["server"]["nic"]["latency"] = latency_s
    return preset_graph(
        {**data, "fabric": fabric_spec(data.get("fabric"))},
        nodes,
        name=str(data.get("name", case.settings["preset"])),
        source=str(case.settings["preset"]),
    )


def _preset_file(topology):
    """A case's preset file (a bundled name or a file beside its sidecar)."""
    return preset_files().get(str(topology), topology)
