"""Every code block of README.md, run as written.

Python blocks run in a temporary folder with matplotlib's Agg backend. The commands of
bash blocks run through ``ccsim``'s entry point unless SKIPPED says why not. A YAML block
is a file the README passes to a command (a sweep spec, a topology preset): it is written
to a temporary file and given to that command. Text blocks are synopses and output, not
run; the options their ``ccsim`` synopses name must exist. A block of another language,
a command that is neither run nor skipped, or a YAML file of an unknown kind fails here,
so a README edit that adds one decides how it is tested.
"""

import re
import shlex
from pathlib import Path

import matplotlib
import pytest
import yaml

from simulator.cli.main import main

README = Path(__file__).resolve().parents[1] / "README.md"
LANGUAGES = ("python", "bash", "sh", "yaml", "text")

#: Commands of bash blocks that are not run, by their first words, and why.
SKIPPED = {
    "python3 -m venv": "makes a virtual environment: the tests already run in one",
    ". .venv/bin/activate": "enters that virtual environment",
    "pip install": "installs ccsim, which the tests import",
    "python -m pytest": "the test suite itself",
    "ccsim bench": "its scenarios run for minutes (tests/test_bench.py runs a small one)",
}
#: What a YAML block is, by a top-level key, and the commands it is run with: ``{file}``
#: is the block written to a file, ``{out}`` a results file beside it.
YAML_COMMANDS = {
    "scenario": (  # a sweep spec: run it, then find its knee from the same results
        "ccsim sweep {file} --out {out} --workers 1 --quiet",
        "ccsim size {file} --axis server.nic.bandwidth --out {out}",
    ),
    "server": (  # a topology preset
        "ccsim topology show {file}",
        "ccsim collective all_reduce --topology {file} --sizes 1M",
    ),
}


def code_blocks(language: str) -> list[tuple[int, str]]:
    """(line of the opening fence, text) of every fenced block in ``language``."""
    blocks, opened, lines = [], None, []
    for number, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        if opened is None and line.startswith("```"):
            opened, lines = (number, line[3:].strip()), []
        elif opened is not None and line.startswith("```"):
            if opened[1] == language:
                blocks.append((opened[0], "\n".join(lines) + "\n"))
            opened = None
        elif opened is not None:
            lines.append(line)
    return blocks


def shell_commands() -> list[tuple[int, str]]:
    """(block line, command) of every command of the bash and sh blocks: lines joined
    at a trailing backslash, then split at ``&&`` and ``;``."""
    commands = []
    for line, text in code_blocks("bash") + code_blocks("sh"):
        for command in re.split(r"&&|;|\n", text.replace("\\\n", " ")):
            command = command.split(" #")[0].strip()
            if command and not command.startswith("#"):
                commands.append((line, command))
    return commands


def skip_reason(command: str) -> str | None:
    return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)


def run_ccsim(command: str, capsys) -> str:
    """Run one ``ccsim`` command line in this process; its stdout, checked to succeed."""
    words = shlex.split(command)
    assert words[0] == "ccsim", command
    code = main(words[1:])
    out, err = capsys.readouterr()
    assert code == 0, f"{command} exited {code}: {err}"
    assert "Traceback" not in out + err
    return out


@pytest.fixture(autouse=True)
def in_temporary_folder(tmp_path, monkeypatch):
    """Files the blocks write land in a fresh folder; figures never open a window."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    matplotlib.use("Agg")


def test_every_block_is_of_a_language_this_file_tests():
    fences = re.findall(r"^```(\S*)$", README.read_text(encoding="utf-8"), flags=re.M)
    opening = fences[::2]
    assert len(fences) % 2 == 0, "README.md has an unclosed code fence"
    assert set(opening) <= set(LANGUAGES), f"decide how tests/test_readme.py runs {opening}"
    assert code_blocks("python") and shell_commands() and code_blocks("yaml")


@pytest.mark.parametrize(
    ("line", "code"), code_blocks("python"), ids=[f"line{n}" for n, _ in code_blocks("python")]
)
def test_python_block_runs(line, code):
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "readme"})


@pytest.mark.parametrize(
    ("line", "command"), shell_commands(), ids=[c for _, c in shell_commands()]
)
def test_shell_command_runs_or_says_why_not(line, command, capsys):
    why = skip_reason(command)
    if why is not None:
        pytest.skip(f"README.md:{line}: {why}")
    assert command.startswith("ccsim "), (
        f"README.md:{line}: {command!r} is neither run nor skipped; add it to SKIPPED "
        "with the reason, or make it a ccsim command"
    )
    assert run_ccsim(command, capsys)


def test_every_skip_is_still_in_the_readme():
    """A skip whose command left the README is dead weight (ccsim bench is named in prose)."""
    text = README.read_text(encoding="utf-8")
    assert [start for start in SKIPPED if start not in text] == []


@pytest.mark.parametrize(
    ("line", "text"), code_blocks("yaml"), ids=[f"line{n}" for n, _ in code_blocks("yaml")]
)
def test_yaml_block_runs_as_the_file_it_shows(line, text, tmp_path, capsys):
    data = yaml.safe_load(text)
    kinds = [key for key in YAML_COMMANDS if key in data]
    assert len(kinds) == 1, f"README.md:{line}: a YAML block of no known kind; see YAML_COMMANDS"
    file = tmp_path / f"readme-{line}.yaml"
    file.write_text(text, encoding="utf-8")
    for command in YAML_COMMANDS[kinds[0]]:
        quoted = {"file": shlex.quote(str(file)), "out": shlex.quote(str(tmp_path / "out.csv"))}
        run_ccsim(command.format(**quoted), capsys)


def synopsis_options() -> list[tuple[str, str]]:
    """(command, option) for every ``--option`` a ``ccsim COMMAND`` synopsis in a text
    block names (continuation lines belong to the synopsis above them)."""
    found = []
    for _, text in code_blocks("text"):
        command = None
        for line in text.splitlines():
            if line.startswith("ccsim "):
                command = line.split()[1]
            elif line[:1] not in (" ", ""):
                command = None
            if command is not None:
                found += [(command, option) for option in re.findall(r"--[a-z][a-z-]*", line)]
    return sorted(set(found))


def test_text_block_synopses_name_real_options(capsys):
    assert synopsis_options()
    helps: dict[str, str] = {}
    for command, option in synopsis_options():
        if command not in helps:
            with pytest.raises(SystemExit):
                main([command, "--help"])
            helps[command] = capsys.readouterr().out
        assert re.search(rf"{option}\b", helps[command]), f"ccsim {command} has no {option}"
