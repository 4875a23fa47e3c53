"""Seconds per optimizer step on a 2-stage pipeline: plain, sifted (full / early exit), overlap.

Run on 2 processes (partitions=2, microbatches=4):

    mpirun -np 2 python scripts/bench_overlap.py --repeats 5

Each rank computes with one thread (a rank stands in for a device); ``tfsift run -np 2
--bind-to core scripts/bench_overlap.py`` also keeps each rank on a core of its own
(``docs/benchmarks.md`` compares runs with and without). ``--pipeline simple``
times the GPipe schedule instead of 1F1B (stage 0's waits then fall at the drain);
``--source batches`` reads batches sliced from arrays batched beforehand instead of
batching samples in tf.data (a sifted run reads 1 / kept source batches per step);
``--variants`` runs some of the variants (no sifting always runs).

Each variant trains the same 1-D ConvNet (2 convolutions, as in examples/sift_mnist1d.py,
and 4) on two cuts: where the profile of the first variant of that model cut it
(``plan_file``), and by hand after the first convolution (``tfsift.partition``), which
leaves stage 0 idle while stage 1 works. On the profiled cut one more variant, overlap
with the default exit (stage 0's last layer), gets a cut of its own: the planner, told
by ``tfsift.sift`` that stage 0 will score in its waits, leaves it room for that (its
own plan file), and no sifting then trains on that plan too, so that the two steps are
compared on the same pipeline (and overlap with ``leftover="keep"`` on it too, which
keeps unscored what no wait had room to score); one more, overlap with
``SiftConfig(log_dir=...)``, times rank 0
writing the sifting metrics to TensorBoard. Each trains on MNIST-1D
for ``--steps`` optimizer steps
(after ``--warmup`` steps that trace and warm up), and the time per step counts
everything the training loop waits for: reading and sifting the data, the step, the
gradient allreduce and the update. Variants run in rotating order ``--repeats`` times
in one job, and the table shows the median, so drift on a noisy machine hits all of
them alike. Rank 0 prints Markdown tables: the time per step, where each rank's step
goes, and the step right after a round (the sifted dataset read and scored source
batches in that step's ``next()``) against the others. ``--actions`` also records every
step in a run log (``log_dir``, ``tfsift.pipeline.rundir``) and splits each rank's step,
after a round and otherwise, into its compute (forwards and backwards), its receives
(waits for a peer, overlap's units on stage 0 included) and its sends; the log gathers
each step's record on rank 0, so those runs' times are not comparable with runs
without it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from sift_mnist1d import load

import tfsift
from partitioner.schedule import COMPUTE, Action, Kind
from tfsift.parallel import runtime
from tfsift.pipeline import rundir
from tfsift.sift import early_exit
from tfsift.sift import overlap as units

CUTS = {
    # the solver's cut, from the profile of the first variant (later ones reuse its plan)
    "profiled": {"auto_partition": True},
    # stage 0 ends after the first convolution (the layers after it are created inside
    # tfsift.partition(1)): stage 0 has little work and waits while stage 1 works
    "after conv0": {"auto_partition": False},
}


class ConvNet(tfsift.DistributedModel):
    """``examples/sift_mnist1d.py``'s ConvNet1D with ``convs`` convolutions (it has 2)."""

    def __init__(self, convs: int) -> None:
        super().__init__()
        # fixed layer names: every variant of a model reuses the plan of its first
        # (plan_file), so that the variants are timed on the same cut
        self.reshape = keras.layers.Reshape((40, 1), name="reshape")
        self.first = keras.layers.Conv1D(32, 5, padding="same", activation="relu", name="conv0")
        with tfsift.partition(1):  # used only with auto_partition=False
            self.convs = [
                keras.layers.Conv1D(32, 5, padding="same", activation="relu", name=f"conv{i + 1}")
                for i in range(convs - 1)
            ]
            self.flatten = keras.layers.Flatten(name="flatten")
            self.dense1 = keras.layers.Dense(128, activation="relu", name="dense0")
            self.dense2 = keras.layers.Dense(10, name="dense1")

    def call(self, x: Any) -> Any:
        h = self.first(self.reshape(x))
        for conv in self.convs:
            h = conv(h)
        return self.dense2(self.dense1(self.flatten(h)))


VARIANTS = {
    "no sifting": None,
    "relative beta=1, full scoring": {"scorer": "full"},
    "relative beta=1, early exit": {"scorer": "early_exit"},
    "relative beta=1, early exit + overlap": {"scorer": "early_exit", "overlap": True},
    # as before a3d26af: every unit scores one source batch, whatever room the wait has
    "relative beta=1, early exit + overlap, one batch a unit": {
        "scorer": "early_exit",
        "overlap": True,
    },
    # as before the head's gradient sums were finished in a wait (ExitHead.finish_early)
    "relative beta=1, early exit + overlap, head finished at the round": {
        "scorer": "early_exit",
        "overlap": True,
    },
    # with SiftConfig(log_dir=...): rank 0 writes the sifting metrics to TensorBoard
    "relative beta=1, early exit + overlap, sift log_dir": {
        "scorer": "early_exit",
        "overlap": True,
    },
    # the default exit (stage 0's last layer) on a cut of its own: the planner gives stage 0
    # room for the scoring (solve_speed's scoring); profiled cut only, with its own plan file
    "relative beta=1, early exit + overlap, cut for it": {
        "scorer": "early_exit",
        "overlap": True,
        "exit_after": None,
    },
    # the same, keeping unscored what no wait had room to score (SiftConfig.leftover)
    "relative beta=1, early exit + overlap, leftover kept, cut for it": {
        "scorer": "early_exit",
        "overlap": True,
        "exit_after": None,
        "leftover": "keep",
    },
    # no sifting on that cut (the plan file the variants above made; one must run first)
    "no sifting, cut for it": None,
}
PLAIN = "no sifting"
POLICY = {"policy": "relative", "beta": 1.0}  # every sifted variant's
ONE_BATCH = "one batch a unit"
AT_THE_ROUND = "head finished at the round"
OWN_CUT = "cut for it"
LOGGED = "sift log_dir"


STAGE0: dict[str, str] = {}  # the last node of stage 0, per variant (its cut)

# what overlap had to work with: stage 0's expected wait per step, a unit's cost there
ROOM = ("overlap_wait_ms", "overlap_unit_ms")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--samples", type=int, default=40000)
    parser.add_argument("--score-batches", type=int, default=8, help="g of SiftConfig")
    parser.add_argument(
        "--convs", type=int, nargs="+", default=[2, 4], help="models: convolutions in each"
    )
    parser.add_argument("--cuts", nargs="+", choices=list(CUTS), default=list(CUTS))
    parser.add_argument("--source", choices=["samples", "batches"], default="samples")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument(
        "--pipeline", choices=["interleaved", "simple"], default="interleaved", help="schedule"
    )
    parser.add_argument(
        "--actions", action="store_true", help="split each step into compute, receives, sends"
    )
    return parser.parse_args()


def source(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tf.data.Dataset:
    """The training batches: batched from samples by tf.data (``--source samples``), or
    slices of arrays batched beforehand (``--source batches``), which costs tf.data
    almost nothing. Either way a background thread prefetches 4 of them."""
    if args.source == "samples":
        train = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return train.batch(args.batch, drop_remainder=True).prefetch(4)
    n = len(x) // args.batch * args.batch
    batched = (x[:n].reshape(-1, args.batch, *x.shape[1:]), y[:n].reshape(-1, args.batch))
    return tf.data.Dataset.from_tensor_slices(batched).repeat().prefetch(4)


def time_variant(
    name: str, convs: int, x: np.ndarray, y: np.ndarray, args: argparse.Namespace
) -> tuple[float, list[float]]:
    """Seconds per optimizer step of one variant (after its warm-up steps), and this
    rank's seconds per step waiting for the next batch, in the step, and in the update,
    the fraction of source batches scored while stage 0 waited, the milliseconds it
    expected to wait per step and a unit's cost there (overlap only), the median step
    right after a round and of the others, how much later rank 0 left ``next()`` than
    rank 1 before each (``skew``), the share of stage 0's late receives, and with
    ``--actions`` this rank's compute, receives and sends per step after a round and
    otherwise (``inside``)."""
    keras.utils.set_random_seed(0)
    model = ConvNet(convs)
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function  # an eager Adam update costs more than this model's step
    def apply(grads: list[tf.Tensor]) -> None:
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    @tfsift.step
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = keras.ops.mean(per_sample(labels, model(images, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    train = source(x, y, args)
    options = VARIANTS[name]
    if name == f"{PLAIN}, {OWN_CUT}":
        # plain training reusing the plan made with room for scoring (plan_differences
        # compares the scoring it was made for): the source batches per step that the
        # sifted variants' policy reads, as tfsift.sift tells the planner
        model._tfsift.scored_batches = 1 / tfsift.SiftConfig(**POLICY).expected_kept()
    units.MOST_PER_UNIT = 1 if name.endswith(ONE_BATCH) else None
    early_exit.FINISH_IN_WAITS = not name.endswith(AT_THE_ROUND)
    if options is not None and name.endswith(LOGGED):
        options = {**options, "log_dir": tempfile.mkdtemp(prefix="tfsift-bench-log-")}
    if options is not None:
        config = tfsift.SiftConfig(
            **{
                **POLICY,
                "exit_after": "first",
                "score_batches": args.score_batches,
                **options,
            }
        )
        train = train.apply(tfsift.sift(model, per_sample, config))
    batches = iter(train)
    stamps = []
    split = np.zeros(3)
    steps: dict[bool, list[float]] = {True: [], False: []}  # step seconds, by "after a round"
    left: list[tuple[float, bool]] = []  # when this rank left next(), and if after a round
    rounds: list[bool] = []  # per step, whether it came right after a round
    seen = 0  # source samples the sifted dataset had read before this step's next()
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        images, labels = next(batches)
        t1 = time.perf_counter()
        grads, _ = train_step(images, labels)
        t2 = time.perf_counter()
        grads = tfsift.allreduce(grads)
        if grads:
            apply(grads)
        stamps.append(time.perf_counter())
        # the sifted dataset runs its rounds on this thread, inside next(): one read of
        # its counters per step, after the update
        now = tfsift.sift_metrics()["samples_seen"] if options else 0
        after, seen = now != seen, now
        rounds.append(after)
        if i >= args.warmup:
            split += [t1 - t0, t2 - t1, stamps[-1] - t2]
            steps[after].append(t2 - t1)
            left.append((t1, after))
    part = model.partitioned
    assert part is not None
    STAGE0[name] = part.graph.nodes[part.bounds[1] - 1].name
    metrics = tfsift.sift_metrics() if options else {}
    overlap = [metrics.get(k, 0.0) for k in ("overlapped_fraction", *ROOM)]
    medians = [float(np.median(steps[k])) if steps[k] else float("nan") for k in (True, False)]
    seconds = (stamps[-1] - stamps[args.warmup - 1]) / args.steps
    late = metrics.get("overlap_late_fraction", 0.0)
    parts = inside(rounds, args.warmup) if args.actions else [float("nan")] * 6
    unscored = metrics.get("samples_unscored", 0) / max(metrics.get("samples_seen", 0), 1)
    kept = [metrics.get("kept_fraction", 1.0), unscored]
    return seconds, [*split / args.steps, *overlap, *medians, *skew(left), late, *parts, *kept]


# what --actions adds up per step: the schedule's action kinds, by what they do
PARTS = {
    "compute": COMPUTE,
    "receives": frozenset({Kind.RECV_F, Kind.RECV_B}),
    "sends": frozenset({Kind.SEND_F, Kind.SEND_B}),
}


def inside(rounds: list[bool], warmup: int) -> list[float]:
    """This rank's compute (F, B), receives (R...) and sends (S...) per timed step, from
    its run log: medians over the steps right after a round, then over the others."""
    log_dir = runtime.get().config.log_dir
    assert log_dir is not None
    _, records = rundir.read_rank_file(rundir.rank_file(log_dir, tfsift.rank()))
    sums: dict[bool, list[list[float]]] = {True: [], False: []}
    for record in records:
        if not record.name.endswith("train_step") or not warmup <= record.call < len(rounds):
            continue
        total = dict.fromkeys(PARTS, 0.0)
        for action, start, end in record.actions:
            kind = Action.parse(action).kind
            total[next(part for part, kinds in PARTS.items() if kind in kinds)] += end - start
        sums[rounds[record.call]].append(list(total.values()))
    return [
        float(v)
        for k in (True, False)
        for v in (np.median(sums[k], axis=0) if sums[k] else [float("nan")] * 3)
    ]


def skew(left: list[tuple[float, bool]]) -> list[float]:
    """How much later rank 0 left ``next()`` than rank 1 (seconds, medians over the timed
    steps after a round, and over the others) on rank 0; NaN on the other ranks. The
    ranks' ``time.perf_counter`` is the same clock on one host (CLOCK_MONOTONIC on
    Linux), which is where this benchmark runs."""
    every = MPI.COMM_WORLD.gather(left, root=0)
    if every is None:
        return [float("nan")] * 2
    gaps: dict[bool, list[float]] = {True: [], False: []}
    for (mine, after), (theirs, _) in zip(every[0], every[1], strict=True):
        gaps[after].append(mine - theirs)
    return [float(np.median(gaps[k])) if gaps[k] else float("nan") for k in (True, False)]


def main() -> None:
    args = parse()
    # one compute thread per rank, as in the other benchmarks: a rank stands in for a
    # device, and stage 0 scoring while it waits must not take a core from stage 1
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    plan = os.path.join(tempfile.mkdtemp(prefix="tfsift-overlap-"), "plan.json")
    plan = MPI.COMM_WORLD.bcast(plan if MPI.COMM_WORLD.Get_rank() == 0 else None, root=0)
    if args.actions:
        rundir.EVERY = 1  # every step in the run log, not a sample of them
    x, y, _, _ = load(args.samples, 0)
    for convs in args.convs:
        for cut in args.cuts:
            config = {
                "partitions": 2,
                "microbatches": 4,
                "pipeline": args.pipeline,
                "profile_repeats": 3,
                **CUTS[cut],
            }
            bench_model(convs, cut, x, y, args, config, plan)


def bench_model(
    convs: int,
    cut: str,
    x: np.ndarray,
    y: np.ndarray,
    args: argparse.Namespace,
    config: dict[str, Any],
    plan: str,
) -> None:
    chosen = [n for n in VARIANTS if n in args.variants or n == PLAIN]
    if any(n.endswith(OWN_CUT) for n in chosen) and f"{PLAIN}, {OWN_CUT}" not in chosen:
        chosen.append(f"{PLAIN}, {OWN_CUT}")  # named or not, once (it ran twice a repeat)
    names = [n for n in chosen if cut == "profiled" or not n.endswith(OWN_CUT)]
    times: dict[str, list[float]] = {name: [] for name in names}
    splits: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            own = name.endswith(OWN_CUT)  # its plan file, made (once) with room for scoring
            logged = {"log_dir": f"{plan}.log-{convs}-{cut}-{r}-{names.index(name)}"}
            tfsift.init(
                {
                    **config,
                    "plan_file": plan + (".sift" if own else ""),
                    **(logged if args.actions else {}),
                }
            )
            seconds, split = time_variant(name, convs, x, y, args)
            times[name].append(seconds)
            splits[name].append(split)
            if tfsift.rank() == 0:
                print(f"repeat {r + 1}: {name}: {times[name][-1] * 1e3:.1f} ms/step", flush=True)
    # every rank's median split, per variant: [[data, step, update, overlapped, *ROOM] per rank]
    mine = {name: np.median(np.array(splits[name]), axis=0).tolist() for name in names}
    every = MPI.COMM_WORLD.gather(mine, root=0)
    if every is not None:  # rank 0
        base = statistics.median(times[PLAIN])
        print(f"\n{convs} convolutions, cut {cut}\n")
        cuts = sorted({STAGE0[name] for name in names})
        for last in cuts:
            print(f"stage 0 ends at {last}: " + ", ".join(n for n in names if STAGE0[n] == last))
        print()
        print("| variant | ms per step (median) | range | vs no sifting |")
        print("| --- | --- | --- | --- |")
        for name in names:
            med = statistics.median(times[name])
            lo, hi = min(times[name]) * 1e3, max(times[name]) * 1e3
            print(f"| {name} | {med * 1e3:.1f} | {lo:.1f} to {hi:.1f} | {med / base:.2f}x |")
        own_plain = f"{PLAIN}, {OWN_CUT}"
        if own_plain in names:  # the sifted steps against the plain one on the cut made for it
            plain = statistics.median(times[own_plain])
            for name in names:
                if name.endswith(OWN_CUT) and name != own_plain:
                    sifted = statistics.median(times[name])
                    print(f"\n{name} against {own_plain}: {sifted / plain:.2f}x")
        print("\nSamples kept / kept unscored (leftover kept), of those read (medians)\n")
        for name in names:
            if VARIANTS[name] is not None:
                kept, unscored = every[0][name][17:19]
                print(f"- {name}: {kept:.0%} / {unscored:.0%}")
        print("\nWhere each rank's step goes (ms per step, medians: next batch / step / update)")
        ranks = range(len(every))
        print(
            "\n| variant | " + " | ".join(f"rank {r}" for r in ranks) + " | scored waiting "
            "| stage 0 waits per step / a unit (ms) | late receives |"
        )
        print("| --- |" + " --- |" * (len(every) + 3))
        for name in names:
            cells = [" / ".join(f"{v * 1e3:.1f}" for v in split[name][:3]) for split in every]
            wait, unit = every[0][name][4:6]
            room = f"{wait:.1f} / {unit:.2f}" if "overlap" in name else ""
            late = f"{every[0][name][10]:.0%}" if "overlap" in name else ""
            print(
                f"| {name} | "
                + " | ".join(cells)
                + f" | {every[0][name][3]:.0%} | {room} | {late} |"
            )
        print(
            "\nThe step (ms, medians) right after a round (the sifted dataset read and scored "
            "source batches in that step's next()) and every other step; and how much later "
            "rank 0 left next() than rank 1 before those steps (ms, medians; negative: earlier)\n"
        )
        print(
            "| variant | "
            + " | ".join(f"rank {r}: after a round / others" for r in ranks)
            + " | rank 0 left next() later than rank 1 by |"
        )
        print("| --- |" + " --- |" * (len(every) + 1))
        for name in names:
            cells = [" / ".join(_ms(v) for v in split[name][6:8]) for split in every]
            gaps = " / ".join(_ms(v) for v in every[0][name][8:10])
            print(f"| {name} | " + " | ".join(cells) + f" | {gaps} |")
        if args.actions:
            print(
                "\nInside the step (ms, medians, from the run log): compute (forwards and "
                "backwards) / receives / sends, right after a round and otherwise\n"
            )
            print(
                "| variant | "
                + " | ".join(f"rank {r}: after a round | rank {r}: others" for r in ranks)
                + " |"
            )
            print("| --- |" + " --- |" * (2 * len(every)))
            for name in names:
                cells = [
                    " / ".join(_ms(v) for v in split[name][11 + 3 * k : 14 + 3 * k])
                    for split in every
                    for k in (0, 1)
                ]
                print(f"| {name} | " + " | ".join(cells) + " |")


def _ms(seconds: float) -> str:
    return "-" if np.isnan(seconds) else f"{seconds * 1e3:.1f}"


if __name__ == "__main__":
    main()
