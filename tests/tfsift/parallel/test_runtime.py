"""tfsift.init in one process: a second call keeps, replaces or refuses the runtime."""

from __future__ import annotations

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


POLLING = "tfsift: MPI was started before `import tfsift` (by mpi4py.MPI or hvd.init())"


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_mpi_started_before_import_tfsift_without_the_yield_is_told_once(launcher: str) -> None:
    # the launch's environment as a user's shell gives it (pytest's process imported tfsift);
    # tfsift imported first, the warning never comes (test_env.py: polled_from_start)
    unset = (env.OMPI_MCA_MPI_YIELD_WHEN_IDLE,)
    proc = mpi.run(2, "yield_check.py", "mpi-first", launcher=launcher, unset=unset)
    got = mpi.reports(proc)
    assert [got[r]["replicas"] for r in (0, 1)] == [2, 2]  # data parallel: Horovod started
    assert [got[r]["polled"] for r in (0, 1)] == [True, True]
    assert (proc.stdout + proc.stderr).count(POLLING) == 1  # rank 0 alone says it
    assert "or launch with `tfsift run`" in proc.stderr
