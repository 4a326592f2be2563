"""Tensor- and context-parallel ranks simulated once: a master stands for its shadows.

The ``tp`` ranks of a Megatron TP group run the same kernels on the same shapes, issue
the same calls in the same order, and (on a cluster that looks the same from each) end
them at the same times; so do the ``cp`` ranks of a CP group, which Megatron-Core gives
balanced halves of the sequence (a master then stands for ``tp x cp`` ranks). A
workload built with ``shadows`` holds the ops of one of them, the master
(:class:`~simulator.workload.trace.Shadows`); the replay processes its ops only, which
is most of a step's cost (a Llama 3 405B replica is a million ops, an eighth of them a
master's). The network still carries every rank's traffic: a call on the TP group runs
over all its ranks (the master issues it for the others), and a call on a group the
shift moves elsewhere (a data-parallel or context-parallel group, a pipeline send) runs
beside its images on the shadows' groups, which nothing waits for. An image call
replayed from its timing alone schedules no event for its ends (a *passive* call:
:meth:`~simulator.workload.isolated.IsolatedCalls.run`); its ends are checked as if
heard, unless something meets it first and it goes on as a bundle.

Checked, not assumed: every image call must end at each of its positions when the
master's call ends at the same position, every image send when the master's send
arrives, and every rank of a TP group's call when its master does (the shadows' next ops
would otherwise start at other times than the master's). Where one does not (a slower
NIC on one rail, ECMP hashing the images elsewhere), the replay is run again with every
rank's ops built (:meth:`~simulator.workload.engine.WorkloadReplay.run`), at once
where a shadow ends after its master (:class:`ShadowsUnlike`), else at the end. Faulted
clusters and per-rank compute scaling build every rank from the start, and so does a
master's pipeline send that crosses servers over several shortest paths
(:func:`sends_hash`): ECMP hashes the master's send and each image's onto spines of
their own, where they meet the other cross-server traffic (a stage's data-parallel
reduction, on a stage split between two NVL72 racks) each differently, and the replay
would find out only late in the step (issue 31: 52 s of CPU for a 405B step on 128
GB200s, the first replay wasted). That test is a guess about CPU time only: the step is
the same either way (every rank built is the reference), and it may build every rank
where the hashed paths happen to be met alike. (They are not on the published GB200 405B
rows: with every rank built, a TP group's ranks end the step 10 ms apart on 128 GPUs.)
Where the replicas are refused too,
:func:`~simulator.workload.replicas.neither_stands_in` says so from the masters' build,
and :func:`~simulator.workload.steady.run_steady` builds every rank at once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..network.routing import Router
from .trace import Workload

#: Relative difference under which a shadow's end counts as its master's (times are
#: the same sums in the same order where the images really are alike; this absorbs only
#: the last bits of rounding).
SAME = 1e-12

#: Why the shadows are refused where :func:`sends_hash` holds.
HASHED_SENDS = "a master's pipeline send crosses servers over several shortest paths"


class ShadowsUnlike(Exception):
    """A shadow did not end with its master (the message says which and when): the
    replay stops at once and builds every rank, or, where ``across_cp`` (the shadow is
    a CP rank away from its master, not in its TP group) and the workload has a build
    with the TP ranks alone shadowed, that build
    (:attr:`~simulator.workload.trace.Shadows.tp_only`)."""

    def __init__(self, message: str, across_cp: bool = False):
        super().__init__(message)
        self.across_cp = across_cp


def shadow_images(workload: Workload) -> tuple[dict[str, tuple[str, ...]] | None, str]:
    """For each group with a master among its ranks, the names of its images on the
    shadows: the other groups the shadows' permutations map it onto (empty for a group
    every permutation maps onto itself, the TP group without CP), each image's ranks in
    the order of the group's; or None and why the shadows cannot stand in."""
    shadows = workload.shadows
    if shadows is None:
        return None, "the workload is not given by TP masters"
    perms = shadows.images()
    by_ranks = {tuple(group.ranks): name for name, group in workload.groups.items()}
    images: dict[str, tuple[str, ...]] = {}
    masters = shadows.masters
    for name, group in workload.groups.items():
        if masters.isdisjoint(group.ranks):
            continue
        own = frozenset(group.ranks)
        seen = {own}
        found = []
        # (Rows as lists at once: one conversion for all, not two per row.)
        for moved in perms[:, np.asarray(group.ranks, dtype=np.int64)].tolist():
            members = frozenset(moved)
            if members in seen:
                continue  # itself (its call covers it), or an image already met
            seen.add(members)
            # Met first through a single generator's power, an image lists its ranks in
            # the order of the group's (a product with the group's own shift rotates it).
            image = by_ranks.get(tuple(moved))
            if image is None:
                return None, f"group {name!r} has no image on the shadows' ranks"
            found.append(image)
        images[name] = tuple(found)
    return images, ""


def crosses_hashed(
    pairs: Iterable[tuple[int, int]], servers: list[int] | None, router: Router
) -> bool:
    """Whether some (source, destination) GPU pair of ``pairs`` is on two servers that
    several shortest paths join and the fabric hashes each connection onto one of them
    (ECMP); ``servers`` is each GPU's server (None: every GPU its own).

    Never where the fabric routes per destination (InfiniBand's subnet manager): there a
    route depends on where its destination is cabled, which a map of GPUs that keeps
    the fabric (the shadows' shift; replicas side by side) carries along, so the
    images' routes are expected to be the routes' images. A guess about CPU time only,
    as for ECMP: the replay still checks the shadows' ends, and the replicas their
    routes image by image."""
    if not router.hashes_connections:
        return False
    crossing = [(a, b) for a, b in pairs if servers is None or servers[a] != servers[b]]
    if not crossing:
        return False
    ends = np.array(crossing, dtype=np.int64)
    return not bool(router.single_path(ends[:, 0], ends[:, 1]).all())


def sends_hash(workload: Workload, servers: list[int] | None, router: Router) -> bool:
    """Whether a master's send in ``workload`` (given by TP masters) crosses servers over
    several shortest paths: its images' sends are then hashed onto other paths than the
    master's, and the shadows are unlike as soon as other traffic meets them there
    (see the module's docstring). Groups' calls are not looked at: their hashed paths
    are met alike on the published H100 clusters, where the shadows stand in."""
    shadows = workload.shadows
    if shadows is None:
        return False
    masters, ops = shadows.masters, workload.ops
    ends = {
        (ops[send].rank, ops[receive].rank)
        for send, receive in workload.pairs
        if ops[send].rank in masters
    }
    return crosses_hashed(sorted(ends), servers, router)


class ShadowCheck:
    """Ends of masters' calls and sends against their shadows', as the replay goes."""

    def __init__(self) -> None:
        # (call or send key) -> {position: master's end}, and the shadows' ends.
        self._master: dict[tuple, dict[int, float]] = defaultdict(dict)
        self._shadow: dict[tuple, list[tuple[int, float, bool]]] = defaultdict(list)
        #: The first disagreement found, if any (the replay then builds every rank).
        self.why = ""
        #: Whether that shadow was a CP rank (or more) away from its master (see
        #: :class:`ShadowsUnlike`).
        self.across_cp = False
        self._expected: list[ExpectedEnds] = []

    def master(self, key: tuple, positions: list[int], now: float) -> None:
        """The master's call (or send) ``key`` ended at ``positions`` now."""
        ends = self._master[key]
        for position in positions:
            ends[position] = now

    def shadow(
        self,
        key: tuple,
        positions: list[int],
        now: float,
        what: str | Callable[[], str],
        across_cp: bool = False,
    ) -> None:
        """An image of ``key`` (or a TP group's shadow rank) ended at ``positions`` now;
        ``what`` names it in the message if it disagrees; ``across_cp``: the shadow is a
        CP rank (or more) away from its master, not in its TP group."""
        self._shadow[key].extend((position, now, across_cp) for position in positions)
        if self.why:
            return
        ends = self._master.get(key, {})
        for position in positions:
            end = ends.get(position)
            # (Within SAME of each other, tested inline: some 100,000 ends a 405B step.)
            if end is not None and not abs(end - now) <= SAME * max(1.0, abs(end), abs(now)):
                name = what() if callable(what) else what
                self.why = f"{name} ended at {now:.9g} s, its master at {end:.9g} s"
                self.across_cp = across_cp
                raise ShadowsUnlike(self.why, across_cp)

    def expected(
        self, key: tuple, what: str | Callable[[], str], across_cp: bool = False
    ) -> ExpectedEnds:
        """The ends of an image of ``key`` replayed without events (a passive call, see
        :meth:`simulator.workload.isolated.IsolatedCalls.run`), checked at :meth:`settle`
        as if each had been heard when it came (``across_cp`` as :meth:`shadow`'s)."""
        return ExpectedEnds(key, what, self._expected, across_cp)

    def expected_family(self, key: tuple, across_cp: Sequence[bool] = ()) -> ExpectedFamily:
        """The ends of the images of ``key`` replayed together without events
        (:meth:`simulator.workload.isolated.IsolatedCalls.run_family`): as one
        :meth:`expected` per image (``across_cp``: each image's, none given: False)."""
        return ExpectedFamily(key, self._expected, across_cp)

    def settle(self) -> str:
        """After the run: the first disagreement between masters and shadows ('' if
        none), including shadows that ended before their master did; :attr:`across_cp`
        says whether that shadow was a CP rank (or more) away from its master."""
        if self.why:
            return self.why
        # Passive images' ends checked where they are (no list of every end is made:
        # there are a few for each of hundreds of thousands of image calls).
        masters = self._master
        # The images of one call on several groups usually share its timing's ends (the
        # same list) and start and cut alike: such a repeat checks the same ends against
        # the same master's again, and is skipped (11 in 12 of the Llama 3 405B CP 16
        # step's 165,000 image calls). The list is alive, so its id names it.
        checked: set[tuple] = set()
        for expected in self._expected:
            key = expected.key
            for start, cut, done, across_cp in expected.ends():
                seen = (key, start, cut, id(done))
                if seen in checked:
                    continue
                checked.add(seen)
                ends = masters.get(key, {})
                for offset, positions in done:
                    when = start + offset
                    if when > cut:
                        continue
                    for position in positions.tolist():
                        end = ends.get(position)
                        if end is None:
                            return f"a shadow of {key} ended where its master never did"
                        if abs(end - when) > SAME * max(1.0, abs(end), abs(when)):
                            self.across_cp = across_cp
                            return (
                                f"a shadow of {key} ended at {when:.9g} s, its master "
                                f"at {end:.9g} s"
                            )
        self._expected.clear()
        for key, seen in self._shadow.items():
            ends = self._master.get(key, {})
            for position, when, across_cp in seen:
                end = ends.get(position)
                if end is None:
                    return f"a shadow of {key} ended where its master never did"
                if not abs(end - when) <= SAME * max(1.0, abs(end), abs(when)):
                    self.across_cp = across_cp
                    return f"a shadow of {key} ended at {when:.9g} s, its master at {end:.9g} s"
        return ""


class ExpectedEnds:
    """The ends a passive image call will have (:meth:`ShadowCheck.expected`): its
    timing's (offset, positions) from its start; a call that goes on as a bundle takes
    back those after the instant it does, and its bundle's ends are heard as they come
    (:meth:`ShadowCheck.shadow`)."""

    def __init__(
        self,
        key: tuple,
        what: str | Callable[[], str],
        registry: list[ExpectedEnds],
        across_cp: bool = False,
    ):
        self.key = key
        self.what = what
        self.across_cp = across_cp
        self.start = 0.0
        self.done: list[tuple[float, np.ndarray]] = []
        self.cut = math.inf
        self._registry = registry

    def expect(self, start: float, done: list[tuple[float, np.ndarray]]) -> None:
        """The call's positions end at ``start`` plus these offsets unless retracted."""
        self.start, self.done = start, done
        self._registry.append(self)

    def retract(self, after: float) -> None:
        """Ends after ``after`` will not be."""
        self.cut = min(self.cut, after)

    def ends(self) -> list[tuple[float, float, list[tuple[float, np.ndarray]], bool]]:
        """(start, cut, done, across_cp) of the call, as :meth:`ShadowCheck.settle`
        checks them."""
        return [(self.start, self.cut, self.done, self.across_cp)]


class ExpectedFamily:
    """The ends the passive images of one master's call replayed together will have
    (:meth:`ShadowCheck.expected_family`): what an :class:`ExpectedEnds` per image
    would hold, kept as one record (Llama 3 405B's CP 16 step replays 162,512 such
    images in 14,368 families).

    Images whose timing's ends are the same list (most of a family's) are checked
    once, as :meth:`ShadowCheck.settle` skips such repeats anyway; an image that goes
    on as a bundle (:meth:`retract`) has its own cut, and then every image of the
    family is listed, in order, as the records per image were."""

    __slots__ = ("_registry", "across_cp", "cuts", "distinct", "dones", "key", "start")

    def __init__(self, key: tuple, registry: list, across_cp: Sequence[bool] = ()):
        self.key = key
        self.across_cp = across_cp  # per image (none given: every image False)
        self.start = 0.0
        self.dones: list[list[tuple[float, np.ndarray]]] = []
        self.distinct: list[int] = []
        self.cuts: dict[int, float] = {}
        self._registry = registry

    def expect(
        self, start: float, dones: list[list[tuple[float, np.ndarray]]], distinct: list[int]
    ) -> None:
        """Image ``i`` ends at ``start`` plus the offsets of ``dones[i]`` unless
        retracted; ``distinct``: the images whose list is not an earlier image's."""
        self.start, self.dones, self.distinct = start, dones, distinct
        self._registry.append(self)

    def retract(self, i: int, after: float) -> None:
        """Image ``i``'s ends after ``after`` will not be."""
        self.cuts[i] = min(self.cuts.get(i, math.inf), after)

    def ends(self) -> list[tuple[float, float, list[tuple[float, np.ndarray]], bool]]:
        """(start, cut, done, across_cp) of each image that :meth:`ShadowCheck.settle`
        would not skip as a repeat within the family (every image where one was cut)."""
        start, dones, cuts = self.start, self.dones, self.cuts
        apart = self.across_cp
        if not cuts:
            return [(start, math.inf, dones[i], bool(apart) and apart[i]) for i in self.distinct]
        return [
            (start, cuts.get(i, math.inf), done, bool(apart) and apart[i])
            for i, done in enumerate(dones)
        ]
