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
        capped = np.isfinite(cap).nonzero()[0]
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
    without building arrays): ``remaining`` (each link's capacity, as floats) may be
    changed in place. None where a share is NaN.

    The rounds of :func:`max_min_rates` on the same doubles: each link's load is the sum
    of its live entries' loads in entry order (integer counts without weights, as
    ``np.bincount`` gives), its share ``max(remaining, 0) / load``, the level the least
    share, and the flows on links within the tie of it freeze there. Work per round
    follows the flows it freezes: a link's load is summed again only when it loses
    entries (the same entries in the same order give the same sum), and caps, each a
    private link of one entry whose share is the cap itself, are taken in sorted order
    rather than scanned every round. Most calls here are bundles' one-link flows, each
    capped at its own pace, with one round per distinct cap.

    >>> small_rates_list([0, 1, 2], [0, 0, 0], 3, [10.0], None, [1.0, 2.0, INF])
    [1.0, 2.0, 7.0]
    """
    loads = [1] * len(flows) if weight is None else weight
    # Each link's live entries (flow, load) in entry order, and each flow's links.
    on_link: dict[int, list[tuple[int, float]]] = {}
    flow_links: list[list[int]] = [[] for _ in range(n_flows)]
    for flow, link, load in zip(flows, links, loads, strict=True):
        entries = on_link.get(link)
        if entries is None:
            on_link[link] = [(flow, load)]
        else:
            entries.append((flow, load))
        flow_links[flow].append(link)
    count = {link: _load(entries) for link, entries in on_link.items()}
    # Caps as (share, flow), least first: a private link's share is its cap (its load is
    # one), NaN's shares are NaN (numpy's path then).
    limits = []
    if cap is not None:
        for flow, limit in enumerate(cap):
            if limit != INF:
                if limit != limit:
                    return None
                limits.append((limit if limit > 0.0 else 0.0, flow))
        limits.sort()
    n_limits, first = len(limits), 0
    rate = [INF] * n_flows  # INF until frozen (a frozen flow's level is finite)
    tie = 1 + _TIE
    while count or first < n_limits:
        level = INF
        shares = []
        for link, total in count.items():
            if not total > 0:
                continue  # a link that only zero weights cross limits nobody
            left = remaining[link]
            share = (left if left > 0.0 else 0.0) / total
            if share != share or left != left:
                return None
            shares.append((share, link))
            if share < level:
                level = share
        if first < n_limits and limits[first][0] < level:
            level = limits[first][0]
        if level == INF:
            break  # every remaining flow crosses only infinite links
        bound = level * tie
        frozen = set()
        for share, link in shares:
            if share <= bound:
                frozen.update(flow for flow, _ in on_link[link])
        while first < n_limits and limits[first][0] <= bound:
            flow = limits[first][1]
            if rate[flow] == INF:
                frozen.add(flow)
            first += 1
        touched = set()
        for flow in frozen:
            rate[flow] = level
            touched.update(flow_links[flow])
        while first < n_limits and rate[limits[first][1]] != INF:
            first += 1  # caps of flows their links froze
        for link in touched:
            taken = 0
            rest = []
            for entry in on_link[link]:
                if entry[0] in frozen:
                    taken = taken + entry[1]
                else:
                    rest.append(entry)
            remaining[link] -= taken * level
            if rest:
                on_link[link] = rest
                count[link] = _load(rest)
            else:
                del on_link[link], count[link]
    return rate


def _load(entries: list[tuple[int, float]]) -> float:
    """A link's load: its entries' loads summed in order from an integer zero (as the
    numpy path's ``bincount`` sums them; an integer count without weights)."""
    total = 0
    for _, load in entries:
        total = total + load
    return total
