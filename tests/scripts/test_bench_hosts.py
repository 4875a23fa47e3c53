"""scripts/bench_hosts.py's pure parts: the link's tc lines, what is predicted to cross the
link, the bytes read from the hosts' counters, and the tables."""

from __future__ import annotations

from types import ModuleType

import pytest
import scripts_module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_hosts")


def test_a_rate_is_a_tbf_a_delay_a_netem_and_both_a_tbf_below_a_netem(bench: ModuleType) -> None:
    Link = bench.Link
    head = "ip netns exec h2 tc qdisc replace dev tfsift0"
    lines = lambda link: [" ".join(cmd) for cmd in bench.tc_commands(link, "h2")]  # noqa: E731
    assert lines(Link("bare")) == []
    assert lines(Link("gig", rate_mbit=1000)) == [
        f"{head} root tbf rate 1000mbit burst 1250000 latency 100ms"  # 10 ms of the rate
    ]
    assert lines(Link("slow", rate_mbit=1)) == [
        f"{head} root tbf rate 1mbit burst 32768 latency 100ms"  # at least 32 KiB
    ]
    assert lines(Link("far", delay_ms=2.5)) == [f"{head} root handle 1: netem delay 2.5ms"]
    assert lines(Link("both", rate_mbit=100, delay_ms=1)) == [
        f"{head} root handle 1: netem delay 1ms",
        f"{head} parent 1:1 handle 10: tbf rate 100mbit burst 125000 latency 100ms",
    ]


def test_the_stages_messages_and_the_allreduce_are_predicted_from_the_model(
    bench: ModuleType,
) -> None:
    s = bench.Settings(layers=4, width=1024, batch=64, M=4)
    slow = bench.Link("100 Mbit/s", rate_mbit=100, delay_ms=1)
    # spread: 2 pipelines x 4 microbatches each way, 16 samples x 1024 float32 each
    total, seconds = bench.predicted(s, bench.SPREAD, slow)
    assert total == 2 * 2 * 4 * 16 * 1024 * 4
    assert seconds == pytest.approx(2 * 4 * (1e-3 + 16 * 1024 * 4 / 12.5e6))  # cut_time each
    # cluster: every gradient once each way (4 layers of 1024 x 1024 + 1024 float32)
    params = 4 * 4 * (1024 * 1024 + 1024)
    total, seconds = bench.predicted(s, bench.CLUSTER, slow)
    assert total == 2 * params
    assert seconds == pytest.approx(params / 12.5e6 + 1e-3)
    assert bench.predicted(s, bench.ONE_HOST, slow) == (0.0, None)
    assert bench.predicted(s, bench.CLUSTER, bench.Link("bare"))[1] is None


def report(rank: int, host: str, tx: int, steps: int = 4) -> dict[str, object]:
    return {
        "rank": rank,
        "host": host,
        "times": [0.1] * steps,
        "bytes": {"tx_bytes": tx, "rx_bytes": 0},
    }


def test_each_hosts_counter_is_read_once_per_step(bench: ModuleType) -> None:
    reports = [report(1, "tfsift-h1", 999), report(0, "tfsift-h1", 400),
               report(2, "tfsift-h2", 800), report(3, "tfsift-h2", 5)]  # fmt: skip
    assert bench.crossing_bytes(reports) == (400 + 800) / 4  # the lowest rank of each host


NAMES = ("one host", "2 hosts, cluster", "2 hosts, spread")


def jobs(one: float, cluster: float, spread: float) -> dict[str, list[dict[str, float]]]:
    """Three rounds; cluster's second job twice as long (the median ignores it)."""
    return {
        NAMES[0]: [{"step_s": one, "bytes": 0.0}] * 3,
        NAMES[1]: [{"step_s": cluster, "bytes": 33.6e6}, {"step_s": 2 * cluster, "bytes": 34e6},
                   {"step_s": cluster, "bytes": 33.6e6}],
        NAMES[2]: [{"step_s": spread, "bytes": 1.1e6}] * 3,
    }  # fmt: skip


def test_the_rows_and_the_answer_come_from_the_jobs_medians(bench: ModuleType) -> None:
    s = bench.Settings()
    slow = bench.Link("100 Mbit/s", rate_mbit=100)
    rows = bench.rows(s, slow, jobs(0.2, 3.0, 0.4))
    assert [r[:5] for r in rows] == [
        ["one host", "200.0", "1.00x", "nothing", "0.00"],
        ["2 hosts, cluster", "3000.0", "15.00x", "the allreduce", "33.60"],
        ["2 hosts, spread", "400.0", "2.00x", "the stages' messages", "1.10"],
    ]
    assert rows[1][5] == f"{2 * 4 * (1024 * 1024 + 1024) * 4 / 1e6:.2f}"  # 2 x the gradients
    assert bench.answer(slow, jobs(0.2, 3.0, 0.4)) == ["100 Mbit/s", "`spread`", "7.50"]
    meta = {"date": "2026-12-06", "cores": 2, "commit": "abc", "load_start": 0.1,
            "load_end": 0.2, "seconds": 60}  # fmt: skip
    text = bench.render({"links": {"100 Mbit/s": jobs(0.2, 3.0, 0.4)}}, meta, s)
    assert text.startswith("Measured 2026-12-06 on 2 cores")
    assert "| 100 Mbit/s | `spread` | 7.50 |" in text
    assert "Rerun: `sudo .venv/bin/python scripts/bench_hosts.py`" in text
    assert "| 100 Mbit/s | 2 hosts, spread | 400.0 | 2.00x |" in text


def test_a_delay_the_kernel_cannot_shape_is_said_not_measured(bench: ModuleType) -> None:
    meta = {"date": "2026-12-06", "cores": 2, "commit": "abc", "load_start": 0.1,
            "load_end": 0.2, "seconds": 60}  # fmt: skip
    raw = {"links": {"100 Mbit/s": jobs(0.2, 3.0, 0.4)}, "unshaped": ["100 Mbit/s, 5 ms each way"]}
    text = bench.render(raw, meta, bench.Settings())
    row = "| 100 Mbit/s, 5 ms each way | not measured: this kernel has no netem (a delay) |  |"
    assert row in text
    assert bench.Settings().links[-1].delay_ms == 5


def test_a_delay_by_the_delay_line_is_said_in_both_tables(bench: ModuleType) -> None:
    meta = {"date": "2026-12-06", "cores": 2, "commit": "abc", "load_start": 0.1,
            "load_end": 0.2, "seconds": 60}  # fmt: skip
    far = "100 Mbit/s, 5 ms each way"
    raw = {"links": {"100 Mbit/s": jobs(0.2, 3.0, 0.4), far: jobs(0.2, 3.1, 0.5)},
           "delay_line": [far]}  # fmt: skip
    text = bench.render(raw, meta, bench.Settings())
    assert f"| {far} (delay line) | `spread` | 6.20 |" in text
    assert f"| {far} (delay line) | 2 hosts, spread | 500.0 | 2.50x |" in text
    assert "| 100 Mbit/s | `spread` | 7.50 |" in text  # undelayed: no label
