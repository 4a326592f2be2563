"""Fabrics that join servers: a registry of :class:`~.base.Fabric` variants by name.

>>> sorted(FABRICS)
['fat-tree', 'leaf-spine', 'rail-optimized', 'single-switch']
"""

from __future__ import annotations

from ...errors import TopologyError, shown
from .base import COMMON_KEYS, Fabric, FabricConfig
from .fat_tree import FatTree
from .leaf_spine import LeafSpine
from .rail_optimized import RailOptimized
from .single_switch import SingleSwitch

FABRICS: dict[str, Fabric] = {
    fabric.name: fabric for fabric in (RailOptimized(), LeafSpine(), FatTree(), SingleSwitch())
}

#: The fabric of a preset whose ``fabric`` section does not name one.
DEFAULT_FABRIC = "rail-optimized"


def get_fabric(name: object, *, where: str = "fabric") -> Fabric:
    """The fabric registered as ``name``; an unknown name lists the valid ones."""
    if not isinstance(name, str) or name not in FABRICS:
        raise TopologyError(
            f"{where} is {shown(name)}; valid fabrics: {', '.join(sorted(FABRICS))}"
        )
    return FABRICS[name]


__all__ = ["COMMON_KEYS", "DEFAULT_FABRIC", "FABRICS", "Fabric", "FabricConfig", "get_fabric"]
