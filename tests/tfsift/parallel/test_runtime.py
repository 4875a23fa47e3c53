"""tfsift.init in one process: a second call keeps, replaces or refuses the runtime."""

from __future__ import annotations

import ctypes

import pytest

import mpi
import tfsift
from tfsift import env, state
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
