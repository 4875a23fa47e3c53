"""The README's and the docs' Python blocks run as written, on 2 ranks under mpirun.

One job runs every page (``tests/mpi_scripts/docs_check.py``): each page in a namespace and
a directory of its own, its blocks in order, with the reader's own parts (data, a model
where the page writes ``MyModel()``) between them and no block edited. docs/api.md is not
among the pages: it is generated from the docstrings, whose examples test_docs.py checks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow, mpi.TWO_STAGES.mark]

PAGES = [mpi.ROOT / "README.md", *sorted((mpi.ROOT / "docs").glob("*.md"))]
# 4 stages cannot share the job's 2 ranks: its config goes through Config.from_dict only
VALIDATED_ONLY = {"migrating.md": [7]}


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


PAGES_RUN = mpi.TWO_STAGES.scenario("docs_check.py", timeout=400)


@pytest.fixture(scope="module")
def pages() -> dict[int, dict[str, Any]]:
    reports = PAGES_RUN()
    assert sorted(reports) == [0, 1]
    return {rank: got["pages"] for rank, got in reports.items()}


def test_every_python_block_of_the_readme_and_docs_runs(pages: dict[int, dict[str, Any]]) -> None:
    expected = {
        page.name: len(python_blocks(page))
        for page in PAGES
        if page.name != "api.md" and python_blocks(page)
    }
    assert {"README.md", "migrating.md", "sifting.md", "checkpoints.md"} <= set(expected)
    for rank, got in pages.items():
        assert sorted(got) == sorted(expected), f"rank {rank}: pages without a scenario"
        for page, count in expected.items():
            validated = VALIDATED_ONLY.get(page, [])
            assert got[page]["validated"] == validated, (page, rank)
            ran = [i for i in range(count) if i not in validated]
            assert got[page]["ran"] == ran, (
                f"rank {rank}: {page} has {count} Python blocks; docs_check.py ran "
                f"{got[page]['ran']}: give the new block its place in SCENARIOS"
            )


def test_the_readme_loop_is_the_one_the_other_pages_show() -> None:
    loop = python_blocks(mpi.ROOT / "README.md")[0]
    assert "for images, labels in tfsift.shard(dataset)" in loop
    assert "grads = tfsift.allreduce(grads)" in loop
    assert "loss.reduce_mean()" in loop  # how a StepOutput is read


def test_what_the_blocks_claim_holds(pages: dict[int, dict[str, Any]]) -> None:
    for rank, got in pages.items():
        readme = got["README.md"]["findings"]
        assert readme["history"] == ["accuracy", "loss", "val_accuracy", "val_loss"]
        assert "policy/pruned" in readme["sifted"]
        # the InfoBatch loop on tfsift.from_arrays: planned by row, the third epoch pruned
        sifting = got["sifting.md"]["findings"]
        kind, pruned = sifting["by_row"]
        assert kind == "IndexedSiftedDataset" and pruned > 0
        # fit with InfoBatch in one line: the first epoch trains everything, the next prune
        assert sifting["fit_kept"][0] == 1.0 and max(sifting["fit_kept"][1:]) < 1.0
        # the last epoch's metrics, which prunes: a mean where there is one, never NaN
        epoch = sifting["epoch"]
        mean = epoch["mean_loss_scored"]
        assert epoch["epochs"] == 3 and (mean is None or mean == mean)  # NaN != NaN
        assert 0 < epoch["kept_fraction"] < 1 and epoch["batches_yielded"] > 0
        # the same on tfsift.from_rows: load read exactly the rows trained, and fewer
        assert got["sifting.md"]["findings"]["from_rows"] == [True, True]
        ckpt = got["checkpoints.md"]["findings"]
        # max_to_keep=3 of the saves at steps 0, 100, 200, 300; the lock names the job
        assert ckpt["files"] == [".tfsift-lock", "ckpt-100", "ckpt-200", "ckpt-300"]
        # the names the page's comment shows, in its order (whether the dropout, which has
        # no compute to speak of, lands on stage 0 depends on the profile)
        assert ckpt["weights"] in (
            ["d1/kernel", "d1/bias"],
            ["d1/kernel", "d1/bias", "drop1/seed_generator_state"],
        )
        assert ckpt["keras_file"] and ckpt["predictions"] == [4, 10]
        moved = got["migrating.md"]["findings"]
        # "stage 0, the default" and "stage 1" of the manual placement block
        assert moved["placed"] == [["body"], ["head"]][rank]
        assert moved["merged"] == [64, 10]  # logits.merge(): the microbatches joined
