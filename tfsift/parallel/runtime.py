"""Process-wide runtime state: the config, the rank topology and the communicators."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import socket
import sys
import threading
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from mpi4py import MPI

from tfsift import env, logs
from tfsift.config import Config
from tfsift.parallel import devices, openmpi, watchdog
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
    # A duplicate of COMM_WORLD for tfsift's own control messages (shard counts, fit's
    # agreements), so they never match a plan broadcast or a user's message; None on one rank.
    control_comm: Any = None
    # Another, for the exit check's barrier alone: on a communicator shared with other
    # collectives, a rank that exits early met a peer's collective there (fit's first
    # agreement, say) as if it were its barrier, failed, and left the peer waiting.
    exit_comm: Any = None
    exit_grace: float = env.EXIT_GRACE  # seconds; see _exit_check
    # every rank's host name when the job spans hosts (messages name a peer's host), else ()
    hosts: tuple[str, ...] = ()
    local_size: int = 1  # the ranks of this host

    @property
    def stage(self) -> int:
        return self.topology.stage(self.rank)

    @property
    def replica(self) -> int:
        return self.topology.replica(self.rank)

    def close(self) -> None:
        """Frees the pipeline and control communicators (collective over their ranks)."""
        for comm in (self.pipe_comm, self.control_comm, self.exit_comm):
            if comm is not None and comm != MPI.COMM_NULL:
                comm.Free()
        self.pipe_comm = self.control_comm = self.exit_comm = None


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
    rank = world.Get_rank()
    try:
        topology = Topology(world.Get_size(), cfg.partitions, cfg.placement_strategy)
    except ValueError as err:
        _say_once(err, rank)  # every rank meets the same launch error
        raise
    logs.configure(rank)  # first: what init itself logs (Open MPI's yield) shows too
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
    grace = env.exit_grace()
    if topology.size > 1:
        _install_abort_hook(rank)
    runtime = _reuse(old, cfg, topology, grace) if old is not None else None
    if runtime is None:
        if old is not None:
            old.close()
        runtime = _create(cfg, topology, use_hvd, grace)
    if topology.size > 1:
        _install_exit_check()  # after _start_horovod: it must run before Horovod's shutdown
    STATE.runtime = runtime
    log.debug("rank %d: stage %d of replica %d", rank, runtime.stage, runtime.replica)
    return runtime


def _reuse(old: Runtime, cfg: Config, topology: Topology, grace: float) -> Runtime | None:
    """The old runtime's communicators under the new config, if the rank layout is the same."""
    if (
        old.topology != topology
        or old.pipe_comm is None
        or old.horovod != _wants_horovod(cfg, topology)
    ):
        return None
    return dataclasses.replace(old, config=cfg, exit_grace=grace)


def _wants_horovod(cfg: Config, topology: Topology) -> bool:
    return cfg.horovod if cfg.horovod is not None else topology.replicas > 1


def _create(cfg: Config, topology: Topology, use_hvd: bool, grace: float) -> Runtime:
    """New communicators (collective over every rank) and, with ``use_hvd``, Horovod."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    # Every rank's host name and config, in the one exchange the first init makes anyway:
    # ranks given different configs fail here, together, naming the key, instead of at the
    # first step with an error that blames the data.
    gathered = world.allgather((socket.gethostname(), cfg)) if topology.size > 1 else []
    differ = _differences([config for _, config in gathered])
    if differ is not None:
        error = ValueError(differ)
        _say_once(error, rank)  # every rank raises the same
        raise error
    pipe_comm = world.Split(color=topology.replica(rank), key=topology.stage(rank))
    host = world.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks of this host
    local_rank, local_size = host.Get_rank(), host.Get_size()
    host.Free()
    devices.pin(local_rank, local_size)  # before anything below can touch a device
    control = world.Dup() if topology.size > 1 else None
    runtime = Runtime(cfg, topology, rank, local_rank, world, pipe_comm, use_hvd)
    runtime.control_comm, runtime.exit_grace = control, grace
    runtime.exit_comm = world.Dup() if topology.size > 1 else None
    runtime.local_size = local_size
    names = [name for name, _ in gathered]
    runtime.hosts = tuple(names) if len(set(names)) > 1 else ()
    if topology.size > 1:
        _yield_in_waits(rank)  # before Horovod's thread starts waiting
    if use_hvd:
        runtime.dp_set, runtime.mp_set = _start_horovod(topology, rank, cfg.timeout)
    return runtime


# Keys that may differ between ranks: the plan file is rank 0's alone (it plans for every
# rank), and in log_dir each rank writes files of its own (a script may give each rank a
# temporary directory of its own)
OWN_PER_RANK = ("plan_file", "log_dir")


def _differences(configs: list[Config]) -> str | None:
    """The error for ranks given different configs (by rank): the first key that differs and
    its value on each rank, ranks with the same value together; None where they agree
    (``OWN_PER_RANK`` aside)."""
    for field in dataclasses.fields(Config):
        if field.name in OWN_PER_RANK:
            continue
        values = [getattr(config, field.name) for config in configs]
        if any(value != values[0] for value in values):
            break
    else:
        return None
    received = by_rank([f"{field.name}={value!r}" for value in values])
    return (
        "tfsift.init was given different configurations on different ranks; give every rank "
        f"the same config (the same dict, or the same {env.TFSIFT_CONFIG}). Received: {received}"
    )


def by_rank(texts: list[str]) -> str:
    """Each rank's ``texts[rank]``, ranks with the same text together, in the order first
    seen: ``microbatches=2 on ranks 0, 2; microbatches=4 on rank 1``."""
    holders: dict[str, list[int]] = {}
    for rank, text in enumerate(texts):
        holders.setdefault(text, []).append(rank)
    return "; ".join(f"{text} on {_ranks(ranks)}" for text, ranks in holders.items())


def _ranks(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 0, 2, 3``, or for many ``ranks 0, 1, 2, 3, 4, ... (64 ranks)``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    listed = ", ".join(map(str, ranks[:5]))
    return f"ranks {listed}" if len(ranks) <= 5 else f"ranks {listed}, ... ({len(ranks)} ranks)"


def _yield_in_waits(rank: int) -> None:
    """Makes Open MPI yield the core in its waits, as ``import tfsift`` asks it to
    (``env.OMPI_MCA_MPI_YIELD_WHEN_IDLE``), where MPI started before that import and polls;
    says so once (rank 0). A value the launch gave the variable is the user's: left alone."""
    if env.yield_given() is not None:
        return
    now = openmpi.yields()
    if now is False and openmpi.make_yield():
        if rank == 0:
            log.info(
                "MPI was started before `import tfsift`, so Open MPI polled in its "
                "waits; tfsift made it yield, as %s=1 (its default) does",
                env.OMPI_MCA_MPI_YIELD_WHEN_IDLE,
            )
        return
    polls = now is False or (now is None and env.polled_from_start())
    if polls and rank == 0 and "Open MPI" in MPI.Get_library_version():
        _warn_polling()


def _warn_polling() -> None:
    """MPI started before ``import tfsift`` could make Open MPI yield in its waits."""
    log.warning(
        "MPI was started before `import tfsift` (by mpi4py.MPI or hvd.init()) "
        "without %s, so Open MPI polls in its waits: Horovod's background thread then takes "
        "up to a third of each rank's core from the training step (data-parallel steps about "
        "1.5x slower, docs/config.md). Import tfsift before mpi4py and Horovod, or set "
        "%s=1 in the launch's environment (mpirun -x %s=1), or launch with `tfsift run`",
        env.OMPI_MCA_MPI_YIELD_WHEN_IDLE,
        env.OMPI_MCA_MPI_YIELD_WHEN_IDLE,
        env.OMPI_MCA_MPI_YIELD_WHEN_IDLE,
    )


def get() -> Runtime:
    """The runtime set up by ``tfsift.init``; raises if ``init`` was not called."""
    if STATE.runtime is None:
        raise RuntimeError("tfsift.init() must be called before using tfsift")
    return STATE.runtime  # type: ignore[no-any-return]


def _start_horovod(topology: Topology, rank: int, timeout: float) -> tuple[Any, Any]:
    import horovod.tensorflow as hvd

    _limit_horovod_stalls(timeout)
    groups = [topology.dp_group(s) for s in range(topology.partitions)]
    groups += [topology.pipeline(r) for r in range(topology.replicas)]
    everyone = tuple(range(topology.size))
    sets = {g: hvd.ProcessSet(list(g)) for g in groups if g != everyone}
    hvd.init(process_sets=list(sets.values()))
    # Horovod shuts down for every rank as soon as one rank exits, so a data-parallel group
    # still reducing its last gradients would fail. atexit runs handlers last-in first-out:
    # this barrier runs before the shutdown Horovod registered in hvd.init (and after
    # _exit_check, registered later, which has already waited, boundedly, for every rank).
    atexit.register(MPI.COMM_WORLD.Barrier)
    if hvd.size() != topology.size or hvd.rank() != rank:
        raise RuntimeError(
            f"Horovod and MPI disagree on the ranks (horovod rank {hvd.rank()} of {hvd.size()}, "
            f"MPI rank {rank} of {topology.size}); launch with horovodrun or mpirun"
        )
    dp = topology.dp_group(topology.stage(rank))
    mp = topology.pipeline(topology.replica(rank))
    return sets.get(dp, hvd.global_process_set), sets.get(mp, hvd.global_process_set)


def _limit_horovod_stalls(timeout: float) -> None:
    """Makes a collective that some ranks never join fail everywhere after ``2 * timeout`` s.

    tfsift's own guard (``collectives.bounded``) ends the job after ``timeout`` s, naming
    the stage whose replicas did not all join; this is the backstop for collectives outside
    it. Horovod then names the missing ranks, shuts down, and the collective raises on
    every rank that joined it (which the abort hook turns into the end of the job). Without
    a shutdown time Horovod only warns, forever. The user's own settings win.
    """
    if not math.isfinite(timeout):
        return
    seconds = max(1, math.ceil(2 * timeout))  # Horovod reads whole seconds
    env.set_default(env.HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, str(seconds))
    # Horovod ignores a shutdown time shorter than its warning time (default 60 s).
    env.set_default(env.HOROVOD_STALL_CHECK_TIME_SECONDS, str(min(60, seconds)))


def _say_once(error: BaseException, rank: int) -> None:
    """If ``error`` ends the script uncaught, rank 0 prints its message in one line and the
    other ranks, which raised the same, print nothing: one message instead of a traceback
    per rank. Any other uncaught exception goes to the hook there was."""
    before = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if value is not error:
            before(kind, value, tb)
        elif rank == 0:
            sys.stderr.write(f"tfsift.init: {error}\n")
            sys.stderr.flush()

    sys.excepthook = hook


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


def _install_exit_check() -> None:
    """Makes a rank that leaves the script while others still run end the job (once)."""
    atexit.unregister(_exit_check)
    atexit.register(_exit_check)


def _exit_check() -> None:
    """At exit, waits up to ``exit_grace`` seconds for every rank to exit; else ends the job.

    ``sys.exit()`` raises ``SystemExit``, which never reaches ``sys.excepthook``: without
    this check the rank would sit in ``MPI_Finalize`` and its peers in a receive from it,
    forever. Every rank joins a non-blocking barrier as it leaves. Ranks that end normally
    meet there within moments of each other; the peers of a rank that left early are
    blocked waiting for it and never come, so that rank ends the job.
    """
    rt: Runtime | None = STATE.runtime
    if rt is None or rt.exit_comm is None or MPI.Is_finalized():
        return
    if not watchdog.wait([rt.exit_comm.Ibarrier()], rt.exit_grace):
        watchdog.abort(
            f"rank {rt.rank} exited (sys.exit() or the end of the script) while other ranks "
            f"were still running: they had not all exited {rt.exit_grace:g} s later "
            f"({env.TFSIFT_EXIT_GRACE})"
        )
