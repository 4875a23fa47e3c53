"""Tracing a subclassed model: node order, tensors live across cuts, stage sub-graphs."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfsift.planning.graph import check_training_branches, trace


class Skip(keras.Model):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4)
        self.b = keras.layers.Dense(4)
        self.c = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        h = self.a(x)
        return self.c(keras.ops.add(self.b(h), h))


def test_nodes_follow_call_order_including_keras_ops() -> None:
    model = Skip()
    graph = trace(model, [tf.zeros((2, 5))])
    ops = [gn.operation for gn in graph.nodes]
    assert ops[0] is model.a and ops[1] is model.b and ops[3] is model.c
    assert type(ops[2]).__name__ == "Add"
    assert len({gn.name for gn in graph.nodes}) == 4


class Heads(keras.Model):  # type: ignore[misc]
    """Two outputs whose keys sort against the order the call makes them."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.aux = keras.layers.Dense(4), keras.layers.Dense(1)
        self.deep, self.head = keras.layers.Dense(4), keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        h = self.body(x)
        reg = self.aux(h)
        return {"cls": self.head(self.deep(h)), "reg": reg}


def test_nodes_follow_call_order_where_dict_outputs_sort_otherwise() -> None:
    # ordered from the outputs flattened (cls before reg): aux after head, and a manual
    # placement of aux on stage 0 was refused as "called after a layer of partition 1"
    model = Heads()
    graph = trace(model, [tf.zeros((2, 5))])
    order = [model.body, model.aux, model.deep, model.head]
    assert [gn.operation for gn in graph.nodes] == order


def test_a_skip_connection_is_live_across_the_cut_it_jumps() -> None:
    graph = trace(Skip(), [tf.zeros((2, 5))])
    h = graph.nodes[0].outputs[0]
    b_out = graph.nodes[1].outputs[0]
    assert graph.live(1) == (h,)
    assert graph.live(2) == (h, b_out)  # h jumps over dense_1 to the add
    assert graph.sample_bytes(graph.live(2)) == 2 * 4 * 4
    assert len(graph.live(3)) == 1


def test_stages_chained_compute_the_whole_model() -> None:
    model = Skip()
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 5)), tf.float32)
    graph = trace(model, [x])
    first, second = graph.stage(0, 2), graph.stage(2, len(graph))
    assert second.inputs == first.outputs
    out = second.run(first.run([x], training=False), training=False)
    want = model.c(model.b(model.a(x)) + model.a(x))
    np.testing.assert_allclose(out[0].numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    assert [len(s.trainable_variables()) for s in (first, second)] == [4, 2]


class Padded(keras.Model):  # type: ignore[misc]
    """Masking, then attention twice: a MultiHeadAttention reads its query's mask from the
    tensor, and deletes its inputs' masks when it runs (not when it is traced)."""

    def __init__(self) -> None:
        super().__init__()
        self.masking = keras.layers.Masking(0.0)
        self.embed = keras.layers.Dense(8)
        self.first = keras.layers.MultiHeadAttention(2, 4)
        self.add = keras.layers.Add()
        self.second = keras.layers.MultiHeadAttention(2, 4)
        self.pool = keras.layers.GlobalAveragePooling1D()

    def call(self, x: Any) -> Any:
        h = self.embed(self.masking(x))
        h = self.add([h, self.first(h, h)])
        return self.pool(self.second(h, h))


def padded_rows() -> tf.Tensor:
    x = np.random.default_rng(0).normal(size=(2, 6, 4)).astype(np.float32)
    x[0, 4:] = x[1, 2:] = 0.0  # padding
    return tf.constant(x)


def test_a_stage_attaches_the_masks_its_inputs_carry_in_one_process() -> None:
    # a stage's inputs come from another stage without the mask Keras attached: a cut
    # before the attention lost its query's mask, and the pooling after it counted the
    # padding, without a word
    model, x = Padded(), padded_rows()
    graph = trace(model, [x])
    graph.find_masks([x])
    first = next(i for i, gn in enumerate(graph.nodes) if gn.operation is model.first)
    second = next(i for i, gn in enumerate(graph.nodes) if gn.operation is model.second)
    want = model(x).numpy()
    for cut in (first, second):
        before, after = graph.stage(0, cut), graph.stage(cut, len(graph))
        got = after.run(before.run([x], training=False), training=False)[0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str(cut))
    # the first attention's query carries the mask; the second's none, as in one process
    # (the first deleted it from the tensors it read), though the trace says it does
    h = graph.nodes[first].inputs[0]
    assert h in graph.masked_reads[first]
    assert not graph.masked_reads[second]
    query = graph.tensors[graph.nodes[second].inputs[0]]
    assert keras.src.backend.get_keras_mask(query) is not None


def test_a_model_without_masks_is_not_run_to_find_them() -> None:
    model = Skip()
    graph = trace(model, [tf.zeros((2, 5))])
    calls = []
    model.a.call = lambda *args, **kwargs: calls.append(1)  # would fail if called
    graph.find_masks([tf.zeros((2, 5))])
    assert calls == [] and graph.masked_reads == [frozenset()] * len(graph)


class HandTied(keras.Model):  # type: ignore[misc]
    """A head tied to the embedding by hand: its weights read in the model's own call."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = keras.layers.Embedding(10, 4, name="tokens")
        self.dense = keras.layers.Dense(4)

    def call(self, ids: Any) -> Any:
        h = self.dense(self.embed(ids))
        return keras.ops.matmul(h, keras.ops.transpose(self.embed.embeddings))


def test_a_layers_weights_read_outside_its_call_are_refused_by_name() -> None:
    # traced, the read was the value at the trace: the head never saw an update and gave
    # the embedding no gradient (weights 0.64 off one process's after 2 epochs, silently)
    with pytest.raises(ValueError) as err:
        trace(HandTied(), [tf.zeros((2, 3), tf.int32)])
    assert str(err.value) == (
        "HandTied.call reads a layer's weights outside that layer's call, where tfsift's "
        "trace of it holds their value when traced, a constant: they would get no gradient "
        "from that use and it would never see their updates. Use them through a call of "
        "their layer (a head tied to an embedding: keras.layers.ReversibleEmbedding, called "
        "with reverse=True), or move the use into a layer of your own. Received: a read of "
        "'tokens/embeddings'"
    )
    trace(Skip(), [tf.zeros((2, 5))])  # weights read in their layers' calls: traced


class HeadHolding(keras.layers.Layer):  # type: ignore[misc]
    """A head that keeps the embedding layer and multiplies by its weights in its call."""

    def __init__(self, embed: Any) -> None:
        super().__init__(name="head")
        self.embed = embed

    def call(self, h: Any) -> Any:
        return keras.ops.matmul(h, keras.ops.transpose(self.embed.embeddings))


class SharedByTwoLayers(keras.Model):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.embed = keras.layers.Embedding(10, 4, name="tokens")
        self.dense = keras.layers.Dense(4)
        self.head = HeadHolding(self.embed)

    def call(self, ids: Any) -> Any:
        return self.head(self.dense(self.embed(ids)))


def test_a_weight_two_layers_hold_on_two_stages_is_refused_by_name() -> None:
    # each stage kept a copy of the embedding trained by its own layer's uses: 0.03 of its
    # weights' sum off one process's after 2 epochs, without a word
    from tfsift.planning.graph import ties

    graph = trace(SharedByTwoLayers(), [tf.zeros((2, 3), tf.int32)])
    assert ties(graph, [0, 3]) == []  # one stage: one copy, the tape adds the uses
    with pytest.raises(ValueError) as err:
        ties(graph, [0, 2, 3])
    assert str(err.value) == (
        "the weight 'tokens/embeddings' belongs to more than one layer, and they run on "
        "different stages: each stage would keep a copy, trained by its own layer's uses "
        "alone. Tie it by calling one layer on every stage that uses it (a head tied to the "
        "embedding: keras.layers.ReversibleEmbedding, called with reverse=True), or keep "
        "those layers on one stage (auto_partition=False and tfsift.partition). Received: "
        "'tokens' on stage 0, 'head' on stage 1"
    )


def test_a_layer_called_on_two_stages_is_a_tie_owned_by_its_first_stage() -> None:
    import keras
    import tensorflow as tf

    from tfsift.planning.graph import ties, trace

    class Tied(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.tied = keras.layers.Dense(4, name="tied")
            self.mid = keras.layers.Dense(4, name="mid")

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.tied(self.mid(self.tied(x)))

    model = Tied()
    graph = trace(model, [tf.ones((2, 4))])
    assert ties(graph, (0, 3)) == []  # nodes tied, mid, tied#1 on one stage
    assert ties(graph, (0, 1, 3)) == ties(graph, (0, 2, 3))
    (tie,) = ties(graph, (0, 2, 3))
    assert tie.layer is model.tied
    assert tie.calls == (("tied", 0), ("tied#1", 1))
    assert (tie.stages, tie.owner) == ((0, 1), 0)


def test_a_layer_with_state_called_on_two_stages_is_refused_by_name() -> None:
    import keras
    import pytest
    import tensorflow as tf

    from tfsift.planning.graph import ties, trace

    class Normed(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.norm = keras.layers.BatchNormalization(name="norm")
            self.mid = keras.layers.Dense(4, name="mid")

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.norm(self.mid(self.norm(x)))

    graph = trace(Normed(), [tf.ones((2, 4))])
    assert ties(graph, (0, 3)) == []
    with pytest.raises(ValueError) as err:
        ties(graph, (0, 2, 3))
    assert str(err.value).startswith("a layer called on several stages may hold only trainable")
    assert str(err.value).endswith(
        "Received: calls 'norm' on stage 0, 'norm#1' on stage 1; non-trainable variables "
        "['norm/moving_mean', 'norm/moving_variance']"
    )


def test_under_mixed_precision_a_cut_carries_the_compute_dtype_at_half_the_bytes() -> None:
    import keras
    import tensorflow as tf

    from tfsift.planning.graph import trace

    def cut_bytes(policy: str) -> tuple[int, str]:
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = keras.Sequential([keras.layers.Dense(8), keras.layers.Dense(4)])
            graph = trace(model, [tf.ones((2, 3))])
            (crossing,) = graph.live(1)  # the first Dense's output, into the second
            return graph.sample_bytes([crossing]), str(graph.tensors[crossing].dtype)
        finally:
            keras.mixed_precision.set_global_policy("float32")

    assert cut_bytes("float32") == (8 * 4, "float32")
    assert cut_bytes("mixed_bfloat16") == (8 * 2, "bfloat16")
    assert cut_bytes("mixed_float16") == (8 * 2, "float16")


class Branching(keras.Model):  # type: ignore[misc]
    """A Python branch on training in the model's own call: not a layer's, so baked into a
    trace (tfsift's fit trained such a model with its inference branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = keras.layers.Dense(4), keras.layers.Dense(1)

    def call(self, x: Any, training: bool = False) -> Any:
        h = self.a(x)
        return self.b(h * 0.0 if training else h)


class Passing(keras.Model):  # type: ignore[misc]
    """training handed to a layer, and ops numbered anew in every trace: one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = keras.layers.Dense(4), keras.layers.Dropout(0.5), Skip()

    def call(self, x: Any, training: bool | None = None) -> Any:
        h = self.a(x)
        return self.b(keras.ops.relu(self.drop(h, training=training) + h) * 2.0)


def test_a_python_branch_on_training_is_refused() -> None:
    with pytest.raises(ValueError) as err:
        check_training_branches(Branching(), [tf.zeros((2, 3))])
    assert str(err.value) == (
        "tfsift traces Branching.call once into a graph of its layers and runs that graph in "
        "every step, training or not; this call takes other layers or ops with training=True "
        "than with training=False (a Python branch on training), so one of them would run the "
        "other's. Move the branch into a layer whose call takes training (Keras passes the "
        "step's on to it), such as keras.layers.Dropout or a layer of your own. Received: 3 "
        "nodes with training=True, 2 with training=False, differing in Multiply"
    )


def test_training_passed_to_layers_is_one_graph_and_the_comparison_leaves_no_calls() -> None:
    model = Passing()
    graph = trace(model, [tf.zeros((2, 3))])
    layers = list(model._flatten_layers(include_self=False))
    traced = [(len(layer._inbound_nodes), len(layer._outbound_nodes)) for layer in layers]
    check_training_branches(model, [tf.zeros((2, 3))])  # ops named add_1, add_2: still equal
    assert [(len(layer._inbound_nodes), len(layer._outbound_nodes)) for layer in layers] == traced
    assert model.a.output is graph.tensors[graph.nodes[0].outputs[0]]  # one call: it has one
