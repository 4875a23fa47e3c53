"""Under mpirun: a stopped 2 x 2 run resumes exactly, and its checkpoint fits other layouts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpi
from tfsift.checkpoint import codec, weights
from tfsift.checkpoint import optimizer as optimizer_lib

# one pytest worker runs both tests, so the module's fixture trains its run once
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.xdist_group("resume_2x2")]
STEPS, EVERY = 10, 5  # checkpoints after steps 4 and 9
LAST = f"ckpt-{STEPS - 1}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Any]]:
    """10 steps on 2 stages x 2 replicas, sifted, with dropout: ckpt-4 and ckpt-9."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    args = (str(directory), "2", str(STEPS), str(EVERY), "--sift")
    return directory, mpi.reports(mpi.run(4, "checkpoint_train.py", *args, timeout=240))


def arrays(directory: Path, prefix: str) -> dict[str, np.ndarray]:
    """Every array of the files ``prefix*.npz``, read with NumPy alone."""
    found: dict[str, np.ndarray] = {}
    for path in sorted(directory.glob(f"{prefix}*.npz")):
        with np.load(path) as npz:
            found.update({k: npz[k] for k in npz.files})
    return found


@pytest.mark.timeout(600)
def test_a_stopped_2x2_sifted_run_with_dropout_resumes_bitwise_and_exports(
    uninterrupted: tuple[Path, dict[int, Any]], tmp_path: Path
) -> None:
    whole, want = uninterrupted
    shutil.copytree(whole / "ckpt-4", tmp_path / "ckpt-4")  # as if stopped after step 4
    args = (str(tmp_path), "2", str(STEPS), str(EVERY), "--sift", "--export")
    got = mpi.reports(mpi.run(4, "checkpoint_train.py", *args, timeout=240))
    for rank in range(4):
        assert got[rank]["first"] == EVERY
        assert got[rank]["losses"] == want[rank]["losses"][EVERY:]
    for name in sorted(p.name for p in (whole / LAST).glob("*.npz")):
        a, b = np.load(whole / LAST / name), np.load(tmp_path / LAST / name)
        assert a.files == b.files, name
        differ = [k for k in a.files if k != codec.TREE and not np.array_equal(a[k], b[k])]
        assert differ == [], name  # weights, optimizer, sift history and buffer, generators
        if name.startswith("state-"):
            sa, sb = codec.unpack(a)["sift"], codec.unpack(b)["sift"]
            for key in ("rounds", "batches_read", "epoch_read"):
                assert sa[key] == sb[key], (name, key)
            assert sa["metrics"]["epochs"] == sb["metrics"]["epochs"] == 2
    plain = _load_plainly(tmp_path / "model.keras", tmp_path)
    assert plain["imported"] == []
    # The file holds replica 0's variables; replica 1 keeps BatchNorm statistics of its own.
    for rank in (r for r in range(4) if got[r]["replica"] == 0):
        np.testing.assert_allclose(plain["predictions"], got[rank]["predictions"], atol=1e-6)


def _load_plainly(path: Path, tmp_path: Path) -> dict[str, Any]:
    """Predictions of the .keras file loaded by a process that imports only Keras."""
    sys.path.insert(0, str(mpi.SCRIPTS))
    from checkpoint_models import samples

    np.save(tmp_path / "x.npy", samples()[0][:16])  # the inputs the job predicted
    script = str(mpi.SCRIPTS / "checkpoint_plain_load.py")
    proc = subprocess.run(
        [sys.executable, script, str(path), str(tmp_path / "x.npy")],
        env={**mpi.environment(), "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(600)
def test_a_2x2_checkpoint_restores_into_one_four_and_two_spread_stages(
    uninterrupted: tuple[Path, dict[int, Any]],
) -> None:
    whole, _ = uninterrupted
    stored_weights = arrays(whole / LAST, "weights-")
    stored_optimizer = arrays(whole / LAST, "optimizer-")
    one = _restore_in_this_process(whole)
    assert one["weights"].keys() == stored_weights.keys()
    assert one["optimizer"].keys() == stored_optimizer.keys()
    _assert_stored(one, stored_weights, stored_optimizer)
    got = mpi.reports(mpi.run(4, "checkpoint_relayout.py", str(whole), timeout=240))
    layouts = {"four": ([0, 1, 2, 3], [0, 0, 0, 0]), "two": ([0, 0, 1, 1], [0, 1, 0, 1])}
    for layout, (stages, replicas) in layouts.items():  # two: spread, pipelines {0, 2}, {1, 3}
        assert [got[rank][layout]["stage"] for rank in range(4)] == stages
        assert [got[rank][layout]["replica"] for rank in range(4)] == replicas
        held = set()
        for rank in range(4):
            found = got[rank][layout]
            assert found["first"] == STEPS
            own = dict(stored_weights)
            if layout == "two":  # the saved layout: each replica takes its own statistics back
                state = whole / LAST / f"state-r{found['replica']}-s{found['stage']}.npz"
                own.update(_local_variables(state))
            _assert_stored(found, own, stored_optimizer)
            held |= set(found["weights"])
            assert np.isfinite(found["loss"])
        assert held == set(stored_weights)  # every layer is somewhere, once per replica
    summary = got[2]["four"]["summary"]
    assert summary[0].endswith("partitions=4; this rank holds stage 2")
    assert any(line.startswith("stage 2: ") and line.endswith("<- this rank") for line in summary)
    assert len({got[rank]["four"]["params"] for rank in range(4)}) == 1


def _local_variables(path: Path) -> dict[str, np.ndarray]:
    """A rank's own non-trainable variables (BatchNorm statistics, seed states), by key."""
    with np.load(path) as npz:
        return {k.split("/", 1)[1]: npz[k] for k in npz.files if k.startswith("variables/")}


def _restore_in_this_process(directory: Path) -> dict[str, Any]:
    sys.path.insert(0, str(mpi.SCRIPTS))
    from checkpoint_models import start

    import tfsift

    model, optimizer, _ = start(1)
    assert tfsift.CheckpointManager(model, optimizer, directory).restore() == STEPS
    part = model.partitioned
    assert part is not None
    return {
        "weights": weights.values(weights.keyed(model, part)),
        "optimizer": optimizer_lib.arrays(optimizer, weights.trainable(model, part)),
    }


def _assert_stored(found: dict[str, Any], stored_weights: Any, stored_optimizer: Any) -> None:
    for key, value in found["weights"].items():
        np.testing.assert_array_equal(np.asarray(value), stored_weights[key], err_msg=key)
    for key, value in found["optimizer"].items():
        np.testing.assert_array_equal(np.asarray(value), stored_optimizer[key], err_msg=key)


def test_a_checkpoint_restores_where_the_cut_moved_with_replica_0s_moved_state(
    tmp_path: Path,
) -> None:
    # the same 2 stages, another cut (a plan made again without plan_file): the dropout
    # layer's seed state moved from stage 1 to stage 0, whose rank file lacks it, and
    # restore failed with "has no value for the layer paths ['drop/seed_generator_state']
    # ... a checkpoint of another model?"
    saved = mpi.reports(mpi.run(2, "moved_cut_check.py", str(tmp_path), "save", timeout=120))
    proc = mpi.run(2, "moved_cut_check.py", str(tmp_path), "restore", timeout=120)
    restored = mpi.reports(proc)
    assert saved[0]["bounds"] == [0, 1, 3] and restored[0]["bounds"] == [0, 2, 3]
    assert all(r["step"] == 1 for r in restored.values())
    for got, want in zip(restored[0]["weights"], saved[0]["weights"], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert (
        "was saved with the stages cut at nodes [0, 1, 3] and is restored into stages cut at "
        "[0, 2, 3]: the variables ['drop/seed_generator_state'], now on stage 0, take replica "
        "0's values (BatchNorm statistics, random-generator states); the rest resumes exactly. "
        "Pass the same plan_file to every run to keep the cut"
    ) in proc.stdout + proc.stderr
