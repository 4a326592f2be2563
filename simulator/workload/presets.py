"""Bundled workload presets and resolution of a workload argument.

A preset in ``workloads/`` is either a full trace (``format: ccsim-workload/1``) or, to
keep the repository small, a *generator spec*: ``format: ccsim-workload-spec/1`` with a
``generator`` (ddp, zero3, megatron, moe) and its parameters; it is expanded on load.
``ccsim generate`` writes full traces from the same generators.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ..errors import shown, unknown_choice
from ..files import load_data
from ..topology.presets import data_dir
from .aicb import load_aicb
from .chakra import is_chakra_source, load_chakra
from .generators import GENERATORS
from .guards import check_generator
from .trace import FORMAT, Workload, WorkloadError, parse_workload

SPEC_FORMAT = "ccsim-workload-spec/1"


def preset_files() -> dict[str, Path]:
    """Preset name -> file, for every bundled workload preset."""
    folder = data_dir("workloads")
    return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix in (".yaml", ".yml", ".json")}


def describe_presets() -> list[tuple[str, str]]:
    """(name, description) of every bundled workload preset."""
    out = []
    for name, path in preset_files().items():
        data = _read(path)
        out.append((name, str(data.get("description", ""))))
    return out


def _read(path: Path) -> Any:
    fmt = "yaml" if path.suffix in (".yaml", ".yml") else "json"
    return load_data(path, what="workload", fmt=fmt, error=WorkloadError)


def from_spec(
    data: dict[str, Any], *, origin: str = "spec", max_flows: int | None = None
) -> Workload:
    """Expand a generator spec (see the module docstring); one whose trace would pass
    the resource guard's limit (``max_flows``) is refused before it is generated."""
    generator = data.get("generator")
    if generator not in GENERATORS:
        raise unknown_choice(f"generator in {origin}", generator, GENERATORS)
    params = {
        k: v for k, v in data.items() if k not in ("format", "generator", "description", "name")
    }
    accepted = inspect.signature(GENERATORS[generator]).parameters
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise WorkloadError(
            f"{origin}: unknown parameter {shown(unknown[0])} for {generator}; valid: "
            + ", ".join(sorted(accepted))
        )
    check_generator(generator, params, max_flows)
    workload = GENERATORS[generator](**params)
    if data.get("name"):
        workload.name = str(data["name"])
    if data.get("description"):
        workload.description = str(data["description"])
    return workload


def resolve_workload(
    source: str | Path, *, max_flows: int | None = None, stand_ins: bool = False
) -> Workload:
    """A preset name, a trace file (.json/.yaml), a spec file, an AICB file (.txt) or a
    Chakra trace (a ``.et`` file, a folder or a prefix of ``<prefix>.<rank>.et`` files);
    ``max_flows`` is the resource guard's limit for a spec's generator or an AICB file.
    ``stand_ins``: a ``megatron`` spec that does not say otherwise builds one
    data-parallel replica and one rank per TP group (``replicas`` and ``shadows``), which
    the replay lets stand for the rest where it checks that they may (else it builds
    every rank: :mod:`simulator.workload.replicas`, :mod:`simulator.workload.shadows`)."""
    presets = preset_files()
    if str(source) not in presets and is_chakra_source(source):
        return load_chakra(source)
    path = presets.get(str(source), Path(str(source)))
    if not path.is_file():
        raise unknown_choice("workload (preset name or file)", str(source), presets)
    if path.suffix == ".txt":
        return load_aicb(path, max_flows=max_flows)
    data = _read(path)
    if isinstance(data, dict) and data.get("format") == SPEC_FORMAT:
        data = {"name": path.stem, **data}
        if stand_ins and data.get("generator") == "megatron":
            data.setdefault("replicas", True)
            data.setdefault("shadows", True)
        return from_spec(data, origin=str(path), max_flows=max_flows)
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return parse_workload(data, origin=str(path))
    raise WorkloadError(
        f"{path}: expected format {FORMAT!r} (a trace) or {SPEC_FORMAT!r} (a generator spec)"
    )
