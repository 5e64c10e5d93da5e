"""The CPU backend's float32 dense product: x @ w whose weight gradient xᵀ·g is a C++ kernel.

Why: in the CPU training step XLA's oneDNN dots run the forward and input-gradient products
at about torch's speed, but the weight gradients (a contraction over every token of the
batch, both operands activations) at about half of it, because oneDNN transposes and
re-blocks both operands on every call. `weight_grad.cc` reads them in place (measurements in
benchmarks/README.md). The result is an ordinary float32 product (accumulated in float32,
by blocks of 256 tokens, 128 with AVX-512), not a reduced-precision one.

`matmul` is a primitive whose derivative with respect to w is `weight_grad` (the kernel
where `library.kernels_apply`, else XLA's product) and with respect to x is `input_grad`.
Forward and reverse mode, their compositions and vmap all work.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import core
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jlearngene.ops.cpu import library, onednn
from jlearngene.ops.reference import bf16_product, rounded_matmul


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w for x (K, M), w (M, N); see the module docstring."""
    _check_2d('matmul', x, w, 1, 0)
    return _matmul_p.bind(x, w)


def weight_grad(x: jax.Array, g: jax.Array) -> jax.Array:
    """xᵀ·g for x (K, M) and g (K, N): the compiled kernel when lowered for one CPU device
    with float32 operands and `library.available()`, else XLA's product."""
    _check_2d('weight_grad', x, g, 0, 0)
    return _weight_grad_p.bind(x, g)


def input_grad(g: jax.Array, w: jax.Array) -> jax.Array:
    """g·wᵀ, the input gradient of x @ w. oneDNN (`onednn.options()`) reads wᵀ in place;
    XLA's default CPU kernels are slow with a transposed operand, so without the options
    wᵀ is first written out row-major."""
    return g @ (w.T if onednn.options() else materialised_t(w))


def _check_2d(name, a, b, axis_a, axis_b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[axis_a] != b.shape[axis_b]:
        raise ValueError(f'{name}: incompatible operands {a.shape} and {b.shape}')


def materialised_t(a: jax.Array) -> jax.Array:
    """`a.T` as a real row-major copy: the barrier stops XLA from folding the transpose
    back into the consuming dot as a transposed operand."""
    return jax.lax.optimization_barrier(a.T)


def _xla_weight_grad(x: jax.Array, g: jax.Array) -> jax.Array:
    # Without oneDNN, YNNPACK is fast only with row-major operands; transposing x pays when
    # it is the narrower operand.
    if onednn.options() or x.shape[1] > g.shape[1]:
        return x.T @ g
    return materialised_t(x) @ g


def _product(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w


_matmul_p = Primitive('jlearngene_matmul')
_matmul_p.def_impl(_product)
_matmul_p.def_abstract_eval(
    lambda x, w: core.ShapedArray((x.shape[0], w.shape[1]), jnp.result_type(x, w)))
mlir.register_lowering(_matmul_p, mlir.lower_fun(_product, multiple_results=False))
# x @ w is bilinear: the cotangent of x is ct·wᵀ, that of w is xᵀ·ct.
ad.defbilinear(_matmul_p, lambda ct, x, w: input_grad(ct, w), lambda ct, x, w: weight_grad(x, ct))

_weight_grad_p = Primitive('jlearngene_weight_grad')
_weight_grad_p.def_impl(lambda x, g: _xla_weight_grad(x, g))
_weight_grad_p.def_abstract_eval(
    lambda x, g: core.ShapedArray((x.shape[1], g.shape[1]), jnp.result_type(x, g)))
mlir.register_lowering(_weight_grad_p, mlir.lower_fun(_xla_weight_grad, multiple_results=False))
# xᵀ·g is bilinear: the cotangent of x is g·ctᵀ, that of g is x·ct.
ad.defbilinear(_weight_grad_p, lambda ct, x, g: g @ ct.T, lambda ct, x, g: matmul(x, ct))


def _batched(fn):
    """vmap rule: the plain XLA product, with the batch axis moved to the front."""
    def rule(args, dims):
        return jax.vmap(fn, in_axes=tuple(dims))(*args), 0   # dims: None where not batched
    return rule


batching.primitive_batchers[_matmul_p] = _batched(_product)
batching.primitive_batchers[_weight_grad_p] = _batched(lambda x, g: x.T @ g)


def _cpu_weight_grad_lowering(ctx, x, g):
    """The kernel's FFI call where it applies (`library.ffi_applies`), else XLA's product."""
    if library.ffi_applies(ctx):
        return jax.ffi.ffi_lowering(library.TARGET)(ctx, x, g)
    return mlir.lower_fun(_xla_weight_grad, multiple_results=False)(ctx, x, g)


mlir.register_lowering(_weight_grad_p, _cpu_weight_grad_lowering, platform='cpu')


def bf16_transpose(a: jax.Array) -> jax.Array:
    """`a.T` in bfloat16 as a row-major array, written out through a flat, barriered copy:
    XLA:CPU decides early, while a plain transpose is still a column-major view, whether a
    bfloat16 dot can run in YNNPACK (AMX on recent Xeons), and upcasts the dot to float32
    when it cannot."""
    t = a.T.astype(jnp.bfloat16)
    return jax.lax.optimization_barrier(t.reshape(-1)).reshape(t.shape)


def _bf16_matmul_bwd(res, g):
    x, w = res
    g = g.astype(jnp.bfloat16)
    dx = bf16_product(g, bf16_transpose(w))
    if x.shape[1] <= w.shape[1]:
        dw = bf16_product(bf16_transpose(x), g)
    else:   # transpose the narrower gradient instead of x; the barrier keeps XLA from
        # folding the small result's transpose back into the product as a transposed operand
        dw = jax.lax.optimization_barrier(bf16_product(bf16_transpose(g), x)).T
    return dx.astype(x.dtype), dw.astype(w.dtype)


# `ops.reference.bf16_matmul` (rounded operands forward and backward, float32 result) with
# the backward pass's transposed operands laid out for XLA:CPU's bfloat16 dots.
bf16_matmul = rounded_matmul(_bf16_matmul_bwd)
