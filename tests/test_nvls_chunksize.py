"""NCCL_NVLS_CHUNKSIZE: parsed as NCCL reads it, and the NVLS chunk NCCL derives from it.

NCCL sets ``comm->nvlsChunkSize`` from the variable (transport/nvls.cc:160 and 206-224 at
v2.30.7-1); NVLS's chunk starts from one 512 KiB Simple step (DEFAULT_BUFFSIZE 4 MiB /
NCCL_STEPS 8) cut to it, NVLSTree's from it, and both are cut while a piece
(channels x heads of them) would get fewer than 64, 8, 2 (NVLS) chunks
(enqueue.cc:2258-2285). Every expected chunk here is worked out from those rules; every
expected time from the thread-block pipeline of :func:`simulator.library.nccl.nvls_loops`
with its cited constants (a loop of channels x heads x chunk, a + b x heads us of
synchronisation and heads x chunk at one block's rate per step).
"""

import dataclasses
import math

import pytest

from simulator.cli import main
from simulator.collective.policy import NcclPolicy, nvls_chunk
from simulator.errors import CcsimError
from simulator.library.nccl import NVLS_CTA_GBPS, NVLS_STEP_US
from simulator.library.nccl_env import parse_nccl_env
from simulator.library.protocol import calibration_of
from simulator.topology import load_topology
from simulator.validate.nccl_tests import BUNDLED, load_case, run_case

GiB = 2**30
SETTING = "NCCL_NVLS_CHUNKSIZE=524288"


# -- parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("524288", 524288), ("0x80000", 524288)])
def test_the_setting_reads_decimal_and_hex_as_strtoll_does(text, value):
    env = parse_nccl_env(f"NCCL_NVLS_CHUNKSIZE={text}")
    assert env.nvls_chunk == value
    assert env.text == f"NCCL_NVLS_CHUNKSIZE={text}"
    assert parse_nccl_env({"NCCL_NVLS_CHUNKSIZE": value}).nvls_chunk == value
    assert parse_nccl_env(None).nvls_chunk is None  # NCCL's default: 128 KiB


@pytest.mark.parametrize("text", ["big", "256", "0", "-1", "2147483648", "1.5e6"])
def test_a_chunk_nccl_could_not_use_is_one_line_naming_the_variable(text):
    with pytest.raises(CcsimError) as error:
        parse_nccl_env(f"NCCL_NVLS_CHUNKSIZE={text}")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"NCCL_NVLS_CHUNKSIZE={text}: ") and "512" in message


def test_the_command_line_refuses_a_bad_chunk_with_exit_2(capsys):
    argv = ["collective", "all_reduce", "--topology", "hgx-b200", "--sizes", "1G"]
    assert main([*argv, "--nccl", "NCCL_NVLS_CHUNKSIZE=100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NCCL_NVLS_CHUNKSIZE=100" in err


# -- NCCL's chunk --------------------------------------------------------------------


def test_nvls_chunk_follows_nccls_thresholds_at_two_settings():
    ops = 24 * 8  # 8 B200s: 24 NVLS channels x 8 heads
    # 128 KiB: 64 KiB below 64 x 192 x 128 KiB = 1.5 GiB, kept from there.
    assert nvls_chunk("NVLS", 1.5 * GiB - 1, ops) == 65536
    assert nvls_chunk("NVLS", 1.5 * GiB, ops) == 131072
    # 512 KiB: the same test against 64 x 192 x 512 KiB = 6 GiB.
    assert nvls_chunk("NVLS", 4 * GiB, ops, 524288) == 65536
    assert nvls_chunk("NVLS", 6 * GiB, ops, 524288) == 524288
    # NVLS never exceeds one 512 KiB Simple step; NVLSTree takes the setting as it is.
    assert nvls_chunk("NVLS", 64 * GiB, ops, 2**21) == 524288
    assert nvls_chunk("NVLSTree", 64 * GiB, ops, 2**21) == 2**21
    # A setting off the 512-byte grain is rounded down, as NCCL does.
    assert nvls_chunk("NVLS", 64 * GiB, ops, 200_000) == 199_680
    # Below the thresholds the setting's size does not matter (32 KiB under 8 x ops x
    # chunk-after-the-first-cut, 16 KiB under 2 x ops x it).
    assert nvls_chunk("NVLS", 64 * 2**20, ops) == nvls_chunk("NVLS", 64 * 2**20, ops, 524288)


def test_the_setting_does_not_change_what_nccl_picks():
    graph = load_topology("hgx-b200")
    plain, chunked = NcclPolicy(), NcclPolicy(env=SETTING)
    for size in (2**10, 2**20, 2**26, 2**31, 2**34):
        a, b = plain.choose(graph, "all_reduce", size), chunked.choose(graph, "all_reduce", size)
        assert (a.algorithm, a.protocol, a.channels) == (b.algorithm, b.protocol, b.channels)


def pipeline_us(size: float, chunk: float) -> float:
    """One server of 8 B200s, NVLS all-reduce on 24 channels x 8 heads, by hand: each of
    the size / (24 x 8 x chunk) loops costs the larger of one thread block's step
    (a + 8 b us, then 8 x chunk at NVLS_CTA_GBPS) and the links' time for the loop
    (18 NVLinks x 40.1 GB/s x NVLS share 0.74 x 8/9); the pipeline fills and drains in
    NVLS_FILL = 2 more; the last partial loop pays a whole synchronisation; and the
    call NCCL's Simple base latency (8.4 us) plus the preset's launch."""
    a, b = NVLS_STEP_US["blackwell"]
    sync = a + 8 * b
    step = sync + 8 * chunk / (NVLS_CTA_GBPS["blackwell"] * 1e3)
    link = 24 * 8 * chunk / (18 * 40.1 * 0.74 * 8 / 9 * 1e3)
    loops = size / (24 * 8 * chunk)
    return (loops + 2) * max(step, link) + (math.ceil(loops) - loops) * sync + 8.4


@pytest.mark.parametrize(
    ("size", "chunks"), [(2 * GiB, (131072, 65536)), (4 * GiB, (131072, 65536))]
)
def test_two_and_four_gib_on_eight_b200s_follow_the_hand_pipeline(size, chunks):
    """At 2 and 4 GiB the default keeps 128 KiB chunks (link-bound), 512 KiB moves the
    cut to 6 GiB so NCCL runs 64 KiB chunks, twice the loops, each thread-block bound
    (9.8 + 8 x 64 KiB / 28.5 GB/s = 28.2 us against the links' 26.5 us)."""
    graph = load_topology("hgx-b200")
    launch_us = calibration_of(graph).launch_s * 1e6
    times = []
    for env, chunk in zip((None, SETTING), chunks, strict=True):
        result = NcclPolicy(env=env).simulate(graph, "all_reduce", size)
        assert result.params["nccl_algorithm"] == "NVLS"
        assert result.params["message_bytes"] == chunk
        want = pipeline_us(size, chunk) + launch_us
        # ccsim's schedule runs at most 32 chunks deep and its fill is given back in
        # closed form: 2% covers that approximation, not the chunk (5% apart here).
        assert result.time_s * 1e6 == pytest.approx(want, rel=0.02)
        times.append((result.time_s * 1e6, want))
    (plain, plain_hand), (chunked, chunked_hand) = times
    # The slowdown the setting causes, against the hand pipeline's: within 0.5%.
    assert chunked / plain == pytest.approx(chunked_hand / plain_hand, rel=0.005)
    assert chunked / plain > 1.04


def test_from_six_gib_the_larger_chunk_takes_fewer_loops():
    """At 8 GiB 512 KiB chunks stay (8 GiB >= 6 GiB): a quarter of the default's loops,
    both link-bound, so the time moves only by the pipeline's shorter fill and the
    last loop's synchronisation, which the hand pipeline gives too."""
    graph = load_topology("hgx-b200")
    launch_us = calibration_of(graph).launch_s * 1e6
    result = NcclPolicy(env=SETTING).simulate(graph, "all_reduce", 8 * GiB)
    assert result.params["message_bytes"] == 524288
    assert result.time_s * 1e6 == pytest.approx(pipeline_us(8 * GiB, 524288) + launch_us, rel=0.02)


def test_a_sidecar_that_states_the_setting_runs_with_it():
    """The held-out A4 B200 job sets NCCL_NVLS_CHUNKSIZE=524288 (its sidecar's ``nccl``):
    ``ccsim validate`` runs its 4 GiB size with 64 KiB chunks, slower than the default's
    128 KiB by the hand pipeline's ratio."""
    case = load_case(BUNDLED.parent / "nccl-tests-heldout2" / "B200-1N-AR-gke-a4-deepep.yaml")
    assert case.settings["nccl"] == SETTING
    row = [m for m in case.measured if m[0] == 4 * GiB]
    chunked = run_case(dataclasses.replace(case, measured=row))
    settings = {k: v for k, v in case.settings.items() if k != "nccl"}
    plain = run_case(dataclasses.replace(case, measured=row, settings=settings))
    ratio = chunked.simulated_us[0] / plain.simulated_us[0]
    hand = pipeline_us(4 * GiB, 65536) / pipeline_us(4 * GiB, 131072)
    assert ratio == pytest.approx(hand, rel=0.005)
