"""The CPU backend of `jlearngene.ops`: what makes the CPU training step as fast as torch's.

* dense, float32: `dense.matmul`, whose weight gradient is a C++ kernel (`weight_grad.cc`)
  and whose input gradient reads wᵀ in the layout the CPU dots want.
* dense, bfloat16 operands: `dense.bf16_matmul`, the reference's rounded product with the
  backward pass's transposes written out row-major for XLA:CPU's bfloat16 dots.
* attention with q and k of one length: the C++ kernel of `attention.py` on the fused
  (B, T, 3, H, Dh) tensor, forward and backward, where the library is `available()`, the
  operands are float32 and Dh is a multiple of 16, opted in with
  JLEARNGENE_CPU_ATTENTION_KERNEL=1; other calls go to the reference.
* compiler options: oneDNN dots (`onednn.options()`), opted in with JLEARNGENE_CPU_ONEDNN=1.

Switches: JLEARNGENE_CPU_KERNELS=0 (the C++ kernels; the weight gradient is then XLA's
product), or JLEARNGENE_BACKENDS=reference for all of it. The C++ library is built at first use (`library`).
"""
from __future__ import annotations

import jax.numpy as jnp

from jlearngene import ops
from jlearngene.ops.cpu import attention, dense, onednn

NAME = 'cpu'


def _dense(x, w, precision):
    if precision == 'bfloat16':
        return dense.bf16_matmul(x, w).astype(x.dtype)
    return dense.matmul(x, w)


def _attention(q, k, v, scale, need_probs, probs_name):
    # The device count is known when lowering, where the primitive falls back to XLA's
    # operations for a partitioned program.
    if q.shape != k.shape or not attention.kernel_applies(q.shape[-1], [q.dtype], 1):
        return NotImplemented
    # The kernel reads the fused layout; with q, k and v split from one fused projection
    # XLA turns this stack (and its gradient's split) back into that tensor.
    o, probs = attention.attention(jnp.stack([q, k, v], axis=2), scale, probs_name=probs_name)
    return o, (probs if need_probs else None)


ops.register(ops.Backend(name=NAME, platform='cpu', dense=_dense, attention=_attention,
                         compiler_options=onednn.options))
