"""A ``PipeComm`` stand-in over in-process queues, for tests that run stages on threads."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

Spec = tuple[tuple[int, ...], Any]


class FakePipe:
    """A ``PipeComm`` over in-process queues; records every call in order."""

    def __init__(self, stage: int, queues: dict[tuple[int, int, int, int], queue.Queue[Any]]):
        self.stage, self.queues = stage, queues
        self.calls: list[str] = []
        self.comm = None
        self.timeout = 10.0

    def _queue(self, src: int, dst: int, direction: int, m: int) -> queue.Queue[Any]:
        return self.queues.setdefault((src, dst, direction, m), queue.Queue())

    def send(self, tensors: Sequence[tf.Tensor], dest: int, direction: int, m: int) -> None:
        self.calls.append(f"send{'FBC'[direction]}{m}->{dest}")
        self._queue(self.stage, dest, direction, m).put([np.asarray(t) for t in tensors])

    def recv(
        self, specs: Sequence[Spec], source: int, direction: int, m: int, idle: Any = None
    ) -> list[tf.Tensor]:
        self.calls.append(f"recv{'FBC'[direction]}{m}<-{source}")
        arrays = self._queue(source, self.stage, direction, m).get(timeout=self.timeout)
        assert [tuple(a.shape) for a in arrays] == [tuple(s) for s, _ in specs]
        return [tf.convert_to_tensor(a) for a in arrays]

    def recv_arrays(
        self, specs: Sequence[Spec], source: int, direction: int, m: int, idle: Any = None
    ) -> list[np.ndarray]:
        return [t.numpy() for t in self.recv(specs, source, direction, m, idle)]

    def wait(self) -> None:
        self.calls.append("wait")
