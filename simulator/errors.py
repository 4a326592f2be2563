"""Errors that ccsim reports to users.

Every problem caused by input (a bad preset, an unknown algorithm, a malformed size)
raises a :class:`CcsimError` whose message names the offending file, field or node and
says how to fix it. The CLI prints the message on one line and exits with code 2;
anything else escaping is a bug in ccsim.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable


class CcsimError(Exception):
    """A user-facing error: bad input, an unsupported combination, a deadlock."""


class TopologyError(CcsimError):
    """A topology graph or preset is malformed."""


class ScheduleError(CcsimError):
    """A collective schedule is malformed or does not compute what it claims."""


class DeadlockError(ScheduleError):
    """A schedule or trace stopped with work left that can never start."""


def unknown_choice(what: str, name: object, choices: Iterable[str]) -> CcsimError:
    """Build the standard 'unknown X' error listing the valid choices."""
    valid = ", ".join(sorted(choices))
    return CcsimError(f"unknown {what} {shown(name)}; valid choices: {valid}")


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6
_SHORT.maxlevel = 3


def shown(value: object) -> str:
    """``repr(value)`` cut short, for messages about values read from a user's file.

    A message names the value it refuses without copying a whole file into one line.

    >>> shown("gpu0")
    "'gpu0'"
    >>> shown(list(range(1000)))
    '[0, 1, 2, 3, 4, 5, ...]'
    """
    return _SHORT.repr(value)
