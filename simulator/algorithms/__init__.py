"""Registry of collective algorithms, keyed by name.

Adding an algorithm: one module with an :class:`Algorithm` subclass, listed in
``_ALGORITHMS`` below.
"""

from __future__ import annotations

from ..errors import CcsimError, unknown_choice
from .base import Algorithm, RankLayout
from .chain import RingWithChains
from .chain_tree import ChainTree
from .collnet import CollNetChain, CollNetDirect
from .direct import Direct
from .halving_doubling import HalvingDoubling
from .hierarchical import Hierarchical
from .multipath import Multipath
from .nccl_p2p import NcclP2p
from .nvls import Nvls
from .nvls_tree import NvlsTree
from .pairwise import Pairwise
from .pipelined import Pipelined
from .schedule import Schedule
from .tree import Tree

# The ring is registered with its broadcast/reduce chains (RingWithChains extends Ring).
_ALGORITHMS: dict[str, Algorithm] = {
    algo.name: algo
    for algo in (
        RingWithChains(),
        Hierarchical(),
        Pipelined(),
        Tree(),
        ChainTree(),
        HalvingDoubling(),
        Multipath(),
        Nvls(),
        NvlsTree(),
        CollNetDirect(),
        CollNetChain(),
        Direct(),
        Pairwise(),
        NcclP2p(),
    )
}


def algorithm_names() -> list[str]:
    """Names of every registered algorithm."""
    return sorted(_ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; an error lists the valid names otherwise."""
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise unknown_choice("algorithm", name, _ALGORITHMS) from None


def build_schedule(
    algorithm: str, op: str, layout: RankLayout | int, size_bytes: float, **options
) -> Schedule:
    """Expand ``algorithm`` for ``op`` on ``layout`` (or a plain rank count) into a schedule."""
    if isinstance(layout, int):
        layout = RankLayout(layout)
    algo = get_algorithm(algorithm)
    reason = algo.unsupported(op, layout)
    if reason is not None:
        able = [
            name
            for name, other in sorted(_ALGORITHMS.items())
            if other.unsupported(op, layout) is None
        ]
        raise CcsimError(
            f"algorithm {algorithm!r} cannot run {op} on {layout.ranks} ranks ({reason}); "
            f"algorithms that can: {', '.join(able) or 'none'}"
        )
    if not size_bytes > 0:
        raise CcsimError(f"size must be positive, got {size_bytes!r} bytes")
    return algo.build(op, layout, size_bytes, **options)


def build_quotient(
    algorithm: str, op: str, layout: RankLayout, size_bytes: float, period: int, **options
) -> Schedule | None:
    """The representatives of ``algorithm``'s schedule under a shift of ``period`` ranks,
    built directly (:meth:`Algorithm.quotient`), or None where it does not build them."""
    algo = get_algorithm(algorithm)
    if algo.unsupported(op, layout) is not None or not size_bytes > 0:
        return None
    return algo.quotient(op, layout, size_bytes, period, **options)


__all__ = [
    "Algorithm",
    "RankLayout",
    "algorithm_names",
    "build_quotient",
    "build_schedule",
    "get_algorithm",
]
