"""The ``tfsift`` command: version, planning, simulation, profiling, checks and launching."""

from __future__ import annotations

import argparse
import sys

from tfsift.version import __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfsift`` console script."""
    parser = argparse.ArgumentParser(prog="tfsift", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tfsift {__version__}")
    commands = parser.add_subparsers(dest="command")
    from partitioner.cli import add_subcommands
    from tfsift.cli import doctor, profile, run, timeline

    add_subcommands(commands)
    profile.add_subcommand(commands)
    run.add_subcommand(commands)
    doctor.add_subcommand(commands)
    timeline.add_subcommand(commands)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
