"""Pipelined hierarchical collectives: the two-level algorithm on k slices of the data.

The data is cut into k slices (the ``chunks`` option), each running every phase of
:mod:`simulator.algorithms.hierarchical`. A rank sends on its intra-server links and on
its inter-server links in slice order, so while slice i crosses the servers, slice i+1
is already being reduced inside them: the two kinds of links work at the same time.

For all-reduce the intra-server links carry two phases per slice (reduce-scatter A and
all-gather C), the inter-server links one (all-reduce B); the intra-server order is
A0 A1 C0 A2 C1 ... so that B(i+1) has its input before B(i) ends. With T_intra and
T_inter the two totals of plain ``hierarchical`` (T = T_intra + T_inter), per-slice
times t_A = t_C = T_intra/(2k) and t_B = T_inter/k, and latency neglected:

* inter-server bound (t_B >= 2 t_A): the inter links never idle after A0 and the last
  C follows the last B, so T(k) = T_inter + T_intra/k;
* intra-server bound (t_B <= 2 t_A): the intra links idle only while C0 waits for B0
  and the last C for the last B, t_B - t_A each when positive, so
  T(k) = T_intra + 2 max(0, t_B - t_A).

The speedup over ``hierarchical`` tends to (T_intra + T_inter) / max(T_intra, T_inter).
All-gather and reduce-scatter are two-stage pipelines: T(k) = t1 + t2 + (k-1) max(t1, t2)
with t_i the stage times of one slice (latency included). Per-slice latency grows with k,
so the best k is finite.

``chunks`` = k = 1 is plain ``hierarchical``. More slices add per-step latency and ops
(k times as many); ``--chunks auto`` picks k by simulation. ``intra="mesh"`` runs the
in-server phases as a full-mesh exchange, as in ``hierarchical`` (T_intra is then
2(a_i + n/(g B_i)) for all-reduce); the stage model above is unchanged.
"""

from __future__ import annotations

from .hierarchical import Hierarchical


class Pipelined(Hierarchical):
    """Hierarchical with k slices whose intra- and inter-server phases overlap."""

    name = "pipelined"
    description = "hierarchical on k = --chunks slices, intra and inter phases overlapped"
    slices = True
