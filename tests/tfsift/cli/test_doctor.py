"""``tfsift doctor``: one line per piece of the stack, a fix for each missing one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tfsift.cli import doctor, main

ROOT = Path(__file__).resolve().parents[3]


def fake_stack(gpus: int = 0, cuda: bool = False, missing: tuple[str, ...] = ()) -> Any:
    """An ``_import`` that serves stand-ins for the heavy modules, and fails on ``missing``."""
    modules = {
        "tensorflow": SimpleNamespace(
            __version__="2.21.0",
            config=SimpleNamespace(list_physical_devices=lambda kind: ["GPU"] * gpus),
            sysconfig=SimpleNamespace(get_build_info=lambda: {"is_cuda_build": cuda}),
        ),
        "keras": SimpleNamespace(__version__="3.15.1"),
        "mpi4py": SimpleNamespace(__version__="4.0.0"),
        "horovod": SimpleNamespace(__version__="0.28.1"),
        "horovod.tensorflow": SimpleNamespace(mpi_built=lambda: True, gloo_built=lambda: True),
        "matplotlib": SimpleNamespace(__version__="3.9.0"),
        "tensorflow.python.util._pywrap_util_port": SimpleNamespace(IsMklEnabled=lambda: False),
    }

    def load(name: str) -> Any:
        if name in missing:
            raise ImportError(f"No module named {name!r}")
        return modules[name]

    return load


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(doctor, "_import", fake_stack())
    monkeypatch.setattr(
        doctor.shutil, "which", lambda name: "/usr/bin/mpirun" if name == "mpirun" else None
    )
    done = subprocess.CompletedProcess([], 0, "mpirun (Open MPI) 4.1.4\n", "")
    monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: done)
    return monkeypatch


def test_a_complete_stack_passes(
    stack: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "ok       horovod     0.28.1, TensorFlow ops: yes, MPI: yes, Gloo: yes" in out
    assert "mpirun      /usr/bin/mpirun: mpirun (Open MPI) 4.1.4" in out
    assert out.endswith("everything tfsift needs is here\n")
    assert "fix:" not in out


def test_missing_mpirun_and_horovod_fail_with_their_fixes(
    stack: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.setattr(doctor, "_import", fake_stack(missing=("horovod.tensorflow",)))
    stack.setattr(doctor.shutil, "which", lambda name: None)
    assert main(["doctor"]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = {line.split()[1]: i for i, line in enumerate(lines) if line.startswith("MISSING")}
    assert set(at) == {"horovod", "mpirun"}
    assert "horovod.tensorflow cannot be imported: ImportError" in lines[at["horovod"]]
    assert lines[at["horovod"] + 1].split("fix: ")[1].startswith("bash scripts/setup.sh")
    assert lines[at["mpirun"]].endswith("not on PATH")
    assert "apt-get install openmpi-bin" in lines[at["mpirun"] + 1]
    assert lines[-1] == "missing: horovod, mpirun; fix them, then run `tfsift doctor` again"


def test_horovod_without_mpi_is_missing(
    stack: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    modules = fake_stack()

    def load(name: str) -> Any:
        if name == "horovod.tensorflow":
            return SimpleNamespace(mpi_built=lambda: False, gloo_built=lambda: True)
        return modules(name)

    stack.setattr(doctor, "_import", load)
    assert main(["doctor"]) == 1
    assert "MPI: no" in capsys.readouterr().out


@pytest.mark.parametrize(
    "gpus, cuda, nvidia_smi, status, words",
    [(0, False, False, "ok", "none (CPU-only TensorFlow"),
     (2, True, True, "ok", "2: up to 2 ranks per host can have one each"),
     (0, True, True, "warning", "none visible to this CUDA build"),
     (0, False, True, "warning", "nvidia-smi is here but TensorFlow is the CPU-only build")],
)  # fmt: skip
def test_gpus_are_counted_and_a_cpu_wheel_on_a_gpu_machine_is_a_warning(
    stack: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    gpus: int,
    cuda: bool,
    nvidia_smi: bool,
    status: str,
    words: str,
) -> None:
    stack.setattr(doctor, "_import", fake_stack(gpus=gpus, cuda=cuda))
    stack.setattr(doctor.shutil, "which", lambda name: "/x" if nvidia_smi else None)
    check = doctor.check_gpus()
    print(doctor.format_report([check]))
    out = capsys.readouterr().out
    assert out.split()[0] == status and words in out
    assert not check.required  # tfsift trains on CPUs too


def test_a_wrong_tensorflow_version_is_missing_with_the_pinned_fix(
    stack: pytest.MonkeyPatch,
) -> None:
    def load(name: str) -> Any:
        return SimpleNamespace(__version__="2.16.1", sysconfig=SimpleNamespace(
            get_build_info=lambda: {}))  # fmt: skip

    stack.setattr(doctor, "_import", load)
    check = doctor.check_tensorflow()
    assert not check.ok and check.detail.startswith("2.16.1 (")
    assert "tensorflow-cpu==2.21.0" in check.fix


def test_this_machine_has_the_stack_and_no_gpu() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tfsift.cli", "doctor"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    status = {line.split()[1]: line.split()[0] for line in done.stdout.splitlines()[:-1]
              if not line.startswith(" ")}  # fmt: skip
    for name in ("python", "tensorflow", "keras", "mpi4py", "horovod", "mpirun", "cpus"):
        assert status[name] == "ok", done.stdout
    assert "gpus" in status
    for noise in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard"):
        assert noise not in done.stderr, done.stderr  # filtered as tfsift run filters it


@pytest.mark.parametrize(
    ("gpus", "np", "code", "line"),
    [(4, "4", 0, "ok       gpus        4 for 4 ranks on this host: one each (local rank i uses "
                 "GPU i)"),
     (8, "2", 0, "ok       gpus        8 for 2 ranks on this host: one each (local rank i uses "
                 "GPU i)"),
     (2, "4", 1, "MISSING  gpus        2 for 4 ranks on this host: tfsift.init will refuse to "
                 "start (one GPU per local rank)")],
)  # fmt: skip
def test_np_checks_one_gpu_per_rank_on_this_host(
    stack: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    gpus: int,
    np: str,
    code: int,
    line: str,
) -> None:
    stack.delenv("TFSIFT_PIN_GPU", raising=False)
    stack.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    stack.setattr(doctor, "_import", fake_stack(gpus=gpus, cuda=True))
    assert main(["doctor", "-np", np]) == code
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, text in enumerate(lines) if text.split()[1] == "gpus")
    assert lines[at] == line
    if code:
        assert lines[at + 1].split("fix: ")[1] == (
            "start at most 2 ranks per host (-np 2, or -H host:2 for each host), or set "
            "TFSIFT_PIN_GPU=0 and place the ranks on GPUs yourself"
        )
        assert lines[-1] == "missing: gpus; fix them, then run `tfsift doctor` again"


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [("TFSIFT_PIN_GPU", "0", "TFSIFT_PIN_GPU=0"),
     ("CUDA_VISIBLE_DEVICES", "3", "CUDA_VISIBLE_DEVICES=3")],
)  # fmt: skip
def test_gpus_the_user_placed_are_left_alone_whatever_np(
    stack: pytest.MonkeyPatch, name: str, value: str, why: str
) -> None:
    stack.delenv("TFSIFT_PIN_GPU", raising=False)
    stack.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    stack.setenv(name, value)
    stack.setattr(doctor, "_import", fake_stack(gpus=1, cuda=True))
    check = doctor.check_gpus(ranks=4)
    assert (check.ok, check.detail) == (True, f"1; {why}: tfsift.init leaves them as they are")


@pytest.mark.parametrize(
    ("capability", "enabled", "override", "words"),
    [((9, 0), True, None, "on for 1 GPU(s), TensorFlow's default: float32 matrix products"),
     ((9, 0), False, None, "off: float32 products keep float32 precision"),
     ((8, 0), True, "0", "off: float32 products keep float32 precision"),
     ((7, 5), True, None, "not used (no GPU of compute capability 8.0+)")],
)  # fmt: skip
def test_tf32_is_reported_where_tensorflow_uses_it(
    monkeypatch: pytest.MonkeyPatch,
    capability: tuple[int, int],
    enabled: bool,
    override: str | None,
    words: str,
) -> None:
    experimental = SimpleNamespace(
        get_device_details=lambda gpu: {"compute_capability": capability},
        tensor_float_32_execution_enabled=lambda: enabled,
    )
    tf = SimpleNamespace(
        config=SimpleNamespace(
            list_physical_devices=lambda kind: ["GPU:0"], experimental=experimental
        )
    )
    monkeypatch.setattr(doctor, "_import", lambda name: tf)
    if override is None:
        monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    else:
        monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", override)
    check = doctor.check_tf32()
    assert check.ok and not check.required and check.detail.startswith(words)


@pytest.mark.parametrize(
    ("onednn", "flags", "detail"),
    [(True, {"avx512_bf16", "avx512f"}, "oneDNN's; bfloat16 units (avx512_bf16): "
      "mixed_bfloat16 took 0.91x float32's step with them"),
     (True, {"avx512_vnni"}, "oneDNN's; no bfloat16 units: mixed_bfloat16 took 2.0x "
      "float32's step on such a CPU"),
     (False, set(), "Eigen's (TF_ENABLE_ONEDNN_OPTS=0, or an older CPU); no bfloat16 units: "
      "mixed_bfloat16 took 2.0x float32's step on such a CPU"),
     (False, {"amx_bf16"}, "Eigen's (TF_ENABLE_ONEDNN_OPTS=0, or an older CPU); bfloat16 "
      "units (amx_bf16), which TensorFlow uses through oneDNN's kernels")],
)  # fmt: skip
def test_the_cpu_kernels_say_what_mixed_bfloat16_does_with_them(
    stack: pytest.MonkeyPatch, onednn: bool, flags: set[str], detail: str
) -> None:
    port = SimpleNamespace(IsMklEnabled=lambda: onednn)
    stack.setattr(doctor, "_import", lambda name: port)
    stack.setattr(doctor, "_cpu_flags", lambda: flags)
    assert doctor.check_kernels() == doctor.Check("kernels", True, detail, required=False)


def test_this_machines_cpu_flags_are_read(stack: pytest.MonkeyPatch) -> None:
    assert "fpu" in doctor._cpu_flags() or not Path("/proc/cpuinfo").exists()


def test_tf32_without_a_gpu_is_not_used(stack: pytest.MonkeyPatch) -> None:
    assert doctor.check_tf32() == doctor.Check("tf32", True, "not used (no GPU)", required=False)


def test_help_tells_a_user_what_doctor_checks_not_how_it_is_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tfsift.cli.main import main

    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Checks what tfsift needs on this machine" in text
    assert "Exits 1 when a required piece is missing" in text
    assert "_import" not in text and "``" not in text  # the module docstring's internals
