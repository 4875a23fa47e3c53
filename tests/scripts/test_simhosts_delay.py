"""scripts/simhosts.sh delay: a simulated host's link delayed by the userspace delay line
(scripts/simhosts-bin/delayline.py), with a rate on top, and restored."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import mpi
from tfsift.parallel.launch import mpirun_command

# the tests that bound a round trip or a transfer from above are marked alone: they assume
# that no other job competes for the cores (scripts/test.sh)
pytestmark = [pytest.mark.hosts, pytest.mark.xdist_group("simhosts")]

# host 2 answers: 10 one-byte round trips (no sizes), or for each size, once that many
# bytes came
SERVER = """
import socket, sys
server = socket.create_server(("0.0.0.0", 5201))
print("listening", flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for want in [int(n) for n in sys.argv[1:]] or [1] * 10:
    got = 0
    while got < want:
        got += len(conn.recv(min(want - got, 1 << 20)))
    conn.sendall(b"k")
"""
# host 1 asks, and prints the seconds until each answer
CLIENT = """
import json, socket, sys, time
conn = socket.create_connection(("10.251.0.2", 5201))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for size in [int(n) for n in sys.argv[1:]] or [1] * 10:
    start = time.monotonic()
    conn.sendall(bytes(size))
    conn.recv(1)
    times.append(time.monotonic() - start)
print(json.dumps(times))
"""


def simhosts(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(mpi.SIMHOSTS), *args], capture_output=True, text=True)


def on(host: int, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", f"tfsift-h{host}", *cmd]


def exchange(*sizes: int) -> list[float]:
    """Seconds from host 1 to host 2 and back on one TCP connection, made before: 10
    one-byte round trips (no ``sizes``), or each size's bytes one after the other, until
    host 2 says it has them."""
    server = subprocess.Popen(
        on(2, sys.executable, "-c", SERVER, *map(str, sizes)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == "listening\n"
        client = subprocess.run(
            on(1, sys.executable, "-c", CLIENT, *map(str, sizes)),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert client.returncode == 0, client.stderr
        times: list[float] = json.loads(client.stdout)
        return times
    finally:
        server.kill()
        server.wait()


def link(host: int) -> tuple[str, str]:
    """Host ``host``'s tfsift0: its kind (veth or tun) and its MTU."""
    out = subprocess.run(
        ["ip", "-n", f"tfsift-h{host}", "-d", "-j", "link", "show", "tfsift0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    [info] = json.loads(out.stdout)
    return info["linkinfo"]["info_kind"], str(info["mtu"])


def ms(times: list[float]) -> list[float]:
    return [round(1e3 * t, 1) for t in times]


def median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]  # a round trip or two the shared cores delayed


@pytest.fixture
def delayed(two_hosts: int) -> Iterator[None]:
    """Host 1's link delayed 20 ms each way; its veth back after the test."""
    got = simhosts("delay", "1", "20")
    assert got.returncode == 0, got.stderr
    yield
    assert simhosts("delay", "1", "off").returncode == 0


@pytest.mark.alone
def test_20_ms_each_way_makes_a_round_trip_40_to_60_ms_and_off_restores_the_veth(
    two_hosts: int,
) -> None:
    bare = ms(exchange())
    assert median(bare) < 5, bare
    assert link(1) == link(2) == ("veth", "1500")
    got = simhosts("delay", "1", "20")
    assert got.returncode == 0, got.stderr
    try:
        assert link(1) == ("tun", "65521")  # the delay line's TAP, few frames per MB
        assert link(2) == ("veth", "65521")  # the other hosts' too, or TCP's MSS keeps 1500
        delayed = ms(exchange())
        print(f"round trips, ms: bare {bare}, 20 ms each way {delayed}")
        assert min(delayed) >= 40 and median(delayed) < 60, delayed
        again = simhosts("delay", "1", "20")  # a second delay replaces the first
        assert again.returncode == 0, again.stderr
        assert min(exchange()) >= 0.040
    finally:
        off = simhosts("delay", "1", "off")
    assert off.returncode == 0, off.stderr
    assert link(1) == link(2) == ("veth", "1500")
    addr = subprocess.run(on(1, "ip", "-o", "-4", "addr", "show", "tfsift0"),
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert "10.251.0.1/24" in addr.stdout
    restored = ms(exchange())
    assert median(restored) < 5, restored
    assert simhosts("delay", "1", "0").returncode == 0  # nothing delayed: still fine
    assert link(1) == ("veth", "1500")


def test_bad_delays_say_what_was_expected(two_hosts: int) -> None:
    got = simhosts("delay", "1", "soon")
    assert got.returncode == 2
    assert got.stderr == (
        "simhosts: delay needs a delay in ms (a number >= 0, or off). Received: 'soon'\n"
    )
    got = simhosts("delay", "7", "5")
    assert got.returncode == 2
    assert got.stderr == "simhosts: delay needs an existing host number. Received: '7'\n"


def test_a_delay_line_that_cannot_start_leaves_the_host_its_veth(
    two_hosts: int, tmp_path: Path
) -> None:
    fake = tmp_path / "python3"  # found first on PATH by simhosts.sh
    fake.write_text("#!/bin/sh\necho 'no TAP devices here' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    got = subprocess.run(["bash", str(mpi.SIMHOSTS), "delay", "1", "5"],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert got.returncode == 1
    assert got.stderr == "simhosts: host 1's delay line did not start: no TAP devices here\n"
    assert link(1) == ("veth", "1500")
    assert len(exchange()) == 10  # host 1 reaches host 2 again


@pytest.mark.alone
def test_a_rate_on_the_delayed_link_adds_to_the_delay(delayed: None) -> None:
    # 100 Mbit/s out of host 1, on its TAP inside its namespace, as scripts/bench_hosts.py
    tbf = ["tc", "qdisc", "replace", "dev", "tfsift0", "root", "tbf", "rate", "100mbit",
           "burst", "125000", "latency", "100ms"]  # fmt: skip
    subprocess.run(on(1, *tbf), check=True)
    nbytes = 5_000_000
    # the first 4 MB open TCP's windows (its receive window grows by round trips, as on
    # any link this long), the next 5 MB are timed
    _, seconds = exchange(4_000_000, nbytes)
    rate = nbytes / 12.5e6  # 0.4 s
    # the last byte is 20 ms late and the answer 20 ms: 40 ms, less the 10 ms that the
    # tbf's burst lets through at once
    print(f"{nbytes / 1e6:g} MB at 100 Mbit/s, 20 ms each way: {seconds:.3f} s")
    assert rate + 0.040 - 0.010 <= seconds < 1.2 * rate + 0.040, seconds
    off = simhosts("delay", "1", "off")
    print(off.stdout)
    # 'delayline tfsift-h1: 510 frames, 9034085 bytes, 0.050 s CPU': the large MTU copies
    # the 9 MB in frames of tens of kB (a 1500-byte MTU's would be 1.3 kB on average)
    said = re.fullmatch(r"delayline tfsift-h1: (\d+) frames, (\d+) bytes, [\d.]+ s CPU\n",
                        off.stdout)  # fmt: skip
    assert said is not None, off.stdout
    frames, copied = said.groups()
    assert int(copied) > 9_000_000 and int(copied) / int(frames) > 16_000, off.stdout


@pytest.mark.mpi
def test_an_mpi_job_runs_across_the_delayed_link(delayed: None) -> None:
    # a round trip between the hosts' ranks through Open MPI's TCP transport, after one
    # to make the connection; and an allreduce of 1 MB
    code = (
        "import json, time, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD\n"
        "def trip():\n"
        "    t = time.monotonic()\n"
        "    if c.rank == 0: c.send(1, dest=1); c.recv(source=1)\n"
        "    else: c.recv(source=0); c.send(1, dest=0)\n"
        "    return time.monotonic() - t\n"
        "trip(); rtt = trip()\n"
        "x = c.allreduce(np.full(1 << 18, c.rank + 1, np.float32))\n"
        "import socket\n"
        "print(json.dumps([c.rank, socket.gethostname(), rtt, float(x.min()), float(x.max())]))"
    )
    cmd = mpi.on_hosts(mpirun_command(2, ["-c", code]), 2, 2)
    proc = subprocess.run(cmd, env=mpi.environment(), capture_output=True, text=True,
                          timeout=120, cwd=mpi.ROOT)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    got = sorted(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))
    print(got)
    assert [(r[0], r[1], r[3], r[4]) for r in got] == [
        (0, "tfsift-h1", 3.0, 3.0),
        (1, "tfsift-h2", 3.0, 3.0),
    ]
    assert all(r[2] >= 0.040 for r in got), got
