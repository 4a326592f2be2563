"""The ``ccsim`` command: one module per command group, each adding its subcommands to
the parser in :mod:`~.main`. Code here only parses arguments, calls the layers below and
turns user errors into one line and exit code 2."""

from .main import EXIT_USAGE, build_parser, main

__all__ = ["EXIT_USAGE", "build_parser", "main"]
