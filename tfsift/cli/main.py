"""The ``tfsift`` command: version, planning, simulation, profiling and launching."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from tfsift.version import __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfsift`` console script."""
    parser = argparse.ArgumentParser(prog="tfsift", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tfsift {__version__}")
    commands = parser.add_subparsers(dest="command")
    from partitioner.cli import add_subcommands

    add_subcommands(commands)
    from tfsift.cli.profile import add_subcommand

    add_subcommand(commands)
    run = commands.add_parser("run", help="launch a training script on N local ranks with mpirun")
    run.add_argument("-np", type=int, required=True, help="number of processes")
    run.add_argument("script", nargs=argparse.REMAINDER, help="script and its arguments")
    run.set_defaults(func=_run)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


def _run(args: argparse.Namespace) -> int:
    from tfsift.parallel.launch import mpirun_command

    if not args.script:
        raise SystemExit("tfsift run: expected a script to launch. Received: nothing after -np")
    cmd = mpirun_command(args.np, args.script)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
