"""The GPU backend of `jlearngene.ops`: the attention core through cuDNN's fused attention.

`jax.nn.dot_product_attention(..., implementation='cudnn')` runs softmax(scale·q·kᵀ)·v as
one cuDNN flash-attention kernel forward and backward: the (B, H, T, T) probabilities are
never written to memory, and the softmax statistics are kept in float32 inside the kernel.
The backend takes an attention call only where that kernel computes the same result:

  * the probabilities are not requested (`need_probs=False`: no attention maps captured);
  * q, k and v are bfloat16 or float16, all of one dtype (cuDNN has no float32 kernel:
    float32 models run the reference, XLA's float32 softmax);
  * q, k and v have one sequence length and a head dim that is a multiple of 8 and at most
    128 (the class-token-only last block, Tq = 1, runs the reference: one query row is
    cheap, and the shapes stay those cuDNN documents for every architecture);
  * jax's own checks pass when the call is traced (cuDNN present, a supported version and
    compute capability); where they raise, the call goes to the reference.

It is enabled where jax's GPU platform is CUDA and JLEARNGENE_GPU_CUDNN_ATTENTION is not 0.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jlearngene import ops

NAME = 'gpu'
ENV_SWITCH = 'JLEARNGENE_GPU_CUDNN_ATTENTION'
DTYPES = (jnp.bfloat16, jnp.float16)
MAX_HEAD_DIM = 128


def decline_reason(q, k, v, need_probs: bool) -> str | None:
    """Why the cuDNN kernel does not take an attention call.

    It tests every condition of the module docstring but the last: jax's own checks run when the
    call is traced.

    Args:
        q: the queries, (B, Tq, H, Dh): an array or a `jax.ShapeDtypeStruct`.
        k: the keys, (B, T, H, Dh), likewise.
        v: the values, of `k`'s shape, likewise.
        need_probs: whether the call asks for the attention probabilities.

    Returns:
        The first reason found, in words; `None` where the kernel takes the call.
    """
    if need_probs:
        return 'the attention probabilities are requested'
    if not all(t.dtype == q.dtype for t in (k, v)) or q.dtype not in DTYPES:
        return f'dtypes {q.dtype}, {k.dtype}, {v.dtype}: cuDNN takes bfloat16 or float16 only'
    if q.shape[1] != k.shape[1]:
        return f'query length {q.shape[1]} differs from key length {k.shape[1]}'
    dh = q.shape[-1]
    if dh % 8 or dh > MAX_HEAD_DIM:
        return f'head dim {dh} is not a multiple of 8 at most {MAX_HEAD_DIM}'
    return None


def _attention(q, k, v, scale, need_probs, probs_name):
    if decline_reason(q, k, v, need_probs) is not None:
        return NotImplemented
    try:
        o = jax.nn.dot_product_attention(q, k, v, scale=scale, implementation='cudnn')
    except (NotImplementedError, ValueError, RuntimeError):
        return NotImplemented        # jax's checks of cuDNN, its version or the device
    return o, None


@functools.cache
def cuda_available() -> bool:
    """Whether jax has an NVIDIA (CUDA) GPU platform (False on CPU-only and ROCm builds).

    Returns:
        True where the first GPU device's platform version names CUDA or its kind names NVIDIA.
        Cached: computed once per process.
    """
    try:
        devices = jax.devices('gpu')
    except RuntimeError:
        return False
    if not devices:
        return False
    version = getattr(getattr(devices[0], 'client', None), 'platform_version', '') or ''
    return 'cuda' in version.lower() or 'nvidia' in devices[0].device_kind.lower()


def enabled() -> bool:
    """Whether the backend runs: its environment switch is on and a CUDA device is there.

    Returns:
        True where JLEARNGENE_GPU_CUDNN_ATTENTION is unset or on and `cuda_available()`.

    Raises:
        ValueError: JLEARNGENE_GPU_CUDNN_ATTENTION holds no on/off value (`ops.env_switch_on`).
    """
    return ops.env_switch_on(ENV_SWITCH) and cuda_available()


ops.register(ops.Backend(NAME, 'gpu', attention=_attention, enabled=enabled))
