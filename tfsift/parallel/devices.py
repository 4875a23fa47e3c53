"""One GPU per local rank: which GPU a rank keeps, and hiding the others from TensorFlow.

A tfsift rank holds one pipeline stage and runs it on one device. On a host with G GPUs
and L ranks (its local ranks 0 .. L-1), ``tfsift.init`` makes local rank i see only
GPU i, with memory growth on, before TensorFlow initialises its devices::

    host with 4 GPUs: tfsift run -np 4 python train.py
    local rank        0       1       2       3
    TensorFlow sees   GPU 0   GPU 1   GPU 2   GPU 3   (each as /GPU:0 in that process)

Without this every rank would place its stage on GPU 0 and, by TensorFlow's default,
reserve nearly all of its memory. It is left alone when there is no GPU, when
``CUDA_VISIBLE_DEVICES`` already names a single device (a launcher pinned the rank),
and when ``TFSIFT_PIN_GPU=0``. More local ranks than GPUs is an error rather than a
warning: ranks sharing a GPU would each reserve its memory and fail later, far from
the cause; share on purpose with ``TFSIFT_PIN_GPU=0``.
"""

from __future__ import annotations

import logging

from tfsift import env

log = logging.getLogger("tfsift")


def choose(
    local_rank: int, local_size: int, gpus: int, pin: bool, cuda_visible: str = ""
) -> int | None:
    """The index of the GPU local rank ``local_rank`` keeps, or None to leave devices be.

    Example:
        >>> choose(local_rank=1, local_size=4, gpus=4, pin=True)
        1

    Args:
        local_rank, local_size: this rank's index among the ranks of its host, their number.
        gpus: the GPUs TensorFlow sees on this host.
        pin: ``TFSIFT_PIN_GPU``.
        cuda_visible: ``CUDA_VISIBLE_DEVICES`` ("" when unset).

    Raises:
        ValueError: more ranks on this host than GPUs.
    """
    if not pin or gpus == 0 or single_device(cuda_visible):
        return None
    if local_size > gpus:
        raise ValueError(
            f"tfsift.init gives every rank of a host its own GPU, so a host may run at most "
            f"as many ranks as it has GPUs: start at most {gpus} ranks per host (tfsift run "
            f"-np N -H host1:{gpus},host2:{gpus} ...), or set {env.TFSIFT_PIN_GPU}=0 and place "
            f"the ranks yourself (ranks sharing a GPU must then limit their memory). Received: "
            f"{local_size} ranks on this host, {gpus} GPUs"
        )
    return local_rank


def single_device(cuda_visible: str) -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` names exactly one GPU (the rank is pinned already)."""
    return len([d for d in cuda_visible.split(",") if d.strip()]) == 1


def pin(local_rank: int, local_size: int) -> int | None:
    """Makes the chosen GPU the only one TensorFlow sees on this rank; returns its index.

    Raises:
        ValueError: more ranks on this host than GPUs.
        RuntimeError: TensorFlow initialised its devices before ``tfsift.init``.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    visible = env.get(env.CUDA_VISIBLE_DEVICES)
    index = choose(local_rank, local_size, len(gpus), env.pin_gpu(), visible)
    if index is None:
        return None
    gpu = gpus[index]
    try:
        tf.config.set_visible_devices(gpu, "GPU")  # a no-op when already so (a second init)
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as error:
        raise RuntimeError(
            f"tfsift.init must run before TensorFlow uses its devices, to give local rank "
            f"{local_rank} only GPU {index} of the {len(gpus)} on this host; call it first "
            f"in the script (before creating tensors, models or datasets), or set "
            f"{env.TFSIFT_PIN_GPU}=0 and choose the devices yourself. Received: {error}"
        ) from error
    log.debug("local rank %d of %d: GPU %d of %d", local_rank, local_size, index, len(gpus))
    return index
