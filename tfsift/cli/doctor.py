"""``tfsift doctor``: checks the stack tfsift runs on and says how to fix what is missing.

Each check is a small function returning a ``Check``; ``run`` calls them in order, prints
one line each (and the fix under anything wrong) and exits 1 when a required piece is
missing; ``-np N`` also checks that N ranks on this host can have one GPU each, and
``-H host1,host2`` (or ``--hostfile``) checks the hosts of a job across them
(``tfsift.cli.preflight``: ssh, the same versions, MPI between them, and with
``--checkpoint-dir`` a shared directory). The checks import TensorFlow and Horovod only
through ``_import``, so a test can pretend any of them is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfsift import env
from tfsift.parallel import devices

# What `tfsift doctor --help` tells a user (the module docstring is for its readers).
DESCRIPTION = (
    "Checks what tfsift needs on this machine (Python, TensorFlow, Keras, mpi4py, Horovod, "
    "mpirun, the CPU cores, the GPUs, the CPU kernels and what mixed precision does with "
    "them, matplotlib for the charts) and prints one line per "
    "check, with how to fix anything missing or mismatched. Exits 1 when a required piece "
    "is missing, 0 otherwise. With -np N it also checks that N ranks started on this host "
    "can each have a GPU of its own."
)
SETUP = "bash scripts/setup.sh"
TF_VERSION = "2.21."  # pinned in constraints.txt; Horovod is built against it
KERAS_VERSION = "3.15."  # planning/keras_internals.py reads private Keras 3.15 APIs
TF_FIX = (
    f"{SETUP} (installs tensorflow-cpu==2.21.0); on a GPU machine "
    "`pip install tensorflow==2.21.0` instead (docs/install.md)"
)


@dataclasses.dataclass(frozen=True)
class Check:
    """What one check found.

    Args:
        name: what was checked ("tensorflow", "mpirun", ...).
        ok: whether it is there and usable.
        detail: what was found (a version, a path, a count) or why it failed.
        fix: how to fix it when not ok.
        required: whether tfsift cannot run without it (else a warning).
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def add_subcommand(commands: Any) -> None:
    """Registers ``doctor`` on the ``tfsift`` argument parser."""
    cmd = commands.add_parser(
        "doctor",
        help="check TensorFlow, Keras, Horovod, MPI, CPUs and GPUs; say how to fix each",
        description=DESCRIPTION,
    )
    cmd.add_argument(
        "-np",
        type=int,
        dest="np",
        metavar="N",
        help="ranks you will start on this host: check that each can have its own GPU",
    )
    cmd.add_argument(
        "-H",
        "--host",
        dest="hosts",
        metavar="HOST[:N],...",
        help="the job's hosts: check that ssh reaches each, that each has the same Python, "
        "tfsift, TensorFlow, Keras, Horovod and mpi4py, and that MPI connects them",
    )
    cmd.add_argument(
        "--hostfile", metavar="FILE", help="the job's hosts from an Open MPI hostfile, as -H"
    )
    cmd.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="with -H or --hostfile: check that every host sees this directory (shared)",
    )
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace | None = None) -> int:
    """Runs every check, prints the report; 1 if a required piece is missing, else 0."""
    from tfsift.cli.run import import_tensorflow_quietly

    import_tensorflow_quietly()  # TensorFlow's start-up lines, filtered as tfsift run does
    checks = [probe() for probe in probes(getattr(args, "np", None))]
    names = host_names(args)
    if names:
        from tfsift.cli import preflight

        checks += preflight.checks(names, getattr(args, "checkpoint_dir", None))
    print(format_report(checks))
    return 1 if any(c.required and not c.ok for c in checks) else 0


def host_names(args: argparse.Namespace | None) -> list[str]:
    """The hosts ``-H`` or ``--hostfile`` name (slots dropped), in order, each once.

    Raises:
        SystemExit: ``--checkpoint-dir`` without hosts, or a bad host list or hostfile.
    """
    from tfsift.cli import hosts

    listed, path = getattr(args, "hosts", None), getattr(args, "hostfile", None)
    try:
        found = hosts.parse_list(listed) if listed else []
        found += hosts.parse_hostfile(path) if path else []
    except (ValueError, OSError) as err:
        raise SystemExit(f"tfsift doctor: {err}") from None
    if getattr(args, "checkpoint_dir", None) and not found:
        raise SystemExit(
            "tfsift doctor: --checkpoint-dir is checked across the hosts -H or --hostfile "
            "names. Received: --checkpoint-dir without hosts"
        )
    return list(dict.fromkeys(h.name for h in found))


def probes(ranks: int | None = None) -> list[Callable[[], Check]]:
    """The checks, in the order they print (looked up when called, so tests can patch);
    ``ranks`` is ``-np``, the ranks to start on this host."""
    return [
        check_python,
        check_tensorflow,
        check_keras,
        check_mpi4py,
        check_horovod,
        check_mpirun,
        check_cpus,
        functools.partial(check_gpus, ranks),
        check_tf32,
        check_kernels,
        check_matplotlib,
    ]


def format_report(checks: list[Check]) -> str:
    """One aligned line per check, its fix indented below it, and a verdict."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        status = "ok" if c.ok else ("MISSING" if c.required else "warning")
        lines.append(f"{status:<8} {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"{'':<8} {'':<{width}}  fix: {c.fix}")
    missing = [c.name for c in checks if c.required and not c.ok]
    if missing:
        lines.append(f"missing: {', '.join(missing)}; fix them, then run `tfsift doctor` again")
    else:
        lines.append("everything tfsift needs is here")
    return "\n".join(lines)


def check_python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] == (3, 11)
    return Check("python", ok, f"{version} ({sys.executable})", "use Python 3.11 (TFSIFT_PYTHON)")


def check_tensorflow() -> Check:
    try:
        tf = _import("tensorflow")
    except Exception as err:
        return Check("tensorflow", False, f"cannot import: {_reason(err)}", TF_FIX)
    wheel = _distribution("tensorflow-cpu", "tensorflow")
    kind = "CUDA" if _cuda_build(tf) else "CPU only"
    detail = f"{tf.__version__} ({wheel or 'unknown'} wheel, {kind})"
    return Check("tensorflow", tf.__version__.startswith(TF_VERSION), detail, TF_FIX)


def check_keras() -> Check:
    try:
        keras = _import("keras")
    except Exception as err:
        return Check("keras", False, f"cannot import: {_reason(err)}", f"{SETUP}")
    ok = keras.__version__.startswith(KERAS_VERSION)
    return Check("keras", ok, keras.__version__, f"pip install 'keras=={KERAS_VERSION}*'")


def check_mpi4py() -> Check:
    try:
        mpi4py = _import("mpi4py")
    except Exception as err:
        return Check("mpi4py", False, f"cannot import: {_reason(err)}", SETUP)
    return Check("mpi4py", True, mpi4py.__version__)


def check_horovod() -> Check:
    try:
        horovod = _import("horovod")
        hvd = _import("horovod.tensorflow")
    except Exception as err:
        detail = f"horovod.tensorflow cannot be imported: {_reason(err)}"
        return Check("horovod", False, detail, f"{SETUP} (builds Horovod 0.28.1 with TF and MPI)")
    mpi, gloo = bool(hvd.mpi_built()), bool(hvd.gloo_built())
    detail = f"{horovod.__version__}, TensorFlow ops: yes, MPI: {_yes(mpi)}, Gloo: {_yes(gloo)}"
    fix = f"rebuild with HOROVOD_WITH_MPI=1: {SETUP} after removing the cached wheel"
    return Check("horovod", mpi, detail, fix)


def check_mpirun() -> Check:
    path = shutil.which("mpirun")
    fix = f"apt-get install openmpi-bin libopenmpi-dev ({SETUP} does it)"
    if path is None:
        return Check("mpirun", False, "not on PATH", fix)
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("mpirun", False, f"{path} does not run: {_reason(err)}", fix)
    version = (done.stdout.strip().splitlines() or ["version unknown"])[0]
    return Check("mpirun", done.returncode == 0, f"{path}: {version}", fix)


def check_cpus() -> Check:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    total = os.cpu_count() or 1
    detail = f"{total} cores" + (f", {usable} usable by this process" if usable else "")
    return Check("cpus", True, detail + "; `tfsift run` oversubscribes beyond them")


def check_gpus(ranks: int | None = None) -> Check:
    try:
        tf = _import("tensorflow")
        gpus = len(tf.config.list_physical_devices("GPU"))
    except Exception as err:
        return Check("gpus", False, f"unknown: {_reason(err)}", TF_FIX, required=False)
    if gpus:
        return gpus_for_ranks(gpus, ranks)
    if _cuda_build(tf):
        detail = "none visible to this CUDA build of TensorFlow"
        fix = "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
        return Check("gpus", False, detail, fix, required=False)
    if shutil.which("nvidia-smi"):
        detail = "nvidia-smi is here but TensorFlow is the CPU-only build"
        return Check("gpus", False, detail, TF_FIX, required=False)
    return Check(
        "gpus", True, "none (CPU-only TensorFlow; training runs on the CPUs)", required=False
    )


def check_tf32() -> Check:
    """Whether float32 matrix products and convolutions run in TF32 on these GPUs.

    TensorFlow turns TF32 on by default on GPUs of compute capability 8.0 and newer: fast,
    but with 10 mantissa bits, so a pipeline's gradients no longer match one process's to
    float32 rounding (on an H100, up to 7.5% apart; docs/install.md#gpus). Reported, not
    required: it is the user's trade.
    """
    try:
        tf = _import("tensorflow")
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return Check("tf32", True, "not used (no GPU)", required=False)
        details = [tf.config.experimental.get_device_details(g) for g in gpus]
        newer = [d for d in details if tuple(d.get("compute_capability", (0, 0))) >= (8, 0)]
        on = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    except Exception as err:
        return Check("tf32", False, f"unknown: {_reason(err)}", required=False)
    if not newer:
        return Check("tf32", True, "not used (no GPU of compute capability 8.0+)", required=False)
    if not on or os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return Check("tf32", True, "off: float32 products keep float32 precision", required=False)
    return Check(
        "tf32",
        True,
        f"on for {len(newer)} GPU(s), TensorFlow's default: float32 matrix products and "
        "convolutions keep 10 mantissa bits; to compare a pipeline with one process, turn it "
        "off (tf.config.experimental.enable_tensor_float_32_execution(False) or "
        "NVIDIA_TF32_OVERRIDE=0)",
        required=False,
    )


def gpus_for_ranks(gpus: int, ranks: int | None) -> Check:
    """Whether ``tfsift.init`` can give each of ``ranks`` ranks on this host its own GPU."""
    try:
        pin = env.pin_gpu()
    except ValueError as err:
        return Check("gpus", False, str(err), f"{env.TFSIFT_PIN_GPU}=0 or 1", required=False)
    visible = env.get(env.CUDA_VISIBLE_DEVICES)
    if not pin or devices.single_device(visible):
        why = f"{env.TFSIFT_PIN_GPU}=0" if not pin else f"{env.CUDA_VISIBLE_DEVICES}={visible}"
        return Check(
            "gpus", True, f"{gpus}; {why}: tfsift.init leaves them as they are", required=False
        )
    if ranks is None:
        detail = f"{gpus}: up to {gpus} ranks per host can have one each (tfsift.init gives "
        return Check("gpus", True, detail + "local rank i GPU i; -np N checks N)", required=False)
    try:
        devices.choose(0, ranks, gpus, pin, visible)
    except ValueError:
        return Check(
            "gpus",
            False,
            f"{gpus} for {ranks} ranks on this host: tfsift.init will refuse to start "
            "(one GPU per local rank)",
            f"start at most {gpus} ranks per host (-np {gpus}, or -H host:{gpus} for each host), "
            f"or set {env.TFSIFT_PIN_GPU}=0 and place the ranks on GPUs yourself",
        )
    detail = f"{gpus} for {ranks} ranks on this host: one each (local rank i uses GPU i)"
    return Check("gpus", True, detail, required=False)


# The CPU flags of bfloat16 arithmetic units, as Linux names them in /proc/cpuinfo
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def check_kernels() -> Check:
    """Which CPU kernels TensorFlow runs here, and what ``mixed_bfloat16`` does with them.

    TensorFlow 2.21 runs oneDNN's kernels by default on CPUs with AVX-512 VNNI or BF16
    (``TF_ENABLE_ONEDNN_OPTS`` decides otherwise). On a 2-stage decoder
    (docs/benchmarks.md) ``mixed_bfloat16`` took 0.91x float32's step with oneDNN and
    bfloat16 units, 2.0x without such units. With oneDNN, ``mixed_float16`` on a pipeline
    differs from one process by float16 rounding (docs/big-models.md). Reported, not
    required.
    """
    try:
        onednn = bool(_import("tensorflow.python.util._pywrap_util_port").IsMklEnabled())
    except Exception as err:
        return Check("kernels", False, f"unknown: {_reason(err)}", required=False)
    units = ", ".join(flag for flag in BFLOAT16_FLAGS if flag in _cpu_flags())
    kernels = "oneDNN's" if onednn else "Eigen's (TF_ENABLE_ONEDNN_OPTS=0, or an older CPU)"
    if not units:
        use = "no bfloat16 units: mixed_bfloat16 took 2.0x float32's step on such a CPU"
    elif onednn:
        use = f"bfloat16 units ({units}): mixed_bfloat16 took 0.91x float32's step with them"
    else:
        use = f"bfloat16 units ({units}), which TensorFlow uses through oneDNN's kernels"
    return Check("kernels", True, f"{kernels}; {use}", required=False)


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux; none elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}


def check_matplotlib() -> Check:
    try:
        matplotlib = _import("matplotlib")
    except Exception as err:
        detail = f"not installed ({_reason(err)}); only --timeline and .draw() need it"
        return Check("matplotlib", False, detail, "pip install matplotlib", required=False)
    return Check("matplotlib", True, f"{matplotlib.__version__} (timeline charts)")


def _import(name: str) -> Any:
    return importlib.import_module(name)


def _distribution(*names: str) -> str | None:
    """The first of ``names`` installed as a distribution (which TensorFlow wheel)."""
    for name in names:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name
    return None


def _cuda_build(tf: Any) -> bool:
    return bool(tf.sysconfig.get_build_info().get("is_cuda_build", False))


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
