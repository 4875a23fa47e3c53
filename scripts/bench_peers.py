"""How does tfsift compare with what a user would run instead, on the same model?

The conv chain in one process (Keras, PyTorch), on K=2 pipelines (tfsift's schedules
against ``torch.distributed.pipelining``'s) and in 2-rank data parallelism (tfsift, with Open
MPI polling as before tfsift made it yield, tf.distribute's MWMS, PyTorch DDP), all jobs in
rotating order; the PyTorch rows need ``--torch PYTHON`` (default ``.venv-peers``, made by
``scripts/bench/peers-venv.sh``), else they are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
from pathlib import Path
from statistics import median

from bench_pipeline import Settings as ChainSettings
from bench_pipeline import run_job
from bench_schedules import schedule_config

from bench import harness, report
from bench.harness import ROOT, Result, say
from bench.main import Benchmark, at_least_one, run

TORCH_WORKER = ROOT / "scripts" / "_bench_peers_torch_worker.py"
TORCH_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
POLLING = "tfsift, Open MPI polling"
# (row, framework, ranks, worker mode); the framework's one-process row comes first
CASES = (
    ("one process", "tfsift / Keras", 1, "reference"),
    ("one process", "PyTorch", 1, "single"),
    ("K=2 pipeline, GPipe", "tfsift", 2, "simple"),
    ("K=2 pipeline, GPipe", "PyTorch", 2, "gpipe"),
    ("K=2 pipeline, 1F1B", "tfsift", 2, "interleaved"),
    ("K=2 pipeline, 1F1B", "PyTorch", 2, "1f1b"),
    ("K=2 pipeline, interleaved 1F1B, 2 stages a rank", "tfsift", 2, "interleaved/2"),
    ("K=2 pipeline, interleaved 1F1B, 2 stages a rank", "PyTorch", 2, "interleaved_1f1b"),
    # a cap with room for ZB-H1's deferral (without one, tfsift defers what fits in 1F1B's peak)
    ("K=2 pipeline, zero bubble (ZB-H1)", "tfsift", 2, "zero_bubble@1GB"),
    ("K=2 pipeline, zero bubble (ZB-H1)", "PyTorch", 2, "zero_bubble"),
    ("data parallel, 2 x B/2", "tfsift", 2, "dp"),
    ("data parallel, 2 x B/2", POLLING, 2, "dp"),
    ("data parallel, 2 x B/2", "tf.distribute MWMS", 2, "mwms"),
    ("data parallel, 2 x B/2", "PyTorch", 2, "ddp"),
)
ONE_PROCESS = {fw: "tfsift / Keras" for fw in ("tfsift", POLLING, "tf.distribute MWMS")}
ZB, ONE_F_ONE_B = "K=2 pipeline, zero bubble (ZB-H1)", "K=2 pipeline, 1F1B"
GPIPE, VIRTUAL = "K=2 pipeline, GPipe", "K=2 pipeline, interleaved 1F1B, 2 stages a rank"
DP = "data parallel, 2 x B/2"
# (tfsift's row, the other's): their jobs' ratio within each round of the rotation, where
# both ran minutes apart; the medians of the whole run drift with the machine's speed
PAIRS = tuple(
    (f"{a} | {fa}", f"{b} | {fb}")
    for a, fa, b, fb in (
        (GPIPE, "tfsift", GPIPE, "PyTorch"), (ONE_F_ONE_B, "tfsift", ONE_F_ONE_B, "PyTorch"),
        (ONE_F_ONE_B, "tfsift", GPIPE, "tfsift"), (ZB, "tfsift", ZB, "PyTorch"),
        (ZB, "tfsift", ONE_F_ONE_B, "tfsift"), (VIRTUAL, "tfsift", VIRTUAL, "PyTorch"),
        (VIRTUAL, "tfsift", ONE_F_ONE_B, "tfsift"), (DP, "tfsift", DP, "tf.distribute MWMS"),
        (DP, "tfsift", DP, "PyTorch"),
    )
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(default_factory=ChainSettings)
    M: int = 8
    repeats: int = 3
    torch: str = str(TORCH_PYTHON)
    pipelines_only: bool = False  # the one-process and pipeline rows, no data parallel


QUICK = Settings(chain=ChainSettings(width=32, warmup=1, steps=3, profile_repeats=2), M=4,
                 repeats=1)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(s: Settings, framework: str, ranks: int, mode: str) -> list[Result]:
    """One job of one configuration; each rank's report."""
    c = s.chain
    if framework == "PyTorch":
        cfg = {f: getattr(c, f) for f in ("layers", "width", "side", "batch", "warmup", "steps")}
        args = [mode, json.dumps(cfg | {"M": s.M, "port": free_port()})]
        return harness.run_job(TORCH_WORKER, args, ranks, timeout=600, python=s.torch)
    config = schedule_config(mode)  # interleaved/2, zero_bubble@1GB: as bench_schedules reads
    extra = {"M": s.M, "optimize": "speed", **config}
    if ranks == 1:
        extra["pipeline"] = "simple"
    if config["pipeline"] in ("simple", "interleaved", "zero_bubble"):
        mode = "pipeline"
    extra["ports"] = [free_port() for _ in range(ranks)]
    env = {"OMPI_MCA_mpi_yield_when_idle": "0"} if framework == POLLING else None
    return run_job(ranks, mode, c.worker_config(**extra), timeout=600, env=env)


def cases(s: Settings) -> list[tuple[str, str, int, str]]:
    chosen = [c for c in CASES if not (s.pipelines_only and c[0].startswith("data parallel"))]
    if Path(s.torch).exists():
        return chosen
    say(f"no PyTorch environment at {s.torch}: the PyTorch rows are left out")
    return [c for c in chosen if c[1] != "PyTorch"]


def measure(s: Settings) -> Result:
    chosen = {f"{row} | {framework}": (framework, n, mode) for row, framework, n, mode in cases(s)}
    rounds = harness.rounds(list(chosen), s.repeats,
                            lambda key: median(job(s, *chosen[key])[0]["times"]))  # fmt: skip
    torch = s.torch if Path(s.torch).exists() else None
    return {"medians": harness.by_name(rounds), "torch": torch, "M": s.M}


def paired(medians: dict[str, list[float]], mine: str, other: str) -> list[float]:
    """``mine``'s job time over ``other``'s, round by round."""
    return [a / b for a, b in zip(medians[mine], medians[other], strict=True)]


def paired_rows(medians: dict[str, list[float]]) -> list[list[str]]:
    """One row per pair in ``PAIRS`` whose both rows ran: the median ratio, how many
    rounds tfsift's job was the shorter, and every round's ratio."""
    rows = []
    for mine, other in PAIRS:
        if mine not in medians or other not in medians:
            continue
        ratios = paired(medians, mine, other)
        (row, fw), (other_row, other_fw) = mine.split(" | "), other.split(" | ")
        name = (f"{row}: {fw} / {other_fw}" if row == other_row
                else f"{fw}: {row} / {other_row}" if fw == other_fw
                else f"{fw}, {row} / {other_fw}, {other_row}")  # fmt: skip
        shorter = f"{sum(r < 1 for r in ratios)} of {len(ratios)}"
        rows.append([name, f"{median(ratios):.3f}", shorter, report.listed(ratios)])
    return rows


def render(raw: Result, meta: Result, s: Settings) -> str:
    medians = {k: median(v) for k, v in raw["medians"].items()}
    rows = []
    for key, seconds in medians.items():
        row, framework = key.split(" | ")
        own = f"one process | {ONE_PROCESS.get(framework, framework)}"
        speedup = medians[own] / seconds if own in medians else float("nan")
        jobs = report.listed((1e3 * t for t in raw["medians"][key]), ".0f")
        rows.append([row, framework, f"{1e3 * seconds:.1f}", f"{speedup:.2f}x", jobs])
    M = raw.get("M", s.M)  # as measured, whatever --microbatches says now
    rounds = len(next(iter(raw["medians"].values())))  # as measured, whatever --repeats says
    header = ["configuration", "framework", "step ms", "speed-up over its one process", "jobs"]
    pairs = ["tfsift's step / the other's", "median", "tfsift shorter in", "per round"]
    return BENCH.section(
        meta, f"### M={M} microbatches in the pipelines, {rounds} jobs per configuration",
        report.table(header, rows), "### Paired by round of the rotation",
        report.table(pairs, paired_rows(raw["medians"])),
    )  # fmt: skip


BENCH = Benchmark("peers", __doc__.splitlines()[0], Settings(), QUICK, measure, render)


def main(argv: list[str] | None = None) -> None:
    """Reads this benchmark's own options; the rest is the shared command line's. Other
    settings than the docs' table (``--microbatches``, ``--pipelines-only``) need
    ``--no-docs``, lest they overwrite that table."""
    own = argparse.ArgumentParser(add_help=False)
    add = own.add_argument
    add("--torch", default=str(TORCH_PYTHON), help="PyTorch's Python (default: .venv-peers)")
    add("--microbatches", type=int, help="M of the pipelines (default 8)")
    add("--pipelines-only", action="store_true", help="the one-process and pipeline rows only")
    known, rest = own.parse_known_args(argv)
    at_least_one(own, microbatches=known.microbatches)
    if (known.microbatches is not None or known.pipelines_only) and "--no-docs" not in rest:
        own.error("--microbatches and --pipelines-only need --no-docs (the docs keep M=8's run)")
    base = QUICK if "--quick" in rest else Settings()
    M = known.microbatches if known.microbatches is not None else base.M
    chosen = dataclasses.replace(base, torch=known.torch, M=M, pipelines_only=known.pipelines_only)
    run(BENCH, argv, chosen, own=own)


if __name__ == "__main__":
    main()
