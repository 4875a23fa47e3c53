"""A stage without trainable variables takes its part in the sums the other stages' update
makes over the pipeline, under real mpirun (tests/mpi_scripts/update_check.py): ``fit``
and the README's loop with ``global_clipnorm``, a ``LossScaleOptimizer`` and
``gradient_accumulation_steps`` train as one process does, where they used to wait for
that stage until the job's timeout. Keras' own ``apply_gradients`` of a stage's gradients,
whose norm or finite check would see that stage alone, is refused. fit and evaluate add
the regularized weights' penalties of every stage, as one process's Keras model does, and
refuses a layer's add_loss on every rank."""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOB = mpi.TWO_STAGES.scenario("update_check.py", timeout=120)


@mpi.TWO_STAGES.mark
def test_a_stage_without_variables_joins_the_global_norm_and_finite_check() -> None:
    reports = JOB()
    assert sorted((r["stage"], r["variables"]) for r in reports.values()) == [(0, 4), (1, 0)]
    for rep in reports.values():
        keys = ("fit_clipnorm", "fit_loss_scale", "fit_accumulated", "fit_ema", "loop_loss_scale")
        for key in keys:
            assert rep[key] < 1e-6, (key, rep)  # the whole model's weights, one process's


CLIPS = (
    "on a pipeline, an optimizer's own apply (apply_gradients) with global_clipnorm would "
    "clip this stage's gradients by their own norm, not the whole model's. Update with "
    "update = tfsift.compiled_update(optimizer, model), or fit, which clip by the norm over "
    "every stage, or clip with tfsift.clip_by_global_norm(grads, clip_norm, model) and pass "
    "an optimizer without global_clipnorm. Received: SGD(global_clipnorm=0.01) updating a "
    "stage's variables"
)


@mpi.TWO_STAGES.mark
def test_apply_gradients_refuses_a_norm_or_finite_check_of_one_stage() -> None:
    reports = JOB()
    by_stage = {r["stage"]: r["apply_gradients"] for r in reports.values()}
    assert by_stage[0] == {
        "plain": "applied",  # nothing it computes spans the gradients
        "ema": "applied",  # nor do moving averages
        "clipnorm": CLIPS,
        "accumulated": CLIPS,
        "loss_scale": "on a pipeline, a LossScaleOptimizer's own apply (apply_gradients) "
        "would skip a step on the stages whose gradients are not finite and take it on the "
        "others. Update with update = tfsift.compiled_update(optimizer, model), or fit, "
        "which skip it on every stage when any stage's gradients are not finite. Received: "
        "LossScaleOptimizer(SGD) updating a stage's variables",
    }
    assert set(by_stage[1].values()) == {"no variables"}


@mpi.TWO_STAGES.mark
def test_fit_and_evaluate_add_every_stages_weight_penalties() -> None:
    for rep in JOB().values():
        assert rep["penalty"] > 0.1  # left out, losses and weights would differ far more
        assert rep["penalized_loss_error"] < 1e-5, rep
        assert rep["penalized_evaluate_error"] < 1e-5, rep
        assert rep["penalized_weights_error"] < 1e-6, rep


@mpi.TWO_STAGES.mark
def test_the_loop_adds_every_stages_weight_penalties_after_allreduce() -> None:
    for rep in JOB().values():
        assert rep["losses_refused"] == (
            "model.losses cannot join the loss inside a @tfsift.step function: on a pipeline "
            "each stage holds only its own weights. Leave the penalties out of the loss and "
            "add them after tfsift.allreduce with grads, penalty = "
            "tfsift.add_weight_penalties(grads, model, optimizer) (fit adds them itself). "
            "Received: regularized.losses read inside a step function"
        )
        assert rep["loop_penalized_weights_error"] < 1e-6, rep
        assert rep["loop_penalty"] > 0.1, rep


@mpi.TWO_STAGES.mark
def test_fit_refuses_add_loss_on_every_stage() -> None:
    for rep in JOB().values():
        assert rep["add_loss"] == (
            "tfsift's fit adds the penalties of regularized weights to the loss as Keras "
            "does, but not the losses a layer adds in call (add_loss), which depend on each "
            "microbatch's activations on its stage. Add them to the loss in a @tfsift.step "
            "loop, or regularize the weights. Received: add_loss in layer 'penalized'"
        )


@mpi.TWO_STAGES.mark
def test_fit_refuses_a_mask_on_the_output_on_every_stage() -> None:
    # Keras' loss would average over the unmasked positions only; fit's counted them all
    for rep in JOB().values():
        assert rep["output_mask"] == (
            "tfsift's fit and evaluate do not weigh the loss by a mask on the model's output, "
            "as Keras' losses do (padding from Embedding(mask_zero=True) or Masking that "
            "reaches the output): the loss would count the masked positions. Stop the mask "
            "before the output and pass the padding as sample_weight, or weigh the loss "
            "yourself in a @tfsift.step loop. Received: a mask on output 0 of model 'padded'"
        )


@mpi.TWO_STAGES.mark
def test_a_layer_frozen_after_the_first_step_is_refused_on_every_stage() -> None:
    # the stages would compute the gradients of the weights trainable at the first step
    for rep in JOB().values():
        assert rep["refrozen"] == (
            "a layer's trainable flag changed after the model was partitioned; tfsift fixes "
            "each stage's trainable weights when it partitions the model (its first step). "
            "Set trainable before the first step: for fine-tuning, save the weights "
            "(model.save_weights or a CheckpointManager) and load them into a new model with "
            "the layers frozen. Received: A/kernel (trainable=False), A/bias (trainable=False)"
        )


@mpi.TWO_STAGES.mark
def test_a_regularized_embedding_tied_across_stages_trains_as_in_one_process() -> None:
    for rep in JOB().values():
        assert rep["tied_held"] == ["embed/embeddings"]  # a copy on each stage
        assert rep["tied_loss_error"] < 1e-5, rep  # the penalty counted once
        assert rep["tied_weights_error"] < 1e-6, rep  # its gradient on both copies
