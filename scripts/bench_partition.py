"""How good and how fast is the exact partition solver, against the baselines?

Five cost vectors (a VGG-like CNN, a GPT-2-medium-like transformer, a ResNet-50-like chain
whose cuts inside a block carry the skip tensor, two random heterogeneous chains), K in
{2, 4, 8}, M = 8, the default link: the step-time estimate of the exact solver, of the
brute-force optimum where C(L - 1, K - 1) is small enough, and of the baselines. Then the
solver's run time on 10,000 layers x 64 stages.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import report
from bench.harness import Result
from bench.main import Benchmark, run
from partitioner import (
    CostModel,
    LayerCost,
    Partition,
    block_partition,
    by_parameters,
    solve_memory,
    solve_speed,
    step_time_estimate,
    uniform,
)

FLOPS = 20e12  # effective device speed for the analytic models, FLOP/s
M = 8
STAGES = (2, 4, 8)
BRUTE_FORCE_LIMIT = 2_000_000  # partitions
F32 = 4


def layer(name: str, flops: float, params: int, acts: int, out: int, batch: int) -> LayerCost:
    """A layer from per-sample forward FLOPs; the backward costs twice the forward."""
    forward = flops * batch / FLOPS
    return LayerCost(name, forward, 2 * forward, params * F32, acts * F32, out * F32)


def vgg(batch: int = 32) -> CostModel:
    """VGG-16 on 224x224: channels widen as the resolution halves; a large FC head."""
    layers, size, cin = [], 224, 3
    for block, (cout, convs) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]):
        for i in range(convs):
            pixels = size * size
            flops, params = 2 * 9 * cin * cout * pixels, 9 * cin * cout + cout
            name = f"conv{block + 1}_{i + 1}"
            layers.append(layer(name, flops, params, 2 * pixels * cout, pixels * cout, batch))
            cin = cout
        size //= 2
        out = size * size * cout
        layers.append(layer(f"pool{block + 1}", 4 * out, 0, out, out, batch))
    for i, (fin, fout) in enumerate([(25088, 4096), (4096, 4096), (4096, 1000)]):
        layers.append(layer(f"fc{i + 1}", 2 * fin * fout, fin * fout + fout, 2 * fout, fout, batch))
    return CostModel(tuple(layers), batch_size=batch)


def gpt(batch: int = 8, seq: int = 1024, d: int = 1024, blocks: int = 24) -> CostModel:
    """GPT-2 medium: embedding, attention and MLP layers per block, an untied LM head."""
    hidden, vocab = seq * d, 50257
    layers = [layer("embedding", hidden, vocab * d + seq * d, hidden, hidden, batch)]
    for b in range(blocks):
        attention, acts = 8 * seq * d * d + 4 * seq * seq * d, 6 * hidden + 16 * seq * seq
        layers.append(layer(f"attn{b}", attention, 4 * d * d + 6 * d, acts, hidden, batch))
        mlp = 16 * seq * d * d
        layers.append(layer(f"mlp{b}", mlp, 8 * d * d + 7 * d, 10 * hidden, hidden, batch))
    layers.append(layer("lm_head", 2 * seq * d * vocab, vocab * d, seq * vocab, seq * vocab, batch))
    return CostModel(tuple(layers), batch_size=batch)


def resnet(batch: int = 32) -> CostModel:
    """ResNet-50: three layers per bottleneck block; cuts inside a block carry the skip."""
    stem = 2 * 49 * 3 * 64 * 112 * 112
    layers = [layer("stem", stem, 49 * 3 * 64, 2 * 64 * 112 * 112, 64 * 56 * 56, batch)]
    cin, size = 64, 56
    for stage, (width, count) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for b in range(count):
            if b == 0 and stage > 0:
                size //= 2
            pixels, cout = size * size, 4 * width
            skip = pixels * cout if b == 0 else pixels * cin  # projected or identity input
            names = [f"res{stage + 2}{chr(97 + b)}_{k}" for k in ("reduce", "conv", "expand")]
            shapes = [(cin, width, 1), (width, width, 9), (width, cout, 1)]
            for name, (ci, co, k) in zip(names, shapes, strict=True):
                out = pixels * co + (skip if name != names[2] else 0)
                flops, acts = 2 * k * ci * co * pixels, 3 * pixels * co
                layers.append(layer(name, flops, k * ci * co, acts, out, batch))
            cin = cout
    layers.append(layer("fc", 2 * 2048 * 1000, 2048 * 1000, 1000, 1000, batch))
    return CostModel(tuple(layers), batch_size=batch)


def random_chain(L: int, seed: int, batch: int = 16) -> CostModel:
    """Heavy-tailed times, parameters and activations; cuts of varied size."""
    rng = np.random.default_rng(seed)
    forward = rng.lognormal(-7.0, 1.0, L)
    layers = []
    for i in range(L):
        backward = float(forward[i] * rng.uniform(1.5, 3.0))
        sizes = [int(rng.lognormal(*shape)) for shape in ((14, 2), (11, 1.5), (10, 1.5))]
        layers.append(LayerCost(f"l{i}", float(forward[i]), backward, *sizes))
    return CostModel(tuple(layers), batch_size=batch)


def brute_force(costs: CostModel, K: int) -> Partition | None:
    """The least step-time estimate over every partition, vectorised; None if too many."""
    L = costs.num_layers
    if math.comb(L - 1, K - 1) > BRUTE_FORCE_LIMIT:
        return None
    p = costs.prefix
    cuts = np.array(list(itertools.combinations(range(1, L), K - 1)), dtype=np.int64)
    cuts = cuts.reshape(-1, K - 1)
    ends = [np.zeros((len(cuts), 1), np.int64), cuts, np.full((len(cuts), 1), L, np.int64)]
    bounds = np.hstack(ends)
    t = p.compute[bounds[:, 1:]] - p.compute[bounds[:, :-1]]
    t[:, 1:] = t[:, 1:] + p.cut[bounds[:, 1:-1]]
    t[:, :-1] = t[:, :-1] + p.cut[bounds[:, 1:-1]]
    best = int(np.argmin(t.sum(axis=1) + (M - 1) * t.max(axis=1)))
    return Partition(tuple(int(x) for x in bounds[best]))


METHODS: dict[str, Callable[[CostModel, int], Partition]] = {
    "uniform": lambda costs, K: uniform(costs.num_layers, K),
    "by_parameters": by_parameters,
    "block_partition": block_partition,
}


def compare(name: str, costs: CostModel, K: int) -> list[str]:
    """One row of step-time estimates, in milliseconds."""
    started = time.perf_counter()
    exact = solve_speed(costs, K, M)
    elapsed = time.perf_counter() - started
    best = step_time_estimate(costs, exact, M)
    brute = brute_force(costs, K)
    if brute is not None:
        assert math.isclose(step_time_estimate(costs, brute, M), best, rel_tol=1e-9), name
    row = [name, str(costs.num_layers), str(K), f"{1e3 * best:.1f}",
           "= exact" if brute is not None else "n/a (too many)"]  # fmt: skip
    for method in METHODS.values():
        value = step_time_estimate(costs, method(costs, K), M)
        row.append(f"{1e3 * value:.1f} (+{100 * (value / best - 1):.1f}%)")
    return [*row, f"{1e3 * elapsed:.0f}"]


@dataclasses.dataclass(frozen=True)
class Settings:
    layers: int = 10_000  # the solver timing's chain
    stages: int = 64
    repeats: int = 3


def scale_timing(s: Settings) -> list[list[str]]:
    """Median solver time on ``s.layers`` layers x ``s.stages`` stages, speed and memory."""
    rng = np.random.default_rng(0)
    forward = rng.uniform(1e-4, 1e-3, s.layers)
    layers = (
        LayerCost(f"l{i}", float(forward[i]), float(2 * forward[i] * rng.uniform(0.8, 1.2)),
                  int(rng.integers(0, 10**7)), int(rng.integers(10**3, 10**6)),
                  int(rng.integers(10**3, 10**5)))
        for i in range(s.layers)
    )  # fmt: skip
    costs = CostModel(tuple(layers), batch_size=32)
    costs.prefix  # noqa: B018 - built once, outside the timed solves
    rows = []
    for label, solver in [("speed", solve_speed), ("memory", solve_memory)]:
        runs = []
        for _ in range(s.repeats):
            started = time.perf_counter()
            solver(costs, s.stages, M)
            runs.append(time.perf_counter() - started)
        rows.append([label, f"{s.layers:,}", str(s.stages), str(M),
                     f"{statistics.median(runs):.2f} s", report.listed(runs, ".2f")])  # fmt: skip
    return rows


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, or the platform's machine type."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


MODELS: list[tuple[str, Callable[[], CostModel]]] = [
    ("VGG-16 CNN", vgg),
    ("GPT-2 medium", gpt),
    ("ResNet-50 (skips)", resnet),
    ("random, L=24", lambda: random_chain(24, 1)),
    ("random, L=200", lambda: random_chain(200, 2)),
]


def measure(s: Settings) -> Result:
    """Step-time estimates per model and K, then the solver's timings."""
    steps = [compare(name, build(), K) for name, build in MODELS for K in STAGES]
    machine = f"{cpu_name()}, Python {platform.python_version()}, numpy {np.__version__}"
    return {"steps": steps, "timings": scale_timing(s), "machine": machine}


def render(raw: Result, meta: Result, s: Settings) -> str:
    header = ["model", "L", "K", "exact", "brute force", *METHODS, "solve ms"]
    return "\n\n".join([
        f"{report.provenance(meta, BENCH.command)} {raw['machine']}.",
        f"### Step-time estimate T = sum_s t_s + (M - 1) max_s t_s, ms (M = {M})",
        report.table(header, raw["steps"]),
        f"### Solver run time, {s.layers:,} random layers into {s.stages} stages",
        report.table(["solver", "L", "K", "M", "median", "runs (s)"], raw["timings"]),
    ])  # fmt: skip


BENCH = Benchmark(
    "partition", __doc__.splitlines()[0], Settings(), Settings(layers=1_000, stages=16, repeats=1),
    measure, render, max_wait=0.0,  # one process, and the timings are of the solver alone
)  # fmt: skip

if __name__ == "__main__":
    run(BENCH)
