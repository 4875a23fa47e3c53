"""Pipeline x data parallelism: replicas stay equal to a one-process run; failures end the job."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpi

pytestmark = pytest.mark.slow  # and mpi, on each test that launches mpirun or horovodrun


# On 2 simulated hosts x 2 ranks (ranks 0, 1 on the first): cluster puts each replica on a
# host of its own, so the allreduce crosses them; spread puts each stage on one, so the
# pipeline's sends cross them
ON_SIMHOSTS = [pytest.mark.hosts, pytest.mark.xdist_group("simhosts")]
ON_HOSTS = [pytest.param(0, id="one_host"), pytest.param(2, id="two_hosts", marks=ON_SIMHOSTS)]
PIPELINES = {"cluster": [[0, 1], [2, 3]], "spread": [[0, 2], [1, 3]]}  # ranks, by replica
# on one host, in the jobs the other 2 x 2 tests share
ON_ONE_HOST = {
    placement: job.scenario("hybrid_check.py", "2", placement, "4", timeout=600)
    for placement, job in [("cluster", mpi.CLUSTER_2X2), ("spread", mpi.SPREAD_2X2)]
}


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("placement", "hosts"),
    [
        pytest.param("cluster", 0, id="cluster-one_host", marks=mpi.CLUSTER_2X2.mark),
        pytest.param("spread", 0, id="spread-one_host", marks=mpi.SPREAD_2X2.mark),
        pytest.param("cluster", 2, id="cluster-two_hosts", marks=ON_SIMHOSTS),
        pytest.param("spread", 2, id="spread-two_hosts", marks=ON_SIMHOSTS),
    ],
)
def test_two_stages_by_two_replicas_train_like_one_process(
    placement: str, hosts: int, request: pytest.FixtureRequest
) -> None:
    if hosts:
        request.getfixturevalue("two_hosts")
        got = mpi.reports(
            mpi.run(4, "hybrid_check.py", "2", placement, "4", timeout=600, hosts=hosts)
        )
    else:
        got = ON_ONE_HOST[placement]()
    pipelines = PIPELINES[placement]
    assert sorted(got) == [0, 1, 2, 3]
    check_hosts(got, hosts)
    for replica, ranks in enumerate(pipelines):
        for stage, rank in enumerate(ranks):
            data = got[rank]
            assert (data["stage"], data["replica"]) == (stage, replica)
            assert (data["mp_size"], data["dp_size"]) == (2, 2)
            assert data["mp_set"] == ranks
            assert data["dp_set"] == [p[stage] for p in pipelines]
            assert data["weight_error"] < 1e-5, (rank, data["weight_error"])
        assert sum(got[rank]["num_vars"] for rank in ranks) == 8  # split, none lost
        assert got[ranks[0]]["losses"] == got[ranks[1]]["losses"]
        assert (
            got[ranks[0]]["shard"] == got[ranks[1]]["shard"] == [replica, replica + 2, replica + 4]
        )
        assert got[ranks[0]]["shuffled"] == got[ranks[1]]["shuffled"]
        assert all(v % 2 == replica for v in got[ranks[0]]["shuffled"])
    assert got[pipelines[0][0]]["losses"] != got[pipelines[1][0]]["losses"]  # different shards


# the zero-bubble schedule (a split backward on stage 1) with replicas, in the same job
ZERO_BUBBLE = mpi.CLUSTER_2X2.scenario(
    "hybrid_check.py", "2", "cluster", "4", "zero_bubble", timeout=600
)


@pytest.mark.mpi
@mpi.CLUSTER_2X2.mark
def test_zero_bubble_with_two_replicas_trains_like_one_process() -> None:
    got = ZERO_BUBBLE()
    assert sorted(got) == [0, 1, 2, 3]
    for rank, data in got.items():
        assert data["pipeline"] == "zero_bubble"
        assert data["weight_error"] < 1e-5, (rank, data["weight_error"])
    for ranks in PIPELINES["cluster"]:
        assert sum(got[rank]["num_vars"] for rank in ranks) == 8


# virtual stages (2 chunks a stage of the 6-node model) with replicas, in the same job
VIRTUAL = mpi.CLUSTER_2X2.scenario(
    "hybrid_check.py", "2", "cluster", "4", "interleaved/2", timeout=600
)


@pytest.mark.mpi
@mpi.CLUSTER_2X2.mark
def test_virtual_stages_with_two_replicas_train_like_one_process() -> None:
    got = VIRTUAL()
    assert sorted(got) == [0, 1, 2, 3]
    for rank, data in got.items():
        assert (data["pipeline"], data["virtual"]) == ("interleaved", 2)
        assert data["weight_error"] < 1e-5, (rank, data["weight_error"])
    for ranks in PIPELINES["cluster"]:
        assert sum(got[rank]["num_vars"] for rank in ranks) == 8
        assert got[ranks[0]]["losses"] == got[ranks[1]]["losses"]


def check_hosts(got: dict[int, dict[str, object]], hosts: int) -> None:
    """Ranks 0, 1 ran on the first simulated host and 2, 3 on the second (if ``hosts``)."""
    if hosts:
        assert [got[rank]["host"] for rank in range(4)] == ["tfsift-h1"] * 2 + ["tfsift-h2"] * 2


ON_TWO_REPLICAS = mpi.TWO_REPLICAS.scenario("hybrid_check.py", "1", "cluster", "4")


@pytest.mark.mpi
@mpi.TWO_REPLICAS.mark
def test_pure_data_parallel_two_ranks_train_like_one_process() -> None:
    got = ON_TWO_REPLICAS()
    for rank in (0, 1):
        assert (got[rank]["stage"], got[rank]["replica"], got[rank]["dp_size"]) == (0, rank, 2)
        assert got[rank]["num_vars"] == 8
        assert got[rank]["weight_error"] < 1e-5, got[rank]["weight_error"]


def test_same_script_runs_as_one_plain_process_with_one_partition(tmp_path: Path) -> None:
    script = str(mpi.SCRIPTS / "hybrid_check.py")
    proc = subprocess.run(
        [sys.executable, script, "1", "cluster", "2"],
        env=mpi.environment({mpi.REPORTS: str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert (report["dp_size"], report["mp_size"], report["num_vars"]) == (1, 1, 8)
    assert report["weight_error"] < 1e-5


@pytest.mark.mpi
@pytest.mark.parametrize("hosts", ON_HOSTS)
def test_same_script_runs_under_horovodrun(hosts: int, request: pytest.FixtureRequest) -> None:
    # across hosts horovodrun reaches the second through the stand-in ssh on PATH (that
    # scripts/simhosts.sh exec puts first), as it would through ssh
    if hosts:
        request.getfixturevalue("two_hosts")
    got = mpi.reports(
        mpi.run(
            4, "hybrid_check.py", "2", "cluster", "2", timeout=600, launcher="horovodrun",
            hosts=hosts,
        )
    )  # fmt: skip
    assert sorted(got) == [0, 1, 2, 3]
    check_hosts(got, hosts)
    assert max(d["weight_error"] for d in got.values()) < 1e-5


@pytest.mark.mpi
@pytest.mark.alone
def test_a_group_finishing_late_is_not_shut_down_by_an_early_one() -> None:
    got = mpi.reports(mpi.run(4, "finish_check.py", timeout=180))
    assert {rank: d["total"] for rank, d in got.items()} == {0: [0.5], 1: [0.5], 2: [2.5], 3: [2.5]}


@pytest.mark.mpi
@pytest.mark.fault
def test_a_failing_rank_ends_the_whole_job_quickly_with_its_error_once() -> None:
    start = time.monotonic()
    proc = mpi.run(2, "failure_check.py", timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert elapsed < 60, elapsed
    output = proc.stdout + proc.stderr
    assert output.count("RuntimeError: injected failure on rank 1") == 1
    assert "tfsift: rank 1 failed, aborting the job" in output
