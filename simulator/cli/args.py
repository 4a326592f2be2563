"""Argument types and options shared by the ``ccsim`` subcommands."""

from __future__ import annotations

import argparse

from ..errors import CcsimError


def positive_int(text: str) -> int:
    """argparse type: a positive integer (argparse reports the error on one line).

    >>> positive_int("4")
    4
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_chunks(text: str) -> int | str:
    """``--chunks``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")
    return value


def parse_channels(text: str) -> int | str:
    """``--channels``: a positive integer or ``auto``."""
    return parse_chunks(text)


def parse_fraction(text: str) -> float:
    """A multipath fraction in [0, 1] (a user-facing error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise CcsimError(f"--fraction must be a number in [0, 1] or auto, got {text!r}")
    return value


def add_model_options(cmd: argparse.ArgumentParser) -> None:
    """Options shared by collective, compare and run: fabric, ECMP seed, protocol model."""
    cmd.add_argument(
        "--fabric",
        default=None,
        metavar="TYPE",
        help="fabric joining the servers: rail-optimized, leaf-spine, fat-tree or single-switch "
        "(default: the preset's; given explicitly, one server also gets its switches)",
    )
    cmd.add_argument(
        "--seed", type=int, default=None, metavar="S", help="ECMP hash seed (default: 0)"
    )
    cmd.add_argument(
        "--proto",
        default=None,
        metavar="NAME",
        help="protocol model: LL, LL128, Simple, or auto for the fastest (as NCCL_PROTO); "
        "with it, link efficiencies, per-hop latencies (us) and launch overhead of the preset "
        "apply (default: none, the ideal line-rate model)",
    )
