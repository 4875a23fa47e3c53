"""Per-layer costs of a layer chain: the only input the partitioner needs."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

FORMAT = "tfsift.costs/1"
_TIME_FIELDS = ("forward_time", "backward_time")
_BYTE_FIELDS = ("param_bytes", "activation_bytes", "output_bytes")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# The share of a layer's backward that goes to its weight gradients when a zero-bubble
# schedule splits it into B and W: a dense or convolution layer's input gradient and
# weight gradient are as many multiply-adds (a layer without weights has no W).
WEIGHT_SHARE = 0.5


@dataclass(frozen=True)
class LayerCost:
    """Measured costs of one layer.

    Example:
        >>> LayerCost("dense", 1e-3, 2e-3, param_bytes=4096, activation_bytes=256,
        ...           output_bytes=128).forward_time
        0.001

    Args:
        name: unique layer name; the runtime maps stages back to layers by name.
        forward_time: seconds for one microbatch of `CostModel.batch_size` samples.
        backward_time: seconds for the backward pass of the same microbatch.
        param_bytes: bytes of the layer's trainable weights.
        activation_bytes: bytes per sample kept from the forward until the backward.
        output_bytes: bytes per sample of every tensor live across a cut placed right
            after this layer (skip connections included).
    """

    name: str
    forward_time: float
    backward_time: float
    param_bytes: int
    activation_bytes: int
    output_bytes: int


@dataclass(frozen=True)
class PrefixSums:
    """Prefix sums over the chain; `x[hi] - x[lo]` is the total over layers [lo, hi).

    Boundary `i` (0 <= i <= L) sits before layer `i`; `cut[i]` is the one-way transfer
    time of a cut there and `input_bytes[i]` the bytes crossing it (both 0 at 0 and L).
    """

    compute: FloatArray  # forward + backward seconds
    forward: FloatArray
    backward: FloatArray
    state_bytes: IntArray  # param bytes times the optimizer multiplier, rounded per layer
    activation_bytes: IntArray  # per microbatch (already times batch_size)
    cut: FloatArray
    input_bytes: IntArray  # per microbatch
    weight_backward: FloatArray  # the weight gradients' seconds (WEIGHT_SHARE, layers with
    # weights): W's part of a split backward
    weight_grad_bytes: IntArray  # per microbatch: the output gradients of the layers with
    # weights, which a split backward keeps from B to W


_OPTIONS = ("batch_size", "optimizer_multiplier", "bandwidth", "latency", "action_overhead")


@dataclass(frozen=True)
class CostModel:
    """Costs of a chain of layers, plus the machine constants the solvers need.

    Example:
        >>> layer = LayerCost("l0", 1.0, 2.0, 0, 0, 1000)
        >>> CostModel((layer,), bandwidth=1e3, latency=0.5).cut_time(0)
        1.5

    Args:
        layers: the chain, in execution order.
        batch_size: samples per microbatch that the times were measured at.
        optimizer_multiplier: bytes held per parameter byte (weights, gradients and the
            two Adam moments make 4).
        bandwidth: bytes per second between neighbouring stages.
        latency: seconds per message between neighbouring stages.
        action_overhead: seconds the runtime adds to every forward and every backward
            action of a stage, whatever its layers (a compiled call, the gradient tape,
            Python): the simulator charges it; the solvers' cuts do not depend on it, since
            every stage pays it alike.
        shared: groups of layer indices (ascending, two or more) that call the same
            weights, such as a token embedding reused as the output head. `param_bytes`
            counts them at the first call only; a stage that holds a later call but not
            the first holds a copy (`copy_bytes`), and the copies' holders exchange their
            gradients once a step (`exchange_time`).

    Raises:
        ValueError: on an empty chain, a negative, NaN or infinite cost, a duplicate
            layer name, `batch_size < 1` or `bandwidth <= 0`.
    """

    layers: tuple[LayerCost, ...]
    batch_size: int = 1
    optimizer_multiplier: float = 4.0
    bandwidth: float = 1e9
    latency: float = 0.0
    action_overhead: float = 0.0
    shared: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "shared", tuple(tuple(g) for g in self.shared))
        if not self.layers:
            raise ValueError("a cost model needs at least one layer. Received: layers=()")
        _check_int(self.batch_size, "batch_size", 1)
        _check_real(self.optimizer_multiplier, "optimizer_multiplier")
        if not _is_real(self.bandwidth) or not self.bandwidth > 0:
            raise ValueError(
                f"bandwidth must be a number > 0. Received: bandwidth={self.bandwidth!r}"
            )
        _check_real(self.latency, "latency")
        _check_real(self.action_overhead, "action_overhead")
        seen: dict[str, int] = {}
        for index, layer in enumerate(self.layers):
            _check_layer(index, layer)
            if layer.name in seen:
                raise ValueError(
                    "layer names must be unique. Received: "
                    f"layers[{index}] ({layer.name!r}) duplicates layers[{seen[layer.name]}]"
                )
            seen[layer.name] = index
        for group in self.shared:
            if (
                len(group) < 2
                or list(group) != sorted(set(group))
                or not all(isinstance(i, int) and 0 <= i < len(self.layers) for i in group)
            ):
                raise ValueError(
                    "shared must hold groups of two or more ascending layer indices in "
                    f"[0, {len(self.layers)}). Received: shared={self.shared!r}"
                )

    def copy_bytes(self, lo: int, hi: int, *more: tuple[int, int]) -> int:
        """State bytes of the copies that a stage of layers [lo, hi) holds: shared weights
        it calls whose first call lies before it (counted there by `param_bytes`). A rank
        that runs several chunks (virtual stages) passes their spans too (``more``): a
        shared weight it calls holds one copy, none if its first call is in one of them."""
        spans = [(lo, hi), *more]
        state = self.prefix.state_bytes
        return sum(
            int(state[g[0] + 1] - state[g[0]])
            for g in self.shared
            if not any(a <= g[0] < b for a, b in spans)
            and any(a <= i < b for i in g for a, b in spans)
        )

    def exchange_time(self, bounds: Sequence[int], ranks: int | None = None) -> float:
        """Seconds a step spends exchanging the gradients of weights held on several
        stages of `bounds` (each holder sends its gradient to the others, in parallel).
        With ``ranks`` (virtual stages), stage c of `bounds` runs on rank c mod ``ranks``,
        and a rank holds one copy however many of its chunks call the weights."""
        total = 0.0
        for g in self.shared:
            holders = {int(np.searchsorted(bounds, i, side="right")) - 1 for i in g}
            if ranks is not None:
                holders = {c % ranks for c in holders}
            if len(holders) > 1:
                size = self.layers[g[0]].param_bytes
                total += self.latency + (len(holders) - 1) * size / self.bandwidth
        return total

    @property
    def num_layers(self) -> int:
        """L, the number of layers in the chain."""
        return len(self.layers)

    def cut_time(self, i: int) -> float:
        """Seconds to send one microbatch across a cut right after layer `i` (one way)."""
        if not 0 <= i < self.num_layers:
            raise ValueError(
                f"a cut follows a layer index in [0, {self.num_layers}). Received: i={i}"
            )
        return self.latency + self.layers[i].output_bytes * self.batch_size / self.bandwidth

    @cached_property
    def prefix(self) -> PrefixSums:
        """Prefix sums that every solver and the simulator read, so they agree bit for bit."""
        forward = np.array([layer.forward_time for layer in self.layers], dtype=np.float64)
        backward = np.array([layer.backward_time for layer in self.layers], dtype=np.float64)
        params = np.array([layer.param_bytes for layer in self.layers], dtype=np.float64)
        state = np.rint(params * self.optimizer_multiplier).astype(np.int64)
        acts = np.array([layer.activation_bytes for layer in self.layers], dtype=np.int64)
        outputs = np.array([layer.output_bytes for layer in self.layers], dtype=np.int64)
        cut = np.zeros(self.num_layers + 1)
        cut[1:-1] = self.latency + outputs[:-1] * self.batch_size / self.bandwidth
        input_bytes = np.zeros(self.num_layers + 1, dtype=np.int64)
        input_bytes[1:-1] = outputs[:-1] * self.batch_size
        weighted = np.array([layer.param_bytes > 0 for layer in self.layers])
        return PrefixSums(
            compute=_cumsum(forward + backward),
            forward=_cumsum(forward),
            backward=_cumsum(backward),
            state_bytes=_cumsum(state),
            activation_bytes=_cumsum(acts * self.batch_size),
            cut=cut,
            input_bytes=input_bytes,
            weight_backward=_cumsum(np.where(weighted, backward * WEIGHT_SHARE, 0.0)),
            weight_grad_bytes=_cumsum(np.where(weighted, outputs * self.batch_size, 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_dict` inverts it."""
        return {
            "format": FORMAT,
            "batch_size": self.batch_size,
            "optimizer_multiplier": self.optimizer_multiplier,
            "bandwidth": self.bandwidth,
            "latency": self.latency,
            "action_overhead": self.action_overhead,
            "layers": [asdict(layer) for layer in self.layers],
            # only when present: the fingerprints of models without shared weights stay
            **({"shared": [list(g) for g in self.shared]} if self.shared else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """Builds a cost model from `to_dict` output, rejecting unknown or missing keys."""
        _check_keys(
            data,
            {*_OPTIONS, "format", "layers", "shared"},
            {"layers"},
            "cost model",
        )
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"format must be {FORMAT!r}. Received: format={data['format']!r}")
        names = {f.name for f in fields(LayerCost)}
        layers = []
        for index, entry in enumerate(_as_list(data["layers"], "layers")):
            _check_keys(entry, names, names, f"layers[{index}]")
            layers.append(LayerCost(**entry))
        options = {k: data[k] for k in _OPTIONS if k in data}
        shared = tuple(tuple(g) for g in _as_list(data.get("shared", []), "shared"))
        return cls(tuple(layers), shared=shared, **options)

    def to_json(self) -> str:
        """Indented JSON text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        """Writes `to_json()` to `path`."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Reads a file written by `save` (`tfsift profile -o`).

        Raises:
            ValueError: the file is not the JSON of a cost model (a script, say).
        """
        text = Path(path).read_text()
        try:
            return cls.from_json(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} is not a cost file: expected the JSON that `tfsift profile -o` (or "
                f"CostModel.save) writes; reading it failed at line {err.lineno}, column "
                f"{err.colno}: {err.msg}"
            ) from None

    def fingerprint(self) -> str:
        """sha256 hex digest of the canonical JSON (sorted keys, no spaces)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def format_bytes(n: float) -> str:
    """Human-readable binary units: `format_bytes(3 * 2**30) == '3.00 GiB'`."""
    value, unit = float(n), _UNITS[0]
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"


def format_seconds(seconds: float) -> str:
    """A time as the planner's log and ``tfsift timeline`` print it: ms below a second.

    Example:
        >>> format_seconds(0.0123), format_seconds(0.412), format_seconds(16.0)
        ('12.3 ms', '412 ms', '16 s')
    """
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _cumsum(values: npt.NDArray[Any]) -> Any:
    return np.concatenate([np.zeros(1, dtype=values.dtype), np.cumsum(values)])


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _check_real(value: object, name: str, where: str = "") -> None:
    number = float(value) if isinstance(value, int | float) and _is_real(value) else math.nan
    if not (number >= 0 and math.isfinite(number)):
        raise ValueError(f"{name} must be a finite number >= 0. Received: {where}{name}={value!r}")


def _check_int(value: object, name: str, minimum: int, where: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(
            f"{name} must be an integer >= {minimum}. Received: {where}{name}={value!r}"
        )


def _check_layer(index: int, layer: LayerCost) -> None:
    if not isinstance(layer, LayerCost):
        raise ValueError(f"layers must hold LayerCost objects. Received: layers[{index}]={layer!r}")
    where = f"layers[{index}] ({layer.name!r}) "
    if not isinstance(layer.name, str) or not layer.name:
        raise ValueError(f"name must be a non-empty string. Received: {where}name={layer.name!r}")
    for name in _TIME_FIELDS:
        _check_real(getattr(layer, name), name, where)
    for name in _BYTE_FIELDS:
        _check_int(getattr(layer, name), name, 0, where=where)


def _check_keys(data: object, allowed: set[str], required: set[str], what: str) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a JSON object. Received: {what}={data!r}")
    unknown = sorted(set(data) - allowed)
    missing = sorted(required - set(data))
    if unknown or missing:
        raise ValueError(
            f"{what} keys must be among {sorted(allowed)} and include {sorted(required)}. "
            f"Received: unknown={unknown}, missing={missing}"
        )


def _as_list(value: object, name: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{name} must be a JSON list. Received: {name}={value!r}")
    return value
