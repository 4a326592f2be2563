"""gpt-oss's attention as ccsim times it, checked against cuDNN's own measurements and
Transformer Engine's backend rules (issue 31).

* The backend: every published gpt-oss row runs cuDNN's fused attention. Transformer
  Engine's ``get_attention_backend`` (transformer_engine/pytorch/attention/
  dot_product_attention/utils.py) turns FlashAttention off for any ``softmax_type`` but
  "vanilla" (gpt-oss's sinks are "learnable"), keeps FusedAttention for sinks and
  sliding windows in bf16 (v2.9-v2.18), and in FP8 dot-product attention keeps it from
  v2.16 on sm100 with cuDNN 9.21 (v2.14's filter dropped it, and UnfusedDotProduct-
  Attention too, so FP8 attention with sinks had no backend there);
  ``nvte_get_fused_attn_backend`` (common/fused_attn/fused_attn.cpp, v2.14) takes
  learnable softmax from cuDNN 9.13.1 and causal windows (left, 0) from 9.2. The
  containers ship cuDNN 9.13.1 (NeMo 25.11), 9.18 (26.02), 9.20 (26.04) and 9.21 (26.06)
  (Megatron-Bridge v0.6.0 docs/releases/software-versions.md), and only 26.06's and
  26.08's GB200 MXFP8 rows set ``fp8_dot_product_attention``. So no row falls back to
  unfused S x S attention, and ccsim's cuDNN kernels are the right ones; what is checked
  here is their timing.
* cuDNN's measured backward on Blackwell (NVIDIA/cudnn-frontend pull request #505,
  2026-08-07, "bwd+swa summary", microsecond medians of the cuDNN backend column, batch
  1, 16 heads, causal; an SM120 GPU, consumer Blackwell, the only Blackwell figures of
  head 64 and of sliding windows found): at 4,096 tokens, head 64 558.2 us, head 128
  920.7 us, head 64 with a window of 511 171.0 us and of 1,023 276.6 us; at 16,384
  tokens head 64 6,447.7 us, windows 791.8 and 1,169.2 us.
"""

from __future__ import annotations

import pytest

from simulator.workload.devices import DEVICES
from simulator.workload.kernels import Attention, attention_time
from simulator.workload.model import Transformer

#: cudnn-frontend #505's cuDNN backward times (us) by (tokens, head size, window; 0: none).
CUDNN_SM120_BWD_US = {
    (4096, 64, 0): 558.2,
    (4096, 128, 0): 920.7,
    (4096, 64, 511): 171.0,
    (4096, 64, 1023): 276.6,
    (16384, 64, 0): 6447.7,
    (16384, 64, 511): 791.8,
    (16384, 64, 1023): 1169.2,
}


@pytest.mark.parametrize("gpu", ["B200", "GB200"])
def test_head_64_backward_rate_carried_to_blackwell_matches_cudnns(gpu):
    """ccsim carries H100's measured head-64 / head-128 rate ratio (FlashAttention-3
    paper, 0.87 backward at 4k) to Blackwell; cuDNN's own Blackwell backward at 4,096
    tokens gives 0.5 x 920.7 / 558.2 = 0.825 (twice the FLOPs at head 128 in 920.7 us
    against 558.2): the model's ratio within 7% of it."""
    measured = 0.5 * CUDNN_SM120_BWD_US[4096, 128, 0] / CUDNN_SM120_BWD_US[4096, 64, 0]
    assert measured == pytest.approx(0.8247, abs=1e-4)
    device = DEVICES[gpu]
    model = device.attention_rate(4096, True, head_dim=64) / device.attention_rate(
        4096, True, head_dim=128
    )
    assert model == pytest.approx(measured, rel=0.07)


@pytest.mark.parametrize("window", [511, 1023])
def test_window_backward_at_gpt_oss_length_matches_cudnns(window):
    """A windowed kernel's backward over the causal one's at 4,096 tokens and head 64
    (gpt-oss's length and head): ccsim times the band's FLOPs (window_keys) at the
    table's rate for its span; cuDNN measured 171.0 / 558.2 = 0.306 for a window of 511
    and 276.6 / 558.2 = 0.496 for 1,023. ccsim's ratios are 0.334 and 0.505: within 10%.
    (A window of w before a query is w + 1 keys with the query, ccsim's ``window``.)
    At 16,384 tokens ccsim's ratios are 18-24% under cuDNN's (0.094 and 0.149 against
    0.123 and 0.181), which no published row runs with a window."""
    measured = CUDNN_SM120_BWD_US[4096, 64, window] / CUDNN_SM120_BWD_US[4096, 64, 0]
    m = Transformer(layers=2, hidden=1024, heads=16, seq=4096, window=window + 1)
    for gpu in ("H100", "B200", "GB200"):  # a ratio: each device's own table
        device = DEVICES[gpu]
        band = attention_time(device, Attention(16, 4096, m.window_keys(), 64, backward=1))
        causal = attention_time(device, Attention(16, 4096, 4096, 64, backward=1))
        assert band / causal == pytest.approx(measured, rel=0.10)
