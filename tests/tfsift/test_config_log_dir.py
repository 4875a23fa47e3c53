"""The ``log_dir`` key of ``tfsift.init``'s config: where the run log goes."""

from __future__ import annotations

import pytest

from tfsift.config import Config


def test_log_dir_is_unset_by_default_and_takes_a_path() -> None:
    assert Config.from_dict({}).log_dir is None
    assert Config.from_dict({"log_dir": "runs/exp1"}).log_dir == "runs/exp1"


def test_log_dir_comes_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFSIFT_CONFIG", '{"partitions": 2, "log_dir": "runs/exp2"}')
    assert Config.from_env().log_dir == "runs/exp2"


@pytest.mark.parametrize("value", ["", 3, True, ["runs"]])
def test_log_dir_must_be_a_non_empty_string(value: object) -> None:
    with pytest.raises(ValueError) as err:
        Config.from_dict({"log_dir": value})
    assert (
        str(err.value) == f"log_dir must be None or a non-empty string. Received: log_dir={value!r}"
    )
