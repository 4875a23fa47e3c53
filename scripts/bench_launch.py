"""Does data parallelism's speed depend on the launcher, or on what the script imports first?

``scripts/bench_peers.py``'s data-parallel row (tfsift with Horovod, 2 ranks x B/2 of the
conv chain, a core per rank) launched by ``mpirun``, ``horovodrun`` and ``tfsift run``,
with the worker importing tfsift first or ``mpi4py.MPI`` first (``_bench_mpi_first.py``,
which starts MPI before the worker imports tfsift). Every job starts from an environment
without ``OMPI_MCA_mpi_yield_when_idle``, as a user's shell gives it: ``import tfsift``
sets it before MPI starts (tfsift/env.py); where MPI started first, Open MPI polls until
``tfsift.init`` makes it yield (tfsift/parallel/openmpi.py); ``tfsift run``'s own process
sets it for every rank. The rows should be level: a slower "mpi4py first" row means
that polling is back.

Every configuration runs in its own job, all of them in rotating order ``repeats`` times;
a row shows the median of the jobs' median step times, and each job's step over the
``mpirun``, tfsift-first job of its round (the import order tfsift documents): their
median, then every round's.

usage: .venv/bin/python scripts/bench_launch.py [--repeats N] [--quick] [--no-docs]
       [--json F] [--render F]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from bench_pipeline import WORKER
from bench_pipeline import Settings as ChainSettings

from bench import harness, report
from bench.harness import LAUNCHERS, ROOT, Result, say
from bench.main import Benchmark, run

MPI_FIRST = ROOT / "scripts" / "_bench_mpi_first.py"
YIELD = "OMPI_MCA_mpi_yield_when_idle"  # tfsift.env.OMPI_MCA_MPI_YIELD_WHEN_IDLE
ORDERS = ("tfsift first", "mpi4py first")
REFERENCE = "mpirun | tfsift first"


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(default_factory=ChainSettings)
    repeats: int = 3


QUICK = Settings(chain=ChainSettings(width=32, warmup=1, steps=3, profile_repeats=2), repeats=1)


def configurations() -> dict[str, tuple[str, Path]]:
    """``"<launcher> | <order>"`` -> (launcher, worker), the reference first."""
    workers = dict(zip(ORDERS, (WORKER, MPI_FIRST), strict=True))
    return {f"{l} | {o}": (l, workers[o]) for l in LAUNCHERS for o in ORDERS}  # noqa: E741


def job(s: Settings, launcher: str, worker: Path) -> list[Result]:
    """One data-parallel job of 2 ranks; each rank's report."""
    args = ["dp", json.dumps(s.chain.worker_config())]  # bench_peers' "dp" mode
    return harness.run_job(worker, args, 2, timeout=600, launcher=launcher, unset=(YIELD,))


def measure(s: Settings) -> Result:
    chosen = configurations()
    out: dict[str, list[float]] = {key: [] for key in chosen}
    for repeat, key in harness.rotations(list(chosen), s.repeats):
        say(f"#{repeat} {key}")
        ranks = job(s, *chosen[key])
        out[key].append(statistics.median(ranks[0]["times"]))
    return {"medians": out}


def rows(medians: dict[str, list[float]]) -> list[list[str]]:
    """One row per configuration: step ms (median of the jobs), each job over the
    reference's job of its round (median, and every round's), the jobs' ms."""
    out = []
    for key, times in medians.items():
        launcher, order = key.split(" | ")
        ratios = [a / b for a, b in zip(times, medians[REFERENCE], strict=True)]
        out.append(
            [
                launcher,
                order,
                f"{1e3 * statistics.median(times):.1f}",
                f"{statistics.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})",
                ", ".join(f"{1e3 * t:.0f}" for t in times),
            ]
        )
    return out


def render(raw: Result, meta: Result, s: Settings) -> str:
    c = s.chain
    rounds = len(next(iter(raw["medians"].values())))
    return "\n\n".join(
        [
            report.provenance(meta, BENCH.command),
            f"### {c.layers} x Conv2D({c.width}, 3x3) on {c.side}x{c.side}x{c.width}, "
            f"B={c.batch} over 2 ranks, {rounds} jobs per configuration",
            report.table(
                ["launcher", "import order", "step ms", f"/ {_named(REFERENCE)}", "jobs"],
                rows(raw["medians"]),
            ),
        ]
    )


def _named(key: str) -> str:
    """A configuration's key as table text: ``mpirun, tfsift first`` (a ``|`` ends a cell)."""
    return key.replace(" | ", ", ")


BENCH = Benchmark(
    name="launch",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=QUICK,
    measure=measure,
    render=render,
)


if __name__ == "__main__":
    run(BENCH)
