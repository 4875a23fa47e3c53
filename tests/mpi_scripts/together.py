"""Runs several check scripts one after another in one job, each as ``python SCRIPT ARG ...``
would run it: a job's ranks pay their start-up once (see ``mpi.SharedJob``).

usage: together.py SCRIPT [ARG ...] [-- SCRIPT [ARG ...]] ...
  scenario N reports into folder N of the job's reports folder, where each rank that
  finished it leaves a file done.<pid>; its scripts must not exit.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from mpi import REPORTS, SCRIPTS, timed


def scenarios(argv: list[str]) -> list[list[str]]:
    """``argv`` cut at each ``--``: one list per scenario, its script first."""
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            out.append([])
        else:
            out[-1].append(arg)
    if any(not s for s in out):
        raise SystemExit(f"together.py: an empty scenario in {argv}; usage: {__doc__}")
    return out


def main() -> None:
    root, cwd = Path(os.environ[REPORTS]), os.getcwd()
    for index, (script, *args) in enumerate(scenarios(sys.argv[1:])):
        folder = root / str(index)
        folder.mkdir(exist_ok=True)  # every rank makes it: whichever is first
        os.environ[REPORTS] = str(folder)
        # the header says which scenario a failure's output belongs to
        print(f"together.py: scenario {index}: {script} {' '.join(args)}", flush=True)
        sys.argv = [str(SCRIPTS / script), *args]
        with timed(f"{script} {' '.join(args)}"):
            runpy.run_path(sys.argv[0], run_name="__main__")
        (folder / f"done.{os.getpid()}").touch()
        os.chdir(cwd)


if __name__ == "__main__":
    main()
