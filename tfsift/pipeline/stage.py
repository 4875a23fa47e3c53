"""One pipeline stage: its compiled forward and backward, and what it keeps in between."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from tfsift.pipeline.compiled import Compiled
from tfsift.planning.autodiff import add, floats, gradients
from tfsift.planning.graph import Graph, StageGraph
from tfsift.planning.profiler import medians


@dataclasses.dataclass
class Saved:
    """What a forward keeps for its backward: the tape (speed) or the inputs and seeds (memory)."""

    inputs: list[tf.Tensor]
    outputs: list[tf.Tensor] | None
    tape: tf.GradientTape | None
    seeds: list[tf.Tensor] | None


class Stage:
    """Runs one stage's sub-graph; ``recompute`` keeps only stage inputs between F and B."""

    def __init__(self, graph: StageGraph, index: int, recompute: bool) -> None:
        self.graph = graph
        self.index = index
        self.recompute = recompute
        self.variables = graph.trainable_variables()
        self._seeds = graph.seed_states()
        trainable = {id(v) for v in self.variables}
        self.state_variables = [v for v in graph.variables() if id(v) not in trainable]
        self._forward = {flag: _compiled_forward(graph, flag, index) for flag in (True, False)}
        self._recompute_backward = Compiled(
            self._backward_by_recompute, f"stage {index}'s recomputing backward", autograph=False
        )
        self._add = Compiled(add, f"stage {index}'s gradient sum", autograph=False)

    def accumulate(self, total: list[tf.Tensor] | None, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """``total + grads`` elementwise in one compiled call (``grads`` if no total yet)."""
        return grads if total is None else list(self._add(total, grads))

    def forward_call(self, inputs: Sequence[tf.Tensor], training: bool) -> list[tf.Tensor]:
        """The stage's compiled forward, nothing kept (inside another function: inlined)."""
        return list(self._forward[training](*inputs))

    def forward(
        self, inputs: Sequence[tf.Tensor], training: bool, keep: bool
    ) -> tuple[list[tf.Tensor], Saved | None]:
        """Runs the stage; with ``keep`` returns what ``backward`` needs."""
        inputs = list(inputs)
        if not keep:
            return self.forward_call(inputs, training), None
        if self.recompute:
            seeds = [tf.identity(s.value) for s in self._seeds]
            return self.forward_call(inputs, training), Saved(inputs, None, None, seeds)
        with tf.GradientTape() as tape:
            tape.watch(floats(inputs))
            outputs = self.forward_call(inputs, training)
        return outputs, Saved(inputs, outputs, tape, None)

    def backward(
        self,
        saved: Saved,
        out_grads: Sequence[tf.Tensor],
        total: list[tf.Tensor] | None = None,
    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        """Returns (gradients of the stage's variables, added to ``total`` if given;
        gradients of its float inputs). Recomputing, the sum is made in the backward's
        own call: one call a microbatch fewer than a separate ``accumulate``."""
        if saved.tape is None:
            assert saved.seeds is not None
            var_grads, in_grads = self._recompute_backward(
                saved.inputs, list(out_grads), saved.seeds, total
            )
            return list(var_grads), list(in_grads)
        assert saved.outputs is not None
        var_grads, in_grads = self._gradients(saved.tape, saved.inputs, saved.outputs, out_grads)
        return self.accumulate(total, var_grads), in_grads

    def _backward_by_recompute(
        self,
        inputs: list[tf.Tensor],
        out_grads: list[tf.Tensor],
        seeds: list[tf.Tensor],
        total: list[tf.Tensor] | None,
    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        # Rewind the random seeds to the forward's, so that dropout masks repeat exactly, and
        # put back every non-trainable variable afterwards (BatchNorm statistics update once).
        before = [tf.identity(v.value) for v in self.state_variables]
        for state, seed in zip(self._seeds, seeds, strict=True):
            state.assign(seed)
        with tf.GradientTape() as tape:
            tape.watch(floats(inputs))
            outputs = self.graph.run(inputs, True)
        var_grads, in_grads = self._gradients(tape, inputs, outputs, out_grads)
        for var, value in zip(self.state_variables, before, strict=True):
            var.assign(value)
        return (var_grads if total is None else add(total, var_grads)), in_grads

    def _gradients(
        self,
        tape: tf.GradientTape,
        inputs: Sequence[tf.Tensor],
        outputs: Sequence[tf.Tensor],
        out_grads: Sequence[tf.Tensor],
    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        wrt_inputs = floats(inputs) if self.index > 0 else []
        sources = list(self.variables) + wrt_inputs
        n = len(self.variables)
        grads = gradients(tape, floats(outputs), sources, out_grads, sparse=n)
        return grads[:n], grads[n:]


def _compiled_forward(graph: StageGraph, training: bool, index: int) -> Compiled:
    def forward(*inputs: tf.Tensor) -> list[tf.Tensor]:
        if index == 0:
            # Nobody needs gradients of the model input, but a tf.function's gradient
            # computes them for all of its inputs: this lets the first layer's input
            # gradient (a whole backward convolution, say) be pruned.
            inputs = tuple(tf.stop_gradient(x) for x in inputs)
        return graph.run(inputs, training)

    return Compiled(forward, f"stage {index}'s forward", autograph=False)


def microbatch_seconds(
    graph: Graph,
    example: Sequence[tf.Tensor],
    repeats: int,
    recompute: bool = False,
    ends: Sequence[int] = (),
) -> list[float]:
    """The median seconds of one microbatch through this module's stage code, as a stage
    before the last runs it, on the nodes ``[0, end)`` of ``graph`` for each of ``ends``
    (the whole graph if none): the compiled forward under a tape, the activations sent
    and received with their inputs' fingerprint (on ``MPI.COMM_SELF``, through the
    executor's own calls), the backward from them and the gradient sum. The prefixes of
    one call are timed in turn, round after round, so that the machine's drift hits them
    alike.

    The profiler fits the runtime's cost per action and the layers' times to these
    (``tfsift.planning.profiler.profile``'s ``stage_call``); it runs in training mode,
    and the profiler puts the variables back afterwards. ``recompute``: as a stage of
    ``optimize="memory"`` runs it, the backward recomputing the forward in one call."""
    from mpi4py import MPI

    from tfsift.parallel.comm import CHECK, FORWARD, PipeComm
    from tfsift.pipeline.executor import FINGERPRINT, fingerprint

    inputs = [tf.convert_to_tensor(x) for x in example]
    check = fingerprint((tuple(inputs), {}))
    # a message to itself: there at once, so a receive costs what the runtime adds to it
    pipe = PipeComm(MPI.COMM_SELF, timeout=60.0, spin=0.0)

    def timed(end: int) -> Callable[[], list[tf.Tensor]]:
        stage = Stage(graph.stage(0, end), 0, recompute=recompute)
        total = [tf.zeros_like(v) for v in stage.variables]
        outputs = floats(stage.forward(inputs, training=True, keep=False)[0])
        specs = [(tuple(y.shape), y.dtype) for y in outputs]

        def microbatch() -> list[tf.Tensor]:
            outputs, saved = stage.forward(inputs, training=True, keep=True)
            assert saved is not None
            pipe.send([fingerprint((tuple(inputs), {}))], 0, CHECK, 0)
            pipe.send(floats(outputs), 0, FORWARD, 0)
            (theirs,) = pipe.recv_arrays([((FINGERPRINT,), tf.float64)], 0, CHECK, 0)
            assert np.array_equal(theirs, check, equal_nan=True)
            grads = pipe.recv(specs, 0, FORWARD, 0)
            pipe.wait()
            # one tensor fetched to end the timing: the sum is made by one compiled call
            return stage.backward(saved, grads, total)[0][:1]

        return microbatch

    # at least 20 runs: the profiler compares the two paths' medians, a fraction of a
    # millisecond apart on a small model (5 runs each once charged the faster one more)
    return medians([timed(end) for end in (ends or [len(graph)])], max(repeats, 20))
