"""The speed-motivated formulations in `models/vit.py` compute the same function and gradients
as their plain definitions: erf GELU with a custom derivative, the fused q/k/v projection and
the save-only-matmul-outputs checkpoint policy of the encoder blocks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene.models import vit


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
    out, _ = vit.attention(p, x)
    np.testing.assert_allclose(out, _attention_reference(p, x), atol=1e-5)
    g = jax.grad(lambda p: vit.attention(p, x)[0].sum())(p)
    g_ref = jax.grad(lambda p: _attention_reference(p, x).sum())(p)
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
        return jax.grad(lambda p: jnp.square(vit.apply(p, x, cfg, train=True)[0]).sum())(params)

    g_policy, g_remat = grads(tiny_cfg), grads(tiny_cfg.replace(remat=True))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), g_policy, g_remat)


@pytest.mark.parametrize('shape', [((6, 4), (4, 9)), ((9, 7), (7, 3))])
def test_matmul_matches_plain_product_in_both_autodiff_modes(shape):
    """`vit.matmul` (materialised transposes in its derivative) is x @ w for grad and jvp."""
    (n, k), (_, m) = shape
    x = jax.random.normal(jax.random.key(0), (n, k))
    w = jax.random.normal(jax.random.key(1), (k, m))
    np.testing.assert_allclose(vit.matmul(x, w), x @ w, rtol=1e-6)
    f = lambda x, w: jnp.sum(jnp.sin(vit.matmul(x, w)))
    f_ref = lambda x, w: jnp.sum(jnp.sin(x @ w))
    for a, b in zip(jax.grad(f, (0, 1))(x, w), jax.grad(f_ref, (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    tx, tw = jnp.ones_like(x), jnp.full_like(w, 0.5)
    np.testing.assert_allclose(jax.jvp(f, (x, w), (tx, tw))[1], jax.jvp(f_ref, (x, w), (tx, tw))[1],
                               rtol=1e-5, atol=1e-5)
