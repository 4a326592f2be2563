"""ccsim validate LOG: cases read straight from nccl-tests output, settings from its header."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.validate import BUNDLED, guess_preset, load_case, log_case

DATA = Path(__file__).parent / "data" / "nccl-tests"
LOG = DATA / "oci-a100-2n-all_reduce.log"
JSON = DATA / "oci-a100-2n-all_reduce.json"


@pytest.mark.parametrize("path", [LOG, JSON], ids=["stdout", "json"])
def test_a_log_is_the_case_its_sidecar_describes(path):
    """Read with only --topology, the OCI log is the bundled hand-made case: per size, the
    faster of the transcribed out-of-place and in-place runs, and the sidecar's nodes, op
    and GPUs per process, from the header."""
    sidecar = load_case(BUNDLED / "A100-2N-AR-default-roce.yaml")
    case = log_case(path, topology="dgx-a100")
    with (BUNDLED / "A100-2N-AR-default-roce.csv").open() as stream:
        best = [
            min(
                (int(r["bytes"]), float(r[f"time_us_{c}"]), float(r[f"busbw_{c}"]))
                for c in ("oop", "ip")
            )
            for r in csv.DictReader(stream)
        ]
    assert case.measured == best
    for key in ("preset", "nodes", "op", "algorithm", "gpus_per_process"):
        assert case.settings[key] == sidecar.settings[key], key


@pytest.mark.parametrize(
    ("gpu", "preset"),
    [
        ("NVIDIA H100 80GB HBM3", "dgx-h100"),  # CUDA's name of the SXM5 part
        ("NVIDIA GeForce RTX 5090", "pcie-8gpu"),
        ("NVIDIA B200", "hgx-b200"),
        ("NVIDIA H200", "hgx-h200"),
        ("NVIDIA GB200", "gb200-nvl72"),
        ("NVIDIA B300", "hgx-b300"),
        # alibaba-ebmgn7ex carries the same A100 on an eRDMA stack: a log names no stack,
        # so the InfiniBand server is the guess and the cloud preset is asked for by name.
        ("NVIDIA A100-SXM4-40GB", "dgx-a100"),
    ],
)
def test_the_gpu_names_the_preset_when_one_fits(gpu, preset):
    assert guess_preset([gpu]) == preset


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (["NVIDIA H100 PCIe"], "fits no bundled preset"),
        (["NVIDIA GB300"], "fits no bundled preset"),
        (["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"], "GPUs differ"),
        ([], "names no GPU"),
    ],
)
def test_an_ambiguous_or_unknown_gpu_asks_for_topology(gpus, message):
    with pytest.raises(CcsimError, match="pass --topology") as error:
        guess_preset(gpus, "run.log")
    assert message in str(error.value) and str(error.value).startswith("run.log: ")


def test_two_infiniband_presets_of_one_gpu_ask_for_topology(monkeypatch):
    """Where two presets of the same GPU and stack fit, the log cannot choose: both are
    named and --topology asked for (a second dgx-a100 under another name stands in)."""
    from simulator.validate import log_cases

    files = dict(log_cases.preset_files())
    monkeypatch.setattr(
        log_cases, "preset_files", lambda: {**files, "dgx-a100-twin": files["dgx-a100"]}
    )
    with pytest.raises(CcsimError, match="pass --topology") as error:
        guess_preset(["NVIDIA A100-SXM4-40GB"], "run.log")
    assert "fits presets dgx-a100, dgx-a100-twin" in str(error.value)


def table_only(tmp_path, op_row="float     sum      -1"):
    """The OCI log's table without its header lines: no hosts, no GPUs, no ranks."""
    rows = [line for line in LOG.read_text().splitlines() if "float     sum" in line][:3]
    lines = [line for line in LOG.read_text().splitlines() if "size" in line and "count" in line]
    path = tmp_path / "table.log"
    path.write_text("\n".join(lines + [r.replace("float     sum      -1", op_row) for r in rows]))
    return path


def test_what_the_log_does_not_say_comes_from_the_options(tmp_path):
    path = table_only(tmp_path)
    with pytest.raises(CcsimError, match=r"table.log: names no hosts .*; pass --nodes N"):
        log_case(path, topology="dgx-a100")
    case = log_case(path, topology="dgx-a100", nodes=2)
    assert case.settings["nodes"] == 2 and case.settings["gpus_per_process"] == 1
    gather = table_only(tmp_path, op_row="float    none      -1")
    with pytest.raises(CcsimError, match="pass --op OP"):
        log_case(gather, topology="dgx-a100", nodes=1)
    assert log_case(gather, topology="dgx-a100", nodes=1, op="all_gather").settings["op"] == (
        "all_gather"
    )


def test_ranks_must_match_the_simulated_cluster():
    with pytest.raises(CcsimError, match=r"16 ranks ran on 2 host\(s\), but dgx-a100 x 1 has 8"):
        log_case(LOG, topology="dgx-a100", nodes=1)


def trimmed(tmp_path, sizes=4):
    """The OCI log with its first ``sizes`` rows only (a quick run)."""
    lines = LOG.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("8 "))
    path = tmp_path / "oci.log"
    path.write_text("\n".join(lines[: first + sizes] + lines[-3:]) + "\n")
    return path


def test_cli_validates_log_files(tmp_path, capsys):
    log = trimmed(tmp_path)
    assert main(["validate", str(log), "--topology", "dgx-a100", "--detail"]) == 0
    out, err = capsys.readouterr()
    assert "oci.log" in out and "error" not in out
    assert "oci.log: all_reduce, 16 ranks, 1 GPU(s) per process" in err
    assert "--topology dgx-a100 --nodes 2" in err


def ccsim(*args):
    return subprocess.run(
        [sys.executable, "-m", "simulator", *args], capture_output=True, text=True, check=False
    )


def test_cli_errors_name_the_file_and_the_option(tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_text("Segmentation fault (core dumped)\n")
    done = ccsim("validate", str(junk))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "junk.log: not nccl-tests output" in done.stderr.strip().splitlines()[-1]
    pcie = tmp_path / "pcie.log"  # the OCI log as if run on H100 PCIe: no bundled preset
    pcie.write_text(trimmed(tmp_path).read_text().replace("A100-SXM4-40GB", "H100 PCIe"))
    done = ccsim("validate", str(pcie))
    assert done.returncode == 2 and "pass --topology" in done.stderr.splitlines()[-1]
    done = ccsim("validate", "--nodes", "2")
    assert done.returncode == 2 and "--nodes: only with LOG files" in done.stderr
