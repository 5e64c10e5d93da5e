"""The CPU backend's attention kernels (`jlearngene.ops.cpu.attention`): the reference's
values and derivatives in every autodiff mode, and applied where they can be (Dh in whole
vectors, float32, one device, the switch on)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene.ops import reference
from jlearngene.ops.cpu import attention, library

needs_kernel = pytest.mark.skipif(
    jax.default_backend() != 'cpu' or not library.available()
    or os.environ.get(attention.OPT_IN) != '1',
    reason='the compiled CPU attention kernel is not available here or not opted in '
           '(JLEARNGENE_CPU_ATTENTION_KERNEL=1)')


def _qkv(b, t, h, dh, seed=0):
    return 2 * jax.random.normal(jax.random.key(seed), (b, t, 3, h, dh))


def _reference(qkv, scale):
    return reference.probs_attention(*attention.split(qkv), scale)


def _close(a, b, tol=2e-5):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * float(np.abs(b).max()))


@pytest.mark.parametrize('b, t, h, dh', [(2, 65, 3, 64), (3, 5, 2, 16), (1, 1, 1, 32),
                                         (4, 9, 5, 16), (2, 17, 2, 48)])
@pytest.mark.parametrize('jit', [True, False])
def test_values_and_backward_match_the_reference(b, t, h, dh, jit):
    qkv, scale = _qkv(b, t, h, dh), dh ** -0.5
    fn = jax.jit(attention.attention, static_argnums=1) if jit else attention.attention
    o, probs = fn(qkv, scale)
    o_ref, probs_ref = _reference(qkv, scale)
    assert o.shape == (b, t, h, dh) and probs.shape == (b, h, t, t)
    _close(o, o_ref)
    _close(probs, probs_ref)
    d_o = jax.random.normal(jax.random.key(1), o.shape)
    vjp = lambda f: jax.vjp(lambda x: f(x, scale)[0], qkv)[1](d_o)[0]
    _close(jax.jit(lambda: vjp(attention.attention))() if jit else vjp(attention.attention),
           vjp(_reference))


def test_every_autodiff_mode_and_vmap():
    qkv, scale = _qkv(2, 7, 2, 16), 0.25
    r = jax.random.normal(jax.random.key(1), (2, 7, 2, 16))

    def loss(fn):   # reads both outputs: the probabilities' derivative is exercised too
        def f(x):
            o, probs = fn(x, scale)
            return jnp.sum(jnp.sin(o) * r) + jnp.sum(probs ** 2)
        return f

    f, f_ref = loss(attention.attention), loss(_reference)
    _close(jax.jit(jax.grad(f))(qkv), jax.grad(f_ref)(qkv))
    _close(jax.jvp(f, (qkv,), (qkv,))[1], jax.jvp(f_ref, (qkv,), (qkv,))[1])
    hvp = lambda f: jax.jvp(jax.grad(f), (qkv,), (jnp.cos(qkv),))[1]
    _close(jax.jit(lambda: hvp(f))(), hvp(f_ref), 1e-4)
    rev_rev = lambda f: jax.grad(lambda x: jnp.sum(jax.grad(f)(x) ** 2))(qkv)
    _close(jax.jit(lambda: rev_rev(f))(), rev_rev(f_ref), 1e-4)
    stacked = jnp.stack([qkv, -qkv, 2 * qkv])
    _close(jax.jit(jax.vmap(jax.grad(f)))(stacked), jax.vmap(jax.grad(f_ref))(stacked))


def test_kernels_apply_only_where_they_can(monkeypatch):
    f32 = [jnp.float32] * 3
    assert attention.kernel_applies(16, f32, 1) == (library.available() and os.environ.get(attention.OPT_IN) == '1')
    assert not attention.kernel_applies(8, f32, 1)                    # Dh not whole vectors
    assert not attention.kernel_applies(16, [jnp.bfloat16] * 3, 1)
    assert not attention.kernel_applies(16, f32, 8)   # a custom call would gather the operands
    monkeypatch.setenv(library.ENV_SWITCH, '0')
    assert not attention.kernel_applies(16, f32, 1)


@needs_kernel
def test_fallback_gives_the_same_values(monkeypatch):
    qkv = _qkv(2, 9, 2, 16)
    on = jax.jit(lambda x: jax.grad(lambda y: attention.attention(y, 0.25)[0].sum())(x))(qkv)
    monkeypatch.setenv(library.ENV_SWITCH, '0')
    off = jax.jit(lambda x: jax.grad(lambda y: attention.attention(y, 0.25)[0].sum())(x))(qkv)
    _close(on, off)


def test_bad_shape_is_named():
    with pytest.raises(ValueError, match=r'\(B, T, 3, H, Dh\)'):
        attention.attention(jnp.ones((2, 5, 2, 2, 16)), 0.25)


@needs_kernel
def test_kernel_results_are_deterministic():
    """Threads claim the heads in any order; no result may depend on it."""
    qkv = _qkv(16, 33, 4, 32, seed=3)
    fn = jax.jit(lambda x: jax.value_and_grad(lambda y: jnp.sum(attention.attention(y, 0.2)[0] ** 2))(x))
    first = jax.tree.map(np.asarray, fn(qkv))
    for _ in range(5):
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, fn(qkv)), first)
