"""Times overlap's scoring unit through ``ExitHead.score`` with this checkout's exit head
against another revision's, side by side in one process.

A change to how the exit head builds a unit's arguments moves a unit's cost by a
fraction of a millisecond, less than this machine's spread between two runs of
``scripts/bench_exit_calls.py``. So both heads are built here, on the same exit features
(``bench_exit_calls.py``'s 4-convolution model, exit after the first convolution,
B=128, g=8), and timed in alternating order: each repeat times ``--rounds`` rounds
of each head, the unit being row 11 of ``bench_exit_calls.py`` (one source batch
scored, one learnt of a round scored in one call; the rounds' first calls left out).
The other revision's ``tfsift/sift/exit_head.py`` is read with ``git show`` and loaded
beside this checkout's modules.

usage: .venv/bin/python scripts/bench_exit_head_ab.py --against REV [--repeats N]
"""

from __future__ import annotations

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_exit_calls import B, G, commit, scored_round, through_score  # noqa: E402

from tfsift.sift import exit_head  # noqa: E402


def revision_module(rev: str) -> ModuleType:
    """``tfsift/sift/exit_head.py`` as it was at ``rev``, loaded as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:tfsift/sift/exit_head.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="tfsift-ab-")) / "exit_head_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("exit_head_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the other revision (git)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30, help="rounds per head per repeat")
    args = parser.parse_args()
    scorer, x, y, _ = scored_round()
    assert scorer._last is not None
    (features,), (labels,) = scorer._last
    base = scorer._head
    names = (f"this checkout ({commit()})", f"{args.against}")
    heads = {
        name: module.ExitHead(
            None, base._feature, (10,), base.loss, 1e-3, base._features, base.group
        )
        for name, module in zip(names, (exit_head, revision_module(args.against)), strict=True)
    }
    xb, yb = tf.constant(x[:B]), tf.constant(y[:B])
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names if r % 2 else names[::-1]:
            times[name].append(through_score(heads[name], features, labels, xb, yb, args.rounds))
    print(
        f"\nA unit through ExitHead.score, ms (median of {args.rounds} rounds x {G - 1} calls "
        f"per repeat; B={B}, g={G}):\n"
    )
    print("| exit head | repeats | median | range |\n| --- | --- | --- | --- |")
    for name, values in times.items():
        row = " ".join(f"{v:.2f}" for v in values)
        print(
            f"| {name} | {row} | {statistics.median(values):.2f} | "
            f"{min(values):.2f} to {max(values):.2f} |"
        )


if __name__ == "__main__":
    main()
