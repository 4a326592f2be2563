"""Unit parsing: the conventions documented in simulator/units.py."""

import itertools

import pytest

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
