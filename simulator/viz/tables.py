"""Tables of result rows: nccl-tests style text, JSON, CSV and Markdown.

Writers take plain rows (dicts or result dataclasses) and return text; files are written
through :mod:`simulator.files`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..algorithms.chain import ROOTED_OPS

if TYPE_CHECKING:  # types only: tables read these results, they never run them
    from ..topology.bom import BillOfMaterials
    from ..validate.calibrate import Fit
    from ..validate.nccl_tests import CaseResult
    from ..workload.devices import Device
    from ..workload.memory import MemoryEstimate
    from ..workload.metrics import Breakdown


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | Mapping[str, str],
    *,
    formats: Mapping[str, str] | None = None,
) -> str:
    """A GitHub-flavoured Markdown table of ``rows``.

    Parameters
    ----------
    rows : sequence of mappings
        One mapping per table row.
    columns : sequence of keys, or mapping of key to header
        Which keys to show, in order (and their headers).
    formats : mapping of key to format spec, optional
        ``format(value, spec)`` for those keys (e.g. ``{"busbw_GBps": ".1f"}``); others
        print with ``str``.

    Examples
    --------
    >>> print(markdown_table([{"size": 1024, "bw": 1.234}], {"size": "size (B)", "bw": "GB/s"},
    ...                      formats={"bw": ".1f"}))
    | size (B) | GB/s |
    |---:|---:|
    | 1024 | 1.2 |
    """
    headers = dict(columns) if isinstance(columns, Mapping) else {key: key for key in columns}
    formats = dict(formats or {})

    def cell(row: Mapping[str, Any], key: str) -> str:
        value = row.get(key, "")
        if value is None or value == "":
            return ""
        return format(value, formats[key]) if key in formats else str(value)

    numeric = {
        key: all(isinstance(row.get(key), int | float) for row in rows if row.get(key) is not None)
        for key in headers
    }
    lines = [
        "| " + " | ".join(headers.values()) + " |",
        "|" + "|".join("---:" if numeric[key] else "---" for key in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(row, key) for key in headers) + " |" for row in rows]
    return "\n".join(lines)


FORMATS = ("table", "json", "csv")

#: Keys of a collective row, in ``--format json`` and ``csv``.
COLLECTIVE_KEYS = ("op", "algorithm", "ranks", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps")
#: ``ccsim collective --format csv``: those, then how each size ran: the library's own
#: algorithm (NCCL's name; "-" when no library chose), the protocol, channels and chunks
#: (what the table prints below it).
RUN_KEYS = (*COLLECTIVE_KEYS, "library_algorithm", "protocol", "channels", "chunks")

_REDOP = {
    "all_reduce": "sum",
    "reduce_scatter": "sum",
    "reduce": "sum",
    "all_gather": "none",
    "broadcast": "none",
    "all_to_all": "none",
}


def element_count(op: str, size_bytes: int, ranks: int, type_size: int = 4) -> int:
    """The ``count`` column as nccl-tests prints it: elements per rank's send buffer.

    For all-gather and reduce-scatter nccl-tests' size is the whole gathered buffer and
    the count is one rank's share of it.
    """
    count = size_bytes // type_size
    return count // ranks if op in ("all_gather", "reduce_scatter", "all_to_all") else count


def collective_table(rows: Sequence[dict[str, Any]], *, title: str = "", root: int = 0) -> str:
    """nccl-tests' table, column for column (its ``src/util.cu``): size, count, type,
    redop, root, then time, algbw, busbw and #wrong out-of-place and again in-place, and
    the average-busbw footer.

    Whitespace-split fields sit where nccl-tests' do (busbw is ``awk '{print $8}'``).
    ccsim does not model in-place buffers, so the in-place columns repeat the
    out-of-place ones, and it checks no data, so #wrong is N/A (as nccl-tests prints
    with ``-c 0``); the header says both. ``root`` is printed for broadcast and reduce,
    -1 otherwise, as nccl-tests does.

    >>> row = {"op": "all_reduce", "size_bytes": 1048576, "ranks": 8, "time_us": 19.6,
    ...        "algbw_GBps": 53.5, "busbw_GBps": 93.6}
    >>> print(collective_table([row]).splitlines()[-2][:84])
         1048576        262144     float     sum      -1    19.60   53.50   93.60    N/A
    """
    out = io.StringIO()
    if title:
        out.write(f"# {title}\n#\n")
    out.write(
        "# in-place columns repeat out-of-place (ccsim does not model in-place buffers); "
        "#wrong is N/A (no data is checked)\n#\n"
    )
    lead = "# %10s  %12s  %8s  %6s  %6s"
    names = ("time", "algbw", "busbw", "#wrong") * 2
    units = ("(us)", "(GB/s)", "(GB/s)", "") * 2
    for line in (
        lead % ("", "", "", "", "") + "           out-of-place                       in-place",
        lead % ("size", "count", "type", "redop", "root") + _FIGURES % names,
        lead % ("(B)", "(elements)", "", "", "") + _FIGURES % units,
    ):
        out.write(line.rstrip() + "\n")
    for row in rows:
        count = element_count(row["op"], row["size_bytes"], row["ranks"])
        # nccl-tests prints "  %7s  %6s  %6s    N/A" when it checks no data
        figures = (
            f"  {_fixed(row['time_us'], 7)}  {_fixed(row['algbw_GBps'], 6)}  "
            f"{_fixed(row['busbw_GBps'], 6)}    N/A"
        )
        out.write(
            f"{row['size_bytes']:>12}  {count:>12}  {'float':>8}  {_REDOP[row['op']]:>6}  "
            f"{root if row['op'] in ROOTED_OPS else -1:>6}{figures}{figures}\n"
        )
    if rows:
        average = sum(row["busbw_GBps"] for row in rows) / len(rows)
        out.write(f"# {'Avg bus bandwidth':<20} : {average:g}\n")
    return out.getvalue()


#: nccl-tests' headers of the out-of-place and in-place columns: time, algbw, busbw, #wrong.
_FIGURES = "  %7s  %6s  %6s  %6s" * 2


def _fixed(value: float, width: int) -> str:
    """A figure in ``width`` characters, as nccl-tests' ``getFloatStr``: two decimals,
    then fewer, then an exponent when the number does not fit.

    >>> _fixed(12.345, 7), _fixed(123456.7, 7), _fixed(12345678.0, 7)
    ('  12.35', ' 123457', '1.2e+07')
    """
    for spec in (".2f", ".1f", ".0f"):
        text = f"{value:{width}{spec}}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def to_json(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a JSON list; floats printed with repr, so output is byte-reproducible.
    JSON has no infinity or NaN: a non-finite number is written as null.

    >>> to_json([{"time_us": 1.5, "busbw_GBps": float("inf")}]).split()
    ['[', '{', '"time_us":', '1.5,', '"busbw_GBps":', 'null', '}', ']']
    """
    return json.dumps(finite(list(rows)), indent=2, allow_nan=False) + "\n"


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (inf, -inf, NaN) replaced by None, in
    nested dicts, lists and tuples too.

    >>> finite({"a": [1.0, float("nan")], "b": -float("inf")})
    {'a': [1.0, None], 'b': None}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def to_csv(rows: Sequence[dict[str, Any]], keys: Sequence[str] | None = None) -> str:
    """Rows as CSV with a header line: ``keys``, else every key of any row in the order
    first seen (rows of different kinds, such as the bench's collective and workload
    scenarios, leave the cells they do not have empty).

    >>> print(to_csv([{"a": 1}, {"a": 2, "b": 3}]), end="")
    a,b
    1,
    2,3
    """
    out = io.StringIO()
    keys = list(keys or dict.fromkeys(key for row in rows for key in row))
    writer = csv.DictWriter(out, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: row.get(key, "") for key in keys})
    return out.getvalue()


def compare_table(rows: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """Bus bandwidth (GB/s) per size (rows) and algorithm (columns), and the winner."""
    algorithms = list(dict.fromkeys(row["algorithm"] for row in rows))
    sizes = list(dict.fromkeys(row["size_bytes"] for row in rows))
    cell = {(row["size_bytes"], row["algorithm"]): row for row in rows}
    width = max([12, *(len(name) + 1 for name in algorithms)])
    lines = [f"# {title}", "#"] if title else []
    lines.append(f"#{'size':>11}" + "".join(f"{name:>{width}}" for name in algorithms) + "  winner")
    lines.append(f"#{'(B)':>11}" + "".join(f"{'(GB/s)':>{width}}" for _ in algorithms))
    for size in sizes:
        line = f"{size:>12}"
        winner = ""
        for name in algorithms:
            row = cell.get((size, name))
            line += f"{row['busbw_GBps']:>{width}.2f}" if row else f"{'-':>{width}}"
            if row and row["winner"]:
                how = [f"{row['protocol']}"] if row.get("protocol", "-") != "-" else []
                how += [f"{row['channels']} ch", f"chunks {row['chunks']}"]
                winner = f"{name} ({', '.join(how)})"
        lines.append(f"{line}  {winner}")
    # What each column is: the library's choice, the library forced to an algorithm, or
    # the ideal model (an upper bound), so that columns are not misread as alike.
    models = {}
    for row in rows:
        models.setdefault(row["algorithm"], set()).add(row.get("model", "ideal"))
    if any(model != {"ideal"} for model in models.values()):
        said = [f"{name}: {', '.join(sorted(model))}" for name, model in models.items()]
        lines.append("# models: " + "; ".join(said))
    return "\n".join(lines) + "\n"


def report_table(results: list[CaseResult]) -> str:
    """The per-case error table: median absolute errors of busbw (>= 1 MiB), of busbw in
    the 1-32 MiB middle and of time (<= 64 KiB), in-sample and left-one-case-out, the
    largest busbw error and the number of sizes; then the median over the cases.

    "loco" is the error of the run predicted without its own measurements (constants
    fitted on the other runs only); for a run its preset was never fitted to it is the
    in-sample error, marked with "=". Cases the preset was fitted to are marked "*".
    """
    groups = (("busbw", "busbw >= 1 MiB"), ("mid", "busbw 1-32 MiB"), ("time", "time <= 64 KiB"))
    width = max([26, *(len(result.name) + 2 for result in results)])
    head = f"{'case':<{width}}" + "".join(f" {title:>21}" for _, title in groups)
    head += f" {'busbw':>7} {'sizes':>6}"
    sub = f"{'':<{width}}" + f" {'median':>7} {'loco':>13}" * len(groups)
    sub += f" {'max':>7} {'n':>6}"
    lines = [head, sub]

    def pct(value: float | None) -> str:
        return f"{value:6.1f}%" if value is not None else f"{'-':>7}"

    rows = []
    for result in results:
        if result.error:
            lines.append(f"{result.name:<{width}} error: {result.error}")
            continue
        row = result.summary()
        rows.append(row)
        name = f"{result.name}{' *' if result.fitted else ''}"
        line = f"{name:<{width}}"
        for what, _ in groups:
            mark = " " if result.fitted else "="
            loco = pct(row[f"loco_{what}_median_pct"])
            line += f" {pct(row[f'{what}_median_pct'])} {mark:>5}{loco}"
        line += f" {pct(row['busbw_max_pct'])} {len(result.sizes):>6}"
        lines.append(line)
    if rows:
        line = f"{'median over cases':<{width}}"
        for what, _ in groups:
            line += f" {pct(_median(rows, f'{what}_median_pct'))} {'':>5}"
            line += pct(_median(rows, f"loco_{what}_median_pct"))
        lines.append(line)
    for result in results:
        if result.fitted:
            lines.append(
                f"* {result.name}: constants were fitted to it; loco: "
                + (result.loco_source or "not computed (ccsim validate --loco)")
            )
    return "\n".join(lines) + "\n"


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return float(statistics.median(values)) if values else None


def fit_report(fits: list[Fit], *, holdout: bool) -> str:
    """The errors before and after each fit, then the fitted ``nccl`` sections."""
    import yaml

    where = "on the sizes left out of the fit" if holdout else "on every size (fitted on all)"
    lines = [
        f"median absolute error {where}: preset's constants -> fitted",
        f"{'case':<26} {'busbw >= 1 MiB':>20} {'time <= 64 KiB':>20}",
    ]

    def pair(fit: Fit, key: str) -> str:
        if key not in fit.after:
            return f"{'-':>20}"
        return f"{fit.before[key]:8.1f}% -> {fit.after[key]:5.1f}%"

    for fit in fits:
        lines.append(
            f"{fit.case:<26} {pair(fit, 'busbw_median_pct')} {pair(fit, 'time_median_pct')}"
        )
    for fit in fits:
        lines += [
            "",
            f"# {fit.case}: preset {fit.preset}; steps cross {fit.path_class} links; "
            f"plateau set by {', '.join(fit.bottleneck)}",
            yaml.safe_dump({"nccl": fit.nccl_section()}, sort_keys=False).rstrip(),
        ]
    return "\n".join(lines) + "\n"


def breakdown_table(
    result: Breakdown,
    *,
    title: str = "",
    per_rank: bool = False,
    memory: MemoryEstimate | None = None,
    device: Device | None = None,
    model_flops: float = 0.0,
    precision: str = "bf16",
) -> str:
    """Human-readable breakdown: categories in ms (mean and max over ranks) and shares;
    with ``model_flops`` (the step's FLOPs as Megatron-LM counts them, no recomputation),
    TFLOP/s per GPU and their share of ``device``'s dense peak in ``precision`` (MFU);
    with ``memory``, the peak memory per GPU by kind (GB = 1e9 bytes) and whether it
    fits in ``device``'s."""
    step = result.step_s
    lines = [f"# {title}", "#"] if title else []
    lines.append(f"{'step time':<28} {step * 1e3:>12.3f} ms")
    lines.append(f"{'':<28} {'mean (ms)':>12} {'max (ms)':>12} {'share':>7}")
    for label, name in (
        ("compute busy", "compute_s"),
        ("communication busy", "comm_s"),
        ("  overlapped with compute", "overlapped_s"),
        ("  exposed", "exposed_s"),
        ("waiting for peers", "waiting_s"),
        ("bubble (nothing running)", "bubble_s"),
    ):
        mean = result.mean(name)
        lines.append(
            f"{label:<28} {mean * 1e3:>12.3f} {result.max(name) * 1e3:>12.3f} "
            f"{mean / step if step else 0:>7.1%}"
        )
    if result.exposed_by_kind:
        lines.append("")
        lines.append(f"{'exposed communication by':<28} {'mean (ms)':>12} {'share':>7}")
        for kind, value in result.exposed_by_kind.items():
            lines.append(f"  {kind:<26} {value * 1e3:>12.3f} {value / step if step else 0:>7.1%}")
        for call, value in result.exposed_by_call.items():
            lines.append(f"  {call:<26} {value * 1e3:>12.3f} {value / step if step else 0:>7.1%}")
    if model_flops and step:
        per_gpu = model_flops / step / len(result.ranks)
        peak = (
            f" (MFU {per_gpu / device.peak(precision):.1%} of {device.name}'s dense "
            f"{precision} peak, {device.peak(precision) / 1e12:,.0f})"
            if device
            else ""
        )
        lines.append(f"{'model TFLOP/s per GPU':<28} {per_gpu / 1e12:>12.1f}{peak}")
        lines.append("  (model FLOPs as Megatron-LM counts them: no recomputation)")
    if memory is not None:
        lines.append("")
        lines.append(f"{'memory per GPU (peak rank)':<28} {'GB':>12}")
        for label, value in (
            ("weights", memory.weights),
            ("gradients", memory.gradients),
            ("optimizer state", memory.optimizer),
            ("activations", memory.activations),
            ("total", memory.total),
        ):
            lines.append(f"  {label:<26} {value / 1e9:>12.2f}")
        if device is not None and device.memory_bytes:
            verdict = "fits" if memory.fits(device.memory_bytes) else "DOES NOT FIT"
            lines.append(f"  {device.name} holds {device.memory_bytes / 1e9:.2f} GB: {verdict}")
    if per_rank:
        lines.append("")
        lines.append(
            f"{'rank':>6} {'end (ms)':>10} {'compute':>10} {'comm':>10} {'exposed':>10} "
            f"{'waiting':>10} {'bubble':>10}"
        )
        for r in result.ranks:
            lines.append(
                f"{r.rank:>6} {r.step_s * 1e3:>10.3f} {r.compute_s * 1e3:>10.3f} "
                f"{r.comm_s * 1e3:>10.3f} {r.exposed_s * 1e3:>10.3f} "
                f"{r.waiting_s * 1e3:>10.3f} {r.bubble_s * 1e3:>10.3f}"
            )
    return "\n".join(lines) + "\n"


def detail_rows(result: CaseResult) -> list[dict[str, Any]]:
    """One row per size of a validation case: what was measured, what ran, what came out."""
    return [
        {
            "size_bytes": int(result.sizes[i]),
            "measured_us": result.measured_us[i],
            "simulated_us": result.simulated_us[i],
            "measured_busbw_GBps": result.measured_busbw[i],
            "simulated_busbw_GBps": result.simulated_busbw[i],
            "algorithm": result.algorithms[i],
            "protocol": result.protocols[i],
            "channels": result.channels[i] if i < len(result.channels) else None,
            "nccl_model_us": result.nccl_model_us[i] if i < len(result.nccl_model_us) else None,
        }
        for i in range(len(result.sizes))
    ]


def validation_detail(results: Sequence[CaseResult]) -> str:
    """Every size of every case: measured against simulated, the choice it ran with, and
    NCCL's own predicted time of that choice (its tuning model; "-" where NCCL's tuner did
    not choose)."""
    lines = []
    for result in results:
        if result.error:
            continue
        lines += [
            "",
            f"# {result.name}",
            f"{'size (B)':>12} {'time (us)':>10} {'ccsim':>10} {'busbw':>8} {'ccsim':>8}  "
            "algorithm  protocol  channels  nccl model (us)",
        ]
        for row in detail_rows(result):
            model = row["nccl_model_us"]
            lines.append(
                f"{row['size_bytes']:>12} {row['measured_us']:>10.1f} "
                f"{row['simulated_us']:>10.1f} {row['measured_busbw_GBps']:>8.2f} "
                f"{row['simulated_busbw_GBps']:>8.2f}  {row['algorithm']:<9}  "
                f"{row['protocol']:<8}  {row['channels']!s:<8}  "
                + ("-" if model is None else f"{model:.1f}")
            )
    return "\n".join(lines) + "\n"


def search_table(rows: Sequence[Mapping[str, Any]], *, title: str = "") -> str:
    """``ccsim search``'s ranked configurations: the estimate and, where simulated, the
    step (s), model TFLOP/s per GPU (Megatron-LM's count, no recomputation), MFU (of the
    dense peak of the row's precision), exposed communication by dimension (TP, PP, DP,
    CP, EP) and the pipeline bubble (ms), and memory per GPU (GB); a row that was not
    simulated says why after its memory."""
    lines = [f"# {title}", "#"] if title else []
    lines += [
        "# TFLOP/s: model FLOPs per GPU as Megatron-LM counts them (no recomputation);",
        "# MFU: of the GPU's dense peak in the row's precision (bf16 or fp8)",
        "#",
    ]
    # As wide as the longest label (uneven pipeline stages name their layers).
    w = max([40, *(len(str(row["label"])) for row in rows)])
    lines.append(
        f"{'#':>3} {'configuration':<{w}} {'estimate':>9} {'step':>9} {'TFLOP/s':>8} "
        f"{'MFU':>6} {'TP':>8} {'PP':>8} {'DP':>8} {'CP':>8} {'EP':>8} {'bubble':>8} {'memory':>7}"
    )
    lines.append(
        f"{'':>3} {'':<{w}} {'(s)':>9} {'(s)':>9} {'per GPU':>8} {'':>6} "
        f"{'exp (ms)':>8} {'exp (ms)':>8} {'exp (ms)':>8} {'exp (ms)':>8} {'exp (ms)':>8} "
        f"{'(ms)':>8} "
        f"{'(GB)':>7}"
    )

    def ms(value: Any) -> str:
        return f"{value * 1e3:>8.1f}" if value is not None else f"{'':>8}"

    for row in rows:
        head = f"{row['rank']:>3} {row['label']:<{w}} {row['estimate_s']:>9.3f}"
        if row.get("step_s") is None:
            error = row.get("error") or "not simulated"
            memory = row.get("memory_gb")
            lines.append(
                f"{head} {'':>9} {'':>8} {'':>6} {'':>8} {'':>8} {'':>8} {'':>8} {'':>8} {'':>8} "
                + (f"{memory:>7.1f}" if memory is not None else f"{'':>7}")
                + f"  {error}"
            )
            continue
        lines.append(
            f"{head} {row['step_s']:>9.3f} {row['tflops_per_gpu']:>8.1f} {row['mfu']:>6.1%} "
            f"{ms(row['exposed_tp_s'])} {ms(row['exposed_pp_s'])} {ms(row['exposed_dp_s'])} "
            f"{ms(row.get('exposed_cp_s'))} {ms(row.get('exposed_ep_s'))} {ms(row['bubble_s'])} "
            f"{row['memory_gb']:>7.1f}"
            + (f"  {row['cost_x_step']:,.0f}" if row.get("cost_x_step") is not None else "")
        )
    cost = next((row["fabric_cost"] for row in rows if row.get("fabric_cost") is not None), None)
    if cost is not None:
        lines.append(
            f"# fabric cost (priced items, ccsim topology bom): {cost:,.2f}; the number after "
            "memory is cost x step (s), the cost per step/s: lower is better value"
        )
    return "\n".join(lines) + "\n"


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def bom_table(bom: BillOfMaterials) -> str:
    """``ccsim topology bom``: one line per item of the bill of materials (count, typical
    watts each, kW, price each and cost when priced, what it is), then the totals:
    switches by tier, cables by kind and length class, transceivers, network power (kW,
    and the items whose power is unknown), cost (and the items without a price).

    >>> from simulator.topology import load_topology
    >>> from simulator.topology.bom import bill_of_materials
    >>> text = bom_table(bill_of_materials(load_topology("dgx-h100", 2, fabric="leaf-spine")))
    >>> print(text.splitlines()[-4])
    # switches: 1 (leaf 1)
    """
    rows = bom.rows()
    priced = bool(bom.prices)
    fabric = f" on a {bom.fabric} fabric" if bom.fabric else ""
    lines = [
        f"# ccsim topology bom: {bom.name}, {bom.servers} server(s){fabric}; "
        f"{bom.servers_per_rack} server(s) a rack",
        "# W: typical watts each (- where no cited figure); cables: copper DAC to a switch "
        "in the server's rack, optical otherwise (2 transceivers each)",
    ]
    header = ["section", "item", "count", "W each", "kW"]
    header += ["price each", "cost"] if priced else []
    header += ["description"]
    table = [header]
    for row in rows:
        cells = [
            row["section"],
            row["item"] or "-",
            f"{row['count']:,}",
            _number(row["watts_each"], "g"),
            _number(row["power_kw"], ".2f"),
        ]
        if priced:
            cells += [_number(row["price_each"], ",.2f"), _number(row["cost"], ",.2f")]
        table.append([*cells, row["description"]])
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    right = {2, 3, 4, 5, 6}
    for i, r in enumerate(table):
        cells = [
            f"{c:>{w}}" if j in right else f"{c:<{w}}"
            for j, (c, w) in enumerate(zip(r[:-1], widths, strict=True))
        ]
        lines.append(("# " if i == 0 else "  ") + "  ".join([*cells, r[-1]]).rstrip())
    totals = bom.totals()
    tiers = ", ".join(f"{t} {n:,}" for t, n in totals["switches_by_tier"].items())
    kinds = ", ".join(f"{k} {n:,}" for k, n in totals["cables_by_kind"].items())
    lengths = ", ".join(f"{k} {n:,}" for k, n in totals["cables_by_length"].items())
    names = {"switch": "switches", "nic": "NICs", "transceiver": "transceivers"}
    parts = ", ".join(f"{names[k]} {v:.2f}" for k, v in totals["power_kw_by_part"].items() if v)
    unknown = totals["power_unknown"]
    lines += [
        f"# switches: {totals['switches']:,}" + (f" ({tiers})" if tiers else ""),
        f"# links: {kinds or 'none'}; by length: {lengths or 'none'}",
        f"# transceivers: {totals['transceivers']:,}",
        f"# network power: {totals['power_kw']:.2f} kW"
        + (f" ({parts})" if parts else "")
        + (f"; not counted, no cited figure: {', '.join(unknown)}" if unknown else ""),
    ]
    if priced:
        missing = totals["unpriced"]
        lines.append(
            f"# cost: {totals['cost']:,.2f}"
            + (f"; not priced: {', '.join(missing)}" if missing else "")
        )
    return "\n".join(lines) + "\n"


def cost_table(
    records: Sequence[Mapping[str, Any]],
    axes: Sequence[str],
    *,
    metric: str,
    measure: str,
    label: Any = None,
    answer: str | None = None,
    unpowered: Sequence[str] = (),
) -> str:
    """``ccsim size --prices`` / ``--per watt``: every point's axis values, its metric, its
    fabric cost and network power with their value for money (the ``cost_x_...`` and
    ``kw_x_...`` columns of :func:`simulator.sweep.cost.cost_rows`), cheapest first by
    ``measure`` (points without a result last); with a target a ``meets`` column and the
    ``answer`` line. ``label(axis, value)`` writes an axis value (default: as is).

    >>> rows = [{"bw": 2, "status": "ok", "step_s": 1.5, "fabric_cost": 10.0,
    ...          "cost_x_step_s": 15.0, "network_kw": 1.0, "kw_x_step_s": 1.5}]
    >>> print(cost_table(rows, ["bw"], metric="step_s", measure="fabric_cost"))
    ... # doctest: +NORMALIZE_WHITESPACE
    # bw  step_s  cost   cost x step_s  network kW  kW x step_s
      2   1.5     10.00  15.00          1.000       1.5
    <BLANKLINE>
    """
    label = label or (lambda axis, value: str(value))
    keys = [key for key in records[0] if key.startswith(("cost_", "kw_"))] if records else []
    cost_key = next((k for k in keys if k.startswith("cost_")), None)
    kw_key = next((k for k in keys if k.startswith("kw_")), None)
    priced = any(r.get("fabric_cost") is not None for r in records)
    targeted = any("meets" in r for r in records)

    def words(key: str, head: str) -> str:  # cost_x_step_s -> "cost x step_s"
        return head + " " + key.split("_", 1)[1].replace("_", " ", 1)

    header = [*axes, metric]
    header += ["cost", words(cost_key, "cost")] if priced and cost_key else []
    header += ["network kW", words(kw_key, "kW")] if kw_key else []
    header += ["meets"] if targeted else []
    ordered = sorted(
        records,
        key=lambda r: (r.get(measure) is None or r.get(metric) is None, r.get(measure) or 0.0),
    )
    table = [header]
    for r in ordered:
        cells = [label(axis, r[axis]) for axis in axes]
        cells.append("-" if r.get(metric) is None else f"{r[metric]:.6g}")
        if priced:
            cells += [_number(r.get("fabric_cost"), ",.2f"), _number(r.get(cost_key), ",.2f")]
        if kw_key:
            cells += [_number(r.get("network_kw"), ".3f"), _number(r.get(kw_key), ".4g")]
        if targeted:
            cells.append({True: "yes", False: "no"}.get(r.get("meets"), "-"))
        if r.get("status") not in (None, "ok") and r.get("error"):
            cells[-1] += f"  ({r['error']})"
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for i, row in enumerate(table):
        cells = "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True))
        lines.append(("# " if i == 0 else "  ") + cells.rstrip())
    if unpowered:
        lines.append(
            f"# network kW leaves out {', '.join(unpowered)}: no cited figure (give --watts)"
        )
    if answer:
        lines.append(f"# {answer}")
    return "\n".join(lines) + "\n"


def training_table(results: Sequence[Any]) -> str:
    """Published training runs against ccsim's step (``ccsim validate --training``):
    per run its configuration, measured and simulated seconds per step, the error, the
    memory per GPU and whether it fits, then the median and largest |error| of the
    calibration runs and of the held-out ones apart."""
    from ..validate.training import summary

    w = max([20, *(len(r.run.id) for r in results)])
    lines = [
        f"{'run':<{w}} {'use':<11} {'configuration':<36} {'measured':>9} {'ccsim':>9} "
        f"{'error':>7} {'memory':>7} {'fits':>4}",
        f"{'':<{w}} {'':<11} {'':<36} {'(s)':>9} {'(s)':>9} {'':>7} {'(GB)':>7} {'':>4}",
    ]
    for r in results:
        head = f"{r.run.id:<{w}} {r.run.use:<11} {r.run.label:<36} {r.run.measured_step_s:>9.3f}"
        if r.step_s is None:
            lines.append(f"{head} {'':>9} {'':>7} {'':>7} {'':>4}  {r.skipped}")
            continue
        memory = f"{r.memory_gb:>7.1f}" if r.memory_gb is not None else f"{'':>7}"
        fits = {True: "yes", False: "NO", None: ""}[r.fits]
        lines.append(f"{head} {r.step_s:>9.3f} {r.error:>+7.1%} {memory} {fits:>4}")
    lines.append("")
    for use, figures in summary(results).items():
        lines.append(
            f"{use}: {int(figures['runs'])} runs, median |error| {figures['median']:.1%}, "
            f"largest {figures['max']:.1%}"
            + ("  (these runs set a constant: in-sample)" if use == "calibration" else "")
        )
    return "\n".join(lines) + "\n"
