"""tfsift.parallel.comm: the message latency two stages time for the plan."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfsift.parallel.comm import message_latency


class Pipe:
    """Stage ``stage``'s end of an in-process pipe: records its calls in order."""

    def __init__(self, stage: int, queues: dict[tuple[int, int], queue.Queue[Any]]) -> None:
        self.stage, self.queues, self.calls = stage, queues, []

    def send(self, arrays: Sequence[np.ndarray], dest: int, direction: int, m: int) -> None:
        self.calls.append(f"send{'FBC'[direction]}{m}->{dest}")
        self.queues[(self.stage, dest)].put([a.shape for a in arrays])

    def recv_arrays(self, specs: Any, source: int, direction: int, m: int) -> list[np.ndarray]:
        self.calls.append(f"recv{'FBC'[direction]}{m}<-{source}")
        assert self.queues[(source, self.stage)].get(timeout=10) == [s for s, _ in specs]
        return [np.zeros(shape) for shape, _ in specs]

    def wait(self) -> None:
        self.calls.append("wait")


def test_stages_0_and_1_exchange_a_microbatchs_messages_and_stage_0_gets_half_a_trip() -> None:
    queues: dict[tuple[int, int], queue.Queue[Any]] = {(0, 1): queue.Queue(), (1, 0): queue.Queue()}
    pipes = [Pipe(0, queues), Pipe(1, queues), Pipe(2, queues)]
    results: dict[int, float] = {}
    threads = [
        threading.Thread(target=lambda s=s: results.update({s: message_latency(pipes[s], s, 3)}))
        for s in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert message_latency(pipes[2], 2, 3) == 0.0 and pipes[2].calls == []  # no message
    assert pipes[0].calls == ["sendC0->1", "sendF0->1", "recvB0<-1", "wait"] * 4  # a warm-up
    assert pipes[1].calls == ["recvC0<-0", "recvF0<-0", "sendB0->0", "wait"] * 4
    assert results[0] > 0 and results[1] == 0.0
