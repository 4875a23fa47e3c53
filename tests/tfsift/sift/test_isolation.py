"""Sifting's selection (and the experimental part's wait model) runs where TensorFlow, Keras,
mpi4py and Horovod cannot be imported."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = """
import sys

BLOCKED = ("tensorflow", "keras", "mpi4py", "horovod")

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocker())
import numpy as np
import tfsift.sift, tfsift.sift.config, tfsift.sift.policies
from tfsift.sift.config import SiftConfig
from tfsift.sift.policies import make_policy

for name in ("relative", "big_loss", "adaboost", "adaptive"):
    methods = {"methods": ("big_loss", "uniform")} if name == "adaptive" else {}
    policy = make_policy(SiftConfig(policy=name, **methods))
    policy.observe([1.0, 2.0, 3.0])
    policy.select([1.0, 2.0, 3.0], np.random.default_rng(0))
from tfsift.sift.infobatch import InfoBatchPolicy, infobatch_keep

infobatch_keep([1.0, 2.0, float("nan")], 0.5, np.random.default_rng(0))
InfoBatchPolicy(0.5, 0.125, 8).begin_epoch(2, np.arange(3.0), np.array([1.0, 2.0, 6.0]))
# the experimental part's pure piece too: when stage 0 may score in its waits
from tfsift.sift.experimental.overlap import BATCH, WaitModel

WaitModel().batches(0, 0.0, 1, BATCH)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("loaded:", loaded)
"""


def test_sift_policies_never_import_tensorflow_keras_mpi_or_horovod() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded: []"
