"""The README's first example runs as written, on 2 stages, with a small ``dataset``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

DATASET = """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
dataset = tf.data.Dataset.from_tensor_slices(
    (rng.normal(size=(100, 28, 28, 1)).astype("float32"), rng.integers(0, 10, 100))
)
"""


def snippet() -> str:
    text = (mpi.ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)[0]


def test_the_readme_training_loop_runs_as_written_on_two_stages(tmp_path: Path) -> None:
    code = snippet()
    assert "for images, labels in tfsift.shard(dataset)" in code
    script = tmp_path / "train.py"
    # the dataset goes right after `import keras, tfsift`: the snippet is used verbatim
    script.write_text(code.replace("import keras, tfsift\n", "import keras, tfsift\n" + DATASET))
    proc = mpi.run(2, str(script), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
