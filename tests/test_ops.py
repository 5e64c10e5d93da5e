"""`jlearngene.ops`: the reference implementation, backend dispatch and its switches, and
the parity of the model with its backends on and off."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import compiler, ops
from jlearngene.models import layout, vit
from jlearngene.ops import reference
from jlearngene.ops.cpu import library

on_cpu = pytest.mark.skipif(jax.default_backend() != 'cpu', reason='the CPU backend')


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
    with pytest.raises(ValueError, match='incompatible operands'):
        ops.dense(jnp.ones((2, 3)), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r'q \(B, Tq, H, Dh\)'):
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

    old = ops.registered()
    ops.register(ops.Backend('fake', jax.default_backend(), dense=dense, attention=attention,
                             compiler_options=lambda: {'xla_fake': 1}))
    yield calls
    ops._registry.clear()
    ops._registry.update(old)


def test_a_registered_backend_takes_calls_or_declines_them(fake_backend, monkeypatch):
    monkeypatch.setenv(ops.ENV_SWITCH, 'fake')      # this backend only
    x, w = jnp.ones((3, 4)), jnp.ones((4, 5))
    np.testing.assert_array_equal(ops.dense(x, w), 8.0)
    np.testing.assert_array_equal(ops.dense(x[:1], w), 4.0)    # declined: the reference
    q = jnp.ones((1, 2, 1, 4))
    o, _ = ops.attention(q, q, q, 0.5)
    np.testing.assert_allclose(o, 1.0)
    assert fake_backend == ['dense', 'dense', 'attention']
    assert ops.compiler_options() == {'xla_fake': 1}
    with ops.use_reference():
        np.testing.assert_array_equal(ops.dense(x, w), 4.0)
        assert ops.compiler_options() == {} and ops.active_backends() == []
    assert [b.name for b in ops.active_backends()] == ['fake']
    assert ops.active_backends('no-such-platform') == []


def test_the_environment_switch(fake_backend, monkeypatch):
    x, w = jnp.ones((3, 4)), jnp.ones((4, 5))
    monkeypatch.setenv(ops.ENV_SWITCH, 'reference')
    assert ops.active_backends() == [] and compiler.options() == {}
    np.testing.assert_array_equal(ops.dense(x, w), 4.0)
    monkeypatch.setenv(ops.ENV_SWITCH, 'all')
    assert 'fake' in [b.name for b in ops.active_backends()]
    monkeypatch.setenv(ops.ENV_SWITCH, 'fake,nonsense')
    with pytest.raises(ValueError, match=r"unknown backend\(s\) \['nonsense'\]"):
        ops.active_backends()


@on_cpu
def test_the_cpu_backend_is_registered_with_its_compiler_options(monkeypatch):
    assert 'cpu' in [b.name for b in ops.active_backends('cpu')]
    assert ops.active_backends('gpu') == [] and ops.compiler_options('tpu') == {}
    monkeypatch.setenv(ops.ENV_SWITCH, 'cpu')
    assert [b.name for b in ops.active_backends()] == ['cpu']


def _model_parity(cfg, params, images, capture=(), jit=compiler.jit):
    """(logits, grads) with the backends on and with the reference, each freshly traced."""
    def loss(p):
        logits, aux = vit.apply(p, images, cfg, capture=capture)
        extra = sum(jnp.sum(a ** 2) for a in jax.tree.leaves(aux.get('attn', [])))
        return jnp.sum(jnp.sin(logits)) + extra, logits

    def run():
        return jit(jax.grad(loss, has_aux=True))(params)

    on = run()
    with ops.use_reference():
        off = run()
    return on, off


def _max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


PARITY_CASES = {
    'stacked-cls': ({}, (), True),
    'list-avg': ({'pool': 'avg'}, (), False),
    'capture-attn': ({}, ('attn',), True),
    'distill': ({'distill_token': True}, (), True),
}


@on_cpu
@pytest.mark.usefixtures('no_persistent_cache')
@pytest.mark.parametrize('case', sorted(PARITY_CASES))
def test_model_logits_and_gradients_agree_with_and_without_backends(tiny_cfg, case):
    """Float32 arithmetic in another order (C++ kernels, oneDNN): float32 tolerance."""
    changes, capture, stacked = PARITY_CASES[case]
    cfg = tiny_cfg.replace(**changes)                          # head_dim 16: the kernels apply
    params = vit.init(cfg, jax.random.key(0))
    params = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape),
                          params)
    if not stacked:
        params = layout.unstack_blocks(params)
    images = jax.random.normal(jax.random.key(2), (4, 16, 16, 3))
    (g_on, logits_on), (g_off, logits_off) = _model_parity(cfg, params, images, capture)
    scale = max(float(jnp.max(jnp.abs(logits_off))), 1.0)
    assert _max_diff(logits_on, logits_off) < 1e-5 * scale
    g_scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_off))
    assert _max_diff(g_on, g_off) < 1e-5 * g_scale
    assert _max_diff(g_on, jax.tree.map(jnp.zeros_like, g_on)) > 0


@on_cpu
@pytest.mark.usefixtures('no_persistent_cache')
def test_bf16_dense_model_agrees_with_and_without_backends(tiny_cfg):
    """Both compute the rounded-operand products; only the layout of operands differs."""
    cfg = tiny_cfg.replace(dense_precision='bfloat16')
    params = vit.init(cfg, jax.random.key(0))
    images = jax.random.normal(jax.random.key(2), (4, 16, 16, 3))
    (g_on, logits_on), (g_off, logits_off) = _model_parity(cfg, params, images)
    assert _max_diff(logits_on, logits_off) < 1e-5
    g_scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_off))
    assert _max_diff(g_on, g_off) < 1e-3 * g_scale


@on_cpu
def test_kernels_switch_alone_keeps_the_values(tiny_cfg, monkeypatch):
    """JLEARNGENE_CPU_KERNELS=0 leaves the backend on with XLA's products in the kernels' place."""
    params = vit.init(tiny_cfg, jax.random.key(0))
    images = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    loss = lambda p: jnp.sum(vit.apply(p, images, tiny_cfg)[0] ** 2)   # noqa: E731
    on = jax.jit(jax.grad(loss))(params)
    monkeypatch.setenv(library.ENV_SWITCH, '0')
    off = jax.jit(jax.grad(lambda p: loss(p)))(params)
    assert _max_diff(on, off) < 1e-5 * max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(off))


@pytest.mark.usefixtures('no_persistent_cache')
@pytest.mark.parametrize('onednn', ['1', '0'])
@pytest.mark.parametrize('shape', [((6, 4), (4, 9)), ((9, 7), (7, 3))])
def test_dense_is_the_plain_product_in_both_autodiff_modes(shape, onednn, monkeypatch):
    """With and without the oneDNN options (their absence changes the CPU backend's input
    and weight gradients' operand layouts), eager and under `compiler.jit`."""
    from jlearngene.ops.cpu import onednn as onednn_lib
    monkeypatch.setenv(onednn_lib.ENV_SWITCH, onednn)
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
        np.testing.assert_allclose(jit(lambda x, w: jax.jvp(f, (x, w), (tx, tw))[1])(x, w),
                                   jax.jvp(f_ref, (x, w), (tx, tw))[1], rtol=1e-5, atol=1e-5)
