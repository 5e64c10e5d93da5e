"""The CPU backend's attention core: softmax attention from a fused q/k/v tensor, in C++.

`attention(qkv, scale)` maps qkv (B, T, 3, H, Dh) to (o (B, T, H, Dh), probs (B, H, T, T)):
probs = softmax((q·scale)·kᵀ) over the keys, o = probs·v, exactly
`ops.reference.probs_attention`. Why a kernel: XLA:CPU runs this core as six small batched
products per layer with transposes, a concatenate and softmax passes between them, at about
a third of the dense layers' speed, so it took 6–13 % of the ViT training step.
`attention.cc` does one (batch, head) per task, reading q, k, v in place and writing o and
the gradient in the layouts the projections use.

The function is a primitive whose derivative is another primitive, linear in the tangent
of qkv, whose transpose (the backward pass) is the backward kernel. Forward and reverse
mode, their compositions and vmap all work: everything the kernel does not cover falls back
to XLA's operations on the reference's formulas. The kernels run where `library.available()`,
on one CPU device, for float32 with Dh a multiple of 16; the result is float32 arithmetic with
another summation order and, for Dh not a power of 4, another rounding of the scale.

`probs_name` names the probabilities with `checkpoint_name` where the backward pass reads
them, so that a `jax.checkpoint` policy can save them (the ViT's blocks do).
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import core
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jlearngene.ops import reference
from jlearngene.ops.cpu import library

KERNEL_DIM_MULTIPLE = 16   # Dh must be whole vectors of both instruction sets


def attention(qkv: jax.Array, scale: float, *, probs_name: str | None = None):
    """(o, probs) of softmax attention for qkv (B, T, 3, H, Dh); see the module docstring."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f'attention: expected qkv of shape (B, T, 3, H, Dh), got {qkv.shape}')
    return tuple(_attention_p.bind(qkv, scale=float(scale), probs_name=probs_name))


def split(qkv: jax.Array) -> list[jax.Array]:
    """The parts of a fused projection (B, T, n, H, Dh) as n arrays (B, T, H, Dh).

    `split`, not slices: its derivative is one concatenate of the parts' gradients, where
    the slices' would be zero-padded full-size arrays summed."""
    return [t.squeeze(2) for t in jnp.split(qkv, qkv.shape[2], axis=2)]


def _reference_fused(qkv, *, scale, probs_name=None):
    return reference.probs_attention(*split(qkv), scale, probs_name=probs_name)


def _probs_tangent(qkv, probs, t_qkv, scale):
    """d probs for a tangent t_qkv: probs·(dS − Σ probs·dS), dS = (tq·kᵀ + q·tkᵀ)·scale."""
    (q, k, _), (tq, tk, _) = split(qkv), split(t_qkv)
    s = jnp.asarray(scale, q.dtype)
    ds = jnp.einsum('bqhk,bthk->bhqt', tq * s, k) + jnp.einsum('bqhk,bthk->bhqt', q * s, tk)
    return probs * (ds - jnp.sum(probs * ds, axis=-1, keepdims=True))


def _out_tangent(qkv, probs, t_qkv, *, scale):
    """d o for a tangent t_qkv, given probs: d probs·v + probs·tv (linear in t_qkv)."""
    v, tv = split(qkv)[2], split(t_qkv)[2]
    dp = _probs_tangent(qkv, probs, t_qkv, scale)
    return jnp.einsum('bhqt,bthk->bqhk', dp, v) + jnp.einsum('bhqt,bthk->bqhk', probs, tv)


def _backward_reference(qkv, probs, d_out, *, scale):
    """d qkv from d o, given probs: the transpose of `_out_tangent` written out."""
    q, k, v = split(qkv)
    dv = jnp.einsum('bhqt,bqhk->bthk', probs, d_out)
    dp = jnp.einsum('bqhk,bthk->bhqt', d_out, v)
    ds = probs * (dp - jnp.sum(probs * dp, axis=-1, keepdims=True))
    s = jnp.asarray(scale, q.dtype)
    dq = jnp.einsum('bhqt,bthk->bqhk', ds, k) * s
    dk = jnp.einsum('bhqt,bqhk->bthk', ds, q * s)
    return jnp.stack([dq, dk, dv], axis=2)


# Opt-in: with the attention kernel on, a process that runs many differently shaped programs
# (the test suite's ops, dense-precision and compiler tests in one process) has ended in a
# segmentation fault or abort while tracing a later program, and not with it off; until
# that is understood the kernel runs only where this variable is 1.
OPT_IN = 'JLEARNGENE_CPU_ATTENTION_KERNEL'


def kernel_applies(head_dim: int, dtypes, num_devices: int) -> bool:
    """The FFI kernels apply: opted in (`OPT_IN`), Dh in whole vectors and
    `library.kernels_apply`."""
    return (os.environ.get(OPT_IN, '0').strip() == '1' and head_dim % KERNEL_DIM_MULTIPLE == 0
            and library.kernels_apply(dtypes, num_devices))


def _kernel_applies(ctx) -> bool:
    """`kernel_applies` for a lowering context (the device count is known only there)."""
    return ctx.avals_in[0].shape[-1] % KERNEL_DIM_MULTIPLE == 0 and library.ffi_applies(ctx)


def _lowering(fallback, target, n_out):
    def lower(ctx, *args, scale, **_):
        if _kernel_applies(ctx):
            return jax.ffi.ffi_lowering(target)(ctx, *args, scale=np.float32(scale))
        return mlir.lower_fun(functools.partial(fallback, scale=scale),
                              multiple_results=n_out > 1)(ctx, *args)
    return lower


def _merged_batch(prim, n_out):
    """vmap rule: the mapped axis folded into the batch axis B (every operand has B first),
    so the kernel still runs; unmapped operands are broadcast."""
    def rule(args, dims, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        flat = []
        for a, d in zip(args, dims):
            a = jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
            flat.append(a.reshape(size * a.shape[1], *a.shape[2:]))
        outs = prim.bind(*flat, **params)
        outs = outs if n_out > 1 else [outs]
        outs = [o.reshape(size, -1, *o.shape[1:]) for o in outs]
        return (outs, [0] * n_out) if n_out > 1 else (outs[0], 0)
    return rule


def _zero_like(x):
    return ad.Zero(core.get_aval(x).to_tangent_aval())


def _jvp_of(fn):
    """JVP rule of a primitive from jax.jvp of its XLA formula (higher-order derivatives)."""
    def rule(primals, tangents, **params):
        tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
        return jax.jvp(functools.partial(fn, **params), tuple(primals), tangents)
    return rule


# attention: qkv -> (o, probs)
_attention_p = Primitive('jlearngene_attention')
_attention_p.multiple_results = True
_attention_p.def_impl(_reference_fused)


def _attention_abstract_eval(qkv, **_):
    b, t, _, h, dh = qkv.shape
    return (core.ShapedArray((b, t, h, dh), qkv.dtype), core.ShapedArray((b, h, t, t), qkv.dtype))


_attention_p.def_abstract_eval(_attention_abstract_eval)
mlir.register_lowering(_attention_p, mlir.lower_fun(_reference_fused, multiple_results=True))
mlir.register_lowering(_attention_p, _lowering(_reference_fused, 'jlearngene_attention_fwd', 2),
                       platform='cpu')
batching.primitive_batchers[_attention_p] = _merged_batch(_attention_p, 2)


def _attention_jvp(primals, tangents, *, scale, probs_name):
    (qkv,), (t_qkv,) = primals, tangents
    o, probs = _attention_p.bind(qkv, scale=scale, probs_name=probs_name)
    if type(t_qkv) is ad.Zero:
        return (o, probs), (_zero_like(o), _zero_like(probs))
    if probs_name is not None:   # what the tangent (and so the backward pass) reads
        probs = checkpoint_name(probs, probs_name)
    t_o = _out_tangent_p.bind(qkv, probs, t_qkv, scale=scale)
    return (o, probs), (t_o, _probs_tangent(qkv, probs, t_qkv, scale))


ad.primitive_jvps[_attention_p] = _attention_jvp

# The tangent of o: (qkv, probs, t_qkv) -> d o, linear in t_qkv; its transpose is the
# backward kernel.
_out_tangent_p = Primitive('jlearngene_attention_tangent')
_out_tangent_p.def_impl(_out_tangent)
_out_tangent_p.def_abstract_eval(
    lambda qkv, probs, t_qkv, **_: _attention_abstract_eval(qkv)[0])
mlir.register_lowering(_out_tangent_p, mlir.lower_fun(_out_tangent, multiple_results=False))
batching.primitive_batchers[_out_tangent_p] = _merged_batch(_out_tangent_p, 1)
ad.primitive_jvps[_out_tangent_p] = _jvp_of(_out_tangent)


def _out_tangent_transpose(ct, qkv, probs, t_qkv, *, scale):
    # Only t_qkv is ever a linear input: qkv and probs come from the primal computation.
    if type(ct) is ad.Zero:
        return None, None, ad.Zero(t_qkv.aval)
    return None, None, _backward_p.bind(qkv, probs, ct, scale=scale)


ad.primitive_transposes[_out_tangent_p] = _out_tangent_transpose

# The backward pass: (qkv, probs, d o) -> d qkv.
_backward_p = Primitive('jlearngene_attention_backward')
_backward_p.def_impl(_backward_reference)
_backward_p.def_abstract_eval(lambda qkv, probs, d_out, **_: core.ShapedArray(qkv.shape, qkv.dtype))
mlir.register_lowering(_backward_p, mlir.lower_fun(_backward_reference, multiple_results=False))
mlir.register_lowering(_backward_p, _lowering(_backward_reference, 'jlearngene_attention_bwd', 1),
                       platform='cpu')
batching.primitive_batchers[_backward_p] = _merged_batch(_backward_p, 1)
ad.primitive_jvps[_backward_p] = _jvp_of(_backward_reference)
# Linear in d o: its transpose is the tangent again (reverse over reverse).
ad.primitive_transposes[_backward_p] = (
    lambda ct, qkv, probs, d_out, *, scale: (
        None, None, ad.Zero(d_out.aval) if type(ct) is ad.Zero
        else _out_tangent_p.bind(qkv, probs, ct, scale=scale)))
