"""Reading nccl-tests' own output: stdout as printed, and the JSON of its -J option."""

import csv
import json
from pathlib import Path

import pytest

from simulator.errors import CcsimError
from simulator.validate import BUNDLED, read_nccl_output

DATA = Path(__file__).parent / "data" / "nccl-tests"
LOG = DATA / "oci-a100-2n-all_reduce.log"
JSON = DATA / "oci-a100-2n-all_reduce.json"
HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
    "            (us)  (GB/s)  (GB/s)\n"
)

FIGURES = ("time_us_oop", "busbw_oop", "time_us_ip", "busbw_ip")


def transcribed(name: str) -> list[tuple]:
    with (BUNDLED / f"{name}.csv").open() as stream:
        return [
            (int(r["bytes"]), *(float(r[key]) for key in FIGURES)) for r in csv.DictReader(stream)
        ]


@pytest.mark.parametrize("path", [LOG, JSON], ids=["stdout", "json"])
def test_a_public_run_reads_as_its_hand_transcription(path):
    """The OCI 2x A100 run (kubectl and ssh lines around it, no binary name) gives, size
    by size, the figures transcribed by hand in the bundled A100-2N-AR-default-roce.csv,
    and the header gives 16 ranks on 2 hosts, one GPU per process."""
    out = read_nccl_output(path)
    rows = [(r.size, r.time_us, r.busbw, r.time_us_ip, r.busbw_ip) for r in out.rows]
    assert rows == transcribed("A100-2N-AR-default-roce")
    assert out.op() == "all_reduce"
    assert (out.ranks, len(out.hosts), out.processes, out.gpus_per_thread) == (16, 2, 16, 1)
    assert out.gpus == ["NVIDIA A100-SXM4-40GB"] and out.skipped == []


def test_json_names_its_binary():
    assert read_nccl_output(JSON).program == "all_reduce_perf"
    assert read_nccl_output(LOG).program is None  # this nccl-tests did not print it


def write(tmp_path, text, name="run.log"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_noise_prefixes_and_garbled_rows(tmp_path):
    """mpirun --tag-output and srun -l prefixes are removed, NCCL INFO lines skipped, and
    a row cut by another rank's output is skipped and reported by line number."""
    text = (
        "[1,0]<stdout>:# Collective test starting: reduce_scatter_perf_mpi\n"
        "0: #  Rank  0 Group  0 Pid   1001 on     node-a device  0 [0000:07:00] NVIDIA H100\n"
        "0: #  Rank  1 Group  0 Pid   1001 on     node-a device  1 [0000:08:00] NVIDIA H100\n"
        + "".join(f"[1,0]<stdout>:{line}\n" for line in HEADER.splitlines())
        + "node-a:1001:1001 [0] NCCL INFO comm 0x1 rank 0 nranks 2 - Init COMPLETE\n"
        "[1,0]<stdout>:        1024           128     float     sum      -1    20.00    0.05"
        "    0.03      0    20.00    0.05    0.03      0\n"
        "        2048           256     float     sum      -1node-a:1001 [0] NCCL INFO x\n"
        "        4096           512     float     sum      -1    22.00    0.19    0.09      0"
        "    22.00    0.19    0.09      0\n"
    )
    out = read_nccl_output(write(tmp_path, text))
    assert [r.size for r in out.rows] == [1024, 4096]
    assert out.skipped == [8]
    assert out.op() == "reduce_scatter" and out.program == "reduce_scatter_perf_mpi"
    assert (out.ranks, out.processes, out.hosts) == (2, 1, ["node-a"])


@pytest.mark.parametrize(
    ("header", "row", "op"),
    [
        # nccl-tests before the root column: "error" for #wrong
        (
            "#       size         count    type   redop     time   algbw   busbw  error"
            "     time   algbw   busbw  error\n",
            "     1048576        262144   float     sum    30.00   34.95   61.17  2e-07"
            "    29.00   36.16   63.28  2e-07\n",
            "all_reduce",
        ),
        # -S 1: a timestamp after the in-place columns
        (
            HEADER.splitlines()[0] + " timestamp\n",
            "     1048576        262144     float    none       0    30.00   34.95   34.95"
            "      0    29.00   36.16   36.16      0  2025-11-03 10:00:00\n",
            "broadcast",
        ),
    ],
)
def test_columns_are_found_by_name(tmp_path, header, row, op):
    out = read_nccl_output(write(tmp_path, header + row))
    (only,) = out.rows
    assert (only.size, only.count, only.time_us, only.time_us_ip) == (1048576, 262144, 30.0, 29.0)
    assert out.op() == op


def test_all_gather_and_alltoall_print_alike(tmp_path):
    row = "1048576 32768 float none -1 30.00 34.95 30.58 0 30.00 34.95 30.58 0\n"
    out = read_nccl_output(write(tmp_path, HEADER + row))
    assert out.op() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\nworld\n", "not nccl-tests output"),
        (HEADER, "has no rows"),
        (
            HEADER
            + "1024 256 float sum -1 20.0 0.05 0.09 0 20.0 0.05 0.09 0\n"
            + "1024 512 half sum -1 20.0 0.05 0.09 0 20.0 0.05 0.09 0\n",
            "several tables (float sum root -1; half sum root -1)",
        ),
        (
            HEADER + "1024 256 float sum -1 20.0 0.05 0.09 0 20.0 0.05 0.09 0\n" * 2,
            "size 1024 appears twice",
        ),
        ('{"results": 3}', "no 'results' list"),
        ('{"results": [{"size": "big"}]}', "results[0] is not an nccl-tests result"),
        ('{"results": [{"size": 8, "count": 2, "out_of_place": {"time": "nan"}}]}', "results[0]"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "not nccl-tests output"),
    ],
)
def test_what_is_not_an_nccl_tests_table_is_refused_naming_the_file(tmp_path, text, message):
    with pytest.raises(CcsimError, match=r"^run\.log: .*") as error:
        read_nccl_output(write(tmp_path, text))
    assert message in str(error.value)


def test_binary_and_missing_files_are_refused(tmp_path):
    (tmp_path / "run.et").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CcsimError, match="run.et: not nccl-tests output"):
        read_nccl_output(tmp_path / "run.et")
    with pytest.raises(CcsimError, match="gone.log: cannot read"):
        read_nccl_output(tmp_path / "gone.log")


def test_program_names_ccsim_cannot_simulate(tmp_path):
    text = "# Collective test starting: sendrecv_perf\n" + HEADER
    text += "1024 256 float sum -1 20.0 0.05 0.05 0 20.0 0.05 0.05 0\n"
    with pytest.raises(CcsimError, match="does not simulate sendrecv_perf"):
        read_nccl_output(write(tmp_path, text)).op()


def test_json_in_place_only_results_are_skipped(tmp_path):
    data = json.loads(JSON.read_text())
    data["results"][0]["out_of_place"] = None
    out = read_nccl_output(write(tmp_path, json.dumps(data), "run.json"))
    assert len(out.rows) == len(data["results"]) - 1
