"""Does data parallelism's speed depend on the launcher, or on what the script imports first?

bench_peers' data-parallel job under ``mpirun``, ``horovodrun`` and ``tfsift run``, the
worker importing tfsift or ``mpi4py`` first, every job without
``OMPI_MCA_mpi_yield_when_idle`` (``import tfsift`` sets it): a slower "mpi4py first" row
means that Open MPI polls in its waits again. Each job against the ``REFERENCE`` job of its
round.
"""

from __future__ import annotations

import dataclasses
import json
from statistics import median

from bench_pipeline import WORKER
from bench_pipeline import Settings as ChainSettings

from bench import harness, report
from bench.harness import LAUNCHERS, Result
from bench.main import Benchmark, run

YIELD = "OMPI_MCA_mpi_yield_when_idle"  # tfsift.env.OMPI_MCA_MPI_YIELD_WHEN_IDLE
ORDERS = {"tfsift first": [], "mpi4py first": ["--mpi4py-first"]}  # the worker's first arguments
REFERENCE = "mpirun | tfsift first"


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(default_factory=ChainSettings)
    repeats: int = 3


QUICK = Settings(chain=ChainSettings(width=32, warmup=1, steps=3, profile_repeats=2), repeats=1)


def configurations() -> dict[str, tuple[str, list[str]]]:
    """``"<launcher> | <order>"`` -> (launcher, the worker's first arguments), the reference
    first."""
    return {f"{l} | {o}": (l, first) for l in LAUNCHERS for o, first in ORDERS.items()}  # noqa: E741


def measure(s: Settings) -> Result:
    chosen = configurations()

    def job(key: str) -> float:  # bench_peers' data-parallel job of 2 ranks
        launcher, first = chosen[key]
        args = [*first, "dp", json.dumps(s.chain.worker_config())]
        ranks = harness.run_job(WORKER, args, 2, timeout=600, launcher=launcher, unset=(YIELD,))
        return median(ranks[0]["times"])

    return {"medians": harness.by_name(harness.rounds(list(chosen), s.repeats, job))}


def render(raw: Result, meta: Result, s: Settings) -> str:
    c, medians = s.chain, raw["medians"]
    rows = []
    for key, times in medians.items():
        ratios = [a / b for a, b in zip(times, medians[REFERENCE], strict=True)]
        rows.append([*key.split(" | "), f"{1e3 * median(times):.1f}",
                     f"{median(ratios):.3f} ({report.listed(ratios)})",
                     report.listed((1e3 * t for t in times), ".0f")])  # fmt: skip
    rounds = len(next(iter(medians.values())))
    header = ["launcher", "import order", "step ms", f"/ {REFERENCE.replace(' | ', ', ')}", "jobs"]
    return BENCH.section(
        meta,
        f"### {c.layers} x Conv2D({c.width}, 3x3) on {c.side}x{c.side}x{c.width}, "
        f"B={c.batch} over 2 ranks, {rounds} jobs per configuration",
        report.table(header, rows),
    )


BENCH = Benchmark("launch", __doc__.splitlines()[0], Settings(), QUICK, measure, render)

if __name__ == "__main__":
    run(BENCH)
