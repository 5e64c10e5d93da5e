"""ViT model: golden counts, numpy reference forward, layouts, axes, tracing, config errors."""
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import pytree
from jlearngene.models import (ConfigError, ViTConfig, apply, axes, init, init_block,
                               stack_blocks, unstack_blocks, vit_config)


# --- golden parameter counts (DeiT papers / timm) -----------------------------------------

@pytest.mark.parametrize('variant,count', [('Ti', 5_717_416), ('S', 22_050_664), ('B', 86_567_656)])
def test_golden_param_counts(variant, count):
    cfg = vit_config(variant)  # depth 12, 224 px, patch 16, 1000 classes
    shapes = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))
    assert pytree.count_params(shapes)['total'] == count
    assert round(count / 1e6, 1) == {'Ti': 5.7, 'S': 22.1, 'B': 86.6}[variant]


def test_variant_depth_and_patch_override():
    cfg = vit_config('S/8', depth=6, num_classes=10, image_size=32)
    assert (cfg.width, cfg.num_heads, cfg.mlp_dim, cfg.depth, cfg.patch_size) == (384, 6, 1536, 6, 8)
    assert cfg.num_tokens == 16 + 1


# --- numpy reference: an independent implementation that guards the exact float32 model ---

def _np_ln(x, p, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * p['scale'] + p['bias']


def _np_gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _np_forward(params, images, cfg):
    """Textbook ViT in float64 numpy with an explicit strided convolution; either layout,
    every shape read from the parameters."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(images, np.float64)
    b, hgt, wid, _ = x.shape
    ps = cfg.patch_size
    w = p['patch_embed']['kernel']  # (p, p, C, D)
    tokens = []
    for i in range(0, hgt, ps):
        for j in range(0, wid, ps):
            tokens.append(np.einsum('bhwc,hwcd->bd', x[:, i:i + ps, j:j + ps], w) + p['patch_embed']['bias'])
    x = np.stack(tokens, 1)
    prefix = [np.repeat(p[n], b, 0) for n in ('cls_token', 'dist_token') if n in p]
    x = np.concatenate(prefix + [x], 1) + p['pos_embed']
    for l in range(cfg.depth):
        blocks = p['blocks']
        blk = blocks[l] if isinstance(blocks, list) else jax.tree.map(lambda a, l=l: a[l], blocks)
        h = _np_ln(x, blk['norm1'], cfg.ln_eps)
        q, k, v = (np.einsum('btd,dhk->bhtk', h, blk['attn'][n]['kernel'])
                   + blk['attn'][n]['bias'][None, :, None] for n in 'qkv')
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum('bhtk,hkd->btd', s @ v, blk['attn']['out']['kernel']) + blk['attn']['out']['bias']
        x = x + o
        h = _np_ln(x, blk['norm2'], cfg.ln_eps)
        h = _np_gelu(h @ blk['mlp']['fc1']['kernel'] + blk['mlp']['fc1']['bias'])
        x = x + h @ blk['mlp']['fc2']['kernel'] + blk['mlp']['fc2']['bias']
    if cfg.pool == 'cls':
        feats = _np_ln(x[:, 0], p['norm'], cfg.ln_eps)
    elif cfg.pool_norm == 'after':
        feats = _np_ln(x[:, cfg.num_prefix_tokens:].mean(1), p['norm'], cfg.ln_eps)
    else:
        feats = _np_ln(x[:, cfg.num_prefix_tokens:], p['norm'], cfg.ln_eps).mean(1)
    return feats @ p['head']['kernel'] + p['head']['bias']


def _randomise(params, key):
    """Replace every leaf (biases and norms included) with noise so no term hides."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@pytest.mark.parametrize('pool,pool_norm', [('cls', 'before'), ('avg', 'before'), ('avg', 'after')])
def test_forward_matches_numpy_reference(tiny_cfg, pool, pool_norm):
    cfg = tiny_cfg.replace(pool=pool, pool_norm=pool_norm)
    params = _randomise(init(cfg, jax.random.key(0)), jax.random.key(1))
    images = jax.random.normal(jax.random.key(2), (3, 16, 16, 3))
    logits, _ = apply(params, images, cfg)
    np.testing.assert_allclose(np.asarray(logits), _np_forward(params, images, cfg), atol=2e-5, rtol=1e-5)


def test_tanh_gelu_and_bf16_are_options_close_to_exact(tiny_cfg):
    params = init(tiny_cfg, jax.random.key(0))
    images = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    exact, _ = apply(params, images, tiny_cfg)
    for cfg in (tiny_cfg.replace(gelu='tanh'), tiny_cfg.replace(dtype='bfloat16')):
        other, _ = apply(params, images, cfg)
        assert other.dtype == jnp.float32
        np.testing.assert_allclose(other, exact, atol=5e-2)


# --- initialisation --------------------------------------------------------------------

def test_init_layout_and_zeros(tiny_cfg):
    cfg = tiny_cfg.replace(width=64, mlp_dim=256, depth=4)
    p = init(cfg, jax.random.key(0))
    np.testing.assert_array_equal(p['blocks']['norm1']['scale'], 1.0)
    np.testing.assert_array_equal(p['blocks']['mlp']['fc1']['bias'], 0.0)
    np.testing.assert_array_equal(p['head']['bias'], 0.0)
    assert not np.allclose(p['blocks']['attn']['q']['kernel'][0], p['blocks']['attn']['q']['kernel'][1])


def _trunc_normal_draws(cfg):
    """Every trunc-normal leaf of a model: ~1.2M draws."""
    p = init(cfg, jax.random.key(0))
    kernels = [a for path, a in pytree.flatten(p).items()
               if path.endswith('kernel') and 'patch_embed' not in path]
    kernels += [p['pos_embed'], p['cls_token']]
    return np.concatenate([np.asarray(a).ravel() for a in kernels])


def test_default_init_is_timms_normal_with_absolute_bounds():
    """timm's trunc_normal_(std=.02) truncates at ±2 absolute: N(0, 0.02²)."""
    cfg = vit_config('Ti', width=128, num_heads=2, mlp_dim=512, depth=6, image_size=32,
                     patch_size=4, num_classes=10)
    assert cfg.init_truncation == 'absolute'
    w = _trunc_normal_draws(cfg)
    assert w.size > 1_000_000
    # std error of the std ≈ 0.02/sqrt(2n) ≈ 1.4e-5; the ±2σ draws' std is 0.0176.
    assert abs(w.std() - 0.02) < 2e-4, w.std()
    assert abs(w.mean()) < 1e-4
    assert 0.08 < np.abs(w).max() < 0.2     # n ≈ 1e6 normal draws reach ~5σ
    # the tails of a normal: P(|z| > 2) = 4.55 %, P(|z| > 3) = 0.27 %
    assert abs(np.mean(np.abs(w) > 0.04) - 0.0455) < 2e-3
    assert abs(np.mean(np.abs(w) > 0.06) - 0.0027) < 5e-4


def test_two_sigma_init_truncates_at_two_standard_deviations():
    cfg = vit_config('Ti', width=128, num_heads=2, mlp_dim=512, depth=6, image_size=32,
                     patch_size=4, num_classes=10, init_truncation='two_sigma')
    w = _trunc_normal_draws(cfg)
    # std of N(0, 1) truncated at ±2: 0.8796
    assert abs(w.std() - 0.02 * 0.8796) < 2e-4, w.std()
    assert np.abs(w).max() <= 0.04 + 1e-7 and np.abs(w).max() > 0.0399


def test_init_truncation_is_validated(tiny_cfg):
    with pytest.raises(ConfigError, match="init_truncation='one_sigma'"):
        tiny_cfg.replace(init_truncation='one_sigma')


def test_tree_shapes(tiny_cfg):
    cfg = tiny_cfg.replace(distill_token=True, layer_scale=True)
    p = init(cfg, jax.random.key(0))
    L, D, H, M = cfg.depth, cfg.width, cfg.num_heads, cfg.mlp_dim
    chex.assert_shape(p['blocks']['attn']['q']['kernel'], (L, D, H, D // H))
    chex.assert_shape(p['blocks']['attn']['out']['kernel'], (L, H, D // H, D))
    chex.assert_shape(p['blocks']['mlp']['fc1']['kernel'], (L, D, M))
    chex.assert_shape(p['pos_embed'], (1, cfg.num_patches + 2, D))
    chex.assert_tree_shape_prefix(p['blocks'], (L,))
    assert {'cls_token', 'dist_token', 'head_dist'} <= set(p)
    assert 'ls1' in p['blocks'] and 'ls2' in p['blocks']


def test_no_head_returns_features(tiny_cfg):
    cfg = tiny_cfg.replace(num_classes=0)
    p = init(cfg, jax.random.key(0))
    assert 'head' not in p
    out, aux = apply(p, jnp.zeros((2, 16, 16, 3)), cfg)
    chex.assert_shape(out, (2, cfg.width))
    np.testing.assert_array_equal(out, aux['pre_logits'])


def test_pre_logits_layer():
    """representation_size R: Dense (D -> R) + tanh between pooling and the head (original
    ViT / big_vision); aux['pre_logits'] is its output, the head reads it."""
    from jlearngene import costs
    from jlearngene.models import layout
    base = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                      num_classes=5)
    cfg = base.replace(representation_size=12)
    D, R, K = cfg.width, 12, cfg.num_classes
    p = init(cfg, jax.random.key(0))
    chex.assert_shape([p['pre_logits']['kernel'], p['pre_logits']['bias'], p['head']['kernel']],
                      [(D, R), (R,), (R, K)])
    plain = init(base, jax.random.key(0))   # the other draws are those of the model without it
    assert pytree.trees_equal({k: v for k, v in p.items() if k not in ('pre_logits', 'head')},
                              {k: v for k, v in plain.items() if k != 'head'})
    rng = np.random.default_rng(0)
    p['pre_logits'] = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32),
                                   p['pre_logits'])
    x = jnp.asarray(rng.standard_normal((2, 8, 8, 3)), jnp.float32)
    run = jax.jit(apply, static_argnums=2)
    logits, aux = run(p, x, cfg)
    backbone = {k: v for k, v in p.items() if k not in ('pre_logits', 'head')}
    feats = np.asarray(run(backbone, x, base.replace(num_classes=0))[0], np.float64)
    rep = np.tanh(feats @ np.asarray(p['pre_logits']['kernel'], np.float64) + np.asarray(p['pre_logits']['bias']))
    np.testing.assert_allclose(aux['pre_logits'], rep, atol=1e-5, rtol=0)
    want = rep @ np.asarray(p['head']['kernel'], np.float64) + np.asarray(p['head']['bias'])
    np.testing.assert_allclose(logits, want, atol=1e-5, rtol=0)
    assert np.abs(rep - feats[:, :R]).max() > 0.1
    # Without a head the output is the representation.
    out, aux = run({k: v for k, v in p.items() if k != 'head'}, x, cfg.replace(num_classes=0))
    np.testing.assert_array_equal(out, aux['pre_logits'])
    chex.assert_shape(out, (2, R))
    # Logical axes: the heads read 'repr'; slicing the width cuts the layer's input only.
    spec = axes(cfg, p)
    assert spec['pre_logits']['kernel'] == ('embed', 'repr') and spec['pre_logits']['bias'] == ('repr',)
    assert spec['head']['kernel'] == ('repr', 'classes')
    assert layout.axis_size(p, 'head/kernel', 'repr') == R
    narrow = layout.slice_tree(p, {'embed': 8, 'heads': 1})
    chex.assert_shape([narrow['pre_logits']['kernel'], narrow['head']['kernel']], [(8, R), (R, K)])
    small = layout.slice_tree(p, {'repr': 5})
    small_cfg = layout.slice_config(cfg, {'repr': 5})
    assert small_cfg.representation_size == 5
    chex.assert_trees_all_equal_shapes(small, jax.eval_shape(lambda: init(small_cfg, jax.random.key(0))))
    # Costs: the layer's D·R multiply-adds (tanh uncounted), and it goes with the head.
    assert costs.flops_per_image(cfg) - costs.flops_per_image(base) == D * R + (R - D) * K
    assert costs.param_count(cfg) - costs.param_count(base) == D * R + R + (R - D) * K
    assert costs.param_count(cfg, include_head=False) == costs.param_count(base, include_head=False)


@pytest.mark.parametrize('value', [0, -3, 1.5, True, '12'])
def test_representation_size_is_validated(tiny_cfg, value):
    with pytest.raises(ConfigError, match=f'representation_size={re.escape(repr(value))}'):
        tiny_cfg.replace(representation_size=value)


def test_representation_size_with_distillation_is_refused(tiny_cfg):
    with pytest.raises(ConfigError, match='representation_size=8.*distill_token'):
        tiny_cfg.replace(representation_size=8, distill_token=True)


def test_distilled_model_averages_heads_in_eval(tiny_cfg):
    cfg = tiny_cfg.replace(distill_token=True)
    p = _randomise(init(cfg, jax.random.key(0)), jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    logits, aux = apply(p, x, cfg)
    np.testing.assert_allclose(logits, (aux['logits_cls'] + aux['logits_dist']) / 2, atol=1e-6)
    train_logits, _ = apply(p, x, cfg, train=True)
    np.testing.assert_allclose(train_logits, aux['logits_cls'], atol=1e-6)


# --- layouts ---------------------------------------------------------------------------

def test_stack_unstack_round_trip_and_logits(tiny_cfg):
    p = init(tiny_cfg, jax.random.key(0))
    listed = unstack_blocks(p)
    assert isinstance(listed['blocks'], list) and len(listed['blocks']) == tiny_cfg.depth
    assert pytree.trees_equal(stack_blocks(listed), p)
    x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
    a, aux_a = apply(p, x, tiny_cfg, capture=('blocks', 'attn'))
    b, aux_b = apply(listed, x, tiny_cfg, capture=('blocks', 'attn'))
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(aux_a['blocks'], aux_b['blocks'], atol=1e-5)
    np.testing.assert_allclose(aux_a['attn'], aux_b['attn'], atol=1e-6)


def test_list_layout_with_different_head_counts(tiny_cfg):
    p = unstack_blocks(init(tiny_cfg, jax.random.key(0)))
    p['blocks'][1] = init_block(tiny_cfg, jax.random.key(5), num_heads=4)
    logits, aux = apply(p, jnp.ones((2, 16, 16, 3)), tiny_cfg, capture=('attn',))
    chex.assert_shape(logits, (2, 10))
    assert [a.shape[1] for a in aux['attn']] == [2, 4, 2]
    with pytest.raises(ValueError, match='block 1'):
        stack_blocks(p)


def test_heads_times_head_dim_may_differ_from_width(tiny_cfg):
    cfg = tiny_cfg.replace(num_heads=3, head_dim=16)      # attention width 48, width 32
    p = _randomise(init(cfg, jax.random.key(0)), jax.random.key(1))
    L, D = cfg.depth, cfg.width
    chex.assert_shape(p['blocks']['attn']['q']['kernel'], (L, D, 3, 16))
    chex.assert_shape(p['blocks']['attn']['q']['bias'], (L, 3, 16))
    chex.assert_shape(p['blocks']['attn']['out']['kernel'], (L, 3, 16, D))
    x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    logits, _ = jax.jit(apply, static_argnums=2)(p, x, cfg)
    # The numpy reference reads the shapes (and the scale 1/sqrt(16)) from the parameters.
    np.testing.assert_allclose(logits, _np_forward(p, x, cfg), atol=1e-4, rtol=1e-4)
    loss = jax.jit(lambda p: jnp.sum(apply(p, x, cfg)[0] ** 2))
    g = jax.jit(jax.grad(loss))(p)
    chex.assert_trees_all_equal_shapes(g, p)
    eps = 1e-3   # one directional derivative against a central difference
    d = jax.tree.map(lambda a: jax.random.normal(jax.random.key(3), a.shape), p)
    plus = loss(jax.tree.map(lambda a, b: a + eps * b, p, d))
    minus = loss(jax.tree.map(lambda a, b: a - eps * b, p, d))
    directional = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(d)))
    np.testing.assert_allclose(directional, (plus - minus) / (2 * eps), rtol=2e-2)


def test_num_heads_override_keeps_head_dim_in_a_list_layout(tiny_cfg):
    p = unstack_blocks(_randomise(init(tiny_cfg, jax.random.key(0)), jax.random.key(1)))
    p['blocks'][0] = init_block(tiny_cfg, jax.random.key(4), num_heads=3)     # 3 x 16 != 32
    p['blocks'][2] = init_block(tiny_cfg, jax.random.key(5), num_heads=1)
    assert p['blocks'][0]['attn']['k']['kernel'].shape == (32, 3, 16)
    assert p['blocks'][2]['attn']['out']['kernel'].shape == (1, 16, 32)
    x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    logits, aux = jax.jit(lambda p: apply(p, x, tiny_cfg, capture=('attn',)))(p)
    assert [a.shape[1] for a in aux['attn']] == [3, 2, 1]
    np.testing.assert_allclose(logits, _np_forward(p, x, tiny_cfg), atol=1e-4, rtol=1e-4)
    g = jax.jit(jax.grad(lambda p: jnp.sum(apply(p, x, tiny_cfg)[0] ** 2)))(p)
    chex.assert_trees_all_equal_shapes(g, p)
    assert all(float(jnp.abs(b['attn']['q']['kernel']).max()) > 0 for b in g['blocks'])


def test_capture_shapes_and_unknown_capture(tiny_cfg):
    p = init(tiny_cfg, jax.random.key(0))
    _, aux = apply(p, jnp.ones((2, 16, 16, 3)), tiny_cfg, capture=('blocks', 'attn'))
    chex.assert_shape(aux['blocks'], (3, 2, 17, 32))
    chex.assert_shape(aux['attn'], (3, 2, 2, 17, 17))
    np.testing.assert_allclose(aux['attn'].sum(-1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="'feats'"):
        apply(p, jnp.ones((2, 16, 16, 3)), tiny_cfg, capture=('feats',))


def test_axes_have_the_rank_of_every_leaf(tiny_cfg):
    cfg = tiny_cfg.replace(distill_token=True, layer_scale=True)
    for params in (init(cfg, jax.random.key(0)), unstack_blocks(init(cfg, jax.random.key(0))),
                   jax.eval_shape(lambda: init(cfg, jax.random.key(0)))):
        spec = axes(cfg, params)
        assert jax.tree.structure(spec) == jax.tree.structure(params)
        for a, x in zip(jax.tree.leaves(spec), jax.tree.leaves(params)):
            assert len(a) == len(x.shape)
    spec = axes(cfg, init(cfg, jax.random.key(0)))
    assert spec['blocks']['attn']['q']['kernel'] == ('layers', 'embed', 'heads', 'head_dim')
    assert spec['blocks']['mlp']['fc2']['kernel'] == ('layers', 'mlp', 'embed')
    assert spec['head']['kernel'] == ('embed', 'classes')


# --- compilation -----------------------------------------------------------------------

class ApplyVariantsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_and_eager_agree(self):
        cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16,
                         patch_size=4, num_classes=10)
        p = init(cfg, jax.random.key(0))
        x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
        fn = self.variant(lambda params, images: apply(params, images, cfg)[0])
        expected = apply(p, x, cfg)[0]
        np.testing.assert_allclose(fn(p, x), expected, atol=1e-5)

    def test_new_values_do_not_retrace(self):
        cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16,
                         patch_size=4, num_classes=10)

        @jax.jit
        @chex.assert_max_traces(n=1)
        def forward(params, images):
            return apply(params, images, cfg)[0]

        for seed in range(3):
            forward(init(cfg, jax.random.key(seed)), jax.random.normal(jax.random.key(seed), (2, 16, 16, 3)))


def test_train_mode_drop_path_is_stochastic_and_eval_is_not(tiny_cfg):
    cfg = tiny_cfg.replace(drop_path=0.5)
    p = init(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 16, 16, 3))
    a, _ = apply(p, x, cfg, train=True, rng=jax.random.key(1))
    b, _ = apply(p, x, cfg, train=True, rng=jax.random.key(2))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(apply(p, x, cfg)[0], apply(p, x, cfg, train=False)[0])


def test_scan_compile_cost_does_not_grow_with_depth():
    """The stacked layout traces to one loop over the blocks: the program's size is
    independent of depth."""
    sizes = []
    for depth in (2, 8):
        cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=depth, image_size=16,
                         patch_size=4, num_classes=10)
        shapes = jax.eval_shape(lambda c=cfg: init(c, jax.random.key(0)))
        program = jax.make_jaxpr(lambda p, x, c=cfg: apply(p, x, c)[0])(
            shapes, jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.float32))
        scans = [e for e in program.jaxpr.eqns if e.primitive.name == 'scan']
        assert [e.params['length'] for e in scans] == [depth - 1]   # the last block is pruned
        sizes.append((len(program.jaxpr.eqns), len(scans[0].params['jaxpr'].eqns)))
    assert sizes[0] == sizes[1]


# --- config errors ---------------------------------------------------------------------

@pytest.mark.parametrize('overrides,message', [
    (dict(width=100, num_heads=3), r'width=100.*num_heads=3'),
    (dict(depth=0), r'depth=0'),
    (dict(width=-4), r'width=-4'),
    (dict(image_size=30, patch_size=4), r'image_size=30.*patch_size=4'),
    (dict(pool='max'), r"pool='max'"),
    (dict(gelu='relu'), r"gelu='relu'"),
    (dict(dtype='float8'), r"dtype='float8'"),
    (dict(pool_norm='middle'), r"pool_norm='middle'"),
    (dict(pool='cls', class_token=False), r'class_token=False'),
])
def test_config_errors_name_field_and_value(overrides, message):
    with pytest.raises(ConfigError, match=message):
        vit_config('Ti', **overrides)


def test_unknown_variant_and_field():
    with pytest.raises(ConfigError, match="'XL'"):
        vit_config('XL')
    with pytest.raises(ConfigError, match=r"\['widht'\]"):
        vit_config('S', widht=3)
    with pytest.raises(ConfigError, match=r"\['bogus'\]"):
        ViTConfig.from_dict({'bogus': 1})


def test_config_is_hashable_and_round_trips(tiny_cfg):
    assert hash(tiny_cfg) == hash(ViTConfig.from_dict(tiny_cfg.to_dict()))
    assert tiny_cfg.diff(tiny_cfg.replace(depth=5)) == {'depth': (3, 5)}
    assert tiny_cfg.replace(pool='avg').class_token is False


def test_image_shape_errors(tiny_cfg):
    p = init(tiny_cfg, jax.random.key(0))
    with pytest.raises(ValueError, match='18x18.*4'):
        apply(p, jnp.ones((1, 18, 18, 3)), tiny_cfg)
    with pytest.raises(ValueError, match='pos_embed.*17.*65'):
        apply(p, jnp.ones((1, 32, 32, 3)), tiny_cfg)
