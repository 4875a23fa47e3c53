"""tfsift.parallel.comm: the message latency two stages time for the plan."""

from __future__ import annotations

import queue
import threading
from pipes import FakePipe
from typing import Any

from tfsift.parallel.comm import message_latency


def test_stages_0_and_1_exchange_a_microbatchs_messages_and_stage_0_gets_half_a_trip() -> None:
    queues: dict[tuple[int, int, int, int], queue.Queue[Any]] = {}
    pipes = [FakePipe(s, queues) for s in range(3)]
    results: dict[int, float] = {}
    threads = [
        threading.Thread(target=lambda s=s: results.update({s: message_latency(pipes[s], s, 3)}))  # type: ignore[arg-type]
        for s in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert message_latency(pipes[2], 2, 3) == 0.0 and pipes[2].calls == []  # type: ignore[arg-type]
    assert pipes[0].calls == ["sendC0->1", "sendF0->1", "recvB0<-1", "wait"] * 4  # a warm-up
    assert pipes[1].calls == ["recvC0<-0", "recvF0<-0", "sendB0->0", "wait"] * 4
    assert results[0] > 0 and results[1] == 0.0
