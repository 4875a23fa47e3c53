"""The frozen, validated configuration of data sifting."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from tfsift.config import check_bool, check_choice, check_int, plain

POLICIES = (
    "relative",
    "big_loss",
    "small_loss",
    "uniform",
    "grad_norm",
    "adaboost",
    "coreset_extremes",
    "coreset_mean",
    "adaptive",
    "infobatch",
)
METHODS = (
    "uniform",
    "big_loss",
    "small_loss",
    "grad_norm",
    "adaboost",
    "coreset_extremes",
    "coreset_mean",
)
RESCALES = ("normalized", "unbiased")
SCORERS = ("full", "early_exit")
SCORES = ("forward", "training")
LOSS_KINDS = ("auto", "softmax_crossentropy", "squared_error")
TRAINING_SCORE_BATCHES = 8  # score_batches=None with scores="training"
# The experimental fields and their defaults: set otherwise, tfsift.sift.experimental checks them
EXPERIMENTAL = {"scorer": "full", "exit_after": None, "exit_head": None, "exit_lr": 1e-3,
                "overlap": False, "leftover": "score"}  # fmt: skip
AUTO = "auto"  # rescale's default: InfoBatch's weights with policy="infobatch", else none
# The fields whose default follows from others (resolved in __post_init__), and the value
# that asks for it: ``replace`` resolves them again unless it is given them.
IMPLIED: dict[str, object] = {"scores": None, "rescale": AUTO, "score_batches": None, "stale": None}
FRACTION = tuple(p for p in POLICIES if p in METHODS)  # the policies that keep a fraction
# The fields only some policies read: set away from its default for another policy, a
# field would be ignored without a word (InfoBatch given keep=0.3 still prunes by prune)
READ_BY: dict[str, tuple[str, ...]] = {
    "beta": ("relative",), "history": ("relative",), "min_prob": ("relative",),
    "keep": (*FRACTION, "adaptive"), "methods": ("adaptive",), "eta": ("adaptive",),
    "curriculum_T": ("adaptive",), "loss_kind": ("grad_norm", "adaptive"),
    "prune": ("infobatch",), "anneal": ("infobatch",), "epochs": ("infobatch",),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SiftConfig:
    """How batches are scored and which samples are kept.

    Example:
        >>> config = SiftConfig(policy="big_loss", keep=0.25)
        >>> config.replace(keep=0.5).keep
        0.5

        InfoBatch in one line: training scores, its weights, a score table that lasts the
        run; ``fit`` gives it its ``epochs``, a custom loop names them.

        >>> config = SiftConfig(policy="infobatch", epochs=10)
        >>> config.scores, config.rescale, config.stale, config.prune, config.anneal
        ('training', 'unbiased', 10, 0.5, 0.125)

    A field left at a default that follows from others (``scores``, ``rescale``,
    ``score_batches``, ``stale``) is resolved when the config is made and again by
    ``replace``; a value given explicitly is kept, and refused where it conflicts.

    Fields:
        policy: the selection rule; ``"relative"`` is Selective-Backprop (keep sample i
            with probability P_i from its loss percentile), ``"adaptive"`` is
            AdaSelection over ``methods``, ``"infobatch"`` is InfoBatch (prune part of the
            samples below the mean score at each epoch's start, by training scores; it
            needs ``epochs``, which ``fit`` fills in), every other name keeps the fraction
            ``keep``.
        beta: relative only; the exponent in P_i = max(min_prob, p_i ** beta).
            Larger keeps fewer: the long-run kept fraction is 1 / (1 + beta).
        history: relative only; how many recent losses the percentiles come from.
        delay: source batches passed through unsifted before sifting starts.
        min_prob: relative only; the least probability of keeping a sample.
        keep: fraction policies and adaptive; the fraction of each scored batch kept
            (at least one sample).
        methods: adaptive only; the base methods AdaSelection weighs against each other.
        eta: adaptive only; the learning rate of the method weights.
        curriculum_T: adaptive only; T in the curriculum weight T / (T + t), which
            starts favouring easy (small-loss) samples and fades.
        rescale: how the training step reweights kept samples' losses by their keep
            probabilities (``Selection.probs``): None leaves them unweighted,
            ``"unbiased"`` weighs each by 1 / P_i and ``"normalized"`` by 1 / P_i
            divided by the weights' mean; ``"auto"``: ``"unbiased"`` (InfoBatch's
            weights) with ``policy="infobatch"``, else None.
        score_batches: g, source batches read (and scored in one forward pass) per
            round; None: 1 with forward scores (the freshest), 8 with training scores
            (a round then computes nothing, so only its fixed cost, about a millisecond
            on the benchmarks' small models, counts: paid once per 8 batches).
        drop_remainder: whether a kept set smaller than a training batch is dropped at
            the end of the data rather than trained on.
        scorer: ``"full"`` scores with the whole model; ``"early_exit"`` (experimental,
            docs/sifting.md) with the layers up to ``exit_after`` and ``exit_head``.
        exit_after: early_exit only; the name of the layer the scoring pass stops after
            (None: the last of stage 0's, or, with one stage, chosen by profiling).
        exit_head: early_exit only; a Keras layer mapping its output to predictions.
        exit_lr: early_exit only; the learning rate of the exit head.
        stale: epochs a sample's score is reused before it is scored again (0: every
            epoch); with ``scores="training"``, the epochs a recorded loss stays usable
            (at least 1). None: 0 with forward scores, 1 with training scores, and with
            ``policy="infobatch"`` its ``epochs`` (the reference's table, which never
            forgets).
        overlap: early_exit only; score the next round in stage 0's waits for gradients.
        leftover: overlap only; ``"keep"`` keeps unscored what no wait had room to score.
        seed: seeds the random draws of the selection.
        log_dir: where rank 0 writes the metrics as TensorBoard scalars (None: the
            run's ``log_dir`` from ``tfsift.init``, if set; else not written).
        loss_kind: which closed form the grad_norm method uses for the gradient at the
            logits; ``"auto"`` picks from the labels (see ``tfsift.sift.experimental.scores``).
        scores: where the losses the policy ranks come from (None: ``"training"`` with
            ``policy="infobatch"``, else ``"forward"``): ``"forward"`` scores the
            candidates with a forward pass (``scorer``); ``"training"`` runs none and uses
            the loss each sample had when it was last trained, handed back by
            ``SiftedDataset.record`` after each step (a sample never trained, or last
            trained more than ``stale`` epochs ago, is kept unscored).
        prune: infobatch only; r, the fraction of the samples below the mean score pruned
            at each epoch's start (the kept ones among them weigh 1 / (1 - r)).
        anneal: infobatch only; the last fraction of ``epochs`` trained without pruning.
        epochs: infobatch only; the number of epochs the run trains (None: ``fit``'s
            ``epochs``; ``tfsift.sift`` in a loop of your own needs them).
    """

    policy: str = "relative"
    beta: float = 1.0
    history: int = 500
    delay: int = 0
    min_prob: float = 0.0
    keep: float = 0.5
    methods: tuple[str, ...] = METHODS
    eta: float = 1.0
    curriculum_T: float = 1000.0
    rescale: str | None = AUTO
    score_batches: int | None = None
    drop_remainder: bool = True
    scorer: str = "full"
    exit_after: str | None = None
    exit_head: object = None
    exit_lr: float = 1e-3
    stale: int | None = None
    overlap: bool = False
    leftover: str = "score"
    seed: int = 0
    log_dir: str | None = None
    loss_kind: str = "auto"
    scores: str | None = None
    prune: float = 0.5
    anneal: float = 0.125
    epochs: int | None = None
    # the IMPLIED fields this config left to follow from the others (set per instance)
    _implied: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        # a NumPy number (a value computed with NumPy) as the Python number it stands for
        for field in dataclasses.fields(self):
            if isinstance(getattr(self, field.name), np.number):
                object.__setattr__(self, field.name, plain(getattr(self, field.name)))
        implied = frozenset(k for k, v in IMPLIED.items() if getattr(self, k) == v)
        object.__setattr__(self, "_implied", implied)
        check_choice("policy", self.policy, POLICIES)
        if self.epochs is not None:
            check_int("epochs", self.epochs, 1)
        self._resolve("scores", "training" if self.policy == "infobatch" else "forward")
        check_choice("scores", self.scores, SCORES)
        self._resolve("rescale", "unbiased" if self.policy == "infobatch" else None)
        training = self.scores == "training"
        self._resolve("score_batches", TRAINING_SCORE_BATCHES if training else 1)
        infobatch_stale = self.epochs if self.policy == "infobatch" and self.epochs else 1
        self._resolve("stale", infobatch_stale if training else 0)
        check_number("beta", self.beta, "> 0")
        check_int("history", self.history, 1)
        check_int("delay", self.delay, 0)
        check_number("min_prob", self.min_prob, "in [0, 1]")
        check_number("keep", self.keep, "in (0, 1]")
        object.__setattr__(self, "methods", check_methods(self.methods))
        check_number("eta", self.eta, "> 0")
        check_number("curriculum_T", self.curriculum_T, "> 0")
        _check_optional_choice("rescale", self.rescale, (AUTO, *RESCALES))  # AUTO resolved
        check_int("score_batches", self.score_batches, 1)
        check_bool("drop_remainder", self.drop_remainder)
        check_choice("scorer", self.scorer, SCORERS)
        if any(is_set(getattr(self, k), v) for k, v in EXPERIMENTAL.items()):  # when asked for
            from tfsift.sift.experimental.options import check

            check(self)
        check_int("stale", self.stale, 0)
        check_int("seed", self.seed, 0)
        check_optional_name("log_dir", self.log_dir)
        check_choice("loss_kind", self.loss_kind, LOSS_KINDS)
        check_number("prune", self.prune, "in [0, 1)")
        check_number("anneal", self.anneal, "in [0, 1]")
        self._check_read()
        uses = {"grad_norm": True, "adaptive": "grad_norm" in self.methods}
        logits = uses.get(self.policy, False)  # the policy ranks by the model's logits
        if training:
            self._check_training(logits)
        elif self.stale and logits:
            raise ValueError(
                f"stale reuses losses, but policy {self.policy!r} needs fresh logits. "
                f"Received: stale={self.stale}, policy={self.policy!r}"
            )
        if self.policy == "infobatch":
            self._check_infobatch()

    def _check_read(self) -> None:
        """Refuses a field set for a policy (or scorer) that does not read it."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        unread = [
            name
            for name, policies in READ_BY.items()
            if self.policy not in policies and getattr(self, name) != defaults[name]
        ]
        if unread:
            name = unread[0]
            reads = [k for k, policies in READ_BY.items() if self.policy in policies]
            raise ValueError(
                f"{name} is read by {_policies(READ_BY[name])} only; "
                f"policy={self.policy!r} would ignore it"
                + (f" (it reads {', '.join(reads)})" if reads else "")
                + f": leave {name} out. Received: policy={self.policy!r}, "
                f"{name}={getattr(self, name)!r}"
            )

    def _resolve(self, name: str, value: object) -> None:
        """Sets field ``name`` to ``value`` if it was left to follow from the others."""
        if name in self._implied:
            object.__setattr__(self, name, value)

    def _check_training(self, logits: bool) -> None:
        """What ``scores="training"`` rules out: a scorer of its own, ``logits``, stale=0."""
        if self.scorer != "full":
            raise ValueError(
                "scores='training' runs no scoring pass, so it takes no scorer of its own; "
                f"leave scorer='full'. Received: scores='training', scorer={self.scorer!r}"
            )
        if logits:
            raise ValueError(
                "the grad_norm method needs the model's logits, which scores='training' does "
                f"not keep. Received: scores='training', policy={self.policy!r}, "
                f"methods={self.methods!r}"
            )
        if self.stale == 0:  # resolved and checked >= 0 before
            raise ValueError(
                "scores='training' uses the loss a sample had when it was last trained, an "
                "epoch or more before it comes again; stale must be >= 1 (the epochs such a "
                "loss stays usable). Received: scores='training', stale=0"
            )

    def _check_infobatch(self) -> None:
        """InfoBatch prunes by training losses, weighted (its epochs: ``check_epochs``)."""
        if self.scores != "training":
            raise ValueError(
                "policy='infobatch' prunes by the loss each sample had when it was last "
                f"trained; it needs scores='training'. Received: scores={self.scores!r}"
            )
        if self.rescale is None:
            raise ValueError(
                "policy='infobatch' weighs the kept samples below the mean score by "
                "1 / (1 - prune), which the training step must apply; it needs "
                "rescale='unbiased' (InfoBatch's weights) or 'normalized'. Received: rescale=None"
            )

    def check_epochs(self) -> None:
        """Refuses InfoBatch without ``epochs``, where no ``fit`` gives it its own.

        Raises:
            ValueError: ``policy="infobatch"`` and ``epochs=None``.
        """
        if self.policy == "infobatch" and self.epochs is None:
            raise ValueError(
                "policy='infobatch' stops pruning for the last anneal fraction of the run; it "
                "needs epochs (how many epochs you train; fit passes its own). "
                "Received: epochs=None"
            )

    def replace(self, **changes: Any) -> SiftConfig:
        """A copy with ``changes`` applied, validated again; the fields that followed from
        others follow from them again unless ``changes`` names them.

        Example:
            >>> SiftConfig(policy="infobatch").replace(epochs=20).stale
            20
        """
        implied: dict[str, Any] = {k: IMPLIED[k] for k in self._implied if k not in changes}
        return dataclasses.replace(self, **implied, **changes)

    def expected_kept(self) -> float:
        """The long-run fraction of scored samples the policy keeps (delay aside).

        ``relative``: the mean of P = max(min_prob, p ** beta) over percentiles p uniform
        in [0, 1], i.e. 1 / (1 + beta) when min_prob is 0; ``infobatch``: 1 - prune / 2,
        a rough figure (it prunes the fraction prune of the samples below the mean score,
        taken here as half); every other policy: ``keep``.
        The planner uses it to size stage 0's scoring (``overlap``).

        Example:
            >>> SiftConfig(beta=3.0).expected_kept(), SiftConfig(policy="uniform").expected_kept()
            (0.25, 0.5)
        """
        if self.policy == "infobatch":
            return 1.0 - float(self.prune) / 2
        if self.policy != "relative":
            return float(self.keep)
        beta, floor = float(self.beta), float(self.min_prob)
        # max(m, p^b) is m below p* = m^(1/b): m p* + (1 - p*^(b+1)) / (b+1)
        low = floor ** (1 / beta)
        return float(floor * low + (1 - low ** (beta + 1)) / (beta + 1))


# What a number must be, as the error message says it, and the test
BOUNDS = {
    "> 0": lambda v: v > 0,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}


def _policies(names: tuple[str, ...]) -> str:
    """``policy 'relative'``, or ``the policies big_loss, ... and adaptive``."""
    if len(names) == 1:
        return f"policy {names[0]!r}"
    return f"the policies {', '.join(names[:-1])} and {names[-1]}"


def check_number(name: str, value: object, bound: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number. Received: {name}={value!r}")
    if not BOUNDS[bound](value):
        raise ValueError(f"{name} must be {bound}. Received: {name}={value!r}")


def _check_optional_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise ValueError(
            f"{name} must be None or one of {', '.join(map(repr, allowed))}. "
            f"Received: {name}={value!r}"
        )


def check_optional_name(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be None or a non-empty string. Received: {name}={value!r}")


def is_set(value: object, default: object) -> bool:
    """Whether ``value`` is other than ``default`` (an array or a layer is never equal)."""
    return not (value is default or (type(value) is type(default) and value == default))


def check_methods(value: object) -> tuple[str, ...]:
    """`value` as a tuple of known, distinct AdaSelection methods."""
    if isinstance(value, str) or not isinstance(value, tuple | list) or not value:
        raise ValueError(
            f"methods must be a non-empty list of method names. Received: methods={value!r}"
        )
    methods = tuple(value)
    if any(method not in METHODS for method in methods):
        raise ValueError(
            f"methods must be among {', '.join(map(repr, METHODS))}. Received: methods={methods!r}"
        )
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods must not repeat a method. Received: methods={methods!r}")
    return methods
