"""Unit parsing: the conventions documented in simulator/units.py."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import CcsimError
from simulator.units import parse_bandwidth, parse_size, parse_sizes, parse_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("64MiB", 64 * 2**20),
        ("4G", 4 * 2**30),
        ("1GB", 10**9),
        ("1.5K", 1536),
        ("2KB", 2000),
        (512, 512),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400Gbps", 50e9),
        ("200Gbps", 25e9),
        ("900GB/s", 900e9),
        ("25GBps", 25e9),
        ("1GiB/s", 2**30),
        ("100Mbps", 12.5e6),
        (3e9, 3e9),
    ],
)
def test_bandwidths(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8us", 8e-6), ("500ns", 5e-7), ("1.5ms", 1.5e-3), ("2s", 2.0), ("8µs", 8e-6)],
)
def test_times(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("bad", ["400Gbs", "fast", "10 parsecs", "-5GB/s", "0Gbps", ""])
def test_bad_bandwidth_names_the_problem(bad):
    with pytest.raises(CcsimError, match="bandwidth"):
        parse_bandwidth(bad)


def test_size_range_like_nccl_tests():
    """-b 8 -e 4G -f 2 is 8, 16, ..., 2^32: 30 sizes."""
    sizes = parse_sizes("8:4G")
    assert len(sizes) == 30
    assert sizes[0] == 8 and sizes[-1] == 4 * 2**30
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))


def test_size_range_with_factor_and_list():
    assert parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert parse_sizes("1M,64M,1G") == [2**20, 64 * 2**20, 2**30]


@pytest.mark.parametrize("bad", ["0", "-8", "8:4", "1K:2K:1", "a:b", "1:2:3:4", "", "1X"])
def test_bad_sizes(bad):
    with pytest.raises(CcsimError):
        parse_sizes(bad)


PREFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
BITS = ("bps", "b/s", "bit/s", "bits/s", "b/sec")
BYTES = ("Bps", "B/s", "Byte/s", "Bytes/s", "B/sec")


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
@pytest.mark.parametrize("spelling", BITS + BYTES)
def test_small_b_is_bits_and_capital_b_is_bytes_in_every_spelling(prefix, spelling):
    """Vendors write NIC speeds as 200Gb/s (bits): a small b divides by 8 whatever
    follows it; a capital B never does."""
    bytes_per_unit = PREFIXES[prefix] / (8 if spelling in BITS else 1)
    assert parse_bandwidth(f"200{prefix}{spelling}") == pytest.approx(200 * bytes_per_unit)


@given(
    value=st.floats(min_value=1e-3, max_value=1e6, allow_nan=False),
    prefix=st.sampled_from(sorted(PREFIXES)),
    spelling=st.sampled_from(("bps", "b/s", "b/sec")),  # B in their place spells bytes
)
def test_bits_are_an_eighth_of_the_same_bytes(value, prefix, spelling):
    as_bits = parse_bandwidth(f"{value!r}{prefix}{spelling}")
    as_bytes = parse_bandwidth(f"{value!r}{prefix}{spelling.replace('b', 'B', 1)}")
    assert as_bits * 8 == pytest.approx(as_bytes, rel=1e-12)


def test_a_nic_written_in_gb_per_second_is_bits():
    """The regression: 'bandwidth: 200Gb/s' on a NIC was read as 200 GB/s (8x too fast);
    it is 25 GB/s, the same machine as 200Gbps."""
    from simulator.topology import load_topology
    from simulator.topology.presets import preset

    assert parse_bandwidth("200Gb/s") == parse_bandwidth("200Gbps") == 25e9
    graph = load_topology("dgx-a100", 2)
    nics = {d["bandwidth"] for _, d in graph.nodes(data=True) if d["kind"] == "nic"}
    assert preset("dgx-a100")["server"]["nic"]["bandwidth"] == "200Gbps" and nics == {25e9}


@pytest.mark.parametrize("text", ["1e999", "1e999G", "1e400MiB"])
def test_an_infinite_size_is_refused(text):
    with pytest.raises(CcsimError, match="finite"):
        parse_size(text)


# Issue 33: sizes and values that were read as something else, each refused in one line.


def test_a_size_above_any_gpus_memory_is_refused():
    """1e30 bytes ran (a 7.6e24 us all-reduce); 1 TiB (2^40) is the most a size may be."""
    assert parse_sizes("1T") == [2**40]
    with pytest.raises(CcsimError, match=r"'1e30': 1e\+30 bytes is more than 1 TiB"):
        parse_sizes("1e30")
    with pytest.raises(CcsimError, match="more than 1 TiB"):
        parse_sizes("8:2T")


def test_a_size_below_one_element_is_refused():
    """3 bytes of fp32 is a count of 0 (nccl-tests' count column printed 0)."""
    assert parse_sizes("4", element=4) == [4] and parse_sizes("3") == [3]
    with pytest.raises(CcsimError, match="'3' bytes is less than one 4-byte element"):
        parse_sizes("3", element=4)
    with pytest.raises(CcsimError, match="'2' bytes is less than one 4-byte element"):
        parse_sizes("2:64", element=4)


@pytest.mark.parametrize(("text", "written"), [("1Mb", "1MB"), ("64kb", "64KB"), ("2Gb", "2GB")])
def test_a_size_in_small_b_is_ambiguous(text, written):
    """A small b is bits in a rate (400Gbps), so 1Mb as a size was read as 10^6 bytes."""
    with pytest.raises(CcsimError, match=f"could be bits or bytes; write {written} "):
        parse_size(text)
    assert parse_size(written) == parse_size(written.upper())
    assert parse_bandwidth("400Gbps") == 50e9  # rates keep their bits


@pytest.mark.parametrize(
    ("parse", "text"), [(parse_size, "-5MB"), (parse_bandwidth, "-400Gbps"), (parse_time, "-3us")]
)
def test_a_negative_value_is_told_to_be_positive(parse, text):
    """It was told to write a number with a unit, which it had."""
    with pytest.raises(CcsimError, match=f"'{text}': it must be positive, e.g. "):
        parse(text)
