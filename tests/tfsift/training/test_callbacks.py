"""Keras' own messages during fit, evaluate and predict: printed once, on rank 0."""

from __future__ import annotations

from types import SimpleNamespace

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
