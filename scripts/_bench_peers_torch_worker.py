"""One rank of bench_peers.py's PyTorch rows: the conv chain in PyTorch, ``MODE CONFIG_JSON``
(single, ddp or one of ``SCHEDULES``), timed.

Runs in a benchmark-only environment with PyTorch (never tfsift's), under ``mpirun``: the
rank comes from Open MPI's environment and gloo connects the ranks. One compute thread a
rank; channels-last convolutions (PyTorch's fastest layout on CPU).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
Config = dict[str, Any]
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
SIZE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
CHANNELS_LAST = torch.channels_last
# mode: (torch's schedule class, stages a rank); ZB-H1 is the interleaved zero-bubble
# schedule with one stage a rank
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2),
    "zero_bubble": ("ScheduleInterleavedZeroBubble", 1),
}


def chain(cfg: Config) -> nn.Sequential:
    torch.manual_seed(0)
    w = cfg["width"]
    layers = [nn.Sequential(nn.Conv2d(w, w, 3, padding=1), nn.ReLU()) for _ in range(cfg["layers"])]
    return nn.Sequential(*layers).to(memory_format=CHANNELS_LAST)


def data(cfg: Config, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    shape = (batch, cfg["width"], cfg["side"], cfg["side"])
    x = torch.randn(shape).contiguous(memory_format=CHANNELS_LAST)
    return x, torch.randn(shape).contiguous(memory_format=CHANNELS_LAST)


def data_parallel(cfg: Config) -> Callable[[], None]:
    """The whole batch in one process (``single``), or B / SIZE a rank with DDP (``ddp``)."""
    model = nn.parallel.DistributedDataParallel(chain(cfg)) if SIZE > 1 else chain(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = data(cfg, cfg["batch"] // SIZE)

    def step() -> None:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()

    return step


class _ChannelsLast(torch.autograd.Function):
    """Channels-last inside a stage, the default layout between stages (gloo sends only
    contiguous tensors), for activations and their gradients alike."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=CHANNELS_LAST)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class Stage(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(_ChannelsLast.apply(x)).contiguous()


def pipelined(cfg: Config, schedule: str) -> Callable[[], None]:
    """torch.distributed.pipelining: the chain cut in SIZE x v equal chunks, rank r holding
    chunks r, r + SIZE, ... (v = 1: two halves, one per rank)."""
    from torch.distributed import pipelining

    name, v = SCHEDULES[schedule]
    layers, chunks = list(chain(cfg)), SIZE * v
    size = cfg["layers"] // chunks
    parts = [Stage(layers[i * size : (i + 1) * size]) for i in range(RANK, chunks, SIZE)]
    stages = [pipelining.PipelineStage(part, i, chunks, torch.device("cpu"))
              for part, i in zip(parts, range(RANK, chunks, SIZE), strict=True)]  # fmt: skip
    multi = "Interleaved" in name  # the schedules that take a list of a rank's stages
    runner = getattr(pipelining, name)(stages if multi else stages[0], n_microbatches=cfg["M"],
                                       loss_fn=F.mse_loss)  # fmt: skip
    optimizer = torch.optim.SGD([p for part in parts for p in part.parameters()], lr=1e-3)
    x, y = (t.contiguous() for t in data(cfg, cfg["batch"]))

    def step() -> None:
        optimizer.zero_grad()
        if RANK == 0:
            runner.step(x)
        else:
            runner.step(target=y)
        optimizer.step()

    return step


def synced(step: Callable[[], None]) -> float:
    """One step started together on every rank; the slowest rank's seconds."""
    if SIZE > 1:
        dist.barrier()
    start = time.perf_counter()
    step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    if SIZE > 1:
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


if __name__ == "__main__":
    mode, cfg = sys.argv[1], json.loads(sys.argv[2])
    if SIZE > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(cfg["port"])
        dist.init_process_group("gloo", rank=RANK, world_size=SIZE)
    step = data_parallel(cfg) if mode in ("single", "ddp") else pipelined(cfg, mode)
    for _ in range(cfg["warmup"]):
        synced(step)
    times = [synced(step) for _ in range(cfg["steps"])]
    report = {"rank": RANK, "mode": mode, "config": cfg, "times": times, "torch": torch.__version__}
    (Path(os.environ["TFSIFT_BENCH_OUT"]) / f"rank{RANK}.json").write_text(json.dumps(report))
    if SIZE > 1:
        dist.destroy_process_group()
    # PyTorch 2.x's pipelining leaves threads that abort the interpreter's teardown now and
    # then ("terminate called without an active exception", exit 134 after both reports
    # were written); the report is on disk, so leave without a teardown.
    sys.stdout.flush()
    os._exit(0)
