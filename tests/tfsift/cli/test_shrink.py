"""``tfsift run --min-np``: a restarted job relaunched on the hosts still reachable; on
simulated hosts, a 2 x 2 job that loses host 2 finishes as 2 x 1 on host 1, training the
samples an uninterrupted run trains at each step, to its weights within float rounding."""

from __future__ import annotations

import doctest
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import mpi
from tfsift.cli import shrink
from tfsift.cli.restarts import EXITED, NO_ERROR
from tfsift.cli.shrink import Layout, relaunch

TIMED_OUT = "ssh: connect to host b port 22: Connection timed out"


def probe_with(lost: dict[str, str]) -> shrink.Probe:
    def probe(names: Sequence[str]) -> dict[str, str | None]:
        return {name: lost.get(name) for name in names}

    return probe


def test_the_job_shrinks_to_the_slots_left_in_multiples_of_min_np() -> None:
    given = Layout(6, ("--host", "a:2,b:2,c:2", "--mca", "btl", "tcp,self"))
    layout, said = relaunch(given, 2, probe_with({"b": TIMED_OUT}))
    assert layout == Layout(4, ("--mca", "btl", "tcp,self", "--host", "a:2,c:2"))
    assert said == f"on a:2,c:2 with -np 4 instead of 6 (b unreachable: {TIMED_OUT})"
    # 3 slots left, whole multiples of --min-np 2: 2 ranks
    layout, _ = relaunch(Layout(4, ("--host", "a:3,b:1")), 2, probe_with({"b": TIMED_OUT}))
    assert layout == Layout(
        2,
        (
            "--host",
            "a:3",
        ),
    )
    assert relaunch(given, 2, probe_with({})) == (given, "")  # every host answers


def test_too_few_slots_left_stop_the_restarts() -> None:
    with pytest.raises(RuntimeError) as err:
        relaunch(Layout(4, ("--host", "a:2,b:2")), 4, probe_with({"b": TIMED_OUT}))
    assert str(err.value) == (
        f"the hosts that answer ssh give 2 slot(s), fewer than --min-np 4 (b unreachable: "
        f"{TIMED_OUT})"
    )


def test_hostfiles_count_as_host_lists_and_are_replaced_by_one(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    given = Layout(4, ("--hostfile", str(hostfile), "-x", "A=1"))
    assert shrink.given_hosts(given.mpirun_flags) == [shrink.Host("a", 2), shrink.Host("b", 2)]
    layout, _ = relaunch(given, 2, probe_with({"a": TIMED_OUT}))
    assert layout == Layout(2, ("-x", "A=1", "--host", "b:2"))
    assert shrink.without_hosts(["-H=a:1", "--machinefile=f", "-np", "2"]) == ("-np", "2")


def test_docstring_examples_run() -> None:
    assert doctest.testmod(shrink).failed == 0


STEPS, EVERY, CUT_AT = 40, 4, 20  # epoch 1: steps 0-15; epoch 2 (pruned): 16 to about 27


def trained(directory: Path) -> dict[int, dict[int, set[int]]]:
    """The rows each step of each attempt trained, over all replicas (the stage-0 ranks'
    logs), by attempt and step."""
    found: dict[int, dict[int, set[int]]] = {}
    for log in directory.glob("rows-r*"):
        for line in log.read_text().splitlines():
            attempt, step, *rows = map(int, line.split())
            found.setdefault(attempt, {}).setdefault(step, set()).update(rows)
    return found


def trajectory(found: dict[int, dict[int, set[int]]], first: int) -> dict[int, set[int]]:
    """The rows of each step the final weights come from: the last attempt's from ``first``,
    where it resumed, and before that, each step's rows from the latest attempt that trained
    it (an attempt resumes from the checkpoint its predecessor saved last)."""
    last = max(found)
    steps = {s: rows for s, rows in found[last].items() if s >= first}
    for attempt in sorted(found)[:-1]:
        steps.update({s: rows for s, rows in found[attempt].items() if s < first})
    return steps


def final(directory: Path) -> dict[str, np.ndarray]:
    """The final checkpoint's weights and optimizer variables, by file and key."""
    out = {}
    for name in ("weights-s0", "weights-s1", "optimizer-s0", "optimizer-s1"):
        with np.load(directory / f"ckpt-{STEPS - 1}" / f"{name}.npz") as npz:
            out.update({f"{name}/{k}": npz[k] for k in npz.files})
    return out


def link(host: int, state: str) -> None:
    subprocess.run(["ip", "-n", f"tfsift-h{host}", "link", "set", "tfsift0", state], check=True)


def wait_for_step(progress: Path, job: subprocess.Popen[str], ranks: int, step: int) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and job.poll() is None:
        done = [(progress / f"rank{r}").read_text().split() for r in range(ranks)
                if (progress / f"rank{r}").exists()]  # fmt: skip
        if len(done) == ranks and min(int(s) for _, s in done) >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"the job did not reach step {step}")


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.hosts
@pytest.mark.xdist_group("simhosts")
@pytest.mark.timeout(600)
def test_a_2x2_job_that_loses_host_2_finishes_on_host_1_as_2x1(
    two_hosts: int, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"  # the reference: 2 stages x 2 replicas, uninterrupted
    mpi.reports(mpi.run(4, "elastic_train.py", str(whole), str(STEPS), str(EVERY), timeout=300))

    cut, progress, reports = tmp_path / "cut", tmp_path / "progress", tmp_path / "reports"
    progress.mkdir()
    reports.mkdir()
    script = [str(mpi.SCRIPTS / "elastic_train.py"), str(cut), str(STEPS), str(EVERY)]
    script += ["--progress", str(progress), "--pace", "0.1"]
    env = mpi.environment({"TFSIFT_EXIT_GRACE": "3", mpi.REPORTS: str(reports)})
    job = subprocess.Popen(
        ["bash", str(mpi.SIMHOSTS), "exec", sys.executable, "-m", "tfsift.cli", "run",
         "--restarts", "3", "--min-np", "2", "-np", "4", "-H", mpi.places(4, two_hosts),
         *script],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=mpi.ROOT,
    )  # fmt: skip
    try:
        wait_for_step(progress, job, 4, CUT_AT)
        link(2, "down")  # and it stays down: the job must finish without host 2
        out, err = job.communicate(timeout=300)
    finally:
        link(2, "up")
        if job.poll() is None:
            job.kill()
            out, err = job.communicate()
    assert job.returncode == 0, (out + err)[-4000:]
    # mpirun waited for host 2's daemon, and tfsift run ended it
    assert "tfsift run: mpirun had not ended 3 s after a rank aborted the job" in err
    said = [line for line in err.splitlines() if line.startswith("tfsift run: attempt")]
    *before, shrunk, succeeded = said
    n = len(said)  # 2; more where an attempt on the busy cores failed a 3-s timeout of its
    # own (restarted, on both hosts before the cut and on host 1 after it)
    assert all(
        re.fullmatch(rf"tfsift run: attempt {i} of 4 failed \(.*\); starting attempt {i + 1} of 4"
                     r"( on 10\.251\.0\.1:2 .*)?", line)
        for i, line in enumerate(before, 1)
    ), said  # fmt: skip
    assert re.fullmatch(
        rf"tfsift run: attempt {n - 1} of 4 failed \((exit code \d+|killed by signal 9), "
        rf"{re.escape(NO_ERROR)}\); starting attempt {n} of 4 on 10\.251\.0\.1:2 with -np 2 "
        r"instead of 4 \(10\.251\.0\.2 unreachable: ssh: connect to host 10\.251\.0\.2 port "
        r"22: (Connection timed out|No route to host)\)",
        shrunk,
    ), said
    assert succeeded == f"tfsift run: attempt {n} of 4 succeeded"
    # the first attempt on host 1 alone resumed from the last checkpoint before the cut,
    # in epoch 2, which prunes
    first_shrunk = err.split(" on 10.251.0.1:2 with -np 2", 1)[1]
    restored = re.search(r"restored checkpoint .*/ckpt-(\d+)", first_shrunk)
    assert restored and int(restored.group(1)) in (CUT_AT - 1, CUT_AT + EVERY - 1), said
    got = {r["rank"]: r for r in map(json.loads, (f.read_text() for f in reports.glob("*.json")))}
    assert sorted(got) == [0, 1] and {r["replicas"] for r in got.values()} == {1}
    first = got[0]["first"]  # where the last attempt resumed
    # each step trained the samples the uninterrupted run trained then: none twice, none
    # left out, in the epoch the cut fell in and after
    want, have = trained(whole)[0], trajectory(trained(cut), first)
    assert sorted(want) == sorted(have) == list(range(STEPS))
    assert [s for s in range(STEPS) if have[s] != want[s]] == []
    # float32 rounding only: the step's gradient sums run in another order on one replica
    # (the mean of 2 microbatches of 8 samples, against Horovod's mean of two replicas' means
    # of 2 microbatches of 4), so the weights differ in their last bits: 6e-8 at most after
    # 20 steps on 2 x 2 and 20 on 2 x 1 (weights below 1 in magnitude; 7.5e-8 after 18 and
    # 22), and 1e-6 leaves 10x for the Adam steps to carry such differences further
    want_final, have_final = final(whole), final(cut)
    assert sorted(want_final) == sorted(have_final)
    worst = max(float(np.max(np.abs(have_final[k] - v), initial=0)) for k, v in want_final.items())
    print(f"resumed at step {first} on 2 x 1; the final weights differ by {worst:.2g} at most")
    for key, value in want_final.items():
        np.testing.assert_allclose(have_final[key], value, rtol=0, atol=1e-6, err_msg=key)


def test_tfsift_run_shrinks_at_one_restart_and_grows_back_at_the_next(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from tfsift.cli import main, run

    launched: list[tuple[int, tuple[str, ...]]] = []
    probes = iter([{"b": TIMED_OUT}, {}])  # b lost at the first restart, back at the second

    def command(parsed: run.RunArgs) -> list[str]:
        launched.append((parsed.np, parsed.mpirun_flags))
        code = 0 if len(launched) == 3 else 3
        return [sys.executable, "-c", f"raise SystemExit({code})"]

    monkeypatch.setattr(run, "command", command)
    monkeypatch.setattr(shrink.hosts, "reachability", lambda names: probe_with(next(probes))(names))
    argv = ["run", "--restarts", "2", "--min-np", "1", "-np", "2", "-H", "a:1,b:1", "t.py"]
    assert main(argv) == 0
    assert launched == [(2, ("--host", "a:1,b:1")), (1, ("--host", "a:1")),
                        (2, ("--host", "a:1,b:1"))]  # fmt: skip
    assert capfd.readouterr().err.splitlines() == [
        f"tfsift run: attempt 1 of 3 failed (exit code 3, {EXITED}); starting attempt 2 of 3 "
        f"on a:1 with -np 1 instead of 2 (b unreachable: {TIMED_OUT})",
        f"tfsift run: attempt 2 of 3 failed (exit code 3, {EXITED}); starting attempt 3 of 3 "
        "on every host given again, with -np 2",
        "tfsift run: attempt 3 of 3 succeeded",
    ]
