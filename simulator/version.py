"""The package version, in one place (the command line, figures' metadata, reports)."""

__version__ = "0.1.0"
