"""NCCL's example tuner plugin: a CSV file that overrides NCCL's choice per call.

NCCL asks a tuner plugin, when one is loaded, for every collective call: the plugin may
mark an (algorithm, protocol) pair of NCCL's cost table as free (cost 0, so NCCL picks
it) and set the call's channels (``ncclGetAlgoInfo``, src/enqueue.cc:2119-2179 at
NCCL's master of November 2026, 5067397c). NCCL's own example plugin
(``plugins/tuner/example``, loaded with ``NCCL_TUNER_PLUGIN`` and read from
``NCCL_TUNER_CONFIG_FILE``) takes the overrides from a CSV file, one rule a line::

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]

with ``#`` comments and blank lines skipped (plugin.c, ``loadConfig``). For a call it
walks the rules in file order and applies the first that matches the function, a size
in ``[min_bytes, max_bytes]`` (both inclusive), the communicator's nodes and ranks (-1:
any) and the call's pipelined ops and buffer registration (-1 or left out: any), *and*
whose pair NCCL has not ruled out for this call (an ``NCCL_ALGO_PROTO_IGNORE`` entry:
not supported here, or excluded by NCCL_ALGO / NCCL_PROTO); a rule whose pair is ruled
out is passed over and the walk goes on (``pluginGetCollInfo``). The rule's channels,
unless -1, replace the channels NCCL would have trimmed the call to
(``info->nMaxChannels``, enqueue.cc:2178), within the communicator's channels
(enqueue.cc:583-599).

The size a rule is matched against is NCCL's ``nBytes``: the element size times
``ncclFuncMaxSendRecvCount`` (enqueue.cc:2127), i.e. the whole gathered or scattered
buffer for all-gather and reduce-scatter (nccl-tests' size column), the buffer for the
others. ccsim's calls are single ops on unregistered buffers (nccl-tests' default), so
``numPipeOps`` is 1 and ``regBuff`` 0: a rule that asks for more never matches.

Where ccsim departs from the plugin, on purpose: a file that cannot be read, or a line
that does not parse, is an error here (the plugin skips a missing file and reads a
malformed number as 0, so a typo silently changes nothing or everything); and a call no
rule matches, or one a rule with channels -1 matches, runs on the channels NCCL alone
would give it, as the plugin's README says. Its code instead starts every call at 1
channel, which NCCL takes as the call's channels unless a rule sets others: a quirk
RCCL's copy of the plugin fixed by starting at 0, "for proper fallback to default"
(ROCm/rccl#1985, October 2025). All-to-all is grouped send/receive and never asks the
tuner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import CcsimError, shown

#: The plugin's function names (plugin.c, ``parseCollType``) by ccsim operation.
FUNCTIONS = {
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "allreduce": "all_reduce",
}
#: The plugin's algorithm names (``parseAlgorithm``) and NCCL's (``ncclAlgoStr``).
ALGORITHM_NAMES = {
    "tree": "Tree",
    "ring": "Ring",
    "collnet_direct": "CollNetDirect",
    "collnet_chain": "CollNetChain",
    "nvls": "NVLS",
    "nvls_tree": "NVLSTree",
    "pat": "PAT",
}
#: The plugin's protocol names (``parseProtocol``) and NCCL's.
PROTOCOL_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
#: Fields of a rule, in file order; the last two may be left out (plugin.c:
#: CONFIG_FIELDS_REQUIRED 8, CONFIG_FIELDS_MAX 10).
FIELDS = (
    "collective_type",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
    "numPipeOps",
    "regBuff",
)
REQUIRED_FIELDS = 8
#: What ccsim's calls present to the tuner: one op at a time, buffers not registered.
PIPE_OPS = 1
REGISTERED = 0


@dataclass(frozen=True)
class TunerRule:
    """One line of a tuner file (``-1``: any, for channels NCCL's own count)."""

    op: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nodes: int
    ranks: int
    pipe_ops: int = -1
    registered: int = -1
    #: The line of the file it was read from (1-based), for messages and records.
    line: int = 0

    def matches(self, op: str, size_bytes: float, nodes: int, ranks: int) -> bool:
        """Whether this rule is for a call of ``op`` moving ``size_bytes`` (NCCL's
        ``nBytes``) on a communicator of ``nodes`` servers and ``ranks`` ranks."""
        return (
            self.op == op
            and self.min_bytes <= size_bytes <= self.max_bytes
            and self.nodes in (-1, nodes)
            and self.ranks in (-1, ranks)
            and self.pipe_ops in (-1, PIPE_OPS)
            and self.registered in (-1, REGISTERED)
        )


@dataclass(frozen=True)
class TunerConfig:
    """A tuner file's rules, in file order (build one with :func:`load_tuner_config`)."""

    path: str
    rules: tuple[TunerRule, ...]

    def rule_for(
        self,
        op: str,
        size_bytes: float,
        nodes: int,
        ranks: int,
        usable: set[tuple[str, str]] | dict[tuple[str, str], float],
    ) -> TunerRule | None:
        """The rule the plugin applies to this call: the first that matches and whose
        (algorithm, protocol) is in ``usable`` (the pairs NCCL's cost table has not ruled
        out); None: NCCL's own choice.

        >>> config = parse_tuner_config(
        ...     "allreduce,0,65536,nvls,simple,-1,-1,-1\\nallreduce,0,65536,ring,ll,2,-1,-1"
        ... )
        >>> config.rule_for("all_reduce", 4096, 1, 8, {("Ring", "LL")}).line  # no NVLS here
        2
        >>> config.rule_for("all_reduce", 65537, 1, 8, {("Ring", "LL")}) is None
        True
        """
        for rule in self.rules:
            if (rule.algorithm, rule.protocol) in usable and rule.matches(
                op, size_bytes, nodes, ranks
            ):
                return rule
        return None


def load_tuner_config(path: str | Path) -> TunerConfig:
    """Read a tuner file (the example plugin's CSV format, module docstring).

    Raises
    ------
    CcsimError
        One line naming the file, the line and the field, and what it accepts.
    """
    where = f"NCCL_TUNER_CONFIG_FILE={path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CcsimError(
            f"{where}: cannot read the tuner file ({reason}); give the path of a CSV file "
            "of NCCL's example tuner plugin"
        ) from None
    return parse_tuner_config(text, str(path))


def parse_tuner_config(text: str, path: str = "<tuner>") -> TunerConfig:
    """Rules from the text of a tuner file; ``path`` names it in errors.

    >>> parse_tuner_config("# comment\\n\\nallgather,0,4294967295,ring,simple,4,2,-1").rules[0]
    TunerRule(op='all_gather', min_bytes=0, max_bytes=4294967295, algorithm='Ring', \
protocol='Simple', channels=4, nodes=2, ranks=-1, pipe_ops=-1, registered=-1, line=3)
    """
    rules = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        rules.append(_rule(line, number, path))
    if not rules:
        raise CcsimError(
            f"{path}: no tuner rules (every line is blank or a # comment); give lines of "
            f"{','.join(FIELDS)}"
        )
    return TunerConfig(path, tuple(rules))


def _rule(line: str, number: int, path: str) -> TunerRule:
    where = f"{path}:{number}"
    fields = [field.strip() for field in line.split(",")]
    if not REQUIRED_FIELDS <= len(fields) <= len(FIELDS):
        raise CcsimError(
            f"{where}: {len(fields)} fields; a rule has {REQUIRED_FIELDS} to {len(FIELDS)}: "
            f"{','.join(FIELDS)}"
        )
    values = dict(zip(FIELDS, fields, strict=False))

    def name(field: str, names: dict[str, str]) -> str:
        value = values[field]
        if value.lower() not in names:
            raise CcsimError(f"{where}: {field} {shown(value)} is not one of {', '.join(names)}")
        return names[value.lower()]

    def number_of(field: str, low: int) -> int:
        value = values.get(field, "-1")
        try:
            parsed = int(value)
        except ValueError:
            parsed = None
        if parsed is None or parsed < low:
            floor = "-1 (any) or more" if low == -1 else f"{low} or more"
            raise CcsimError(f"{where}: {field} {shown(value)}: expected a whole number, {floor}")
        return parsed

    rule = TunerRule(
        op=name("collective_type", FUNCTIONS),
        min_bytes=number_of("min_bytes", 0),
        max_bytes=number_of("max_bytes", 0),
        algorithm=name("algorithm", ALGORITHM_NAMES),
        protocol=name("protocol", PROTOCOL_NAMES),
        channels=number_of("channels", -1),
        nodes=number_of("nNodes", -1),
        ranks=number_of("nRanks", -1),
        pipe_ops=number_of("numPipeOps", -1),
        registered=number_of("regBuff", -1),
        line=number,
    )
    if rule.max_bytes < rule.min_bytes:
        raise CcsimError(
            f"{where}: max_bytes {rule.max_bytes} is below min_bytes {rule.min_bytes}: the "
            "rule would match no call"
        )
    if rule.channels == 0 or rule.nodes == 0 or rule.ranks == 0:
        zero = next(f for f, v in (("channels", rule.channels), ("nNodes", rule.nodes),
                                   ("nRanks", rule.ranks)) if v == 0)  # fmt: skip
        raise CcsimError(f"{where}: {zero} 0: give a positive number, or -1 for any/default")
    if rule.registered not in (-1, 0, 1):
        raise CcsimError(f"{where}: regBuff {rule.registered}: expected 0, 1 or -1 (either)")
    return rule
