"""scripts/simhosts-bin/delayline.py's copying loop, on datagram sockets in place of TAP
devices (no root, no namespaces): each frame comes out the other side the delay late, in
the order it went in, both ways."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
import uuid
from types import ModuleType

import pytest
import scripts_module

DELAY = 0.05


@pytest.fixture(scope="module")
def delayline() -> ModuleType:
    path = scripts_module.SCRIPTS / "simhosts-bin" / "delayline.py"
    spec = importlib.util.spec_from_file_location("delayline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["delayline"] = module  # where its dataclass looks itself up
    spec.loader.exec_module(module)
    return module


_OPEN_FOR_THE_LINE: list[socket.socket] = []


def test_frames_come_out_the_delay_late_in_order_both_ways(delayline: ModuleType) -> None:
    # host <-> [line] <-> switch, each side a datagram socket pair (a frame a datagram)
    host, host_line = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    switch, switch_line = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for end in (host_line, switch_line):
        end.setblocking(False)
    copied = delayline.Copied()
    line = threading.Thread(
        target=delayline.run,
        args=(host_line.fileno(), switch_line.fileno(), DELAY, copied),
        daemon=True,  # run() never returns: it ends with the test process
    )
    # ...and so must its sockets: closed, their descriptor numbers would be reused by the
    # worker's next files, which the line would go on reading (a later test's subprocess
    # pipe, read here, left its communicate() waiting until the suite's timeout)
    _OPEN_FOR_THE_LINE.extend([host, host_line, switch, switch_line])
    line.start()
    sent = time.monotonic()
    frames = [bytes([i]) * (100 + i) for i in range(20)]
    for frame in frames:
        host.send(frame)
    switch.send(b"back")
    got = [switch.recv(65536) for _ in frames]
    late = time.monotonic() - sent
    assert got == frames
    assert host.recv(65536) == b"back"
    assert late >= DELAY, late
    assert (copied.frames, copied.bytes) == (21, sum(map(len, frames)) + 4)


def test_bad_arguments_are_refused_before_anything_is_made(
    delayline: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert delayline.main(["h1", "tfsift0", "sw", "p1", "soon"]) == 2
    assert capsys.readouterr().err == (
        "delayline: the delay must be a number >= 0 (ms). Received: 'soon'\n"
    )
    assert delayline.main(["h1", "tfsift0", "sw", "p1", "-1"]) == 2
    assert "Received: '-1'" in capsys.readouterr().err
    assert delayline.main(["h1"]) == 2
    assert capsys.readouterr().err.endswith(
        "\nusage: delayline.py HOST_NS HOST_TAP SWITCH_NS SWITCH_TAP DELAY_MS\n"
    )
    absent = f"tfsift-none-{uuid.uuid4().hex}"  # a namespace nobody made
    assert delayline.main([absent, "tfsift0", "sw", "p1", "5"]) == 1
    assert capsys.readouterr().err == (
        f"delayline: cannot make the TAP devices {absent}/tfsift0 and sw/p1: [Errno 2] "
        f"No such file or directory: '/var/run/netns/{absent}'\n"
    )
