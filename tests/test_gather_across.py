"""All-gather on the machines issue 32 names, from Google Cloud's published nccl-tests
runs (bundled, never used to set a constant): 2 x A4 (8 B200 each), 2 x A3 Ultra (8
H200 each), and 8 and 32 GB200 GPUs of one NVL72 rack (A4X hosts of 4 GPUs).

All four ran under Google's gIB setup, whose tuner file (NCCL_TUNER_CONFIG_PATH,
/usr/local/gib/configs/tuner_config_*.txtpb) overrides NCCL's algorithm, protocol and
channels per size and is not public (the sidecars cite where the setting is
documented). ccsim predicts them with NCCL's own choice; the tests below hold what that
prediction gets right, and check ccsim's per-algorithm models against the runs where the
runs themselves show which algorithm ran. The larger errors are in the README.

Figures: 400 Gb/s ConnectX-7 = 50 GB/s, at the presets' RDMA share 0.96 (NCCL's
~48 GB/s per NDR NIC); NVLink5 18 x 50 GB/s = 900 GB/s per direction per GPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from simulator.validate import BUNDLED, validate_folder

#: The bundled cases this module reads.
CASES = (
    "B200-2N-AG-gke-a4-docs",
    "H200-2N-AG-gke-a3ultra",
    "GB200-2N-AG-gke-a4x",
    "GB200-8N-AG-gke-a4x-tas",
)


def _copy(folder: Path, name: str, *, keep=None, nccl: str = "") -> None:
    """Copy a bundled case (and its preset file, if any) into ``folder``, keeping only
    the CSV rows whose size ``keep`` accepts and appending NCCL settings ``nccl``."""
    sidecar = (BUNDLED / f"{name}.yaml").read_text()
    if nccl:
        sidecar += f"nccl: {nccl}\n"
    (folder / f"{name}.yaml").write_text(sidecar)
    header, *rows = (BUNDLED / f"{name}.csv").read_text().splitlines()
    rows = [row for row in rows if keep is None or keep(int(row.split(",")[0]))]
    (folder / f"{name}.csv").write_text("\n".join([header, *rows]) + "\n")
    for line in sidecar.splitlines():
        if line.startswith("preset:") and line.strip().endswith(".yaml"):
            preset = line.split(":", 1)[1].strip()
            shutil.copy(BUNDLED / preset, folder / preset)


def _run(folder: Path) -> dict:
    results = {r.name: r for r in validate_folder(folder)}
    assert all(not r.error for r in results.values()), [r.error for r in results.values()]
    return results


def test_the_cases_are_bundled_and_named_with_their_source():
    """Each case has its table of 24 sizes (1 KiB-8 GiB) and a sidecar citing the page."""
    for name in CASES:
        text = (BUNDLED / f"{name}.yaml").read_text()
        assert "docs.cloud.google.com/ai-hypercomputer/docs/nccl/" in text
        assert "Never used to set a constant" in text
        sizes = [int(r.split(",")[0]) for r in (BUNDLED / f"{name}.csv").read_text().split()[1:]]
        assert sizes == [2**k for k in range(10, 34)]


def test_two_server_all_gather_is_nccl_ring_near_the_nic_bound(tmp_path):
    """NCCL's tuner offers all-gather across servers only Ring, PAT (one GPU a node) and
    NVLS/CollNet with CollNet (tuning.cc:295-296, 353-358), so both 2 x 8 runs are rings.
    A ring over 16 ranks carries 15/16 of the buffer n through each direction of every
    server-to-server NIC pair, 8 NICs a server: busbw = (15/16) n / t <= 8 x 48 = 384
    GB/s; every GPU also forwards its rings over NVLink (PXN included), (15/16) n at
    NCCL's NVLink share, which binds first on H200 (NVLink4: 0.824 x 450 = 370.8 GB/s;
    B200's NVLink5, 0.802 x 900, does not). ccsim's 8 GiB call reaches the lesser bound
    within 1%; the measured runs are 8-11% under it (the README's held-out errors)."""
    for name in CASES[:2]:
        _copy(tmp_path, name, keep=lambda size: size == 2**33)
    results = _run(tmp_path)
    nics = 8 * 50.0 * 0.96
    bounds = {CASES[0]: min(nics, 0.802 * 900), CASES[1]: min(nics, 0.824 * 450)}
    for name in CASES[:2]:
        result = results[name]
        assert result.algorithms == ["Ring"]
        assert result.simulated_busbw[0] == pytest.approx(bounds[name], rel=0.01)
        measured = result.measured_busbw[0]
        assert 0.08 <= (result.simulated_busbw[0] - measured) / measured <= 0.11


def test_rack_all_gather_runs_at_nvls_rate_when_told_nvls(tmp_path):
    """Inside one NVL72 NVLink domain the runs plateau at 478-488 GB/s busbw with 8 and
    32 GPUs, far under the NVLink ring ccsim (and NCCL's own model) picks (~720 GB/s),
    and near an NVLS all-gather, whose links carry (p-1)/p of the buffer into every GPU
    at NVLS's share of NVLink (hgx-b200's 0.597, from NCCL's figures: 537 GB/s busbw at
    most). Run as NVLS (NCCL_ALGO=NVLS, a what-if: the runs do not print their
    algorithm), ccsim's 8-GPU plateau from 512 MiB on is within 3% of each measured size
    and the 32-GPU one from 2 GiB on (where its measured busbw stops rising) within 7%."""
    for name, nccl in ((CASES[2], ""), (CASES[2], "NCCL_ALGO=NVLS"), (CASES[3], "NCCL_ALGO=NVLS")):
        folder = tmp_path / (name + nccl.replace("=", "-"))
        folder.mkdir()
        smallest = 2**29 if name == CASES[2] else 2**31
        _copy(folder, name, keep=lambda size, least=smallest: size >= least, nccl=nccl)
        (result,) = _run(folder).values()
        measured, simulated = np.array(result.measured_busbw), np.array(result.simulated_busbw)
        if not nccl:
            assert set(result.algorithms) == {"Ring"}
            assert np.all(simulated > 1.4 * measured)
            continue
        assert set(result.algorithms) == {"NVLS"}
        assert np.all(simulated <= 537.3)
        bound = 0.03 if name == CASES[2] else 0.07
        assert np.all(np.abs(simulated - measured) / measured <= bound), name


def test_two_b200_servers_small_sizes_match_ll128_steps(tmp_path):
    """The 2 x A4 run's 47-52 us at 1-64 KiB is about twice ccsim's LL ring (~28 us, and
    NCCL's own model: 23-25 us) and close to NCCL's LL128 ring (44.6 us in its model).
    With LL turned off (NCCL_PROTO=LL128,Simple, a what-if: Google's tuner file is not
    public), ccsim's times at <= 64 KiB are within 7% of each measured size."""
    _copy(tmp_path, CASES[0], keep=lambda size: size <= 2**16, nccl="NCCL_PROTO=LL128,Simple")
    result = _run(tmp_path)[CASES[0]]
    assert set(result.protocols) == {"LL128"}
    measured, simulated = np.array(result.measured_us), np.array(result.simulated_us)
    assert np.all(np.abs(simulated - measured) / measured <= 0.07)


#: One-size runs (16 GiB) of all-gather, reduce-scatter and all-to-all on 8, 32 and 64
#: GB200 GPUs of one NVLink domain, NCCL 2.30.4 (yangwhale/gpu-tpu-pedia; sidecars).
RACK_CASES = tuple(
    f"GB200-{hosts}N-{op}-a4x-pedia" for hosts in (2, 8, 16) for op in ("AG", "RS", "A2A")
)


def test_rack_gather_scatter_and_all_to_all_are_predicted_at_16_gib(tmp_path):
    """Held out: at 16 GiB NCCL runs all-gather and reduce-scatter as NVLink rings (ccsim
    ~721 GB/s busbw: 0.802 x 900, NCCL's NVLink5 share) and all-to-all as grouped
    send/receive; the runs measure 683-708 and 667-683 GB/s, so every case is within
    7% (ccsim 2-6% fast on the rings, 5-6% slow on all-to-all, as on the GB300 rack)."""
    for name in RACK_CASES:
        _copy(tmp_path, name)
    results = _run(tmp_path)
    assert sorted(results) == sorted(RACK_CASES)
    for name, result in results.items():
        measured, simulated = result.measured_busbw[0], result.simulated_busbw[0]
        expected = "SendRecv" if "-A2A-" in name else "Ring"
        assert result.sizes == [16 * 2**30] and result.algorithms == [expected], name
        assert abs(simulated - measured) / measured <= 0.07, name
        if expected == "Ring":
            assert simulated == pytest.approx(0.802 * 900, rel=0.005)


#: The same chapter's runs across two racks' NVLink domains (Google's RoCE between them):
#: 2 + 2 hosts (16 GPUs) and 8 + 8 hosts (64 GPUs; its all-to-all, ~60 s of CPU, is in
#: simulator/data/nccl-tests-racks and not run here).
CROSS_RACK_CASES = tuple(f"GB200-2R4N-{op}-a4x-pedia" for op in ("AG", "RS", "A2A")) + tuple(
    f"GB200-2R16N-{op}-a4x-pedia" for op in ("AG", "RS")
)


def test_two_racks_over_roce_are_predicted_at_16_gib(tmp_path):
    """Held out, across two racks (each rack's GPUs one NVLink domain, one 400 Gb/s NIC a
    GPU). 2 x 8 GPUs: the ring all-gather / reduce-scatter crosses the racks through 8
    NICs a rack, busbw <= 8 x 48 = 384 GB/s (the 2-server closed form above), and the
    all-to-all sends half of every GPU's buffer through its own NIC, busbw = 2 x 48 x
    15/16 = 90 GB/s: ccsim meets both within 1% and the runs (378.3, 378.8, 88.5 GB/s)
    within 2%. 2 x 32 GPUs: the rings cross through 32 NICs a rack, so NVLink binds
    (0.802 x 900 = 721.8 GB/s) and the runs (687.7, 701.8) are within 5%."""
    for name in CROSS_RACK_CASES:
        _copy(tmp_path, name)
    results = _run(tmp_path)
    closed = {"AG": 8 * 48.0, "RS": 8 * 48.0, "A2A": 2 * 48.0 * 15 / 16}
    for name, result in results.items():
        op = name.split("-")[2]
        simulated, measured = result.simulated_busbw[0], result.measured_busbw[0]
        assert result.algorithms == ["SendRecv" if op == "A2A" else "Ring"], name
        if name.startswith("GB200-2R4N"):
            assert simulated == pytest.approx(closed[op], rel=0.01), name
            assert abs(simulated - measured) / measured <= 0.02, name
        else:
            assert simulated == pytest.approx(0.802 * 900, rel=0.005), name
            assert abs(simulated - measured) / measured <= 0.05, name
