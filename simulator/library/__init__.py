"""What the communication library does: its protocols, their costs and the constants
of a machine (:mod:`~.protocol`)."""

from .protocol import PROTOCOLS, Calibration, Protocol, calibration_of, parse_calibration

__all__ = ["PROTOCOLS", "Calibration", "Protocol", "calibration_of", "parse_calibration"]
