"""The GEMM kernel model: how long a matrix multiplication takes from its shape.

A GEMM ``C[m x n] = A[m x k] B[k x n]`` (``batch`` of them in one batched kernel) runs
as output tiles, one thread block per tile, a wave of tiles at a time over the device's
multiprocessors (NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning
Performance documentation: tile and wave quantization). Its time is the larger of

* compute: the waves it needs, each as long as one tile's ``2 x tile_m x tile_n x k``
  FLOPs on one multiprocessor at the device's sustained GEMM efficiency, so a GEMM of
  1.05 waves costs 2 and a dimension that is not a multiple of the tile pays for the
  padding; and
* memory: its operands read once (2 bytes an element in bf16, 1 in fp8) and its output
  written once (bf16) at the bandwidth streaming kernels sustain
  (:attr:`~.devices.Device.stream_bandwidth`): the attention scores' GEMMs (``Q K^T``
  writes an s x s block per head, the weighted sum of ``V`` reads it) are memory bound
  with heads of 128 or less on A100 and H100.

The library is assumed to pick whichever of the tile's two orientations is faster, and
a tile side is cut to the matrix side (rounded up to 64) where the matrix is smaller, as
cuBLAS has smaller tiles for those. On devices whose GEMMs were measured by shape
(Hopper: :data:`~.devices.H100_TILE_K_OVERHEAD`), each tile also pays a fixed cost
(``tile_k_overhead``: the pipeline's fill and the epilogue, as that many more K
elements) and each kernel a fixed time (``gemm_kernel_s``), which is why GEMMs with a
short K (small hidden sizes) run further below peak than long ones. What is left out:
split-K and stream-K kernels that soften the last wave, L2 reuse across tiles, and the
host's launch gaps between kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import CcsimError


class Device(Protocol):
    """What the kernel model reads of an accelerator (:class:`~.devices.Device` has it;
    a protocol here so that ``devices`` can time GEMMs without an import circle)."""

    name: str
    peak_flops: float
    efficiency: float
    fp8_flops: float
    fp8_efficiency: float
    units: int
    tile: tuple[int, int]
    tile_k_overhead: int
    gemm_kernel_s: float

    @property
    def stream_bandwidth(self) -> float:
        """Bytes/s a memory-bound kernel moves."""
        ...

    def attention_rate(
        self, tokens: int, backward: bool = False, backend: int = 0, head_dim: int = 128
    ) -> float:
        """FLOP/s of fused causal attention over sequences of ``tokens`` with heads of
        ``head_dim`` (``backend``: an index into :data:`ATTENTION_BACKENDS`)."""
        ...


#: Bytes per element of GEMM operands and results (bf16 / fp16).
ELEMENT_BYTES = 2
#: Smallest tile side cuBLAS falls back to for a narrow matrix (its 64 x 64 tiles).
MIN_TILE = 64
#: How much longer an MXFP8 GEMM (1 x 32 block scales, Blackwell's block-scaled tensor
#: cores) runs than the same GEMM on per-tensor-scaled fp8 operands, MEASURED with the
#: casts outside the timed region: Transformer Engine's GEMM profiling guide
#: (docs/examples/gemm_profiling/gemm_profiling.rst, ``--pre-quantize``, NVIDIA B300,
#: hidden 4096, FFN 16384, 15,872 tokens): the 12 GEMMs of a layer (forward and both
#: gradients) take 7.161 ms in MXFP8 and 6.812 ms in fp8 current scaling (forward 2.365
#: / 2.158, input gradient 2.397 / 2.329, weight gradient 2.400 / 2.325). Measured on
#: B300 and taken for B200 and GB200 (same tensor-core generation): an assumption.
MXFP8_GEMM_SLOWDOWN = 7.161 / 6.812


@dataclass(frozen=True)
class Gemm:
    """``count`` kernels, each ``batch`` independent ``m x k`` by ``k x n`` products, with
    operands of ``bits`` (16: bf16 at the device's 16-bit peak; 8: fp8 at its fp8 peak,
    as Transformer Engine runs linear layers). ``block``: fp8 operands scaled per block
    of that many elements along K (32: MXFP8, at :data:`MXFP8_GEMM_SLOWDOWN` of the
    per-tensor rate; 0: one scale per tensor). ``splits``: each kernel run as that many
    kernels over m / splits rows each, as Transformer Engine's userbuffer overlap chunks
    a GEMM beside its communication; ``margin``: multiprocessors left to a
    communication kernel running beside it (TE's ``set_sm_margin``), the GEMM's tiles
    run on the others (:func:`gemm_time`)."""

    m: int
    n: int
    k: int
    batch: int = 1
    count: int = 1
    bits: int = 16
    block: int = 0
    splits: int = 1
    margin: int = 0

    @property
    def flops(self) -> float:
        """2 m n k per product (a multiply and an add)."""
        return 2.0 * self.m * self.n * self.k * self.batch * self.count

    @property
    def hbm_bytes(self) -> float:
        """Operands read once and the output written once, every kernel."""
        operands = (self.m * self.k + self.k * self.n) * self.bits / 8
        return float((operands + ELEMENT_BYTES * self.m * self.n) * self.batch * self.count)

    def backward(self) -> tuple[Gemm, Gemm]:
        """The two GEMMs of its backward pass: the input gradient ``dC B^T``
        (m x k, over n) and the weight gradient ``A^T dC`` (k x n, over m).

        >>> [g.as_list() for g in Gemm(8, 4, 2).backward()]
        [[8, 2, 4, 1, 1], [2, 4, 8, 1, 1]]
        """
        return (
            Gemm(self.m, self.k, self.n, self.batch, self.count, self.bits, self.block),
            Gemm(self.k, self.n, self.m, self.batch, self.count, self.bits, self.block),
        )

    def times(self, count: int) -> Gemm:
        """The same kernel run ``count`` times as often (e.g. once per layer)."""
        return replace(self, count=self.count * count)

    def in_bits(self, bits: int, block: int = 0) -> Gemm:
        """The same kernel with operands of ``bits`` (scaled per ``block`` elements)."""
        return replace(self, bits=bits, block=block)

    def overlapped(self, splits: int = 1, margin: int = 0) -> Gemm:
        """The same kernel chunked into ``splits`` along m, beside a communication
        kernel that holds ``margin`` multiprocessors."""
        return replace(self, splits=splits, margin=margin)

    def as_list(self) -> list[int]:
        """The trace form ``[m, n, k, batch, count]`` (``bits`` appended when not 16,
        then ``block`` when not 0, then ``splits`` and ``margin`` when either is not
        their default, with every field before them).

        >>> Gemm(8, 4, 2).in_bits(8, 32).as_list()
        [8, 4, 2, 1, 1, 8, 32]
        >>> Gemm(8, 4, 2).overlapped(4, 16).as_list()
        [8, 4, 2, 1, 1, 16, 0, 4, 16]
        """
        form = [self.m, self.n, self.k, self.batch, self.count]
        if self.splits != 1 or self.margin:
            return [*form, self.bits, self.block, self.splits, self.margin]
        if self.block:
            return [*form, self.bits, self.block]
        return form if self.bits == 16 else [*form, self.bits]


#: Fused attention kernels by the code the trace gives them (``Attention.backend``):
#: cuDNN's (Transformer Engine's choice on Hopper and later when both are available,
#: ``get_attention_backend`` in transformer_engine/pytorch/attention.py) and
#: FlashAttention-2's (the ``flash-attn`` package TE runs when ``NVTE_FUSED_ATTN=0``).
ATTENTION_BACKENDS = ("cudnn", "flash2")


@dataclass(frozen=True)
class Attention:
    """``count`` fused causal attention kernels (flash attention, as Transformer Engine
    runs it through cuDNN, or FlashAttention-2's with ``backend`` 1), each over ``batch``
    sequence-heads of ``queries`` query tokens against ``keys`` key tokens of head size
    ``head_dim``; ``backward`` 1 for the backward kernel (it recomputes the scores: 5
    products against the forward's 2, 2.5 times its FLOPs; FlashAttention-2, Dao 2023,
    section 3.1). A sliding window's kernel gives as ``keys`` the count whose causal
    FLOPs are the band's (:meth:`~.model.Transformer.window_keys`)."""

    batch: int
    queries: int
    keys: int
    head_dim: int
    count: int = 1
    backward: int = 0
    #: The kernels' library, an index into :data:`ATTENTION_BACKENDS`.
    backend: int = 0
    #: 1 where the kernels apply attention dropout (Megatron-LM's ``--attention-dropout``,
    #: 0.1 by default): each score's Philox draw inside the fused kernel
    #: (:attr:`~.devices.Device.attention_dropout`).
    dropout: int = 0

    @property
    def flops(self) -> float:
        """Causal: half of the 4 q k d of the scores and their weighted sum (the masked
        blocks are skipped), 2.5 times that backward.

        >>> Attention(1, 1024, 1024, 128).flops == 2 * 1024 * 1024 * 128
        True
        """
        forward = 2.0 * self.queries * self.keys * self.head_dim * self.batch * self.count
        return forward * (2.5 if self.backward else 1.0)

    def as_list(self) -> list[int]:
        """The trace form ``[batch, queries, keys, head_dim, count, backward]``, and the
        backend after them where it is not cuDNN's or the kernels apply dropout, and
        then ``dropout`` (1) where they do.

        >>> Attention(1, 8, 8, 64, dropout=1).as_list()
        [1, 8, 8, 64, 1, 0, 0, 1]
        """
        form = [self.batch, self.queries, self.keys, self.head_dim, self.count, self.backward]
        if self.dropout:
            return [*form, self.backend, self.dropout]
        return [*form, self.backend] if self.backend else form


def attention_time(device: Device, kernel: Attention) -> float:
    """Seconds ``kernel`` takes on ``device``: its FLOPs at the rate the device's fused
    attention sustains at that sequence length and head size
    (:meth:`~.devices.Device.attention_rate`), times the device's measured slowdown
    of its library's kernels with dropout where they apply it
    (:attr:`~.devices.Device.attention_dropout`). The length is the shorter of the query
    and key spans: a causal kernel's queries (a context-parallel rank's chunk against
    the whole sequence), a sliding window's keys (each query tile meets a band of about
    2 w keys, a short sequence's work per tile: the table's shortest length stands for
    it, no banded kernel having been measured in the sources).

    >>> from .devices import DEVICES
    >>> h100 = DEVICES["H100"]
    >>> k = Attention(32, 4096, 4096, 128)
    >>> round(k.flops / attention_time(h100, k) / 1e12)  # cuDNN, causal, 4k: 518 TFLOP/s
    518
    >>> dropped = Attention(32, 4096, 4096, 128, dropout=1)  # H200: 0.614 ms over 0.594
    >>> round(attention_time(h100, dropped) / attention_time(h100, k), 4)
    1.0337
    """
    span = min(kernel.queries, kernel.keys)
    rate = device.attention_rate(span, bool(kernel.backward), kernel.backend, kernel.head_dim)
    if kernel.dropout:
        return kernel.flops / rate * device.attention_dropout[kernel.backend]
    return kernel.flops / rate


def kernels_time(
    device: Device, gemms: tuple[Gemm, ...], attention: tuple[Attention, ...] = ()
) -> float:
    """Seconds a compute op's GEMMs and attention kernels take, one after another."""
    return gemms_time(device, gemms) + sum(attention_time(device, a) for a in attention)


def waves(gemm: Gemm, tile: tuple[int, int], units: int) -> int:
    """Waves of ``tile``-sized output blocks over ``units`` multiprocessors, one kernel.

    >>> waves(Gemm(8192, 2304, 2304), (256, 128), 108)  # 32 x 18 = 576 tiles
    6
    """
    tile_m = min(tile[0], _round_up(gemm.m, MIN_TILE))
    tile_n = min(tile[1], _round_up(gemm.n, MIN_TILE))
    tiles = math.ceil(gemm.m / tile_m) * math.ceil(gemm.n / tile_n) * gemm.batch
    return math.ceil(tiles / units)


def gemm_time(device: Device, gemm: Gemm) -> float:
    """Seconds ``gemm`` takes on ``device`` (see the module docstring).

    A GEMM with a ``margin`` runs its tiles on the device's multiprocessors less the
    margin, each as fast as before (the waves grow; Transformer Engine's ``_math_sms``,
    transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp). One of
    ``splits`` chunks pays its own tiles (each chunk's m cut to the tile) and its own
    kernel's fixed time and re-reads the other operand, but the chunks' tiles share
    waves: TE issues them round-robin on several compute streams (as many as the
    splits, up to ``NVTE_COMM_OVERLAP_MAX_STREAMS``, 3: comm_gemm_overlap.h), so one chunk's last
    wave fills with the next one's tiles.

    >>> from .devices import DEVICES
    >>> a100 = DEVICES["A100"]
    >>> big = Gemm(8192, 8192, 8192)  # 32 x 64 = 2048 tiles: 18.96 -> 19 waves
    >>> round(gemm_time(a100, big) / (big.flops / (a100.peak_flops * a100.efficiency)), 6)
    1.001953
    """
    peak, efficiency = device.peak_flops, device.efficiency
    if gemm.bits == 8:
        efficiency = device.fp8_efficiency or device.efficiency
        if not device.fp8_flops:
            raise CcsimError(
                f"{device.name} has no fp8 tensor cores: run this workload in bf16 "
                "(precision: bf16) or on an H100, H200, B200 or GB200"
            )
        peak = device.fp8_flops
        if gemm.block:
            efficiency /= MXFP8_GEMM_SLOWDOWN
    elif gemm.bits != 16:
        raise CcsimError(f"GEMM operands of {gemm.bits} bits: ccsim times 16 and 8")
    # A tile's fixed cost (pipeline fill, epilogue) as K elements at the 16-bit rate, so
    # that an fp8 tile pays the same time for it as a bf16 one.
    overhead = device.tile_k_overhead / (device.peak_flops * device.efficiency)
    units = device.units - gemm.margin
    if units < 1:
        raise CcsimError(
            f"a GEMM beside communication on {gemm.margin} multiprocessors leaves none of "
            f"{device.name}'s {device.units}: lower num_sm"
        )
    chunk = replace(gemm, m=-(-gemm.m // gemm.splits), count=1, splits=1, margin=0)
    tile_m, tile_n = device.tile
    best = math.inf
    for tile in ((tile_m, tile_n), (tile_n, tile_m)):
        cut = (
            min(tile[0], _round_up(chunk.m, MIN_TILE)),
            min(tile[1], _round_up(gemm.n, MIN_TILE)),
        )
        # One wave: every multiprocessor running a tile, each at its share of the rate.
        per_wave = device.units * 2.0 * cut[0] * cut[1]
        per_wave_s = per_wave * (gemm.k / (peak * efficiency) + overhead)
        tiles = waves(chunk, tile, 1) * gemm.splits
        best = min(best, math.ceil(tiles / units) * per_wave_s)
    # Each chunk reads its rows and the whole other operand and writes its rows.
    operand = gemm.k * gemm.n * gemm.batch * gemm.bits / 8
    memory = (gemm.hbm_bytes / gemm.count + (gemm.splits - 1) * operand) / device.stream_bandwidth
    return gemm.count * (max(best, memory) + gemm.splits * device.gemm_kernel_s)


def gemms_time(device: Device, gemms: tuple[Gemm, ...]) -> float:
    """Seconds a sequence of GEMM kernels takes, one after another."""
    return sum(gemm_time(device, gemm) for gemm in gemms)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step
