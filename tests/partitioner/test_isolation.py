"""The partitioner must run where TensorFlow and Keras cannot even be imported."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocker())
import partitioner, partitioner.cli, partitioner.plan, partitioner.timeline
import partitioner.experimental.scoring, partitioner.ties
from partitioner import CostModel, LayerCost, make_plan, simulate, build
from partitioner.timeline import draw_timeline

costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 10, 10, 10) for i in range(4)))
plan = make_plan(costs, 2, 4)
draw_timeline(simulate(costs, plan.partition, build("interleaved", 2, 4)), sys.argv[1])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))
print("loaded:", loaded)
"""


def test_partitioner_never_imports_tensorflow_or_keras(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path / "t.png")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded: []"
