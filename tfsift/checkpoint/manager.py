"""``tfsift.CheckpointManager``: atomic checkpoints of a partitioned, sifted, data-parallel run.

One save, on every rank (N ranks, K stages, R replicas)::

    rank 0          every rank                               rank 0
    mkdir .partial ─► replica 0 of stage s: weights-s<s>.npz,  ─► manifest.json (checksums),
      (bcast)          optimizer-s<s>.npz; every rank:             fsync, rename .partial to
                       state-r<r>-s<s>.npz; errors allgathered     ckpt-<step>, prune (bcast)

A failure anywhere (a full disk, a permission) removes the partial directory and raises
on every rank; the checkpoints already published are never touched before the new one is.
One job at a time saves into a directory (``tfsift.checkpoint.lock``, taken at the first save).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tfsift.checkpoint import (
    codec,
    collective,
    files,
    lock,
    random_state,
    relayout,
    shared,
    weights,
)
from tfsift.checkpoint import optimizer as optimizer_lib
from tfsift.checkpoint.files import CheckpointError, FileEntry
from tfsift.checkpoint.manifest import (
    MANIFEST,
    MAX_STEP,
    PREFIX,
    Manifest,
    optimizer_file,
    state_file,
    weights_file,
)
from tfsift.checkpoint.store import Checkpoint, candidates, latest_valid
from tfsift.model import DistributedModel, Partitioned
from tfsift.parallel import runtime
from tfsift.version import __version__

log = logging.getLogger("tfsift")


class CheckpointManager:
    """Saves and restores a partitioned run: weights, optimizer, sifting and random states.

    Every method is collective: call it on every rank, at the same point of the loop.
    The first save makes this job the directory's owner until the process ends (or
    ``close``): rank 0 writes a lock file there, and another job's manager for the same
    directory fails at its creation (or its first save), naming this one.

    Example:
        >>> ckpt = tfsift.CheckpointManager(model, optimizer, "runs/exp1/ckpt", sift=train)
        >>> start = ckpt.restore() or 0          # the step to run next
        >>> for step in range(start, steps):
        ...     ...                              # one training step
        ...     if step % 100 == 0:
        ...         ckpt.save(step)

    Args:
        model: the ``tfsift.DistributedModel`` being trained.
        optimizer: its Keras optimizer, or None to save the model's variables only.
        directory: where the ``ckpt-<step>`` directories go (shared by every rank).
        max_to_keep: how many of the newest checkpoints to keep; None keeps all.
        sift: the dataset ``tfsift.sift`` returned, to save its state (loss history,
            policy, early-exit head, data position), or None.

    Raises:
        TypeError: arguments of the wrong kind.
        ValueError: ``max_to_keep`` below 1.
        CheckpointError: another job that still runs saves into the directory (named), or
            the directory is a file.
        RuntimeError: ``tfsift.init`` was not called.
    """

    def __init__(
        self,
        model: DistributedModel,
        optimizer: Any = None,
        directory: str | Path = "checkpoints",
        max_to_keep: int | None = 3,
        sift: Any = None,
    ) -> None:
        self.model = weights.check_model(model, "tfsift.CheckpointManager")
        if optimizer is not None and not hasattr(optimizer, "variables"):
            raise TypeError(
                f"optimizer must be a Keras optimizer or None. Received: {type(optimizer).__name__}"
            )
        if max_to_keep is not None:
            if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int | np.integer):
                raise TypeError(
                    f"max_to_keep must be an int >= 1 or None. Received: {max_to_keep!r}"
                )
            if max_to_keep < 1:
                raise ValueError(
                    f"max_to_keep must be an int >= 1 or None. Received: {max_to_keep!r}"
                )
            max_to_keep = int(max_to_keep)
        sifter = getattr(sift, "sifter", None)
        if sift is not None and not hasattr(sifter, "load_state"):
            raise TypeError(
                "sift must be the dataset tfsift.sift returned (before any other "
                f"transformation). Received: {type(sift).__name__}"
            )
        self.optimizer, self.directory = optimizer, Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            # on every rank that sees it: mkdir's 'File exists' at the first save said less
            raise CheckpointError(
                "tfsift.CheckpointManager's directory must be a directory (made if missing) "
                f"that every rank sees. Received: {str(self.directory)!r}, which is a file"
            )
        self.max_to_keep, self.sifter = max_to_keep, sifter
        self._shared = False  # whether every rank was seen to share the directory
        collective.on_root(runtime.get().world, lambda: lock.check(self.directory))

    def close(self) -> None:
        """Gives the directory up to other jobs now rather than when the process ends (for
        a process that goes on after its training); a later save is no longer guarded."""
        if runtime.get().rank == 0:
            lock.release(self.directory / lock.LOCK)

    def save(self, step: int) -> Path:
        """Writes ``ckpt-<step>`` atomically and returns its path (on every rank).

        ``step`` is the step just completed; ``restore`` returns ``step + 1``.

        Raises:
            CheckpointError: a file could not be written on some rank (the message names
                the rank and the file), another job saves into the directory, or (first
                save) some rank does not see the directory rank 0 writes, as on a path
                local to each host; the earlier checkpoints are untouched.
            ValueError: the model has not been partitioned yet (no step has run), or
                ``step`` is not an int >= 0 (``ckpt--1`` would never be found again).
        """
        rt = runtime.get()
        step = _step(step)
        part = weights.partitioned(self.model, None, "CheckpointManager.save")
        # before the try: a refused save must not remove the owner's partial directory
        collective.on_root(rt.world, lambda: lock.acquire(self.directory))
        self._check_shared(rt)
        final = self.directory / f"{PREFIX}{step}"
        partial = self.directory / f".{final.name}.partial"
        try:
            collective.on_root(rt.world, lambda: _fresh(partial))
            entries = collective.together(rt.world, lambda: self._write(partial, rt, part))
            everyone = [entries]
            if rt.world.Get_size() > 1:
                with collective.bounded():
                    everyone = rt.world.gather(entries, root=0)
            collective.on_root(
                rt.world,
                lambda: self._publish(
                    partial, final, _manifest(step, everyone, rt, part, self.optimizer)
                ),
            )
        except Exception as err:
            if rt.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            if not isinstance(err, CheckpointError):
                raise
            raise CheckpointError(
                f"checkpoint {final} was not saved (the earlier ones are untouched): {err}"
            ) from err
        log.info("saved checkpoint %s", final)
        return final

    def restore(self) -> int | None:
        """Loads the newest complete checkpoint; returns the step to run next, or None.

        All ranks take the checkpoint rank 0 found complete (checksums verified; damaged
        ones are skipped with a warning naming the file). A model that has not run a step
        is partitioned first, for the inputs the manifest records. Weights are matched by
        layer path, so the checkpoint may come from another partitioning or replica
        count; the sifting and random states are restored when R and K are unchanged,
        and the sifting state of a dataset sifted by row under any layout.

        Raises:
            ValueError: the checkpoint does not fit this model (a layer path is missing
                or has another shape).
            CheckpointError: a file could not be read, or some rank does not see the
                directory rank 0 reads; every checkpoint there is damaged (none is
                replaced by a fresh start); none is there and the directory cannot be
                written.
            ValueError: the checkpoint holds another optimizer class's state.
        """
        rt = runtime.get()
        found = collective.on_root(rt.world, lambda: _as_text(latest_valid(self.directory)))
        if found is None:
            self._nothing_to_restore(rt)
            log.info("no checkpoint in %s; starting afresh", self.directory)
            return None
        self._check_shared(rt)
        ckpt = collective.together(rt.world, lambda: Checkpoint(Path(found)))
        with ckpt:
            m = ckpt.manifest
            part = collective.together(
                rt.world, lambda: weights.partitioned(self.model, m.inputs, "restore")
            )
            collective.together(rt.world, lambda: self._load(ckpt, rt, part))
        log.info("restored checkpoint %s", found)
        return m.step + 1

    def _nothing_to_restore(self, rt: runtime.Runtime) -> None:
        """Where ``restore`` found no complete checkpoint: refuses to start afresh over
        damaged ones (the saves would replace them, and a restarted job would retrain
        from the start without a word), and checks that the saves can write here before
        any step rather than fail at the first save. Collective."""
        damaged, why = collective.on_root(
            rt.world,
            lambda: (
                [p.name for p in candidates(self.directory)],
                files.unwritable(self.directory),
            ),
        )
        if damaged:
            raise CheckpointError(
                f"every checkpoint in {self.directory} is damaged (the warnings above name "
                "their files), so none was restored; starting afresh would replace them. "
                "Move them away (or delete them) to start afresh, or restore their files. "
                f"Received: {', '.join(damaged)}"
            )
        if why is not None:
            raise CheckpointError(
                "the checkpoint directory must be one this job can write to (its first "
                f"restore checks it rather than fail at the first save): {why}. Received: "
                f"{self.directory}"
            )

    def _check_shared(self, rt: runtime.Runtime) -> None:
        """Once per manager: every rank must see the directory (``tfsift.checkpoint.shared``)."""
        if not self._shared:
            shared.check(rt.world, self.directory)
            self._shared = True

    def latest(self) -> Path | None:
        """The newest checkpoint directory by name (not verified), or None."""
        found = candidates(self.directory)
        return found[0] if found else None

    def _write(self, partial: Path, rt: runtime.Runtime, part: Partitioned) -> list[FileEntry]:
        s, r = rt.stage, rt.replica
        written: dict[str, dict[str, Any]] = {}
        if r == 0:  # one writer per stage: replicas hold equal weights
            # a weight tied across stages once, by its owner
            written[weights_file(s)] = weights.values(
                weights.owned(weights.keyed(self.model, part), part)
            )
            if self.optimizer is not None:
                trainable = weights.owned(weights.trainable(self.model, part), part)
                written[optimizer_file(s)] = optimizer_lib.arrays(self.optimizer, trainable)
        written[state_file(r, s)] = codec.pack(
            {
                "variables": weights.values(weights.local(self.model, part)),
                "sift": None if self.sifter is None else self.sifter.state(),
                "random": random_state.capture(),
            }
        )
        return [_write_file(partial / name, arrays) for name, arrays in written.items()]

    def _publish(self, partial: Path, final: Path, manifest: Manifest) -> None:
        try:
            files.write_text(partial / MANIFEST, manifest.to_json())
            files.publish(partial, final)
        except OSError as err:
            raise CheckpointError(f"publishing {final} failed: {err}") from err
        self._prune()

    def _prune(self) -> None:
        if self.max_to_keep is not None:  # None keeps all (a slice from None would remove all)
            for path in candidates(self.directory)[self.max_to_keep :]:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.directory.glob(f".{PREFIX}*"):  # left by a job killed mid-save
            shutil.rmtree(path, ignore_errors=True)

    def _load(self, ckpt: Checkpoint, rt: runtime.Runtime, part: Partitioned) -> None:
        m, source = ckpt.manifest, str(ckpt.path)
        keyed = weights.keyed(self.model, part)
        weights.assign(keyed, ckpt.values("weights-"), source)
        if self.optimizer is not None:
            _load_optimizer(self.optimizer, weights.trainable(self.model, part), ckpt)
        saved = (m.replicas, m.partitions, (len(m.bounds) - 1) // m.partitions)
        if saved != (rt.topology.replicas, rt.topology.partitions, part.virtual_stages):
            # a rank's variables differ with its chunks too (virtual stages)
            sift = None if self.sifter is None else relayout.sift_state(ckpt, m.replicas, rt)
            if self.sifter is not None and sift is not None:
                self.sifter.load_state(sift)
            if rt.rank == 0:
                _warn_other_layout(source, m, rt, part.virtual_stages, sift is not None)
            return
        state = codec.unpack(ckpt.arrays(state_file(rt.replica, rt.stage)))
        local = weights.local(self.model, part)
        mine = [(key, var) for key, var in local if key in state["variables"]]
        if len(mine) < len(local) and tuple(m.bounds) != tuple(part.bounds):
            # the cut moved (another profile, no plan_file): a layer now on this rank was
            # saved by another stage's rank, whose replica 0 wrote it to the weights files
            moved = [key for key, var in local if key not in state["variables"]]
            log.warning(
                "%s was saved with the stages cut at nodes %s and is restored into stages cut "
                "at %s: the variables %s, now on stage %d, take replica 0's values (BatchNorm "
                "statistics, random-generator states); the rest resumes exactly. Pass the same "
                "plan_file to every run to keep the cut",
                source, list(m.bounds), list(part.bounds), moved, rt.stage,
            )  # fmt: skip
            local = mine
        weights.assign(local, state["variables"], source)
        random_state.restore(state["random"])
        if self.sifter is not None and state["sift"] is not None:
            self.sifter.load_state(state["sift"])


def _warn_other_layout(source: str, m: Manifest, rt: runtime.Runtime, v: int, sifted: bool) -> None:
    saved_v = (len(m.bounds) - 1) // m.partitions
    sifting = (
        "the sifting state of the dataset sifted by row carries over (tfsift.checkpoint."
        "relayout); the random-generator states start afresh"
        if sifted
        else "the sifting and random-generator states start afresh"
    )
    log.warning(
        "%s was saved with %d replica(s) x %d stage(s)%s and is restored into %d x %d%s: "
        "every replica takes replica 0's variables (BatchNorm statistics included) and "
        "optimizer state; %s",
        source,
        m.replicas,
        m.partitions,
        f" x {saved_v} virtual stages" if saved_v > 1 or v > 1 else "",
        rt.topology.replicas,
        rt.topology.partitions,
        f" x {v} virtual stages" if saved_v > 1 or v > 1 else "",
        sifting,
    )


def _load_optimizer(optimizer: Any, trainable: weights.Keyed, ckpt: Checkpoint) -> None:
    """Builds the optimizer for the stage if the checkpoint holds its slots, and loads them;
    ``iteration`` and the learning rate come from the writer of the stage's first variable."""
    where = ckpt.manifest.index("optimizer-")
    if not trainable or not optimizer_lib.wants_slots(trainable, list(where)):
        return
    optimizer_lib.check_class(optimizer, ckpt.manifest.optimizer)
    if not getattr(optimizer, "built", True):
        optimizer.build([var for _, var in trainable])
    first = trainable[0][0]
    owner = next((name for key, name in where.items() if _var_of(key) == first), None)
    others = ckpt.arrays(owner) if owner else {}
    optimizer_lib.load(optimizer, trainable, ckpt.values("optimizer-"), others)


def _var_of(slot_key: str) -> str:
    """``momentum/dense1/kernel`` -> ``dense1/kernel`` (the slot's variable)."""
    return slot_key.split("/", 1)[-1] if "/" in slot_key else ""


def _manifest(
    step: int,
    everyone: list[list[FileEntry]],
    rt: runtime.Runtime,
    part: Partitioned,
    optimizer: Any = None,
) -> Manifest:
    graph, bounds = part.graph, part.bounds
    return Manifest(
        step=step,
        files=tuple(sorted((e for entries in everyone for e in entries), key=lambda e: e.name)),
        partitions=rt.topology.partitions,
        replicas=rt.topology.replicas,
        placement=rt.config.placement_strategy,
        bounds=tuple(int(b) for b in bounds),
        stages=tuple(
            tuple(gn.name for gn in graph.nodes[bounds[s] : bounds[s + 1]])
            for s in range(len(bounds) - 1)
        ),
        inputs=tuple(
            (tuple(int(d) for d in graph.tensors[t].shape), str(graph.tensors[t].dtype))
            for t in graph.inputs
        ),
        config=dataclasses.asdict(rt.config),
        tfsift_version=__version__,
        optimizer=None if optimizer is None else type(optimizer).__name__,
    )


def _step(step: Any) -> int:
    """``step`` as the int a checkpoint's name and manifest hold; raises ValueError unless
    it is one from 0 to ``MAX_STEP`` (a restore could not find or return another)."""
    if (
        isinstance(step, bool)
        or not isinstance(step, (int, np.integer))
        or not (0 <= step <= MAX_STEP)
    ):
        raise ValueError(
            f"CheckpointManager.save takes the step just completed, an int from 0 to "
            f"{MAX_STEP}. Received: step={step!r}"
        )
    return int(step)


def _fresh(partial: Path) -> None:
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    except OSError as err:
        raise CheckpointError(f"cannot create {partial}: {err}") from err


def _write_file(path: Path, arrays: dict[str, Any]) -> FileEntry:
    try:
        return files.write_npz(path, arrays)
    except OSError as err:
        raise CheckpointError(f"writing {path} failed: {err}") from err


def _as_text(path: Path | None) -> str | None:
    return None if path is None else str(path)
