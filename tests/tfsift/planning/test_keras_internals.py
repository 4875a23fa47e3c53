"""Each private Keras API tfsift relies on still behaves as planning/keras_internals.py says."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfsift.planning import keras_internals


def test_producer_finds_the_node_that_made_a_symbolic_tensor() -> None:
    dense = keras.layers.Dense(3)
    out = dense(keras.Input((4,)))
    assert keras_internals.producer(out).operation is dense


def test_a_node_reruns_on_concrete_values_with_its_recorded_arguments() -> None:
    inp = keras.Input((4,))
    drop = keras.layers.Dropout(0.999, seed=1)
    out = drop(inp)
    node = keras_internals.producer(out)
    ones = tf.ones((2, 4))
    (inference,) = keras_internals.call_node(node, {id(inp): ones}, training=False)
    (trained,) = keras_internals.call_node(node, {id(inp): ones}, training=True)
    np.testing.assert_array_equal(inference.numpy(), ones.numpy())
    assert not np.array_equal(trained.numpy(), ones.numpy())  # training=True reached it


def test_layers_take_the_training_flag_and_ops_do_not() -> None:
    inp = keras.Input((4,))
    relu = keras_internals.producer(keras.ops.relu(inp)).operation
    assert keras_internals.takes_training(keras.layers.Dropout(0.5))
    assert keras_internals.takes_training(keras.layers.Dense(2))
    assert not keras_internals.takes_training(relu)


def test_seed_states_include_sub_layers_generators() -> None:
    inner = keras.layers.Dropout(0.5, seed=3)
    block = keras.Sequential([keras.layers.Dense(2), inner])
    states = keras_internals.seed_states(block)
    assert len(states) == 1 and states[0] is inner.seed_generator.state


def test_free_drops_the_buffer_and_reading_or_assigning_it_says_why() -> None:
    # Keras said "'NoneType' object is not callable" (or has no attribute 'assign')
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    assert not keras_internals.is_freed(dense.kernel)
    keras_internals.free(dense.kernel, "held by stage 1")
    assert keras_internals.is_freed(dense.kernel)
    for use in (
        dense.get_weights,
        dense.kernel.numpy,
        lambda: dense.kernel.assign(np.ones((3, 2))),
    ):
        with pytest.raises(ValueError, match=r"^held by stage 1$"):
            use()
    assert float(dense.bias.numpy().sum()) == 0.0  # the others as they were


def test_the_recorder_lists_assigned_variables_in_order_and_applies_nothing() -> None:
    a, b = keras.Variable(1.0, name="a"), keras.Variable(2.0, name="b")
    with keras_internals.AssignmentRecorder() as recorder:
        b.assign_add(1.0)
        a.assign(5.0)
        b.assign_add(1.0)
        assert float(b.value) == 4.0  # reads inside see the recorded value
    assert recorder.assigned == [b, a]
    assert (float(a.numpy()), float(b.numpy())) == (1.0, 2.0)


def test_stateful_leaves_the_recorder_for_the_block() -> None:
    a = keras.Variable(1.0)
    with keras_internals.AssignmentRecorder() as recorder:
        with keras_internals.stateful():
            a.assign(3.0)
            dense = keras.layers.Dense(2)
            dense.build((None, 3))
        assert not keras_internals.is_freed(dense.kernel)  # created for real, not deferred
        a.assign(7.0)
    assert recorder.assigned == [a] and float(a.numpy()) == 3.0


def test_global_reductions_clip_by_the_given_norm_in_keras_formula() -> None:
    grads = [tf.constant([3.0, 4.0])]  # a norm of 5 here; the whole model's is said to be 10
    variables = [keras.Variable([0.0, 0.0])]
    sgd = keras.optimizers.SGD(1.0, global_clipnorm=2.0)
    assert keras_internals.clips_by_global_norm(sgd) and keras_internals.keras_clipping(sgd)
    with keras_internals.global_reductions(sgd, lambda g: tf.constant(10.0), None):
        sgd.apply(grads, variables)
    np.testing.assert_allclose(variables[0].numpy(), [-0.6, -0.8], rtol=1e-6)  # x 2 / 10
    sgd.apply(grads, variables)  # the block is over: Keras' own norm (5) again
    np.testing.assert_allclose(variables[0].numpy(), [-1.8, -2.4], rtol=1e-6)  # x 2 / 5
    assert "_clip_gradients" not in vars(sgd)


def test_global_reductions_decide_a_loss_scale_skip_by_the_given_verdict() -> None:
    variables = [keras.Variable([1.0])]
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    assert keras_internals.keras_finite_check(scaled)
    with keras_internals.global_reductions(scaled, None, lambda g: tf.constant(False)):
        scaled.apply([tf.constant([4.0])], variables)  # finite here, not on another stage
    assert variables[0].numpy() == [1.0] and float(scaled.dynamic_scale.numpy()) == 2.0
    scaled.apply([tf.constant([4.0])], variables)  # unscaled by 2: a step of 2
    assert variables[0].numpy() == [-1.0]


def test_subclasses_with_their_own_clipping_or_finite_check_are_told_apart() -> None:
    class Clips(keras.optimizers.SGD):  # type: ignore[misc]
        def _clip_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
            return grads

    class Checks(keras.optimizers.LossScaleOptimizer):  # type: ignore[misc]
        def check_finite(self, grads: list[tf.Tensor]) -> tf.Tensor:
            return tf.constant(True)

    assert not keras_internals.keras_clipping(Clips(global_clipnorm=1.0))
    assert not keras_internals.keras_finite_check(Checks(keras.optimizers.SGD()))
    assert not keras_internals.clips_by_global_norm(keras.optimizers.SGD(clipnorm=1.0))


def test_a_functions_forward_keeps_what_its_backward_reads_and_the_backward_prunes() -> None:
    dense = keras.layers.Dense(3, activation="tanh")
    x = tf.ones((2, 4))
    dense(x)
    function = tf.function(lambda x: dense(x))
    concrete = function.get_concrete_function(tf.TensorSpec((2, 4)))
    forward, backward = keras_internals.forward_backward(concrete)
    outputs = forward.call_flat(x, *concrete.captured_inputs)
    assert len(outputs) > 1  # the output, then the intermediates the gradient reads
    at = {id(t): i for i, t in enumerate(concrete.graph.outputs)}
    captures = [outputs[at[id(c)]] if id(c) in at else c for c in backward.captured_inputs]
    dy = tf.ones((2, 3))
    grads = keras_internals.call_backward(backward, [dy], captures)
    # the same compiled function's gradient: eagerly, oneDNN's kernels round otherwise than
    # its fused graph (up to 2e-7 in 19 of 30 random kernels on an AVX-512 CPU)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = function(x)
    want = tape.gradient(y, [x, dense.kernel, dense.bias], output_gradients=dy)
    assert len(grads) == 3  # the input, then each captured variable, in capture order
    for got, expected in zip(grads, want, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)


def test_calls_made_within_calls_forgotten_leave_each_layer_its_nodes() -> None:
    dense = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((3,)), dense])
    before = (len(dense._inbound_nodes), len(dense._outbound_nodes))
    with keras_internals.calls_forgotten(model):
        keras.layers.Dense(1)(dense(keras.Input((3,))))
        assert len(dense._inbound_nodes) == before[0] + 1
    assert (len(dense._inbound_nodes), len(dense._outbound_nodes)) == before


def test_a_mask_is_read_and_attached_where_keras_keeps_it() -> None:
    # Keras keeps a tensor's padding mask on the tensor (``_keras_mask``), symbolic or not
    inp = keras.Input((3,), dtype="int32")
    embedded = keras.layers.Embedding(5, 2, mask_zero=True)(inp)
    assert keras_internals.mask(embedded) is not None and keras_internals.mask(inp) is None
    value, mask = tf.ones((1, 3, 2)), tf.constant([[True, False, True]])
    keras_internals.attach_mask(value, mask)
    assert keras_internals.mask(value) is mask


def test_mask_arguments_filled_in_at_the_trace_are_left_to_the_call() -> None:
    # Layer.__call__ fills ``mask`` in from its input's mask and the trace records it; a
    # rerun leaves it out, so that the call fills it in from the mask its input has then
    inp = keras.Input((3,), dtype="int32")
    embedded = keras.layers.Embedding(5, 2, mask_zero=True)(inp)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    node = keras_internals.producer(pooled)
    assert "mask" in node.arguments.kwargs
    values = {id(embedded): tf.constant([[[1.0, 1.0], [3.0, 3.0], [5.0, 5.0]]])}
    _, kwargs = keras_internals.node_arguments(node, values)
    assert "mask" not in kwargs
    keras_internals.attach_mask(values[id(embedded)], tf.constant([[True, False, True]]))
    (out,) = keras_internals.call_node(node, values)
    assert out.numpy().tolist() == [[3.0, 3.0]]  # (1 + 5) / 2: the masked step skipped


def test_weights_read_outside_every_layers_call_are_listed_once() -> None:
    embed, dense = keras.layers.Embedding(5, 2), keras.layers.Dense(2)
    embed.build((1,))
    with keras_internals.weights_read_outside() as reads:
        dense(embed(tf.constant([[1]])))  # read inside their calls
        keras.ops.transpose(embed.embeddings)  # read outside them, twice
        keras.ops.sum(embed.embeddings)
    assert reads == [embed.embeddings]


def test_the_input_signature_of_a_functional_model_never_called_is_its_inputs_specs() -> None:
    x = keras.Input((3,), name="features")
    tokens = keras.Input((4,), dtype="int32", name="tokens")
    model = keras.Model({"features": x, "tokens": tokens}, keras.layers.Dense(2)(x))
    (signature,) = keras_internals.input_signature(model)
    assert {name: (spec.shape, spec.dtype) for name, spec in signature.items()} == {
        "features": ((None, 3), "float32"),
        "tokens": ((None, 4), "int32"),
    }
