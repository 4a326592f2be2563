"""Model descriptions: the transformer shapes generators build training steps for.

Transformer arithmetic (Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", SC'21, section 5.1): a layer of hidden size h has
about 12 h^2 parameters; its forward pass costs 24 h^2 + 4 s h FLOPs per token (s the
sequence length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .kernels import Gemm


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer: layers, hidden size, sequence length, vocabulary.

    ``ffn`` is the MLP inner size (4h for GPT; LLaMA's SwiGLU uses three h x ffn
    matrices, which ``gated=True`` accounts for); ``heads`` the attention heads (for the
    memory of attention scores).
    """

    layers: int
    hidden: int
    seq: int = 2048
    vocab: int = 51200
    ffn: int = 0
    gated: bool = False
    heads: int = 0

    @property
    def attention_heads(self) -> int:
        """Attention heads (``heads``; default one per 128 of hidden, GPT-3's head size)."""
        return self.heads or max(1, self.hidden // 128)

    @property
    def layer_params(self) -> float:
        """Parameters of one layer: attention 4h^2 plus the MLP."""
        h = self.hidden
        ffn = self.ffn or 4 * h
        return 4 * h * h + (3 if self.gated else 2) * h * ffn

    @property
    def params(self) -> float:
        """All parameters, with input and output embeddings."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden

    def layer_forward_flops(self, tokens: float) -> float:
        """Forward FLOPs of one layer: 2 per parameter per token plus attention scores."""
        return tokens * (2 * self.layer_params + 4 * self.seq * self.hidden)

    def linear_gemms(self, micro_batch: int, *, tp: int = 1) -> tuple[Gemm, ...]:
        """The forward GEMMs of one layer's linear layers on one of ``tp`` tensor-parallel
        ranks, over the b s tokens of a micro-batch (Megatron's column- then
        row-parallel split): QKV h -> 3h/t, the projection h/t -> h, the MLP's first
        layer h -> f/t (2f/t gated: gate and up in one GEMM) and second f/t -> h.
        Together 2 (layer parameters / t) FLOPs per token.

        >>> m = Transformer(layers=1, hidden=1024, seq=512)
        >>> sum(g.flops for g in m.linear_gemms(2, tp=2)) == 2 * (2 * 512) * m.layer_params / 2
        True
        """
        h, f, tokens = self.hidden, self.ffn or 4 * self.hidden, micro_batch * self.seq
        up = (2 if self.gated else 1) * f
        return (
            Gemm(tokens, _split(3 * h, tp), h),
            Gemm(tokens, h, _split(h, tp)),
            Gemm(tokens, _split(up, tp), h),
            Gemm(tokens, h, _split(f, tp)),
        )

    def attention_gemms(self, micro_batch: int, *, tp: int = 1) -> tuple[Gemm, ...]:
        """The attention core's batched GEMMs of one layer's forward on one TP rank: per
        sequence and local head, the scores Q K^T (s x s over the head size) and their
        weighted sum of V (s x head size over s); 4 s h / t FLOPs per token together.

        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8)
        >>> m.attention_gemms(2, tp=2)
        (Gemm(m=512, n=512, k=128, batch=8, count=1), Gemm(m=512, n=128, k=512, batch=8, count=1))
        """
        s, heads = self.seq, self.attention_heads
        size = self.hidden // heads
        batch = micro_batch * _split(heads, tp)
        return (Gemm(s, s, size, batch), Gemm(s, size, s, batch))

    def logits_gemm(self, micro_batch: int, *, tp: int = 1) -> Gemm:
        """The output layer's forward GEMM on one TP rank: b s tokens x h -> V / t."""
        return Gemm(micro_batch * self.seq, _split(self.vocab, tp), self.hidden)

    def layer_elementwise_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        sequence_parallel: bool = False,
        flash_attention: bool = False,
    ) -> float:
        """HBM bytes the non-GEMM kernels of one layer's forward pass move (bf16, 1-byte
        dropout masks), as Megatron-LM fuses them (megatron/core/fusions: fused
        LayerNorm, scale-mask-softmax, bias-GeLU and bias-dropout-add): per token, two
        LayerNorms read and write h (8h bytes), two bias-dropout-adds read the input and
        the residual and write the sum and a mask (14h), softmax reads and writes the
        a s / t scores (4as/t) and its dropout reads, writes and masks them (5as/t), and
        the bias-GeLU reads and writes f / t (4f/t; a gated MLP reads two, 6f/t). The
        22h part is split over TP only with sequence parallelism. ``flash_attention``
        (Dao et al. 2022) never writes the scores to HBM, so their 9as/t is gone; its
        other traffic (Q, K, V read once, the output written once) is within the 22h.

        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8)
        >>> m.layer_elementwise_bytes(1) == 22 * 1024 + 9 * 8 * 512 + 4 * 4096
        True
        """
        h, f = self.hidden, self.ffn or 4 * self.hidden
        per_token = 22 * h / (tp if sequence_parallel else 1)
        if not flash_attention:
            per_token += 9 * self.attention_heads * self.seq / tp
        per_token += (6 if self.gated else 4) * f / tp
        return tokens * per_token

    def step_flops(self, sequences: float, *, recompute: bool = True) -> float:
        """FLOPs of a training step over ``sequences`` sequences as Megatron-LM counts them
        (Narayanan et al., SC'21, eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh) for GPT with full
        recomputation): forward, backward (2x) and, with ``recompute``, the forward again
        of every layer, plus the logits' forward and backward (6 B s h V).

        >>> m = Transformer(layers=96, hidden=12288, seq=2048, vocab=51200)
        >>> B, s, l, h, V = 1536, 2048, 96, 12288, 51200
        >>> m.step_flops(B) / (96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)))
        1.0
        """
        passes = 4 if recompute else 3
        tokens = sequences * self.seq
        return passes * self.layers * self.layer_forward_flops(tokens) + 6 * tokens * (
            self.hidden * self.vocab
        )


def _split(size: int, parts: int) -> int:
    """One rank's share of a dimension split over ``parts`` (rounded up, as padding)."""
    return math.ceil(size / parts)


#: Named models used by the bundled presets.
MODELS = {
    # GPT-3 175B (Brown et al. 2020): 96 layers, hidden 12288, sequence 2048.
    "gpt3-175b": Transformer(layers=96, hidden=12288, seq=2048, vocab=51200, heads=96),
    # LLaMA-13B (Touvron et al. 2023): 40 layers, hidden 5120, SwiGLU MLP of 13824.
    "llama-13b": Transformer(
        layers=40, hidden=5120, seq=2048, vocab=32000, ffn=13824, gated=True, heads=40
    ),
    # GPT-2 XL sized, for quick runs.
    "gpt-1.5b": Transformer(layers=48, hidden=1600, seq=1024, vocab=50257, heads=25),
}
