"""Process-wide runtime state: the config, the rank topology and the communicators."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
import threading
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from mpi4py import MPI

from tfsift.config import Config
from tfsift.parallel.topology import Topology
from tfsift.state import STATE

log = logging.getLogger("tfsift")


@dataclasses.dataclass
class Runtime:
    """What ``tfsift.init`` sets up on every rank."""

    config: Config
    topology: Topology
    rank: int
    local_rank: int
    world: Any  # mpi4py COMM_WORLD: plans and errors are broadcast from rank 0 over it
    pipe_comm: Any  # mpi4py communicator of this rank's pipeline; its rank is the stage
    horovod: bool
    dp_set: Any = None  # horovod ProcessSet of this stage's data-parallel group
    mp_set: Any = None  # horovod ProcessSet of this rank's pipeline

    @property
    def stage(self) -> int:
        return self.topology.stage(self.rank)

    @property
    def replica(self) -> int:
        return self.topology.replica(self.rank)

    def close(self) -> None:
        """Frees the pipeline communicator (collective over the pipeline's ranks)."""
        if self.pipe_comm is not None and self.pipe_comm != MPI.COMM_NULL:
            self.pipe_comm.Free()
        self.pipe_comm = None


def init(config: Mapping[str, Any] | Config | None = None) -> Runtime:
    """Validates ``config``, lays out the ranks and starts Horovod; see ``tfsift.init``.

    A second call with an equal config keeps the runtime; one with another config
    replaces it (step functions planned before then refuse to run), except that the
    rank layout cannot change once Horovod has started.
    """
    cfg = (
        config
        if isinstance(config, Config)
        else (Config.from_env() if config is None else Config.from_dict(config))
    )
    old: Runtime | None = STATE.runtime
    if old is not None and old.config == cfg:
        return old
    world = MPI.COMM_WORLD
    topology = Topology(world.Get_size(), cfg.partitions, cfg.placement_strategy)
    rank = world.Get_rank()
    use_hvd = cfg.horovod if cfg.horovod is not None else topology.replicas > 1
    if not use_hvd and topology.replicas > 1:
        raise ValueError(
            f"horovod=False needs world size == partitions (no data parallelism). "
            f"Received: world size {topology.size}, partitions={cfg.partitions}"
        )
    if old is not None and old.horovod and (old.topology, True) != (topology, use_hvd):
        raise ValueError(
            "tfsift.init was already called and started Horovod, whose process sets cannot "
            f"change in a running job (partitions={old.config.partitions}, "
            f"placement_strategy={old.config.placement_strategy!r}, horovod=True). Received: "
            f"partitions={cfg.partitions}, placement_strategy={cfg.placement_strategy!r}, "
            f"horovod={use_hvd}"
        )
    if topology.size > 1:
        _install_abort_hook(rank)
    runtime = _reuse(old, cfg, topology) if old is not None else None
    if runtime is None:
        if old is not None:
            old.close()
        pipe_comm = world.Split(color=topology.replica(rank), key=topology.stage(rank))
        local_rank = world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        runtime = Runtime(cfg, topology, rank, local_rank, world, pipe_comm, use_hvd)
        if use_hvd:
            runtime.dp_set, runtime.mp_set = _start_horovod(topology, rank)
    STATE.runtime = runtime
    log.debug("rank %d: stage %d of replica %d", rank, runtime.stage, runtime.replica)
    return runtime


def _reuse(old: Runtime, cfg: Config, topology: Topology) -> Runtime | None:
    """The old runtime's communicators under the new config, if the rank layout is the same."""
    if old.topology != topology or old.pipe_comm is None:
        return None
    return dataclasses.replace(old, config=cfg)


def get() -> Runtime:
    """The runtime set up by ``tfsift.init``; raises if ``init`` was not called."""
    if STATE.runtime is None:
        raise RuntimeError("tfsift.init() must be called before using tfsift")
    return STATE.runtime  # type: ignore[no-any-return]


def _start_horovod(topology: Topology, rank: int) -> tuple[Any, Any]:
    import horovod.tensorflow as hvd

    groups = [topology.dp_group(s) for s in range(topology.partitions)]
    groups += [topology.pipeline(r) for r in range(topology.replicas)]
    everyone = tuple(range(topology.size))
    sets = {g: hvd.ProcessSet(list(g)) for g in groups if g != everyone}
    hvd.init(process_sets=list(sets.values()))
    # Horovod shuts down for every rank as soon as one rank exits, so a data-parallel group
    # still reducing its last gradients would fail. atexit runs handlers last-in first-out:
    # this barrier runs before the shutdown Horovod registered in hvd.init.
    atexit.register(MPI.COMM_WORLD.Barrier)
    if hvd.size() != topology.size or hvd.rank() != rank:
        raise RuntimeError(
            f"Horovod and MPI disagree on the ranks (horovod rank {hvd.rank()} of {hvd.size()}, "
            f"MPI rank {rank} of {topology.size}); launch with horovodrun or mpirun"
        )
    dp = topology.dp_group(topology.stage(rank))
    mp = topology.pipeline(topology.replica(rank))
    return sets.get(dp, hvd.global_process_set), sets.get(mp, hvd.global_process_set)


def _install_abort_hook(rank: int) -> None:
    """Makes an uncaught exception on any rank end the whole job instead of hanging the others."""

    def abort(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"tfsift: rank {rank} failed, aborting the job:\n{text}")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    def thread_abort(args: threading.ExceptHookArgs) -> None:
        abort(args.exc_type, args.exc_value or Exception(), args.exc_traceback)

    sys.excepthook = abort
    threading.excepthook = thread_abort
