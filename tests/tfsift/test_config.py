"""Config validation: every bad value is named in the error, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tfsift
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
    for missing in ("/nonexistent.json", str(tmp_path)):  # a folder: IsADirectoryError before
        monkeypatch.setenv("TFSIFT_CONFIG", missing)
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


def test_numpy_numbers_are_taken_and_stored_as_python_numbers() -> None:
    cfg = Config.from_dict(
        {
            "partitions": np.int64(2),
            "microbatches": np.int32(4),
            "virtual_stages": np.uint8(2),
            "memory_cap": np.int64(2**30),
            "profile_repeats": np.int16(3),
            "timeout": np.float32(1.5),
        }
    )
    got = (cfg.partitions, cfg.microbatches, cfg.virtual_stages, cfg.memory_cap)
    assert got == (2, 4, 2, 2**30)
    assert (cfg.profile_repeats, cfg.timeout) == (3, 1.5)
    for name in ("partitions", "microbatches", "virtual_stages", "memory_cap", "profile_repeats"):
        assert type(getattr(cfg, name)) is int, name
    assert type(cfg.timeout) is float
    assert type(Config(timeout=np.float64(2.0)).timeout) is float  # a float subclass
    assert type(Config(timeout=np.int64(3)).timeout) is int
    plain = {"microbatches": 4, "virtual_stages": 2, "memory_cap": 2**30, "profile_repeats": 3}
    assert cfg == Config(partitions=2, timeout=1.5, **plain)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"partitions": np.True_},
            "partitions must be an integer >= 1. Received: partitions=np.True_",
        ),
        (
            {"microbatches": True},
            "microbatches must be an integer >= 1. Received: microbatches=True",
        ),
        ({"partitions": np.int64(0)}, "partitions must be an integer >= 1. Received: partitions=0"),
        (
            {"partitions": np.float32(2)},
            "partitions must be an integer >= 1. Received: partitions=2.0",
        ),
        ({"timeout": np.False_}, "timeout must be a number > 0. Received: timeout=np.False_"),
        ({"timeout": np.float32(0)}, "timeout must be a number > 0. Received: timeout=0.0"),
    ],
)
def test_numpy_bools_and_bad_numpy_numbers_are_refused(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        Config.from_dict(values)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ('{"partitions": 1}', "config='{\"partitions\": 1}' (str)"),
        ([], "config=[] (list)"),
        ([("partitions", 2)], "config=[('partitions', 2)] (list)"),
        ("x" * 100, f"config='{'x' * 76}... (str)"),
    ],
)
def test_a_config_that_is_not_a_mapping_is_refused_naming_its_type(
    values: object, shown: str
) -> None:
    for call in (Config.from_dict, tfsift.init):  # tfsift.init copied it with dict() first
        with pytest.raises(TypeError) as err:
            call(values)  # type: ignore[operator]
        assert str(err.value) == (
            "tfsift.init's config must be a mapping of config keys (a dict), a Config, or "
            "None to read TFSIFT_CONFIG; JSON text goes in TFSIFT_CONFIG, or pass "
            f"json.loads(text). Received: {shown}"
        )


@pytest.mark.parametrize("name", ["plan_file", "log_dir"])
@pytest.mark.parametrize("value", ["", 3, b"plan.json"])
def test_path_keys_must_be_non_empty_strings(name: str, value: object) -> None:
    with pytest.raises(ValueError) as err:
        Config.from_dict({name: value})
    assert (
        str(err.value) == f"{name} must be None or a non-empty string. Received: {name}={value!r}"
    )


def test_path_keys_take_path_objects_as_their_strings(tmp_path: Path) -> None:
    cfg = Config.from_dict({"plan_file": tmp_path / "plan.json", "log_dir": tmp_path})
    assert (cfg.plan_file, cfg.log_dir) == (str(tmp_path / "plan.json"), str(tmp_path))


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("[1,2]", "[1, 2] (list)"), ("3", "3 (int)"), ('"run.json"', "'run.json' (str)")],
)
def test_config_from_the_environment_that_is_json_but_no_object_says_what_it_parsed_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, parsed: str
) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(text)
    for raw in (text, str(path)):
        monkeypatch.setenv("TFSIFT_CONFIG", raw)
        with pytest.raises(ValueError) as err:
            Config.from_env()
        assert str(err.value) == (
            "TFSIFT_CONFIG holds JSON but not an object (a mapping of config keys, e.g. "
            f'{{"partitions": 2}}): it parsed to {parsed}. Received: {raw!r}'
        )
    path.write_text("{1")
    monkeypatch.setenv("TFSIFT_CONFIG", str(path))  # a file that is not JSON says so
    with pytest.raises(ValueError, match=r"^TFSIFT_CONFIG is not valid JSON \("):
        Config.from_env()
