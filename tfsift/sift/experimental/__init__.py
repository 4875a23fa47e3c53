"""Sifting's experimental part: early-exit scoring on stage 0 (SIFT), overlap, AdaSelection.

What never paid on any task measured (docs/sifting.md, docs/benchmarks.md) is kept here,
apart from the core of ``tfsift.sift``: ``SiftConfig(scorer="early_exit")`` scores with
stage 0's layers and a small head that learns online (``early_exit``, ``exit_head``;
``collectives``: the head's exchanges between the replicas),
``overlap=True`` in stage 0's waits for gradients (``overlap``), and
``policy="adaptive"`` weighs the selection methods against each other (``adaptive``;
``scores``: the gradient norms and AdaBoost weights its grad_norm and adaboost rank by),
each of which is a policy of its own too (``fraction``: ``big_loss``, ``uniform``, ...);
``options`` checks the config's fields for the early exit and overlap. The core reaches
it only when a config asks for it (``tfsift.sift.transform``, ``tfsift.sift.policies``,
``tfsift.sift.config``), and it reaches the runtime only through ``tfsift.hooks``:
room on stage 0 in the plan, and stage 0's waits.
"""
