"""tfsift.init in one process: a second call keeps, replaces or refuses the runtime."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import mpi
import tfsift
from tfsift import env, state
from tfsift.config import Config
from tfsift.parallel import runtime


def test_init_with_an_equal_config_keeps_the_runtime() -> None:
    tfsift.init({"microbatches": 2})
    first = runtime.get()
    tfsift.init({"microbatches": 2})
    assert runtime.get() is first


def test_init_with_another_config_replaces_the_runtime_and_keeps_the_layout() -> None:
    tfsift.init({"microbatches": 2})
    first = runtime.get()
    tfsift.init({"microbatches": 4})
    second = runtime.get()
    assert second is not first
    assert (second.config.microbatches, first.config.microbatches) == (4, 2)
    assert second.pipe_comm is first.pipe_comm  # same rank layout: the communicator is reused


def test_reset_frees_the_pipeline_communicator() -> None:
    tfsift.init({})
    rt = runtime.get()
    state.reset()
    assert rt.pipe_comm is None and state.STATE.runtime is None
    with pytest.raises(RuntimeError) as err:
        runtime.get()
    assert str(err.value) == "tfsift.init() must be called before using tfsift"


def test_partition_blocks_nest_and_unwind_in_the_process_state() -> None:
    with tfsift.partition(1):
        with tfsift.partition(2):
            assert state.STATE.partitions == [1, 2]
        assert state.STATE.partitions == [1]
    assert state.STATE.partitions == []


def test_init_rejects_a_bad_exit_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFSIFT_EXIT_GRACE", "soon")
    with pytest.raises(ValueError) as err:
        tfsift.init({})
    assert str(err.value) == "TFSIFT_EXIT_GRACE must be a number of seconds > 0. Received: 'soon'"
    monkeypatch.setenv("TFSIFT_EXIT_GRACE", "2.5")
    tfsift.init({})
    assert runtime.get().exit_grace == 2.5


def test_init_asking_for_horovod_after_a_runtime_without_it_does_not_reuse_it() -> None:
    from tfsift.parallel import runtime as rt_module

    tfsift.init({})
    first = rt_module.get()
    assert not first.horovod
    assert (
        rt_module._reuse(first, first.config.__class__(horovod=True), first.topology, 10.0) is None
    )


# TensorFlow's own line before the note on its oneDNN kernels, on CPUs where it runs them
ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
MADE_TO_YIELD = (
    "MPI was started before `import tfsift`, so Open MPI polled in its waits; tfsift "
    "made it yield, as OMPI_MCA_mpi_yield_when_idle=1 (its default) does"
)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_mpi_started_before_import_tfsift_is_made_to_yield_and_told_once(launcher: str) -> None:
    # the launch's environment as a user's shell gives it (pytest's process imported tfsift)
    unset = (env.OMPI_MCA_MPI_YIELD_WHEN_IDLE,)
    proc = mpi.run(2, "yield_check.py", "mpi-first", launcher=launcher, unset=unset)
    got = mpi.reports(proc)
    assert [got[r]["replicas"] for r in (0, 1)] == [2, 2]  # data parallel: Horovod started
    assert [got[r]["polled"] for r in (0, 1)] == [True, True]
    # polling when tfsift was imported, yielding once tfsift.init has run, on every rank
    assert [got[r]["yields"] for r in (0, 1)] == [[False, True], [False, True]]
    assert (proc.stdout + proc.stderr).count(MADE_TO_YIELD) == 1  # rank 0 alone says it
    warned = [line for line in proc.stderr.splitlines() if "WARNING" in line and ABSL not in line]
    assert warned == []


def test_open_mpi_yields_here_and_is_made_to_yield_when_it_polls() -> None:
    from tfsift.parallel import openmpi

    tfsift.init({})  # MPI started after import tfsift (conftest): Open MPI yields
    assert openmpi.yields() is True
    library = openmpi._library()
    assert library is not None
    flag = ctypes.c_bool.in_dll(library, openmpi.FLAG)
    flag.value = False  # as in a process that started MPI before import tfsift
    try:
        assert openmpi.yields() is False
        assert openmpi.make_yield() is True
        assert flag.value is True
    finally:
        flag.value = True


def test_init_takes_numpy_numbers_as_python_numbers() -> None:
    tfsift.init({"partitions": np.int64(1), "microbatches": np.int32(2), "timeout": np.float32(5)})
    cfg = runtime.get().config
    assert (type(cfg.partitions), type(cfg.microbatches), type(cfg.timeout)) == (int, int, float)
    assert (cfg.partitions, cfg.microbatches, cfg.timeout) == (1, 2, 5.0)


@pytest.mark.parametrize("config", ['{"partitions": 1}', [], 7])
def test_init_refuses_a_config_that_is_not_a_mapping(config: object) -> None:
    with pytest.raises(TypeError) as err:
        runtime.init(config)  # type: ignore[arg-type]
    message = str(err.value)
    assert "JSON text goes in TFSIFT_CONFIG, or pass json.loads(text)" in message
    assert message.endswith(f"Received: config={config!r} ({type(config).__name__})")
    assert state.STATE.runtime is None


def test_ranks_given_the_same_config_agree() -> None:
    assert runtime._differences([Config(microbatches=2)] * 3) is None
    assert runtime._differences([]) is None  # one process: nothing gathered
    # equal values: a NumPy scalar was stored as the Python number it stands for
    assert runtime._differences([Config(timeout=np.float32(2)), Config(timeout=2)]) is None


def test_ranks_given_different_configs_name_the_first_key_and_each_ranks_value() -> None:
    two, four = Config(microbatches=2), Config(microbatches=4, optimize="memory")
    assert runtime._differences([two, four, two, two]) == (
        "tfsift.init was given different configurations on different ranks; give every rank "
        "the same config (the same dict, or the same TFSIFT_CONFIG). Received: "
        "microbatches=2 on ranks 0, 2, 3; microbatches=4 on rank 1"
    )
    timeouts = [Config(timeout=9.0 if r == 7 else 5.0) for r in range(8)]
    assert runtime._differences(timeouts).endswith(  # type: ignore[union-attr]
        "Received: timeout=5.0 on ranks 0, 1, 2, 3, 4, ... (7 ranks); timeout=9.0 on rank 7"
    )
    # rank 0's plan file, and a log directory of each rank's own (a benchmark's temporary
    # directories were refused): they may differ
    own = [Config(plan_file=f"/tmp/{r}/plan.json", log_dir=f"runs/{r}") for r in range(2)]
    assert runtime._differences(own) is None


@pytest.mark.mpi
def test_ranks_given_different_configs_fail_together_at_init_and_can_init_again() -> None:
    got = mpi.reports(mpi.run(2, "config_check.py", timeout=120))
    prefix = (
        "tfsift.init was given different configurations on different ranks; give every rank "
        "the same config (the same dict, or the same TFSIFT_CONFIG). Received: "
    )
    errors = [
        prefix + "microbatches=2 on rank 0; microbatches=4 on rank 1",
        prefix + "partitions=2 on rank 0; partitions=1 on rank 1",  # layouts differ too
    ]
    assert [got[r]["errors"] for r in (0, 1)] == [errors, errors]
    assert [got[r]["stage"] for r in (0, 1)] == [0, 1]  # then the same config starts
