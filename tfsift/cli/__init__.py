"""The ``tfsift`` command line: profile, plan, simulate, run, doctor."""

from tfsift.cli.main import main

__all__ = ["main"]
