"""NCCL settings per communicator, as Megatron-Core gives each process group its own.

Megatron-Core reads ``--nccl-communicator-config-path``, a YAML mapping process-group
names to NCCL options (``min_ctas``, ``max_ctas``, ``cga_cluster_size``, ``net_name``),
and creates each group's communicator with them (``get_nccl_options``,
megatron/core/parallel_state.py lines 131-161 at core_v0.14.0). NCCL bounds that
communicator's channels by them unless NCCL_MIN_CTAS / NCCL_MAX_CTAS are set, which
replace them (:meth:`simulator.library.nccl_env.NcclEnv.ctas`).

:func:`parse_communicators` reads such a mapping (a published run's
``nccl_communicators``, a YAML file, or ``--nccl-comm`` items) into
:class:`~simulator.library.nccl_env.CommConfig` per group name, refusing names that are
not Megatron-Core's and keys its YAML does not take. :func:`communicator_of` names the
Megatron-Core process group each group of the ``megatron`` generator stands for, so that
the replay (:class:`~simulator.workload.engine.WorkloadReplay`'s ``communicators``) runs
each group's collectives on its own communicator's channels.

Not modelled: the pipeline's ``pp`` group (ccsim's pipeline sends are flows, not NCCL
send/receive with channels) and the groups ccsim's generator does not build (``mp``,
``tp_dp``, ``pos_embd``, ...): accepted, nothing of theirs is run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import CcsimError, shown
from ..files import load_data
from ..library.nccl_env import COMM_CONFIG_KEYS, CommConfig, parse_comm_config

__all__ = [
    "COMM_CONFIG_KEYS",
    "GENERATOR_GROUPS",
    "MEGATRON_GROUPS",
    "check_communicators",
    "communicator_of",
    "communicators_from_items",
    "parse_communicators",
]

#: Megatron-Core's process-group names that take NCCL options: every
#: ``get_nccl_options("...")`` of megatron/core/parallel_state.py at core_v0.14.0 (lines
#: 765-1228) and core_v0.19.0 (lines 943-1672), and the older releases' names
#: (core_r0.8.0 and core_r0.10.0: exp, tp_exp, mp_exp, dp_modulo_exp, dp_modulo_exp_cp;
#: core_r0.11.0 and core_v0.12.0: inter_dp_cp), which YAML files written for them still
#: list (MLPerf v5.1's conf/nccl/custom_communicator_cta.yaml: tp_exp).
MEGATRON_GROUPS = (
    "dp", "dp_cp", "intra_dp_cp", "inter_dp_cp", "cp", "hcp", "mp", "tp", "pp", "embd",
    "pos_embd", "tp_dp_cp", "tp_dp", "tp_cp", "ep", "ep_tp", "tp_ep_mp", "tp_ep_pp",
    "ep_dp", "intra_ep_dp", "inter_ep_dp", "intra_dist_opt_instance", "gtp_remat",
    "gtp_remat_dp", "gtp_remat_dp_cp", "expt_gtp_remat", "tp_ep_gtp_remat_pp",
    "ep_gtp_remat_dp", "exp", "tp_exp", "mp_exp", "dp_modulo_exp", "dp_modulo_exp_cp",
)  # fmt: skip

#: The ``megatron`` generator's group names (simulator/workload/generators.py) by the
#: prefix each starts with, and the Megatron-Core process group whose communicator runs
#: their collectives:
#:
#: * ``tp.``: the tensor-parallel group ("tp", parallel_state.py line 910 at core_v0.14.0);
#: * ``cp.s``: the context-parallel group ("cp", line 864); ``cp.a2a.`` and ``cp.p2p.``:
#:   the hierarchical CP groups of a2a+p2p ("hcp", line 878);
#: * ``dp.``: each stage's data-parallel ranks over CP too, where distributed data
#:   parallelism reduces gradients and gathers parameters
#:   (``get_data_parallel_group(with_context_parallel=True)``,
#:   distributed/distributed_data_parallel.py line 81): "dp_cp" (line 765), at CP 1 too;
#: * ``emb.``: the tied embedding's pair of stages ("embd", line 1015);
#: * ``amax.``: fp8's amax reduction over TP x DP x CP
#:   (``get_amax_reduction_group(with_context_parallel=True)``, line 1366): "tp_dp_cp"
#:   (line 1043);
#: * ``ep.``: the expert-parallel group ("ep", line 1079); ``edp.``: the experts'
#:   data-parallel group ("ep_dp", line 1159).
GENERATOR_GROUPS = (
    ("tp.", "tp"),
    ("cp.s", "cp"),
    ("cp.a2a.", "hcp"),
    ("cp.p2p.", "hcp"),
    ("dp.", "dp_cp"),
    ("emb.", "embd"),
    ("amax.", "tp_dp_cp"),
    ("ep.", "ep"),
    ("edp.", "ep_dp"),
)


def communicator_of(group: str) -> str | None:
    """The Megatron-Core process group whose communicator runs the collectives of the
    ``megatron`` generator's group ``group`` (:data:`GENERATOR_GROUPS`); None for other
    names (traces' own groups).

    >>> communicator_of("cp.s0.d3.t0"), communicator_of("dp.s1.t0"), communicator_of("x")
    ('cp', 'dp_cp', None)
    """
    for prefix, name in GENERATOR_GROUPS:
        if group.startswith(prefix):
            return name
    return None


def parse_communicators(data: Any, where: str) -> dict[str, CommConfig]:
    """Per Megatron-Core process group, its NCCL configuration, from a mapping of group
    names to mappings of :data:`~simulator.library.nccl_env.COMM_CONFIG_KEYS` (the
    layout of Megatron-Core's ``--nccl-communicator-config-path`` YAML). ``where``
    names the source in errors (a file, a published run).

    >>> parse_communicators({"cp": {"max_ctas": 1}}, "x")["cp"].max_ctas
    1
    >>> parse_communicators({"cpp": {"max_ctas": 1}}, "row r")
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: row r: unknown process group 'cpp'; valid: dp, dp_cp, ...
    """
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise CcsimError(
            f"{where}: expected a mapping of process groups ({', '.join(MEGATRON_GROUPS)}) "
            f"to NCCL options, got {shown(data)}"
        )
    configs: dict[str, CommConfig] = {}
    for name, options in data.items():
        if name not in MEGATRON_GROUPS:
            raise CcsimError(
                f"{where}: unknown process group {shown(name)}; valid: "
                f"{', '.join(MEGATRON_GROUPS)} (Megatron-Core's names)"
            )
        configs[str(name)] = parse_comm_config(options, f"{where}, group {name}")
    return configs


def communicators_from_items(items: Iterable[str]) -> dict[str, CommConfig]:
    """``--nccl-comm`` items: a YAML file in Megatron-Core's layout, or
    ``GROUP:KEY=VALUE[,KEY=VALUE...]`` such as ``cp:max_ctas=1,min_ctas=1``; a group
    given twice takes the keys of both (the later value wins).

    >>> communicators_from_items(["cp:max_ctas=1", "dp_cp:max_ctas=8"])["dp_cp"].text
    'max_ctas=8'
    """
    merged: dict[str, dict[str, Any]] = {}
    for item in items:
        text = str(item).strip()
        group, colon, rest = text.partition(":")
        if not colon or "=" not in rest:
            if text.endswith((".yaml", ".yml", ".json")):
                data = load_data(text, what="NCCL communicator configuration")
                checked = parse_communicators(data, text)  # its errors name the file
                for name in checked:
                    merged.setdefault(name, {}).update(data[name])
                continue
            raise CcsimError(
                f"--nccl-comm {shown(text)}: expected GROUP:KEY=VALUE[,KEY=VALUE] such as "
                "cp:max_ctas=1, or a YAML file of Megatron-Core's "
                f"--nccl-communicator-config-path; keys: {', '.join(COMM_CONFIG_KEYS)}"
            )
        options = merged.setdefault(group.strip(), {})
        for pair in rest.split(","):
            key, equals, value = pair.partition("=")
            if not equals or not key.strip():
                raise CcsimError(
                    f"--nccl-comm {shown(text)}: expected KEY=VALUE, got {shown(pair)}; "
                    f"keys: {', '.join(COMM_CONFIG_KEYS)}"
                )
            options[key.strip()] = _value(value.strip())
    return parse_communicators(merged, "--nccl-comm")


def _value(text: str) -> Any:
    """A command-line value as YAML would read it: a whole number, true / false, or text."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def check_communicators(configs: Mapping[str, CommConfig], groups: Iterable[str]) -> None:
    """Refuse settings per process group for a workload none of whose groups is one of
    the ``megatron`` generator's (a trace names its groups its own way: nothing would
    apply). Names the workload lacks are accepted: Megatron-Core's YAML commonly lists
    every group (``cp`` for a run at CP 1, ``ep`` for a dense model) and Megatron-Core
    ignores those it does not create.

    >>> check_communicators({"cp": CommConfig(max_ctas=1)}, ["g0", "g1"])
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: NCCL settings per process group (cp) apply to the megatron ...
    """
    if not configs:
        return
    names = list(groups)
    if any(communicator_of(group) is not None for group in names):
        return
    listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    raise CcsimError(
        f"NCCL settings per process group ({', '.join(configs)}) apply to the megatron "
        f"generator's groups (tp.*, cp.*, dp.*, ...); this workload's groups ({listed}) "
        "are none of them"
    )
