"""The reference implementation of `jlearngene.ops`: plain jax, what every platform runs
where no backend takes a call (CPUs and TPUs always, with XLA's own kernels; GPUs but for
`ops.gpu`'s cuDNN attention)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

DENSE_PRECISIONS = ('float32', 'bfloat16')


def dense(x: jax.Array, w: jax.Array, precision: str = 'float32') -> jax.Array:
    """`x @ w`; with precision='bfloat16' the rounded-operand product `bf16_matmul`.

    Unlike `jlearngene.ops.dense` it checks nothing: any other `precision` is the plain product.

    Args:
        x: the left operand, (N, K).
        w: the right operand, (K, M).
        precision: 'float32' (default) or 'bfloat16'.

    Returns:
        The product, (N, M); with 'bfloat16', cast to `x`'s dtype.
    """
    if precision == 'bfloat16':
        return bf16_matmul(x, w).astype(x.dtype)
    return x @ w


def bf16_product(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b from bfloat16-rounded operands, accumulated and returned in float32.

    Args:
        a: the left operand.
        b: the right operand, matmul-compatible with `a`.

    Returns:
        `a @ b` in float32.
    """
    return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                      preferred_element_type=jnp.float32)


@jax.custom_vjp
def bf16_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w (float32 result) from bfloat16-rounded operands, forward and backward.

    The gradients are the same kind of product, g·wᵀ and xᵀ·g with the cotangent g rounded too
    (and cast back to the dtypes of `x` and `w`): JAX's derived backward would multiply the
    float32 cotangent with a bfloat16 operand, which XLA computes in float32.

    Args:
        x: the left operand, (N, K).
        w: the right operand, (K, M).

    Returns:
        The product, (N, M), float32.
    """
    return bf16_product(x, w)


def _bf16_matmul_fwd(x, w):
    return bf16_product(x, w), (x, w)


def _bf16_matmul_bwd(res, g):
    x, w = res
    g = g.astype(jnp.bfloat16)
    return bf16_product(g, w.T).astype(x.dtype), bf16_product(x.T, g).astype(w.dtype)


bf16_matmul.defvjp(_bf16_matmul_fwd, _bf16_matmul_bwd)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, *,
              need_probs: bool = False, probs_name: str | None = None):
    """(o, probs) of softmax attention; see `jlearngene.ops.attention`.

    Without `need_probs` this is `jax.nn.dot_product_attention` (probs None); with it, the
    explicit product, softmax (in float32 whatever the inputs' dtype) and product, the
    probabilities written out.

    Args:
        q: the queries, (B, Tq, H, Dh).
        k: the keys, (B, T, H, Dh).
        v: the values, of `k`'s shape.
        scale: the factor of the queries, usually `Dh ** -0.5`.
        need_probs: compute and return the probabilities.
        probs_name: with `need_probs`, the `checkpoint_name` of the probabilities; `None`: no name.

    Returns:
        `(o, probs)`, with o (B, Tq, H, Dh) and probs (B, H, Tq, T) in `q`'s dtype, or `None` without
        `need_probs`.
    """
    if not need_probs:
        return jax.nn.dot_product_attention(q, k, v, scale=scale), None
    logits = jnp.einsum('bqhk,bthk->bhqt', q * jnp.asarray(scale, q.dtype), k)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
    if probs_name is not None:
        probs = checkpoint_name(probs, probs_name)
    return jnp.einsum('bhqt,bthk->bqhk', probs, v), probs
