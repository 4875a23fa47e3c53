"""Keras' progress bar for a sifted ``fit``: each epoch counts the batches it trained."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras


class SiftedProgbar(keras.callbacks.ProgbarLogger):  # type: ignore[misc]
    """Keras' ``ProgbarLogger``, whose count is each epoch's own.

    Keras takes the first epoch's count as every epoch's (``45/45`` on an epoch that
    trained 30 batches); a sifted epoch trains as many batches as its samples kept fill.
    Each epoch starts without a target, takes ``planned()`` once it is known (InfoBatch
    by row plans the epoch at its start; ``steps_per_epoch`` caps it), and ends at the
    batches it trained.
    """

    target: int | None  # Keras' attribute: the epoch's count, None until known

    def __init__(self, planned: Callable[[], int | None], steps: int | None) -> None:
        super().__init__()
        self._planned, self._steps = planned, steps

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.target = None
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.target is None and self.progbar is not None:
            planned = self._planned()
            if planned is not None:
                self.target = planned if self._steps is None else min(planned, self._steps)
                self.progbar.target = self.target
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not self.seen:  # Keras' bar cannot end at 0 of 0
            return
        self.target = self.seen
        if self.progbar is not None:
            self.progbar.target = self.seen
        super().on_epoch_end(epoch, logs)
