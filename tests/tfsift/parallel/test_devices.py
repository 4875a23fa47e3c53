"""One GPU per local rank, with TensorFlow's device functions stood in for (no GPU here)."""

from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

import tfsift
from tfsift.parallel import devices


class FakeConfig:
    """The ``tf.config`` calls ``devices.pin`` makes, recorded; ``initialised`` makes the
    changes raise as TensorFlow does once its devices are in use."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: int, initialised: bool = False):
        self.gpus = [f"GPU{i}" for i in range(gpus)]
        self.visible: list[Any] = []
        self.growth: list[Any] = []
        self.initialised = initialised
        monkeypatch.setattr(tf.config, "list_physical_devices", self.list_physical_devices)
        monkeypatch.setattr(tf.config, "set_visible_devices", self.set_visible_devices)
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", self.set_memory_growth)

    def list_physical_devices(self, kind: str) -> list[Any]:
        return list(self.gpus) if kind == "GPU" else []

    def set_visible_devices(self, device: Any, kind: str) -> None:
        if self.initialised:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible.append((device, kind))

    def set_memory_growth(self, device: Any, enable: bool) -> None:
        self.growth.append((device, enable))


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFSIFT_PIN_GPU", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize("local_rank", [0, 3])
def test_each_local_rank_sees_only_its_own_gpu_with_memory_growth(
    monkeypatch: pytest.MonkeyPatch, local_rank: int
) -> None:
    fake = FakeConfig(monkeypatch, gpus=4)
    assert devices.pin(local_rank, 4) == local_rank
    assert fake.visible == [(f"GPU{local_rank}", "GPU")]
    assert fake.growth == [(f"GPU{local_rank}", True)]


def test_fewer_ranks_than_gpus_leave_the_rest_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeConfig(monkeypatch, gpus=8)
    assert devices.pin(1, 2) == 1 and fake.visible == [("GPU1", "GPU")]


def test_no_gpu_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeConfig(monkeypatch, gpus=0)
    assert devices.pin(0, 2) is None
    assert fake.visible == fake.growth == []


@pytest.mark.parametrize(
    ("name", "value"),
    [("TFSIFT_PIN_GPU", "0"), ("TFSIFT_PIN_GPU", "off"), ("CUDA_VISIBLE_DEVICES", "2")],
)
def test_the_user_can_keep_devices_as_they_are(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    fake = FakeConfig(monkeypatch, gpus=1)  # one GPU for three ranks: pinning would refuse
    monkeypatch.setenv(name, value)
    assert devices.pin(2, 3) is None
    assert fake.visible == fake.growth == []


def test_several_cuda_visible_devices_are_shared_out_one_per_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeConfig(monkeypatch, gpus=2)  # TensorFlow lists the two CUDA lets it see
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert devices.pin(1, 2) == 1 and fake.visible == [("GPU1", "GPU")]


def test_more_ranks_on_a_host_than_gpus_is_refused_with_both_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeConfig(monkeypatch, gpus=2)
    with pytest.raises(ValueError) as err:
        devices.pin(0, 4)
    assert str(err.value) == (
        "tfsift.init gives every rank of a host its own GPU, so a host may run at most as "
        "many ranks as it has GPUs: start at most 2 ranks per host (tfsift run -np N -H "
        "host1:2,host2:2 ...), or set TFSIFT_PIN_GPU=0 and place the ranks yourself (ranks "
        "sharing a GPU must then limit their memory). Received: 4 ranks on this host, 2 GPUs"
    )


def test_devices_already_in_use_say_to_call_init_first(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeConfig(monkeypatch, gpus=2, initialised=True)
    with pytest.raises(RuntimeError) as err:
        devices.pin(1, 2)
    assert str(err.value) == (
        "tfsift.init must run before TensorFlow uses its devices, to give local rank 1 only "
        "GPU 1 of the 2 on this host; call it first in the script (before creating tensors, "
        "models or datasets), or set TFSIFT_PIN_GPU=0 and choose the devices yourself. "
        "Received: Visible devices cannot be modified after being initialized"
    )


def test_a_bad_pin_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeConfig(monkeypatch, gpus=1)
    monkeypatch.setenv("TFSIFT_PIN_GPU", "maybe")
    with pytest.raises(ValueError) as err:
        devices.pin(0, 1)
    assert str(err.value) == "TFSIFT_PIN_GPU must be 0 or 1. Received: 'maybe'"


@pytest.mark.parametrize(
    ("value", "single"), [("", False), ("3", True), (" 3 ", True), ("0,1", False), ("-1", True)]
)
def test_a_single_cuda_visible_device_means_pinned_already(value: str, single: bool) -> None:
    assert devices.single_device(value) is single


def test_init_pins_before_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeConfig(monkeypatch, gpus=2)
    tfsift.init({})
    assert fake.visible == [("GPU0", "GPU")]  # one process: local rank 0 of 1
    assert tfsift.local_rank() == 0
