"""Selection policies: per-sample losses in, kept indices out (NumPy only).

``relative`` (Selective-Backprop: ``tfsift.sift.relative``) is the core's; ``infobatch``
selects by its epoch's plan (``tfsift.sift.infobatch``). The fraction policies
(``big_loss``, ``small_loss``, ``uniform``, ``grad_norm``, ``adaboost``,
``coreset_extremes``, ``coreset_mean``: ``tfsift.sift.experimental.fraction``) and
AdaSelection's ``adaptive`` (``tfsift.sift.experimental.adaptive``) showed no gain on
the tasks measured (docs/benchmarks-log.md): they are the experimental part's, imported
when a config names one. ``make_policy`` builds any of them behind one interface,
``tfsift.sift.selection.Policy``.
"""

from __future__ import annotations

from tfsift.sift.config import SiftConfig
from tfsift.sift.relative import RelativePolicy
from tfsift.sift.selection import Policy


def make_policy(config: SiftConfig) -> Policy:
    """The policy `config` names, with its parameters.

    Example:
        >>> make_policy(SiftConfig(policy="big_loss", keep=0.5)).select([3.0, 1.0]).indices
        array([0])
    """
    if config.policy == "relative":
        return RelativePolicy(config.beta, config.history, config.min_prob)
    if config.policy == "adaptive":  # AdaSelection: the experimental part, when asked for
        from tfsift.sift.experimental.adaptive import AdaptivePolicy

        return AdaptivePolicy(
            config.methods, config.keep, config.eta, config.curriculum_T, config.loss_kind
        )
    from tfsift.sift.experimental.fraction import FractionPolicy  # as adaptive

    return FractionPolicy(config.policy, config.keep, config.loss_kind)
