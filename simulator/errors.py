"""Errors that ccsim reports to users.

Every problem caused by input (a bad preset, an unknown algorithm, a malformed size)
raises a :class:`CcsimError` whose message names the offending file, field or node and
says how to fix it. The CLI prints the message on one line and exits with code 2;
anything else escaping is a bug in ccsim.
"""

from __future__ import annotations

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
    return CcsimError(f"unknown {what} {name!r}; valid choices: {valid}")
