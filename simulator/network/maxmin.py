"""Max-min fair rates by progressive filling, vectorised over flows and links.

Flows and links are given as a sparse incidence: parallel arrays ``inc_flow`` and
``inc_link`` with one entry per (flow, link) pair. All flows' rates rise together; when
a link runs out of capacity the flows crossing it freeze at their current rate, and the
others keep rising. Each round is a few numpy passes over the incidence, and there are
as many rounds as distinct bottleneck levels (one, in a symmetric collective step).
A small incidence (:data:`SMALL_ENTRIES`) is filled by the same arithmetic in plain
Python loops, to the same bits.
"""

from __future__ import annotations

import numpy as np

INF = float("inf")

# Links whose fair share is within this relative distance of the minimum are treated as
# bottlenecked in the same round; it absorbs rounding in capacity - sum(rates).
_TIE = 1e-12
#: Up to this many incidence entries, :func:`max_min_rates` fills in plain Python
#: (:func:`_small_rates`): most rate computations of a training step are a handful of
#: flows (two 1,024-GPU jobs on a 2:1 leaf-spine, ``ccsim bench jobs-2x1024-leaf-spine``:
#: median 6 entries, 91% at most 48), where numpy's fixed cost per pass dominates. On
#: that run's 108,749 computations, replayed one by one: 57 against 200 us at up to 8
#: entries, 212 against 331 us at 17-32, 357 against 404 us at 33-48, and slower beyond.
SMALL_ENTRIES = 48


def max_min_rates(
    inc_flow: np.ndarray,
    inc_link: np.ndarray,
    n_flows: int,
    capacity: np.ndarray,
    weight: np.ndarray | None = None,
    cap: np.ndarray | None = None,
) -> np.ndarray:
    """Max-min fair rate of each flow.

    Parameters
    ----------
    inc_flow, inc_link : int arrays of equal length
        Flow ``inc_flow[i]`` crosses link ``inc_link[i]``; flows are ``0..n_flows-1`` and
        links index ``capacity``. A flow crossing no link gets an infinite rate.
    capacity : float array
        Capacity of each link in bytes/s (may be ``inf``).
    weight : float array, optional
        Load of each incidence entry on its link per unit of the flow's rate (default 1).
        An aggregated flow standing for k identical flows whose copies spread over a class
        of c equivalent links loads the class's representative link k/c times its rate.
    cap : float array, optional
        The most each flow may take (``inf``: no limit), whatever its links leave: a
        flow that stands for a call's traffic on one link at the pace the call keeps
        alone (see :mod:`simulator.workload.bundles`). A capped flow is a flow over one
        more link of its own, of that capacity.

    Examples
    --------
    Two flows on one link share it; a third on a second link gets that link alone.

    >>> max_min_rates(np.array([0, 1, 2]), np.array([0, 0, 1]), 3, np.array([10.0, 4.0]))
    array([5., 5., 4.])

    One flow standing for three identical flows shares a link with a plain one:

    >>> max_min_rates(np.array([0, 1]), np.array([0, 0]), 2, np.array([8.0]), np.array([3.0, 1.0]))
    array([2., 2.])

    A flow capped at 1 leaves the rest of the link to the other:

    >>> cap = np.array([1.0, np.inf])
    >>> max_min_rates(np.array([0, 1]), np.array([0, 0]), 2, np.array([10.0]), cap=cap)
    array([1., 9.])
    """
    if len(inc_flow) <= SMALL_ENTRIES:
        small = _small_rates(inc_flow, inc_link, n_flows, capacity, weight, cap)
        if small is not None:
            return small
    if cap is not None:
        capped = np.flatnonzero(np.isfinite(cap))
        if len(capped):
            # One private link per capped flow, of the cap's capacity.
            first = len(capacity)
            inc_flow = np.concatenate([inc_flow, capped])
            inc_link = np.concatenate([inc_link, first + np.arange(len(capped))])
            capacity = np.concatenate([np.asarray(capacity, dtype=float), cap[capped]])
            if weight is not None:
                weight = np.concatenate([np.asarray(weight, dtype=float), np.ones(len(capped))])
    rate = np.full(n_flows, np.inf)
    if n_flows == 0 or len(inc_flow) == 0:
        return rate
    n_links = len(capacity)
    remaining = np.asarray(capacity, dtype=float).copy()
    # The incidence entries of flows not yet frozen, compacted as flows freeze: each
    # round's work is the live entries, not every entry (rounds are the distinct
    # bottleneck levels, hundreds on an ECMP fabric).
    flows, links = inc_flow, inc_link
    weights = None if weight is None else np.asarray(weight, dtype=float)
    while len(flows):
        count = np.bincount(links, weights=weights, minlength=n_links)
        used = count > 0
        share = np.full(n_links, np.inf)
        share[used] = np.maximum(remaining[used], 0.0) / count[used]
        level = share.min()
        if not np.isfinite(level):
            break  # every remaining flow crosses only infinite links
        bottleneck = share <= level * (1 + _TIE)
        newly = np.zeros(n_flows, dtype=bool)
        newly[flows[bottleneck[links]]] = True
        rate[newly] = level
        taken = newly[flows]
        remaining -= (
            np.bincount(links[taken], weights=None if weights is None else weights[taken],
                        minlength=n_links) * level
        )  # fmt: skip
        keep = ~taken
        flows, links = flows[keep], links[keep]
        if weights is not None:
            weights = weights[keep]
    return rate


def _small_rates(
    inc_flow: np.ndarray,
    inc_link: np.ndarray,
    n_flows: int,
    capacity: np.ndarray,
    weight: np.ndarray | None,
    cap: np.ndarray | None,
) -> np.ndarray | None:
    """:func:`max_min_rates` of a small incidence, bit for bit: the same operations on the
    same doubles in the same order (each link's load summed over its entries in entry
    order, as ``np.bincount`` sums; integer counts where no weight is given; a capped
    flow's private link after the others), in Python loops instead of numpy passes.
    None where a share is NaN (numpy's ``min`` and ``maximum`` treat NaN their own way):
    the caller then takes the numpy path."""
    rate = small_rates_list(
        inc_flow.tolist(),
        inc_link.tolist(),
        n_flows,
        [float(c) for c in np.asarray(capacity).tolist()],
        None if weight is None else np.asarray(weight, float).tolist(),
        None if cap is None else np.asarray(cap, dtype=float).tolist(),
    )
    return None if rate is None else np.array(rate, dtype=float)


def small_rates_list(
    flows: list[int],
    links: list[int],
    n_flows: int,
    remaining: list[float],
    weight: list[float] | None,
    cap: list[float] | None,
) -> list[float] | None:
    """:func:`_small_rates` on Python lists (the caller's scalar path hands them over
    without building arrays): ``remaining`` (each link's capacity, as floats) and
    ``flows``/``links`` may be changed in place. None where a share is NaN."""
    # Integer counts without weights, as np.bincount gives (the same quotients).
    loads: list = [1] * len(flows) if weight is None else weight
    if cap is not None:
        for flow, limit in enumerate(cap):
            if limit != INF:
                flows.append(flow)
                links.append(len(remaining))
                remaining.append(limit)
                loads.append(1 if weight is None else 1.0)
    rate = [INF] * n_flows
    entries = list(zip(flows, links, loads, strict=True))
    tie = 1 + _TIE
    while entries:
        count: dict[int, float] = {}
        for _, link, load in entries:
            count[link] = count.get(link, 0) + load
        level = INF
        shares = {}
        for link, total in count.items():
            if not total > 0:
                continue  # a link that only zero weights cross limits nobody
            left = remaining[link]
            share = (left if left > 0.0 else 0.0) / total
            if share != share or left != left:
                return None
            shares[link] = share
            if share < level:
                level = share
        if level == INF:
            break  # every remaining flow crosses only infinite links
        bound = level * tie
        bottleneck = {link for link, share in shares.items() if share <= bound}
        frozen = {flow for flow, link, _ in entries if link in bottleneck}
        for flow in frozen:
            rate[flow] = level
        taken: dict[int, float] = {}
        rest = []
        for entry in entries:
            if entry[0] in frozen:
                taken[entry[1]] = taken.get(entry[1], 0) + entry[2]
            else:
                rest.append(entry)
        for link, total in taken.items():
            remaining[link] -= total * level
        entries = rest
    return rate
