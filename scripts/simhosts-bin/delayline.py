"""A userspace delay line: two TAP devices, frames copied between them DELAY ms late."""

# Usage (scripts/simhosts.sh delay K MS starts it; the lines below are what it runs):
#   delayline.py HOST_NS HOST_TAP SWITCH_NS SWITCH_TAP DELAY_MS
# makes HOST_TAP in the network namespace HOST_NS and SWITCH_TAP in SWITCH_NS (names as
# `ip netns` lists them), copies every Ethernet frame read from one to the other DELAY_MS
# after it was read, in the order read, and runs until SIGTERM/SIGINT; its TAP devices go
# with it. It configures nothing: the caller gives the devices their addresses, MTU and
# bridge. This kernel has no netem qdisc (nor any other that delays), hence userspace.
#
# Why a select loop and no thread: the delay is the same for every frame, so each
# direction's queue is already sorted by release time (a deque, not a heap) and frames
# keep their order; one thread waits for a frame to read or for the first one due, so
# there is no lock and no thread to wake.

from __future__ import annotations

import collections
import ctypes
import dataclasses
import fcntl
import os
import select
import signal
import struct
import sys
import time

CLONE_NEWNET = 0x40000000  # <sched.h>
TUNSETIFF = 0x400454CA  # _IOW('T', 202, int) in <linux/if_tun.h>
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000  # frames without the 4-byte packet-information prefix
FRAME_MAX = 65535 + 14  # a TAP's largest MTU and its Ethernet header
QUEUE_MAX = 4096  # frames waiting per direction; beyond it a frame is dropped, as a full link
READ_BATCH = 64  # frames read from one side before the other is looked at (fairness)
Queue = collections.deque[tuple[float, bytes]]  # (release time, frame)


@dataclasses.dataclass
class Copied:
    frames: int = 0
    bytes: int = 0


def setns(name: str) -> None:
    """Moves this process into the network namespace ``name`` (Python 3.11 has no
    os.setns, so libc's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(name: str) -> int:
    """A TAP device ``name`` in this process's network namespace, as a non-blocking fd;
    the device lasts as long as the fd (it is not persistent)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def read_all(fd: int, queue: Queue, release: float, copied: Copied) -> None:
    """Queues the frames ``fd`` has now (up to READ_BATCH), each to be released at ``release``."""
    for _ in range(READ_BATCH):
        try:
            frame = os.read(fd, FRAME_MAX)
        except BlockingIOError:
            return
        if len(queue) < QUEUE_MAX:
            queue.append((release, frame))
            copied.frames += 1
            copied.bytes += len(frame)


def write_due(fd: int, queue: Queue, now: float) -> None:
    """Writes every frame of ``queue`` due by ``now`` to ``fd``, oldest first."""
    while queue and queue[0][0] <= now:
        frame = queue.popleft()[1]
        try:
            os.write(fd, frame)
        except OSError:
            pass  # the device is down (EIO) or the kernel is short of memory: a lost frame


def run(host_fd: int, switch_fd: int, delay: float, copied: Copied) -> None:
    """Copies frames both ways between two fds (TAP devices, or any that read and write
    whole frames), each ``delay`` seconds late; never returns."""
    to_switch: Queue = collections.deque()
    to_host: Queue = collections.deque()
    while True:
        due = [q[0][0] for q in (to_switch, to_host) if q]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        readable, _, _ = select.select([host_fd, switch_fd], [], [], timeout)
        now = time.monotonic()
        if host_fd in readable:
            read_all(host_fd, to_switch, now + delay, copied)
        if switch_fd in readable:
            read_all(switch_fd, to_host, now + delay, copied)
        write_due(switch_fd, to_switch, now)
        write_due(host_fd, to_host, now)


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        usage = "usage: delayline.py HOST_NS HOST_TAP SWITCH_NS SWITCH_TAP DELAY_MS"
        print(f"{__doc__}\n{usage}", file=sys.stderr)
        return 2
    host_ns, host_tap, switch_ns, switch_tap, delay_ms = argv
    try:
        delay = float(delay_ms) / 1e3
    except ValueError:
        delay = -1.0
    if not delay >= 0:
        print(f"delayline: the delay must be a number >= 0 (ms). Received: {delay_ms!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    # a TAP is made in the namespace its fd was opened in, and stays usable from any other
    try:
        setns(host_ns)
        host_fd = open_tap(host_tap)
        setns(switch_ns)
        switch_fd = open_tap(switch_tap)
    except OSError as err:
        print(f"delayline: cannot make the TAP devices {host_ns}/{host_tap} and "
              f"{switch_ns}/{switch_tap}: {err}", file=sys.stderr)  # fmt: skip
        return 1
    copied = Copied()
    start = os.times()

    def stop(signum: int, _: object) -> None:
        used = os.times()
        cpu = used.user + used.system - start.user - start.system
        print(f"delayline {host_ns}: {copied.frames} frames, {copied.bytes} bytes, "
              f"{cpu:.3f} s CPU", file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"delayline {host_ns}: {host_tap} <-> {switch_ns}/{switch_tap}, {delay_ms} ms",
          file=sys.stderr, flush=True)  # fmt: skip
    run(host_fd, switch_fd, delay, copied)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
