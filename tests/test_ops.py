"""`jlearngene.ops`: the reference implementation, the registry of backends, dispatch and
its switches."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import compiler, ops
from jlearngene.ops import reference


def _probs_reference(q, k, v, scale):
    """The definition in float64 numpy."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum('bqhk,bthk->bhqt', q, k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum('bhqt,bthk->bqhk', p, v), p


@pytest.mark.parametrize('tq', [7, 1])
def test_reference_attention_with_and_without_probs_is_the_definition(tq):
    keys = jax.random.split(jax.random.key(0), 3)
    k, v = (jax.random.normal(kk, (2, 7, 3, 16)) for kk in keys[1:])
    q = jax.random.normal(keys[0], (2, tq, 3, 16))
    o_ref, p_ref = _probs_reference(q, k, v, 0.3)
    o, probs = reference.attention(q, k, v, 0.3)               # jax.nn.dot_product_attention
    assert probs is None
    np.testing.assert_allclose(o, o_ref, atol=2e-6)
    o, probs = reference.attention(q, k, v, 0.3, need_probs=True)
    np.testing.assert_allclose(o, o_ref, atol=2e-6)
    np.testing.assert_allclose(probs, p_ref, atol=2e-6)
    g = jax.grad(lambda q: reference.attention(q, k, v, 0.3)[0].sum())(q)
    g_probs = jax.grad(lambda q: reference.attention(q, k, v, 0.3, need_probs=True)[0].sum())(q)
    np.testing.assert_allclose(g, g_probs, atol=1e-5)


def test_dense_and_attention_name_bad_arguments():
    with pytest.raises(ValueError, match="precision 'tf32'"):
        ops.dense(jnp.ones((2, 2)), jnp.ones((2, 2)), 'tf32')
    with pytest.raises(ValueError, match=r'dense: .*\(2, 3\).*\(2, 2\)'):
        ops.dense(jnp.ones((2, 3)), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r'attention: .*\(1, 3, 4, 8\)'):
        ops.attention(jnp.ones((1, 3, 2, 8)), jnp.ones((1, 3, 2, 8)), jnp.ones((1, 3, 4, 8)), 1.0)


@pytest.fixture
def fake_backend():
    """A backend on this platform that doubles dense results and declines attention."""
    calls = []

    def dense(x, w, precision):
        calls.append('dense')
        return NotImplemented if x.shape[0] == 1 else 2 * (x @ w)

    def attention(q, k, v, scale, need_probs, probs_name):
        calls.append('attention')
        return NotImplemented

    assert 'fake' not in ops.registered()
    ops.register(ops.Backend('fake', jax.default_backend(), dense=dense, attention=attention))
    yield calls
    if 'fake' in ops.registered():
        ops.unregister('fake')


def test_a_registered_backend_takes_calls_or_declines_them(fake_backend, monkeypatch):
    monkeypatch.setenv(ops.ENV_SWITCH, 'fake')      # this backend only
    x, w = jnp.ones((3, 4)), jnp.ones((4, 5))
    np.testing.assert_array_equal(ops.dense(x, w), 8.0)
    np.testing.assert_array_equal(ops.dense(x[:1], w), 4.0)    # declined: the reference
    q = jnp.ones((1, 2, 1, 4))
    o, _ = ops.attention(q, q, q, 0.5)
    np.testing.assert_allclose(o, 1.0)
    assert fake_backend == ['dense', 'dense', 'attention']
    with ops.use_reference():
        np.testing.assert_array_equal(ops.dense(x, w), 4.0)
        assert ops.active_backends() == []
    assert [b.name for b in ops.active_backends()] == ['fake']
    assert ops.active_backends('no-such-platform') == []


def test_the_environment_switch(fake_backend, monkeypatch):
    x, w = jnp.ones((3, 4)), jnp.ones((4, 5))
    monkeypatch.setenv(ops.ENV_SWITCH, 'reference')
    assert ops.active_backends() == []
    np.testing.assert_array_equal(ops.dense(x, w), 4.0)
    monkeypatch.setenv(ops.ENV_SWITCH, 'all')
    assert 'fake' in [b.name for b in ops.active_backends()]
    monkeypatch.setenv(ops.ENV_SWITCH, 'fake,nonsense')
    with pytest.raises(ValueError, match=r"\['nonsense'\]"):
        ops.active_backends()


def test_the_gpu_backend_is_the_only_built_in_one():
    """CPUs and TPUs run the reference (XLA's own kernels)."""
    assert {n: b.platform for n, b in ops.registered().items()} == {'gpu': 'gpu'}
    assert ops.active_backends('cpu') == [] and ops.active_backends('tpu') == []


def test_unregister_removes_a_backend(fake_backend):
    ops.unregister('fake')
    assert 'fake' not in ops.registered()
    assert 'fake' not in [b.name for b in ops.active_backends()]
    with pytest.raises(KeyError, match='fake'):
        ops.unregister('fake')


@pytest.mark.parametrize('shape', [((6, 4), (4, 9)), ((9, 7), (7, 3))])
def test_dense_is_the_plain_product_in_both_autodiff_modes(shape):
    """Eager and under `compiler.jit`."""
    (n, k), (_, m) = shape
    x = jax.random.normal(jax.random.key(0), (n, k))
    w = jax.random.normal(jax.random.key(1), (k, m))
    f = lambda x, w: jnp.sum(jnp.sin(ops.dense(x, w)))      # noqa: E731
    f_ref = lambda x, w: jnp.sum(jnp.sin(x @ w))            # noqa: E731
    for jit in (lambda g: g, compiler.jit):
        np.testing.assert_allclose(jit(ops.dense)(x, w), x @ w, rtol=1e-6, atol=1e-6)
        for a, b in zip(jit(jax.grad(f, (0, 1)))(x, w), jax.grad(f_ref, (0, 1))(x, w)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        tx, tw = jnp.ones_like(x), jnp.full_like(w, 0.5)
        np.testing.assert_allclose(jit(lambda x, w, tx=tx, tw=tw: jax.jvp(f, (x, w), (tx, tw))[1])(x, w),
                                   jax.jvp(f_ref, (x, w), (tx, tw))[1], rtol=1e-5, atol=1e-5)
