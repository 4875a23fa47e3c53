import dataclasses

import numpy as np

from tfsift.sift.metrics import COUNTERS, SiftMetrics


def test_an_epochs_figures_are_the_totals_since_its_start() -> None:
    metrics = SiftMetrics()
    metrics.begin_epoch()
    metrics.samples_seen, metrics.samples_kept = 10, 4
    metrics.record(np.array([1.0, 3.0, np.nan]), np.array([1]), scored=3)
    metrics.begin_epoch()
    metrics.samples_seen, metrics.samples_kept = 20, 12
    metrics.record(np.array([2.0, 4.0]), np.array([0, 1]), scored=2)
    epoch, total = metrics.as_dict(epoch=True), metrics.as_dict()
    assert (epoch["samples_seen"], epoch["samples_kept"], epoch["kept_fraction"]) == (10, 8, 0.8)
    assert (epoch["samples_scored"], epoch["nonfinite_losses"], epoch["epochs"]) == (2, 0, 2)
    assert (epoch["mean_loss_scored"], epoch["mean_loss_kept"]) == (3.0, 3.0)
    assert (total["samples_seen"], total["kept_fraction"]) == (20, 0.6)
    assert total["nonfinite_losses"] == 1
    assert (total["mean_loss_scored"], total["mean_loss_kept"]) == (2.5, 3.0)


def test_a_mean_of_no_scored_loss_is_none_not_nan() -> None:
    metrics = SiftMetrics()
    metrics.begin_epoch()
    metrics.samples_seen = metrics.samples_kept = 8
    for view in (metrics.as_dict(), metrics.as_dict(epoch=True)):
        assert (view["mean_loss_scored"], view["mean_loss_kept"]) == (None, None)
        assert view["kept_fraction"] == 1.0


def test_the_epochs_start_is_saved_and_restored_with_the_totals() -> None:
    metrics = SiftMetrics()
    metrics.samples_seen = 5
    metrics.begin_epoch()
    metrics.samples_seen = 9
    restored = SiftMetrics(**dataclasses.asdict(metrics))
    assert restored.as_dict(epoch=True)["samples_seen"] == 4
    assert set(restored.at_epoch_start) == set(COUNTERS)
    # a state saved before epochs had a start restores as totals
    old = {k: v for k, v in dataclasses.asdict(metrics).items() if k != "at_epoch_start"}
    assert SiftMetrics(**old).as_dict(epoch=True)["samples_seen"] == 9
