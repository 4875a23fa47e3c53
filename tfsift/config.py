"""The frozen, validated tfsift configuration."""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import re
from collections.abc import Mapping
from typing import Any

from partitioner.plan import AUTO
from partitioner.schedule import PIPELINES
from partitioner.solver import OPTIMIZE
from tfsift import env

# The choice lists have one home each: schedules and solvers in partitioner/ (which
# cannot import tfsift), rank placements here (topology.py reads them from here).
PLACEMENTS = ("cluster", "spread")
__all__ = ["AUTO", "OPTIMIZE", "PIPELINES", "PLACEMENTS", "Config", "parse_bytes"]
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
# The keys whose values __post_init__ stores as plain Python values (see plain)
_NUMBERS = (
    "partitions",
    "microbatches",
    "virtual_stages",
    "default_partition",
    "memory_cap",
    "profile_repeats",
    "timeout",
)
_PATHS = ("plan_file", "log_dir")


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything ``tfsift.init`` accepts; see ``docs/architecture.md``.

    Example:
        >>> Config.from_dict({"partitions": 2, "microbatches": 4}).pipeline
        'auto'
    """

    partitions: int = 1
    microbatches: int = 1
    pipeline: str = AUTO
    virtual_stages: int | None = None  # 1; with pipeline="auto", what the plan found fastest
    optimize: str = "speed"
    horovod: bool | None = None
    placement_strategy: str = "cluster"
    auto_partition: bool = True
    default_partition: int = 0
    memory_cap: int | None = None
    plan_file: str | None = None
    profile_repeats: int = 5
    timeout: float = 600.0
    log_dir: str | None = None

    def __post_init__(self) -> None:
        # Plain values: a NumPy scalar (a value computed with NumPy) or a pathlib.Path is
        # taken, and the stored config compares, pickles and prints as one of plain values.
        for name in (*_NUMBERS, *_PATHS):
            object.__setattr__(self, name, plain(getattr(self, name)))
        check_int("partitions", self.partitions, 1)
        check_int("microbatches", self.microbatches, 1)
        check_int("profile_repeats", self.profile_repeats, 1)
        check_choice("pipeline", self.pipeline, (*PIPELINES, AUTO))
        check_choice("optimize", self.optimize, OPTIMIZE)
        check_choice("placement_strategy", self.placement_strategy, PLACEMENTS)
        check_bool("auto_partition", self.auto_partition)
        if self.horovod is not None:
            check_bool("horovod", self.horovod)
        self._check_virtual_stages()
        check_int("default_partition", self.default_partition, 0)
        chunks = self.partitions * (self.virtual_stages or 1)  # manual placement's indices
        if self.default_partition >= chunks:
            bound = f"partitions={self.partitions}"
            if chunks != self.partitions:
                bound = f"partitions x virtual_stages={chunks}"
            raise ValueError(
                f"default_partition must be < {bound}. "
                f"Received: default_partition={self.default_partition}"
            )
        if self.default_partition and self.auto_partition:
            raise ValueError(
                "default_partition is the stage of the layers outside tfsift.partition blocks "
                "when you place layers by hand; with auto_partition=True the solver places "
                "every layer. Set auto_partition=False, or leave default_partition out. "
                f"Received: auto_partition=True, default_partition={self.default_partition}"
            )
        if self.memory_cap is not None:
            check_int("memory_cap", self.memory_cap, 1)
        _check_positive("timeout", self.timeout)
        for name in _PATHS:
            _check_path(name, getattr(self, name))

    def _check_virtual_stages(self) -> None:
        """Virtual stages run Megatron-LM's interleaved 1F1B over K v chunks."""
        v = self.virtual_stages
        if v is None:
            return
        check_int("virtual_stages", v, 1)
        if v == 1:
            return
        if self.partitions < 2:
            raise ValueError(
                "virtual_stages > 1 interleaves model chunks over two or more stages: set "
                "partitions >= 2, or virtual_stages=1. "
                f"Received: partitions={self.partitions}, virtual_stages={v}"
            )
        if self.pipeline not in ("interleaved", AUTO):
            split = " (ZB-V, a zero-bubble schedule on virtual stages, is not supported)"
            raise ValueError(
                "virtual_stages > 1 runs Megatron-LM's interleaved 1F1B: use "
                f"pipeline='interleaved' with virtual_stages, or pipeline={self.pipeline!r} "
                f"with virtual_stages=1{split if self.pipeline == 'zero_bubble' else ''}. "
                f"Received: pipeline={self.pipeline!r}, virtual_stages={v}"
            )
        K, M = self.partitions, self.microbatches
        rounds = max(1, M // K)
        if M % rounds:
            raise ValueError(
                "with virtual_stages > 1, microbatches must be a multiple of max(1, "
                f"microbatches // partitions) = {rounds}, the rounds in which each chunk takes "
                "them (a multiple of partitions always is). "
                f"Received: partitions={K}, microbatches={M}, virtual_stages={v}"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Config:
        """Builds a config from a mapping, rejecting unknown keys and anything but a mapping."""
        if not isinstance(values, Mapping):
            raise TypeError(
                "tfsift.init's config must be a mapping of config keys (a dict), a Config, or "
                f"None to read {env.TFSIFT_CONFIG}; JSON text goes in {env.TFSIFT_CONFIG}, or "
                f"pass json.loads(text). Received: config={_short(values)} "
                f"({type(values).__name__})"
            )
        allowed = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in allowed:
                raise ValueError(
                    f"Unknown tfsift config key {key!r}. Allowed keys: {', '.join(allowed)}"
                )
        fixed = dict(values)
        if isinstance(fixed.get("memory_cap"), str):
            fixed["memory_cap"] = parse_bytes(fixed["memory_cap"])
        return cls(**fixed)

    @classmethod
    def from_env(cls) -> Config:
        """Reads ``TFSIFT_CONFIG`` (JSON text or a path to a JSON file); defaults if unset."""
        raw = env.get(env.TFSIFT_CONFIG).strip()
        if not raw:
            return cls()
        from_file = not raw.startswith("{") and os.path.isfile(raw)  # a folder is no file
        try:
            values = json.loads(_read(raw) if from_file else raw)
        except json.JSONDecodeError as err:
            if not from_file and not raw.startswith("{"):
                raise ValueError(
                    f"{env.TFSIFT_CONFIG} is neither JSON nor an existing file. Received: {raw!r}"
                ) from None
            raise ValueError(
                f"{env.TFSIFT_CONFIG} is not valid JSON ({err}). Received: {raw!r}"
            ) from err
        if not isinstance(values, dict):
            raise ValueError(
                f"{env.TFSIFT_CONFIG} holds JSON but not an object (a mapping of config keys, "
                f'e.g. {{"partitions": 2}}): it parsed to {_short(values)} '
                f"({type(values).__name__}). Received: {raw!r}"
            )
        return cls.from_dict(values)


def parse_bytes(text: str) -> int:
    """Parses ``"8GiB"``, ``"512MB"`` or ``"1e9"`` into a number of bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"memory size must look like '8GiB', '512MB' or '1e9'. Received: {text!r}")
    try:
        return int(float(match.group(1)) * _UNITS[unit])
    except ValueError:
        raise ValueError(
            f"memory size must look like '8GiB', '512MB' or '1e9'. Received: {text!r}"
        ) from None


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _short(value: object) -> str:
    """``repr(value)``, cut to 80 characters (an error message quotes what it received)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def plain(value: object) -> object:
    """A NumPy integer or float (any ``numbers`` integer or real) as the Python int or float
    it stands for, a path object as its string; anything else as it is. Bools stay bools (and
    NumPy's, not a ``numbers`` type, stay NumPy's), for the checks to refuse as numbers."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}. Received: {name}={value!r}")


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0. Received: {name}={value!r}")


def _check_path(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be None or a non-empty string. Received: {name}={value!r}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false. Received: {name}={value!r}")


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, allowed))}. Received: {name}={value!r}"
        )
