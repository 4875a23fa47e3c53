"""Keras callbacks on every rank, and ``BackupAndRestore`` for a partitioned run.

``fit`` runs the same callbacks on every rank with the same logs, so a callback that
decides (``EarlyStopping``, ``ReduceLROnPlateau``, ``ModelCheckpoint``'s best) decides the
same everywhere. What a callback shows or writes is rank 0's alone (``for_rank``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import keras

from tfsift.checkpoint import CheckpointManager, collective, files
from tfsift.checkpoint.files import CheckpointError
from tfsift.parallel import runtime

# Writers of what every rank would write alike: one copy, from rank 0. Several ranks
# writing one CSV or one TensorBoard log_dir would interleave rows or repeat every curve.
_RANK_0_ONLY = (keras.callbacks.TensorBoard, keras.callbacks.CSVLogger)


def for_rank(
    callbacks: list[keras.callbacks.Callback], rank: int
) -> list[keras.callbacks.Callback]:
    """The callbacks ``rank`` runs: on ranks other than 0, without ``TensorBoard`` and
    ``CSVLogger``, and with every other callback's ``verbose`` set to 0 (its messages,
    such as ``EarlyStopping``'s, print once, on rank 0).

    Raises:
        TypeError: Keras' ``BackupAndRestore``, naming ``tfsift.callbacks.BackupAndRestore``.
    """
    for callback in callbacks:
        if type(callback) is keras.callbacks.BackupAndRestore:
            raise TypeError(
                "keras.callbacks.BackupAndRestore cannot restore a partitioned model: its "
                "ranks would write and remove the same files, and it keeps no optimizer "
                "state. Use tfsift.callbacks.BackupAndRestore(backup_dir), which saves a "
                "tfsift checkpoint at each epoch's end and resumes from it. Received: "
                "keras.callbacks.BackupAndRestore"
            )
    if rank == 0:
        return callbacks
    kept = [c for c in callbacks if not isinstance(c, _RANK_0_ONLY)]
    for callback in kept:
        if isinstance(getattr(callback, "verbose", None), int):
            callback.verbose = 0
    return kept


def check_writable(callbacks: list[keras.callbacks.Callback]) -> None:
    """Refuses, before the first epoch and on every rank, a ``ModelCheckpoint`` or
    ``BackupAndRestore`` whose directory cannot be written (they would fail only at the
    end of an epoch, its training lost). Rank 0 checks: it writes their files. Collective.

    Raises:
        CheckpointError: a directory that is not writable or not a directory (named).
    """
    targets = [(f"{type(c).__name__}'s", _directory(c)) for c in callbacks]
    wanted = [(what, directory) for what, directory in targets if directory is not None]
    if wanted:
        collective.on_root(runtime.get().world, lambda: _check_directories(wanted))


def _directory(callback: keras.callbacks.Callback) -> Path | None:
    """Where ``callback`` writes, for those that write at an epoch's end."""
    if isinstance(callback, BackupAndRestore):
        return callback.backup_dir
    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        # the directory part before any {epoch}-like field: what exists before the save
        fixed = str(callback.filepath).split("{", 1)[0]
        return Path(os.path.dirname(fixed) or ".")
    return None


def _check_directories(wanted: list[tuple[str, Path]]) -> None:
    for what, directory in wanted:
        why = files.unwritable(directory)
        if why is not None:
            raise CheckpointError(
                f"{what} directory must be one this job can write to (fit checks it before "
                f"the first epoch rather than fail after it): {why}. Received: {directory}"
            )


class BackupAndRestore(keras.callbacks.Callback):  # type: ignore[misc]
    """Keras' ``BackupAndRestore`` for a ``DistributedModel``: an interrupted ``fit``
    started again with the same callback resumes at the epoch after the last one saved.

    At each epoch's end it saves a ``tfsift.CheckpointManager`` checkpoint (every stage's
    weights, the optimizer's state and the random states, written as one collective
    save) into ``backup_dir``; at the start of ``fit`` it restores the newest complete
    one and ``fit`` skips the epochs already done. ``backup_dir`` must be a directory
    every rank sees (as for ``CheckpointManager``). With ``fit(..., sift=...)`` the
    sifting state (loss history, policy, score table) is saved too, and the resumed run
    continues with the next epoch as the uninterrupted one did.

    Example:
        >>> model.fit(ds, epochs=10,
        ...           callbacks=[tfsift.callbacks.BackupAndRestore("runs/exp1/backup")])

    Args:
        backup_dir: where the checkpoints go.
        save_freq: ``"epoch"``, the only frequency supported (a checkpoint inside an
            epoch could not be resumed at its batch by ``fit``).
        delete_checkpoint: remove ``backup_dir`` when ``fit`` ends normally, as Keras does.

    Raises:
        ValueError: ``save_freq`` is not ``"epoch"``, or ``backup_dir`` is empty.
    """

    def __init__(
        self, backup_dir: str | Path, save_freq: str = "epoch", delete_checkpoint: bool = True
    ) -> None:
        super().__init__()
        if not str(backup_dir):
            raise ValueError("BackupAndRestore needs a backup_dir. Received: backup_dir=''")
        if save_freq != "epoch":
            raise ValueError(
                "tfsift.callbacks.BackupAndRestore saves at each epoch's end only "
                "(save_freq='epoch'); for saves every N steps use tfsift.CheckpointManager "
                f"in a custom loop. Received: save_freq={save_freq!r}"
            )
        self.backup_dir, self.delete_checkpoint = Path(backup_dir), delete_checkpoint
        self._manager: CheckpointManager | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        sifted = getattr(model, "_fit_sifted", None)  # fit(..., sift=...)'s dataset
        self._manager = CheckpointManager(
            model, model.optimizer, self.backup_dir, max_to_keep=1, sift=sifted
        )
        resumed = self._manager.restore()  # the epoch to run next: the last saved one + 1
        if resumed is not None:
            model._initial_epoch = resumed  # Keras' own protocol: fit starts there
            if sifted is not None:  # saved at an epoch's end: go on with the next one
                sifted.sifter.start_next_epoch()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        assert self._manager is not None, "on_train_begin makes the manager"
        self._manager.save(epoch)

    def on_train_end(self, logs: Any = None) -> None:
        """``fit`` ended normally (an error skips this, keeping the backup for a rerun)."""
        manager, self._manager = self._manager, None
        if manager is None:
            return
        manager.close()
        if self.delete_checkpoint:
            world = runtime.get().world
            collective.on_root(world, lambda: shutil.rmtree(self.backup_dir, ignore_errors=True))
