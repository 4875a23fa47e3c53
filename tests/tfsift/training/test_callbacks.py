"""Keras' own messages during fit, evaluate and predict: printed once, on rank 0."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import keras
import pytest
from keras.src.utils import io_utils

from tfsift.parallel import runtime
from tfsift.training import callbacks


@pytest.mark.parametrize("rank", [0, 1])
def test_keras_messages_print_on_rank_0_alone(
    rank: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # TerminateOnNaN prints through io_utils whatever its verbose: "Batch 1: Invalid
    # loss, terminating training" came once per rank, where the docs say once
    monkeypatch.setattr(runtime, "get", lambda: SimpleNamespace(rank=rank))
    with callbacks.quiet_elsewhere():
        io_utils.print_msg("Batch 1: Invalid loss, terminating training")
    assert capsys.readouterr().out == (
        "" if rank else "Batch 1: Invalid loss, terminating training\n"
    )
    assert keras.config.is_interactive_logging_enabled()  # as it was after


def test_a_tensorboard_whose_epoch_end_rank_0_cannot_do_alone_is_refused(tmp_path: Any) -> None:
    # histogram_freq on 2 stages failed at the first epoch's end, reading a stage-1 weight
    # on rank 0; embeddings_freq on 2 ranks left rank 0 alone in model.save_weights until
    # the timeout, which then named a stalled rank
    board = keras.callbacks.TensorBoard
    callbacks.check_tensorboard([board(str(tmp_path), histogram_freq=1)], partitions=1, size=2)
    callbacks.check_tensorboard([board(str(tmp_path), embeddings_freq=1)], partitions=1, size=1)
    callbacks.check_tensorboard([board(str(tmp_path), write_images=True)], partitions=2, size=4)
    with pytest.raises(ValueError) as err:
        callbacks.check_tensorboard([board(str(tmp_path), histogram_freq=2)], 2, 2)
    assert str(err.value) == (
        "keras.callbacks.TensorBoard(histogram_freq=...) logs every layer's weights from "
        "rank 0, which holds only stage 0's on a pipeline of 2 stages. Pass histogram_freq=0 "
        "(the metrics still log), or log weights in a callback of your own from "
        "model.get_weights(), which every rank calls. Received: histogram_freq=2, partitions=2"
    )
    with pytest.raises(ValueError) as err:
        callbacks.check_tensorboard([board(str(tmp_path), embeddings_freq=1)], 1, 2)
    assert str(err.value) == (
        "keras.callbacks.TensorBoard(embeddings_freq=...) saves the model's weights from rank 0 "
        "alone, and tfsift's model.save_weights is called on every rank together. Pass "
        "embeddings_freq=0, and save weights with keras.callbacks.ModelCheckpoint(path, "
        "save_weights_only=True), which every rank runs. Received: embeddings_freq=1 on 2 ranks"
    )
