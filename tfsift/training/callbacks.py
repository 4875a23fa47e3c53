"""Keras callbacks on every rank, and ``BackupAndRestore`` for a partitioned run.

``fit`` runs the same callbacks on every rank with the same logs, so a callback that
decides (``EarlyStopping``, ``ReduceLROnPlateau``, ``ModelCheckpoint``'s best) decides the
same everywhere. What a callback shows or writes is rank 0's alone (``for_rank``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
from mpi4py import MPI

from tfsift.checkpoint import CheckpointManager, collective, files
from tfsift.checkpoint.files import CheckpointError
from tfsift.parallel import collectives, runtime
from tfsift.parallel.comm import allgather_object

# Writers of what every rank would write alike: one copy, from rank 0. Several ranks
# writing one CSV or one TensorBoard log_dir would interleave rows or repeat every curve.
_RANK_0_ONLY = (keras.callbacks.TensorBoard, keras.callbacks.CSVLogger)
# What runs on rank 0 alone anyway: a script may give them to rank 0 only (Horovod's recipe)
_SHOWN_ONLY = (*_RANK_0_ONLY, keras.callbacks.ProgbarLogger)
# Keras' callbacks that decide at a batch from the logs alone, which are the same on every
# rank: they stop every rank at the same batch without an exchange
_DECIDE_ALIKE = (
    keras.callbacks.History,
    keras.callbacks.ProgbarLogger,
    keras.callbacks.TerminateOnNaN,
    keras.callbacks.ModelCheckpoint,
    *_RANK_0_ONLY,
)
_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


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


def check_tensorboard(
    callbacks: list[keras.callbacks.Callback], partitions: int, size: int
) -> None:
    """Refuses a ``TensorBoard`` whose epoch-end work rank 0, the one rank that runs it,
    cannot do alone: ``histogram_freq`` reads every layer's weights, which rank 0 holds
    only for stage 0 on a pipeline; ``embeddings_freq`` calls ``model.save_weights``,
    which every rank calls together (rank 0 alone waited for the others until the timeout).

    Raises:
        ValueError: naming the argument, what to pass instead and the layout.
    """
    for board in (c for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)):
        if board.histogram_freq and partitions > 1:
            raise ValueError(
                "keras.callbacks.TensorBoard(histogram_freq=...) logs every layer's weights "
                f"from rank 0, which holds only stage 0's on a pipeline of {partitions} "
                "stages. Pass histogram_freq=0 (the metrics still log), or log weights in a "
                "callback of your own from model.get_weights(), which every rank calls. "
                f"Received: histogram_freq={board.histogram_freq}, partitions={partitions}"
            )
        if board.embeddings_freq and size > 1:
            raise ValueError(
                "keras.callbacks.TensorBoard(embeddings_freq=...) saves the model's weights "
                "from rank 0 alone, and tfsift's model.save_weights is called on every rank "
                "together. Pass embeddings_freq=0, and save weights with "
                "keras.callbacks.ModelCheckpoint(path, save_weights_only=True), which every "
                f"rank runs. Received: embeddings_freq={board.embeddings_freq} on {size} ranks"
            )


def check_same_everywhere(
    model: keras.Model, callbacks: list[keras.callbacks.Callback], steps: int | None = None
) -> None:
    """Refuses, on every rank, a ``fit`` set up otherwise on some ranks: callbacks that
    differ (by class, in order; leaving out those that only show or write what rank 0 alone
    does anyway), or another optimizer configuration or loss.

    Every rank runs ``fit``'s steps, saves and stops in lock-step: a ``ModelCheckpoint``
    given to rank 0 only (Horovod's recipe) saved on rank 0 alone and waited for the
    other stages until the ``timeout``, naming a stalled rank; a learning rate of each
    rank's own trained each stage at its own rate, without a word. ``steps``, the batches
    of an epoch where the data says (its cardinality): data sharded by hand into shards of
    other lengths left the replicas with more batches waiting for the others in the
    gradients' average until the ``timeout``, which named a stalled replica. One exchange
    of a digest (bounded by the ``timeout``), and the setups where the digests differ.

    Raises:
        ValueError: the ranks' setups differ (the first that differs, each rank's named).
    """
    rt = runtime.get()
    if rt.topology.size == 1:
        return
    mine = {
        "callbacks": [type(c).__qualname__ for c in callbacks if not isinstance(c, _SHOWN_ONLY)],
        "optimizer": _described(getattr(model, "optimizer", None)),
        "exclude_from_weight_decay": _excluded(model),
        "loss": _described(getattr(model, "loss", None)),
        "batches": steps,
    }
    digest = np.frombuffer(hashlib.sha256(repr(mine).encode()).digest()[:8], np.int64)
    everyone = np.zeros(rt.topology.size, np.int64)
    collectives.control_wait(
        rt.control_comm.Iallgather(digest.copy(), everyone),
        "at the start of fit for the other ranks to start it too (every rank must call fit)",
    )
    if len(set(everyone.tolist())) == 1:
        return
    setups = allgather_object(rt.control_comm, mine)  # every rank is here: no wait
    what = next(k for k in mine if any(s[k] != setups[0][k] for s in setups))
    values = [setup[what] for setup in setups]
    received = runtime.by_rank([_shown(value, values) for value in values])
    if what == "callbacks":
        raise ValueError(
            "fit was given other callbacks on some ranks. Every rank runs fit's steps, saves "
            "and stops in lock-step, so give every rank the same callbacks (tfsift shows the "
            "progress and writes TensorBoard and CSVLogger files on rank 0 alone, so those "
            f"may be given to rank 0 only). Received: {received}"
        )
    if what == "batches":
        raise ValueError(
            "fit was given data of another length on some ranks: every replica must train "
            "as many batches an epoch (each step averages every replica's gradients), and "
            "the ranks of a pipeline the same batches. Shard with tfsift.shard(dataset), "
            "which gives every replica as many, or pass steps_per_epoch no larger than the "
            f"shortest. Received: batches an epoch: {received}"
        )
    if what == "exclude_from_weight_decay":
        raise ValueError(
            "the model's optimizer excludes other weights from weight decay on some ranks "
            "(exclude_from_weight_decay). Every stage and replica trains one model, so "
            f"exclude the same weights on every rank. Received: {received}"
        )
    raise ValueError(
        f"the model was compiled with another {what} on some ranks. Every stage and replica "
        "trains one model, so compile it alike on every rank (the same optimizer settings "
        f"and learning rate, the same loss). Received: {received}"
    )


def _shown(value: Any, values: list[Any]) -> str:
    """``value``, one rank's of ``values``, as the error shows it: a list of callbacks; of
    an optimizer's or a loss's configuration, the entries that differ between the ranks."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"
    if all(isinstance(v, dict) for v in values):
        keys = [k for k in value if any(v.get(k) != value[k] for v in values)]
        return ", ".join(f"{k}={value[k]!r}" for k in keys) or str(value)
    return str(value)


def _described(value: Any) -> Any:
    """An optimizer or loss as what decides its computation, comparable across ranks: its
    class and configuration (less its name, which Keras numbers per process), a function's
    qualified name, or as it is (a name, a list or dict of them)."""
    if isinstance(value, (list, tuple)):
        return [_described(v) for v in value]
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    if hasattr(value, "get_config"):
        try:
            config = value.get_config()
        except NotImplementedError:  # a schedule without get_config, which Keras trains with
            return {"class": type(value).__name__, **_attributes(value)}
        return {"class": type(value).__name__, **_unnamed(config)}
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return value


def _attributes(value: Any) -> dict[str, Any]:
    """What Keras cannot serialize, by its attributes: numbers, strings, schedules and
    wrapped optimizers; an optimizer's public ones (and its learning rate), all of a
    user's schedule's."""
    schedule = isinstance(value, keras.optimizers.schedules.LearningRateSchedule)
    kept = {}
    for k, v in sorted(vars(value).items()):
        if k in ("name", "built") or (k.startswith("_") and not schedule and k != "_learning_rate"):
            continue
        if isinstance(
            v, (keras.optimizers.schedules.LearningRateSchedule, keras.optimizers.Optimizer)
        ):
            kept["learning_rate" if k == "_learning_rate" else k] = _described(v)
        elif isinstance(v, (bool, int, float, str, type(None))):
            kept[k] = v
    return kept


def _excluded(model: keras.Model) -> Any:
    """What the model's optimizer leaves out of weight decay (``exclude_from_weight_decay``,
    kept out of its config): the names it matches and the paths of the variables listed."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    listed: set[int] = getattr(optimizer, "_exclude_from_weight_decay", set())
    pattern = getattr(optimizer, "_exclude_from_weight_decay_pattern", None)
    paths = sorted(v.path for v in model.weights if id(v) in listed)
    # Keras joins the names in a set's order, which differs from process to process
    names = sorted(pattern.pattern.split("|")) if pattern is not None else []
    return {"var_names": names, "var_list": paths, "unknown": len(listed) - len(paths)}


def _unnamed(config: Any) -> Any:
    """``config`` without its ``name`` entries, nested ones too (a wrapped optimizer's)."""
    if isinstance(config, dict):
        return {k: _unnamed(v) for k, v in config.items() if k != "name"}
    return config


def decides_at_batches(callbacks: list[keras.callbacks.Callback]) -> bool:
    """Whether a callback may stop ``fit`` at a batch from what one rank alone sees (a time
    budget, a file): one of its own, with a batch hook (``agree_to_stop`` then runs at
    every batch, not only at each epoch's end)."""
    base = keras.callbacks.Callback
    return any(
        not isinstance(c, _DECIDE_ALIKE)
        and any(getattr(type(c), h) is not getattr(base, h) or h in vars(c) for h in _BATCH_HOOKS)
        for c in callbacks
    )


def agree_to_stop(model: keras.Model) -> None:
    """``model.stop_training`` on every rank where any rank's callbacks set it: one that
    stopped alone left the others waiting for it until the ``timeout``, naming a stalled
    rank. A small exchange over every rank, bounded by the ``timeout``."""
    rt = runtime.get()
    if rt.topology.size == 1:
        return
    mine, anyone = np.array([int(bool(model.stop_training))], np.int64), np.zeros(1, np.int64)
    collectives.control_wait(
        rt.control_comm.Iallreduce(mine, anyone, op=MPI.MAX),
        "in fit for the other ranks to say whether a callback stopped training",
    )
    model.stop_training = bool(anyone[0])


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


@contextlib.contextmanager
def quiet_elsewhere() -> Iterator[None]:
    """Within it, Keras' own messages (``TerminateOnNaN``'s, and any callback's printed
    through ``keras.utils.io_utils``, which ``verbose=0`` does not silence) print on rank 0
    alone: elsewhere Keras logs them at INFO level (its interactive logging off), not
    once per rank."""
    rt = runtime.get()
    if rt.rank == 0 or not keras.config.is_interactive_logging_enabled():
        yield
        return
    keras.config.disable_interactive_logging()
    try:
        yield
    finally:
        keras.config.enable_interactive_logging()
