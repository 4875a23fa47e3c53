"""An embedding not tied to a head trains as in one Keras process
(tests/mpi_scripts/sparse_check.py): its gradient stays a lookup's ``tf.IndexedSlices``
through the microbatches' sum, the replicas' average and the pipeline's global norm, so
Adam squares each looked-up row, and ``global_clipnorm``, ``clipnorm`` and ``clipvalue``
clip by the rows, as Keras does with one process's tape. Summed dense, as tfsift did,
they trained otherwise without a word (0.17 apart after 2 epochs with Adam on 2 stages).
On 2 stages (each schedule, 2 virtual stages a rank, ``optimize="memory"``, and a table
looked up on both stages, as an encoder and a decoder share one), 2 stages x 2 replicas
and 1 stage x 2 replicas; in ``fit`` and in the README's loop with
``tfsift.clip_by_global_norm`` (against a Keras loop with ``tf.clip_by_global_norm``).
"""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

EXACT = 1e-5  # float rounding (the rows added in another order), which Adam scales up
EVERY = "adam,adamw_global_clipnorm,rmsprop_clipnorm,adagrad_clipvalue,loop"
ON_TWO_STAGES = mpi.TWO_STAGES.scenario(
    "sparse_check.py",
    f"-:{EVERY}",
    "zero_bubble@1GB:adam,loop",
    "memory:adam",
    "interleaved/2:adam",
    "shared:adam,adamw_global_clipnorm",
    timeout=300,
)
ON_ONE_STAGE = mpi.TWO_REPLICAS.scenario("sparse_check.py", "dp:adam,rmsprop_clipnorm,loop")
ON_2X2 = mpi.CLUSTER_2X2.scenario("sparse_check.py", "-:adam,adamw_global_clipnorm,loop")


def check(reports: mpi.Reports, configs: list[str]) -> None:
    for rep in reports.values():
        assert sorted(rep["errors"]) == sorted(configs), rep
        for name, error in rep["errors"].items():
            assert error < EXACT, (name, rep)


@mpi.TWO_STAGES.mark
def test_two_stages_train_a_lookup_table_as_one_process() -> None:
    configs = [f"-:{EVERY}/{k}" for k in EVERY.split(",")]
    configs += ["zero_bubble@1GB:adam,loop/adam", "zero_bubble@1GB:adam,loop/loop"]
    configs += ["memory:adam/adam", "interleaved/2:adam/adam"]
    configs += ["shared:adam,adamw_global_clipnorm/adam"]
    configs += ["shared:adam,adamw_global_clipnorm/adamw_global_clipnorm"]
    reports = ON_TWO_STAGES()
    check(reports, configs)
    # the table shared by both stages: their rows joined (summed dense: 0.44 apart)
    assert all(r["tied"] for r in reports.values())


@mpi.CLUSTER_2X2.mark
def test_two_stages_by_two_replicas_gather_the_replicas_rows() -> None:
    configs = [
        f"-:adam,adamw_global_clipnorm,loop/{k}" for k in ("adam", "adamw_global_clipnorm", "loop")
    ]
    check(ON_2X2(), configs)


@mpi.TWO_REPLICAS.mark
def test_one_stage_by_two_replicas_gathers_the_replicas_rows() -> None:
    configs = [f"dp:adam,rmsprop_clipnorm,loop/{k}" for k in ("adam", "rmsprop_clipnorm", "loop")]
    check(ON_ONE_STAGE(), configs)
