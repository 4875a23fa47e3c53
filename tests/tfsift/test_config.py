"""Config validation: every bad value is named in the error, before anything runs."""

from __future__ import annotations

import json

import pytest

from tfsift.config import Config, parse_bytes


def test_defaults_are_one_stage_one_microbatch_auto_speed() -> None:
    cfg = Config.from_dict({})
    assert (cfg.partitions, cfg.microbatches, cfg.pipeline, cfg.optimize) == (
        1,
        1,
        "auto",
        "speed",
    )
    # virtual stages alone choose interleaved 1F1B on them, as pipeline="interleaved" does
    assert (
        Config.from_dict({"partitions": 2, "microbatches": 4, "virtual_stages": 2}).pipeline
        == "auto"
    )


def test_unknown_key_lists_the_allowed_keys() -> None:
    with pytest.raises(ValueError) as err:
        Config.from_dict({"partitons": 2})
    assert str(err.value).startswith(
        "Unknown tfsift config key 'partitons'. Allowed keys: partitions, "
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"pipeline": "gpipe"},
            "pipeline must be one of 'simple', 'interleaved', 'zero_bubble', 'auto'. "
            "Received: pipeline='gpipe'",
        ),
        (
            {"optimize": "fast"},
            "optimize must be one of 'speed', 'memory'. Received: optimize='fast'",
        ),
        ({"partitions": 0}, "partitions must be an integer >= 1. Received: partitions=0"),
        ({"microbatches": 2.5}, "microbatches must be an integer >= 1. Received: microbatches=2.5"),
        (
            {"placement_strategy": "ring"},
            "placement_strategy must be one of 'cluster', 'spread'. "
            "Received: placement_strategy='ring'",
        ),
        (
            {"partitions": 2, "default_partition": 2},
            "default_partition must be < partitions=2. Received: default_partition=2",
        ),
        (
            {"partitions": 2, "default_partition": 1},
            "default_partition is the stage of the layers outside tfsift.partition blocks when "
            "you place layers by hand; with auto_partition=True the solver places every layer. "
            "Set auto_partition=False, or leave default_partition out. "
            "Received: auto_partition=True, default_partition=1",
        ),
        ({"horovod": "yes"}, "horovod must be true or false. Received: horovod='yes'"),
        (
            {"partitions": 2, "pipeline": "zero_bubble", "virtual_stages": 2},
            "virtual_stages > 1 runs Megatron-LM's interleaved 1F1B: use "
            "pipeline='interleaved' with virtual_stages, or pipeline='zero_bubble' with "
            "virtual_stages=1 (ZB-V, a zero-bubble schedule on virtual stages, is not "
            "supported). Received: pipeline='zero_bubble', virtual_stages=2",
        ),
        (
            {"partitions": 2, "pipeline": "simple", "virtual_stages": 2},
            "virtual_stages > 1 runs Megatron-LM's interleaved 1F1B: use "
            "pipeline='interleaved' with virtual_stages, or pipeline='simple' with "
            "virtual_stages=1. Received: pipeline='simple', virtual_stages=2",
        ),
        (
            {"virtual_stages": 2},
            "virtual_stages > 1 interleaves model chunks over two or more stages: set "
            "partitions >= 2, or virtual_stages=1. Received: partitions=1, virtual_stages=2",
        ),
        (
            {"partitions": 4, "microbatches": 9, "virtual_stages": 2},
            "with virtual_stages > 1, microbatches must be a multiple of max(1, microbatches "
            "// partitions) = 2, the rounds in which each chunk takes them (a multiple of "
            "partitions always is). Received: partitions=4, microbatches=9, virtual_stages=2",
        ),
        (
            {"virtual_stages": 0},
            "virtual_stages must be an integer >= 1. Received: virtual_stages=0",
        ),
        (
            {"partitions": 2, "virtual_stages": 2, "default_partition": 4},
            "default_partition must be < partitions x virtual_stages=4. "
            "Received: default_partition=4",
        ),
    ],
)
def test_bad_values_name_the_constraint_and_the_value(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        Config.from_dict(values)
    assert str(err.value) == message


def test_virtual_stages_are_unset_by_default_and_interleave_or_leave_auto_to_choose() -> None:
    assert Config().virtual_stages is None  # 1, or with pipeline="auto" the plan's choice
    assert Config(partitions=2, microbatches=3, virtual_stages=2).virtual_stages == 2
    assert Config(partitions=4, microbatches=2, pipeline="auto", virtual_stages=2)
    assert Config(partitions=1, pipeline="zero_bubble", virtual_stages=1)  # one chunk: any


def test_memory_cap_accepts_human_units() -> None:
    assert Config.from_dict({"memory_cap": "2GiB"}).memory_cap == 2 * 2**30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1e9") == 10**9


def test_bad_memory_size_is_quoted() -> None:
    with pytest.raises(ValueError, match=r"Received: '8 parsecs'"):
        parse_bytes("8 parsecs")


def test_config_comes_from_the_environment_as_json_or_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("TFSIFT_CONFIG", '{"partitions": 2, "microbatches": 4}')
    assert (Config.from_env().partitions, Config.from_env().microbatches) == (2, 4)
    path = tmp_path / "cfg.json"  # type: ignore[operator]
    path.write_text(json.dumps({"pipeline": "simple"}))
    monkeypatch.setenv("TFSIFT_CONFIG", str(path))
    assert Config.from_env().pipeline == "simple"
    monkeypatch.setenv("TFSIFT_CONFIG", "/nonexistent.json")
    with pytest.raises(ValueError, match="neither JSON nor an existing file"):
        Config.from_env()


def test_timeout_defaults_to_600_seconds_and_takes_any_positive_number() -> None:
    assert Config.from_dict({}).timeout == 600
    assert Config.from_dict({"timeout": 2}).timeout == 2
    assert Config.from_dict({"timeout": 0.5}).timeout == 0.5


@pytest.mark.parametrize("value", [0, -3, "600", True, None, float("nan")])
def test_timeout_must_be_a_number_above_zero(value: object) -> None:
    with pytest.raises(ValueError) as err:
        Config.from_dict({"timeout": value})
    assert str(err.value) == f"timeout must be a number > 0. Received: timeout={value!r}"
