"""Where each job's ranks go: placement policies for several jobs on one cluster.

A placement gives, for each job, the topology rank (the GPU) of each of its ranks, in
the job's rank order: job rank ``r`` runs on GPU ``placement[r]``. Jobs get disjoint GPUs.
Policies, looked up by name (an unknown one lists the valid ones):

``packed``
    The lowest-numbered free GPUs, server after server: a job fills whole servers where
    it can, and consecutive jobs sit side by side (under the same leaves).
``scattered``
    Whole free servers spread evenly over the free ones (the k-th of n servers is free
    server ``floor(k * free / n)``): two jobs of equal size interleave server by server,
    so both cross the fabric's upper tiers (a scheduler that ignores locality).
``rail``
    The same local GPUs (rails) on every server: a job of n GPUs on S servers takes
    n / S GPUs of each, at the lowest local indices free on all of them, consecutive
    ranks inside a server (so tensor-parallel groups stay inside servers). On a
    rail-optimized fabric, jobs on different rails share no rail switch.
``ranks=LIST``
    Explicit GPUs, e.g. ``ranks=0-7,16-23``, in job rank order.

Explicit placements are taken first, then the others in job order, each from the GPUs
still free.

>>> servers = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
>>> [p.tolist() for p in place_jobs(servers, [8, 8], ["packed", "packed"])]
[[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
>>> [p.tolist() for p in place_jobs(servers, [8, 8], ["scattered", "scattered"])]
[[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
>>> [p.tolist() for p in place_jobs(servers, [8, 8], ["rail", "rail"])]
[[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import CcsimError, unknown_choice


class PlacementError(CcsimError):
    """Jobs cannot be placed as asked (overlap, too few GPUs, unknown policy)."""


#: A policy: (servers of every GPU, free mask, GPUs wanted, job name) -> GPUs, in rank order.
Policy = Callable[[np.ndarray, np.ndarray, int, str], np.ndarray]


def _packed(servers: np.ndarray, free: np.ndarray, n: int, job: str) -> np.ndarray:
    """The ``n`` lowest-numbered free GPUs."""
    gpus = np.flatnonzero(free)
    if len(gpus) < n:
        raise PlacementError(
            f"job {job} needs {n} GPUs but only {len(gpus)} are free; use more --nodes"
        )
    return gpus[:n]


def _whole_free_servers(servers: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, int]:
    """Servers whose GPUs are all free (ascending), and GPUs per server (the most)."""
    ids, sizes = np.unique(servers, return_counts=True)
    busy = np.unique(servers[~free])
    return np.setdiff1d(ids, busy), int(sizes.max())


def _scattered(servers: np.ndarray, free: np.ndarray, n: int, job: str) -> np.ndarray:
    """Whole free servers spread evenly over the free ones; ranks fill them in order."""
    whole, per = _whole_free_servers(servers, free)
    need = -(-n // per)
    if len(whole) < need:
        raise PlacementError(
            f"job {job} needs {need} whole free servers for scattered placement ({n} GPUs, "
            f"{per} a server) but {len(whole)} are free; use more --nodes or packed"
        )
    chosen = whole[(np.arange(need) * len(whole)) // need]
    gpus = np.concatenate([np.flatnonzero(servers == s) for s in chosen.tolist()])
    return gpus[:n]


def _rail(servers: np.ndarray, free: np.ndarray, n: int, job: str) -> np.ndarray:
    """The same local GPUs (rails) on every server, the lowest free on all of them."""
    ids = np.unique(servers)
    if n % len(ids):
        raise PlacementError(
            f"job {job} needs {n} GPUs; rail placement puts the same number on each of the "
            f"{len(ids)} servers, so it needs a multiple of {len(ids)}: use ranks=... or "
            "another policy"
        )
    each = n // len(ids)
    members = [np.flatnonzero(servers == s) for s in ids.tolist()]
    width = min(len(m) for m in members)
    rails = [i for i in range(width) if all(free[m[i]] for m in members)]
    if len(rails) < each:
        raise PlacementError(
            f"job {job} needs {each} rails (local GPUs free on every server) but "
            f"{len(rails)} are free; use more --nodes or another policy"
        )
    return np.concatenate([m[rails[:each]] for m in members])


#: Placement policies by name (``ranks=LIST`` is parsed apart).
POLICIES: dict[str, Policy] = {"packed": _packed, "scattered": _scattered, "rail": _rail}


def parse_ranks(text: str, *, field: str = "ranks") -> list[int]:
    """Ranks written as ``0-7,16,20-23`` (ranges inclusive).

    >>> parse_ranks("0-3,8,10-11")
    [0, 1, 2, 3, 8, 10, 11]
    """
    ranks: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if "-" in part:
                first, last = (int(v) for v in part.split("-", 1))
                if last < first:
                    raise ValueError
                ranks.extend(range(first, last + 1))
            else:
                ranks.append(int(part))
        except ValueError:
            raise PlacementError(
                f"{field}: {part!r} is not a number or a range of numbers; write e.g. 0-7,16-23"
            ) from None
    return ranks


def policy_of(spec: str | Sequence[int]) -> str | list[int]:
    """A placement spec checked: a policy name, or explicit ranks (``ranks=0-7`` or a
    list of ints)."""
    if not isinstance(spec, str):
        return [int(r) for r in spec]
    if spec.startswith("ranks="):
        return parse_ranks(spec[len("ranks=") :], field=f"placement {spec!r}")
    if spec not in POLICIES:
        raise PlacementError(str(unknown_choice("placement", spec, [*POLICIES, "ranks=LIST"])))
    return spec


def place_jobs(
    servers: Sequence[int],
    sizes: Sequence[int],
    policies: Sequence[str | Sequence[int]],
    names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """The GPUs of each job: ``sizes[j]`` ranks placed by ``policies[j]`` on a cluster
    whose GPU (topology rank) ``g`` sits in server ``servers[g]``.

    Raises :class:`PlacementError` (one line) on overlapping explicit ranks, ranks
    outside the cluster, more GPUs wanted than the cluster has, an unknown policy, or
    a placement that gives a job fewer or more GPUs than it has ranks.
    """
    servers = np.asarray(servers, dtype=np.int64)
    names = list(names) if names is not None else [f"job{j}" for j in range(len(sizes))]
    if len(policies) != len(sizes):
        raise PlacementError(f"{len(sizes)} jobs but {len(policies)} placements")
    total, gpus = int(sum(sizes)), len(servers)
    if total > gpus:
        raise PlacementError(
            f"the jobs need {total} GPUs ({' + '.join(str(s) for s in sizes)}) but the "
            f"cluster has {gpus}; use more --nodes"
        )
    specs = [policy_of(p) for p in policies]
    free = np.ones(gpus, dtype=bool)
    owner = np.full(gpus, -1, dtype=np.int64)
    out: list[np.ndarray | None] = [None] * len(sizes)
    for j, spec in enumerate(specs):  # explicit ranks first
        if isinstance(spec, str):
            continue
        ranks = np.asarray(spec, dtype=np.int64)
        if len(ranks) != sizes[j]:
            raise PlacementError(
                f"job {names[j]} has {sizes[j]} ranks but its placement gives {len(ranks)} "
                "GPUs; list one GPU per rank"
            )
        bad = ranks[(ranks < 0) | (ranks >= gpus)]
        if len(bad):
            raise PlacementError(
                f"job {names[j]}: GPU {int(bad[0])} is not in the cluster (GPUs 0-{gpus - 1}); "
                "use more --nodes or other ranks"
            )
        values, counts = np.unique(ranks, return_counts=True)
        if (counts > 1).any():
            raise PlacementError(
                f"job {names[j]} lists GPU {int(values[counts > 1][0])} twice; one GPU per rank"
            )
        taken = ranks[owner[ranks] >= 0]
        if len(taken):
            other = names[int(owner[taken[0]])]
            raise PlacementError(
                f"jobs {other} and {names[j]} both use GPU {int(taken[0])}; jobs need disjoint GPUs"
            )
        owner[ranks] = j
        free[ranks] = False
        out[j] = ranks
    for j, spec in enumerate(specs):
        if not isinstance(spec, str):
            continue
        ranks = POLICIES[spec](servers, free, int(sizes[j]), names[j])
        owner[ranks] = j
        free[ranks] = False
        out[j] = ranks
    return [np.asarray(r, dtype=np.int64) for r in out]
