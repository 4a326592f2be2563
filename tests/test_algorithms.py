"""The algorithm suite: registry, symbolic proofs for every op and layout, broken variants.

Each algorithm is checked by the symbolic checker (simulator.algorithms.checker): the final buffers
must match the collective's definition and every conflicting access must be ordered.
"""

import dataclasses

import numpy as np
import pytest

from simulator.algorithms import algorithm_names, build_schedule, get_algorithm
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.algorithms.schedule import Schedule
from simulator.algorithms.tree import btree_parents, double_tree, tree_depth
from simulator.errors import CcsimError, ScheduleError

ROOTED = ("broadcast", "reduce")


def layouts():
    """p = 2..17 ranks on one server, and every even split into 1..8 servers."""
    for p in range(2, 18):
        for servers in range(1, 9):
            if p % servers == 0:
                yield RankLayout(p, tuple(r // (p // servers) for r in range(p)))


def cases():
    for name in algorithm_names():
        for op in get_algorithm(name).ops:
            yield name, op


@pytest.mark.parametrize(("name", "op"), list(cases()))
def test_every_algorithm_computes_its_collective(name, op):
    """For every supported op, p = 2..17 and 1..8 servers, with 1 and 3 chunks (and 2
    channels), the schedule verifies; roots vary for broadcast and reduce."""
    algo = get_algorithm(name)
    checked = 0
    for layout in layouts():
        if algo.unsupported(op, layout) is not None:
            continue
        for chunks, channels in ((1, 1), (3, 2)):
            options = {"root": (layout.ranks * 2) // 3} if op in ROOTED else {}
            verify(
                build_schedule(name, op, layout, 1e6, chunks=chunks, channels=channels, **options)
            )
            checked += 1
    # Every algorithm runs on every p here except the two-level ones, which need equal
    # servers: 16 rank counts x 2 option sets at least.
    assert checked >= 32


def test_registry_lists_the_suite():
    """The issue's algorithms, and the ops each implements."""
    assert set(algorithm_names()) == {
        "ring",
        "hierarchical",
        "pipelined",
        "tree",
        "chain-tree",
        "halving-doubling",
        "direct",
        "pairwise",
        "multipath",
        "nvls",
        "nvls-tree",
        "collnet-direct",
        "collnet-chain",
        "nccl-p2p",
    }
    assert get_algorithm("pairwise").ops == ("all_to_all",)
    assert set(get_algorithm("ring").ops) >= {"broadcast", "reduce", "all_reduce"}


def test_hierarchical_with_servers_not_numbered_in_order():
    """Servers interleaved (rank r on server r mod 3): the two-level rings follow the
    server attribute, not rank order."""
    layout = RankLayout(12, tuple(r % 3 for r in range(12)))
    for name in ("hierarchical", "pipelined"):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            verify(build_schedule(name, op, layout, 1e6, chunks=2))


def test_two_level_needs_servers_of_equal_size():
    """3 + 1 ranks per server: the error names the counts and the algorithms that can."""
    layout = RankLayout(4, (0, 0, 0, 1))
    with pytest.raises(CcsimError, match=r"same number of ranks on every server, got \[3, 1\]"):
        build_schedule("hierarchical", "all_reduce", layout, 1e6)
    with pytest.raises(CcsimError, match="algorithms that can: direct, halving-doubling, ring"):
        build_schedule("pipelined", "all_reduce", layout, 1e6)


def test_unsupported_op_names_the_algorithms_that_can():
    expected = r"ring does not implement all_to_all.*: direct, nccl-p2p, pairwise"
    with pytest.raises(CcsimError, match=expected):
        build_schedule("ring", "all_to_all", 8, 1e6)
    with pytest.raises(CcsimError, match="needs to know each rank's server"):
        build_schedule("hierarchical", "all_gather", RankLayout(8), 1e6)


def test_direct_all_reduce_limit():
    """p(p-1) all-gather sends each waiting for p-1 others: refused beyond 256 ranks."""
    with pytest.raises(CcsimError, match="limited to 256 ranks"):
        build_schedule("direct", "all_reduce", 257, 1e6)
    with pytest.raises(CcsimError, match="root must be a rank from 0 to 7"):
        build_schedule("tree", "broadcast", 8, 1e6, root=8)


def test_nccl_binary_trees():
    """NCCL's trees for 12 ranks (trees.cc comment): 0-8, 8-4, 8-10, 4-2, 4-6, 2-1, 2-3,
    6-5, 6-7, 10-9, 10-11; the mirror (p even) has rank 11 at the top. Depth
    ceil(log2 12) = 4. The shifted tree for p = 5 (odd) has rank 1 at the top."""
    first, second = double_tree(12)
    assert first.tolist() == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 8, 10]
    assert second.tolist() == [11 - u if u >= 0 else -1 for u in first[::-1]]
    assert tree_depth(first) == tree_depth(second) == 4
    assert np.flatnonzero(double_tree(5)[1] < 0).tolist() == [1]
    assert btree_parents(2).tolist() == [-1, 0]


def test_all_to_all_checker_definition():
    """Block (s, d) has owner s*p + d: rank s starts with it, rank d must end with it.
    Three ranks, one direct transfer per off-diagonal pair; dropping any one leaves its
    receiver without the block, sending a block to the wrong rank leaves it missing."""
    p = 3
    pairs = [(s, d) for s in range(p) for d in range(p) if s != d]
    segment = [s * p + d for s, d in pairs]

    def schedule(src, dst, seg):
        n = len(src)
        return Schedule(
            op="all_to_all",
            algorithm="hand",
            ranks=p,
            size_bytes=9.0,
            src=np.array(src),
            dst=np.array(dst),
            nbytes=np.ones(n),
            segment=np.array(seg),
            reduce=np.zeros(n, dtype=bool),
            dep_ptr=np.zeros(n + 1, dtype=np.int64),
            dep_idx=np.zeros(0, dtype=np.int32),
            dep_sent=np.zeros(0, dtype=bool),
            segment_owner=np.arange(p * p),
        )

    src, dst = [s for s, _ in pairs], [d for _, d in pairs]
    verify(schedule(src, dst, segment))
    with pytest.raises(ScheduleError, match="rank 2 ends with block 5 lacking.*ranks \\[1\\]"):
        verify(schedule(src[:3] + src[4:], dst[:3] + dst[4:], segment[:3] + segment[4:]))
    wrong = list(dst)
    wrong[0] = 2  # rank 0 sends its block for rank 1 to rank 2
    with pytest.raises(ScheduleError, match="rank 1 ends with block 1 lacking"):
        verify(schedule(src, wrong, segment))
    with pytest.raises(ScheduleError, match="owner 9; it must be sender"):
        bad = schedule(src, dst, segment)
        verify(dataclasses.replace(bad, segment_owner=np.arange(1, p * p + 1)))


def without(schedule: Schedule, drop) -> Schedule:
    """``schedule`` without the dependencies for which ``drop(op, dep, sent)`` holds."""
    owner = np.repeat(np.arange(schedule.n_ops), np.diff(schedule.dep_ptr))
    keep = ~drop(owner, schedule.dep_idx, schedule.dep_sent)
    counts = np.bincount(owner[keep], minlength=schedule.n_ops)
    return dataclasses.replace(
        schedule,
        dep_ptr=np.concatenate([[0], np.cumsum(counts)]),
        dep_idx=schedule.dep_idx[keep],
        dep_sent=schedule.dep_sent[keep],
    )


@pytest.mark.parametrize(
    ("name", "op", "p"),
    [
        ("tree", "all_reduce", 6),
        ("tree", "reduce", 7),
        ("tree", "broadcast", 7),
        ("hierarchical", "all_reduce", 8),
        ("pipelined", "all_gather", 8),
        ("halving-doubling", "all_reduce", 6),
        ("halving-doubling", "reduce_scatter", 5),
        ("direct", "all_reduce", 5),
        ("ring", "broadcast", 5),
        ("ring", "reduce", 5),
    ],
)
def test_missing_data_dependencies_are_caught(name, op, p):
    """With only the channel-order ("sent") dependencies left, a rank may forward data
    it has not finished receiving (or, in the order the checker runs them, not received
    at all): the checker must reject it."""
    layout = RankLayout(p, tuple(r // 2 for r in range(p)))
    schedule = build_schedule(name, op, layout, 1e6, chunks=2)
    with pytest.raises(ScheduleError, match="race|before holding"):
        verify(without(schedule, lambda _op, _dep, sent: ~sent))


def test_tree_without_one_child_is_caught():
    """Tree all-reduce, 8 ranks: rank 2 has children 1 and 3 in tree 0. If rank 2's
    reduction up waits only for rank 1, rank 3's contribution may not be in it yet."""
    schedule = build_schedule("tree", "all_reduce", 8, 1e6)
    up_from_3 = np.flatnonzero((schedule.src == 3) & (schedule.dst == 2) & schedule.reduce)[0]
    with pytest.raises(ScheduleError, match="race"):
        verify(without(schedule, lambda _op, dep, sent: (dep == up_from_3) & ~sent))


def test_reduce_instead_of_copy_is_caught():
    """Pairwise/direct all-to-all must copy; hierarchical all-gather turned into reduces
    still ends right, but a reduce-scatter turned into copies loses contributions."""
    schedule = build_schedule(
        "hierarchical", "reduce_scatter", RankLayout(8, (0,) * 4 + (1,) * 4), 1e6
    )
    with pytest.raises(ScheduleError, match="lacking"):
        verify(dataclasses.replace(schedule, reduce=np.zeros(schedule.n_ops, dtype=bool)))
    broken = build_schedule("halving-doubling", "all_reduce", 8, 1e6)
    reduce = broken.reduce.copy()
    reduce[np.flatnonzero(~reduce)[0]] = True  # an all-gather copy now adds again
    with pytest.raises(ScheduleError, match="twice"):
        verify(dataclasses.replace(broken, reduce=reduce))


def test_pairwise_rounds_follow_the_issue():
    """p = 8 (power of two): in round i rank r sends to r XOR i; p = 6: to r + i mod 6."""
    s8 = build_schedule("pairwise", "all_to_all", 8, 8e3)
    assert np.array_equal(s8.dst, s8.src ^ (s8.step + 1))
    s6 = build_schedule("pairwise", "all_to_all", 6, 6e3)
    assert np.array_equal(s6.dst, (s6.src + s6.step + 1) % 6)
    assert s6.n_ops == 6 * 5 and s8.n_ops == 8 * 7


def test_bytes_moved_match_the_algorithms():
    """Total bytes on the wire (n = 1e6, p = 8, 2 servers of 4):
    direct all-reduce 2 p (p-1) n/p = 14 n; halving-doubling all-reduce 2 p (p-1)/p n
    = 14 n; double tree 2 trees x 2(p-1) edges x n/2 = 14 n; hierarchical all-reduce:
    intra 2 x p (g-1) n/g = 12 n, inter 2 x p (N-1) n/(gN) = 2 n; ring broadcast (p-1) n."""
    n, p = 1e6, 8
    layout = RankLayout(p, (0,) * 4 + (1,) * 4)
    total = {
        name: build_schedule(name, "all_reduce", layout, n, chunks=2).nbytes.sum()
        for name in ("direct", "halving-doubling", "tree", "hierarchical", "pipelined")
    }
    assert total == pytest.approx(
        {"direct": 14 * n, "halving-doubling": 14 * n, "tree": 14 * n, "hierarchical": 14 * n,
         "pipelined": 14 * n}
    )  # fmt: skip
    assert build_schedule("ring", "broadcast", p, n, chunks=4).nbytes.sum() == pytest.approx(7 * n)
