"""The speed-motivated formulations in `models/vit.py` compute the same function and gradients
as their plain definitions: erf GELU with a custom derivative, the fused q/k/v projection,
the save-only-matmul-outputs checkpoint policy of the encoder blocks and the pruned last
block."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene.models import layout, vit


def test_gelu_exact_matches_jax_and_its_derivative():
    x = jnp.linspace(-8.0, 8.0, 4001, dtype=jnp.float32)
    np.testing.assert_allclose(vit.gelu(x, 'exact'), jax.nn.gelu(x, approximate=False), atol=1e-6)
    g = jax.grad(lambda v: vit.gelu(v, 'exact').sum())(x)
    g_ref = jax.grad(lambda v: jax.nn.gelu(v, approximate=False).sum())(x)
    np.testing.assert_allclose(g, g_ref, atol=1e-6)
    # Forward-mode works too (custom_jvp, not custom_vjp).
    _, t = jax.jvp(lambda v: vit.gelu(v, 'exact'), (x,), (jnp.ones_like(x),))
    np.testing.assert_allclose(t, g_ref, atol=1e-6)


def _attention_reference(p, x):
    """Three separate projections, as the canonical tree stores them."""
    dh = p['q']['kernel'].shape[-1]
    q, k, v = (jnp.einsum('btd,dhk->bthk', x, p[n]['kernel']) + p[n]['bias'] for n in 'qkv')
    probs = jax.nn.softmax(jnp.einsum('bqhk,bthk->bhqt', q * dh ** -0.5, k), axis=-1)
    o = jnp.einsum('bhqt,bthk->bqhk', probs, v)
    return jnp.einsum('bqhk,hkd->bqd', o, p['out']['kernel']) + p['out']['bias']


def test_fused_qkv_attention_matches_separate_projections(tiny_cfg):
    p = vit.init_block(tiny_cfg, jax.random.key(0))['attn']
    p = jax.tree.map(lambda a: a + 0.01 * jax.random.normal(jax.random.key(1), a.shape), p)
    x = jax.random.normal(jax.random.key(2), (2, 5, tiny_cfg.width))
    out, _ = jax.jit(vit.attention)(p, x)
    np.testing.assert_allclose(out, jax.jit(_attention_reference)(p, x), atol=1e-5)
    g = jax.jit(jax.grad(lambda p: vit.attention(p, x)[0].sum()))(p)
    g_ref = jax.jit(jax.grad(lambda p: _attention_reference(p, x).sum()))(p)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), g, g_ref)


def test_attention_rejects_partial_qkv_biases(tiny_cfg):
    p = vit.init_block(tiny_cfg, jax.random.key(0))['attn']
    del p['k']['bias']
    with pytest.raises(ValueError, match='q, k and v'):
        vit.attention(p, jnp.zeros((1, 3, tiny_cfg.width)))


def test_block_save_policy_gives_the_gradients_of_full_remat(tiny_cfg):
    params = vit.init(tiny_cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, tiny_cfg.image_size, tiny_cfg.image_size, 3))

    def grads(cfg):
        return jax.jit(jax.grad(lambda p: jnp.square(vit.apply(p, x, cfg, train=True)[0]).sum()))(params)

    g_policy, g_remat = grads(tiny_cfg), grads(tiny_cfg.replace(remat=True))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), g_policy, g_remat)


def test_attention_for_the_first_queries_only(tiny_cfg):
    p = vit.init_block(tiny_cfg, jax.random.key(0))['attn']
    p = jax.tree.map(lambda a: a + 0.01 * jax.random.normal(jax.random.key(1), a.shape), p)
    x = jax.random.normal(jax.random.key(2), (2, 5, tiny_cfg.width))
    out, probs = vit.attention(p, x, n_queries=2, need_probs=True)
    assert out.shape == (2, 2, tiny_cfg.width) and probs.shape == (2, tiny_cfg.num_heads, 2, 5)
    np.testing.assert_allclose(vit.attention(p, x, n_queries=2)[0], out, atol=1e-6)
    np.testing.assert_allclose(out, _attention_reference(p, x)[:, :2], atol=1e-5)
    g = jax.jit(jax.grad(lambda p: vit.attention(p, x, n_queries=2)[0].sum()))(p)
    g_ref = jax.jit(jax.grad(lambda p: _attention_reference(p, x)[:, :2].sum()))(p)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), g, g_ref)


@pytest.mark.parametrize('stacked, distill, jit', [
    (True, False, True), (False, True, True),
    pytest.param(True, True, False, marks=pytest.mark.slow)],    # eager: one program per op
    ids=['stacked-cls-jit', 'list-cls+dist-jit', 'stacked-cls+dist-eager'])
def test_class_token_pooling_computes_only_the_prefix_of_the_last_block(tiny_cfg, stacked,
                                                                          distill, jit):
    cfg = tiny_cfg.replace(pool='cls', class_token=True, distill_token=distill, depth=2)
    params = vit.init(cfg, jax.random.key(0))
    params = jax.tree.map(lambda a: a + 0.02 * jax.random.normal(jax.random.key(1), a.shape), params)
    if not stacked:
        params = layout.unstack_blocks(params)
    x = jax.random.normal(jax.random.key(2), (3, cfg.image_size, cfg.image_size, 3))
    n_prefix = 2 if distill else 1

    def pruned(p):        # the default path: the last block returns the prefix tokens only
        return vit.apply(p, x, cfg)[0]

    def full(p):          # capturing every block's tokens makes the last block run in full
        return vit.apply(p, x, cfg, capture=('blocks',))[0]

    def loss_and_grad(f):
        fn = jax.value_and_grad(lambda p: jnp.square(f(p)).sum())
        return (jax.jit(fn) if jit else fn)(params)

    tokens = vit.embed(params, x, cfg)
    assert vit.encode(params['blocks'], tokens, cfg, n_out=n_prefix)[0].shape[1] == n_prefix
    (loss, g), (loss_ref, g_ref) = loss_and_grad(pruned), loss_and_grad(full)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), g, g_ref)


def test_pruned_last_block_trains_with_dropout_and_refuses_capture(tiny_cfg):
    cfg = tiny_cfg.replace(pool='cls', class_token=True, dropout=0.1, drop_path=0.1)
    params = vit.init(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(2), (3, cfg.image_size, cfg.image_size, 3))
    logits, _ = vit.apply(params, x, cfg, train=True, rng=jax.random.key(3))
    assert logits.shape == (3, cfg.num_classes) and bool(jnp.isfinite(logits).all())
    with pytest.raises(ValueError, match=r"n_out=1.*capture=\('attn',\)"):
        vit.encode(params['blocks'], vit.embed(params, x, cfg), cfg, n_out=1, capture=('attn',))
