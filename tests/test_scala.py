"""Scala: width grid and stable sampling, sub-network slicing (clean and official rules),
the masked variant, the official checkpoint layout, the registered methods, the slimmable
losses and the experiment's smoke run."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from jlearngene import genes, losses, pytree
from jlearngene.genes import scala
from jlearngene.genes.common import GeneError
from jlearngene.interop import timm
from jlearngene.models import apply, init, vit_config

import helpers
from helpers import images, perturbed

D, H, M, DEPTH, K = 32, 2, 64, 2, 5
GRID = scala.width_grid(0.25, 0.25)            # X = 4: 0.25, 0.5, 0.75, 1


def make_cfg(**kw):
    """Width D, H heads, DEPTH layers, 8 px images, K classes, class-token pooling."""
    return helpers.cfg(**{'width': D, 'num_heads': H, 'mlp_dim': M, 'depth': DEPTH,
                          'image_size': 8, 'num_classes': K, 'pool': 'cls', **kw})


@pytest.fixture(scope='module')
def model():
    cfg = make_cfg()
    return cfg, perturbed(init(cfg, jax.random.key(0)), seed=2)


# ----------------------------------------------------------------------------------------
# Grid and sampling.

def test_grid_halves_match_the_official_sets_and_extend_to_quarter_granularity():
    assert len(scala.width_grid(0.25, 1 / 16)) == 13 and len(scala.width_grid(0.25, 1 / 32)) == 25
    up, low = scala.stable_halves(scala.width_grid(0.25, 1 / 16))
    assert up == tuple(0.625 + i / 16 for i in range(6)) and low == tuple(0.3125 + i / 16 for i in range(5))
    assert scala.stable_halves(scala.width_grid(0.25, 1 / 8)) == ((0.625, 0.75, 0.875), (0.375, 0.5))
    assert scala.stable_halves(GRID) == ((0.75,), (0.5,))        # the official sampler raises here
    # a non-dyadic grid: s = 0.4, g = 0.2
    assert scala.stable_halves(scala.width_grid(0.4, 0.2)) == ((0.8,), (0.6,))
    with pytest.raises(GeneError, match='granularity=0.3'):
        scala.width_grid(0.25, 0.3)
    with pytest.raises(GeneError, match=r'\(0\.5, 1\.0\)'):
        scala.stable_halves((0.5, 1.0))


def test_sampled_widths_lie_in_their_halves_and_are_a_function_of_the_key():
    grid = scala.width_grid(0.25, 1 / 16)
    up, low = scala.stable_halves(grid)
    keys = jax.random.split(jax.random.key(3), 400)
    iu, il = jax.jit(jax.vmap(lambda k: scala.sample_widths(k, grid)))(keys)
    assert set(np.asarray(iu).tolist()) == set(range(len(up)))   # every upper width drawn
    assert set(np.asarray(il).tolist()) == set(range(len(low)))
    again = jax.vmap(lambda k: scala.sample_widths(k, grid))(keys)
    np.testing.assert_array_equal(iu, again[0])                   # jit = eager, same key same draw
    assert min(up) >= 0.625 > max(low) > grid[0]
    interior = np.asarray(jax.vmap(lambda k: scala.sample_interior(k, grid))(keys[:50]))
    assert interior.shape == (50, 2) and interior.min() >= 0 and interior.max() < len(grid) - 2


def test_widths_must_split_into_whole_heads():
    cfg = make_cfg(width=30, num_heads=3, mlp_dim=60)
    assert scala.sizes(cfg, 0.4) == {'embed': 12, 'mlp': 24, 'head_dim': 4}
    with pytest.raises(GeneError, match='width 10.*num_heads=3'):
        scala.sizes(cfg, 1 / 3)                                   # 10 channels, 3 heads
    with pytest.raises(GeneError, match=r'0\.3.*width=32'):
        scala.sizes(make_cfg(), 0.3)
    with pytest.raises(GeneError, match="rule='paper'"):
        scala.subnet(init(make_cfg(), jax.random.key(0)), make_cfg(), 0.5, rule='paper')


# ----------------------------------------------------------------------------------------
# Slicing.

@pytest.mark.parametrize('method', ['scala', 'us_net', 'matformer'])
def test_a_request_the_gene_cannot_make_names_the_method_asked(model, method):
    params, cfg = model[1], model[0]
    with pytest.raises(GeneError, match=f'^{method}.descend: '):
        genes.get(method).descend(params, cfg.replace(depth=DEPTH + 1))


def test_ratio_one_is_the_identity(model):
    cfg, params = model
    sub, sub_cfg = scala.subnet(params, cfg, 1.0)
    assert sub_cfg == cfg
    chex.assert_trees_all_equal(sub, params)
    sub, sub_cfg = scala.subnet(params, cfg, 1.0, rule='official')
    chex.assert_trees_all_equal(sub, params)
    assert cfg.diff(sub_cfg) == {'ln_eps': (1e-6, 1e-5), 'attn_scale': (None, (D // H) ** -0.5)}


def test_isolated_activation_and_where_the_rules_differ(model):
    cfg, params = model
    d, dh, m = D // 2, D // H // 2, M // 2
    full = pytree.flatten(params)
    for ratio, smallest, side in ((0.5, 0.25, 'right'), (0.5, 0.5, 'left'), (0.25, 0.25, 'left')):
        clean = pytree.flatten(scala.subnet(params, cfg, ratio, smallest=smallest)[0])
        official = pytree.flatten(scala.subnet(params, cfg, ratio, smallest=smallest, rule='official')[0])
        n = int(ratio * D)
        e = slice(0, n) if side == 'left' else slice(D - n, D)
        np.testing.assert_array_equal(clean['norm/scale'], full['norm/scale'][e])
        np.testing.assert_array_equal(clean['head/kernel'], full['head/kernel'][e])
        np.testing.assert_array_equal(clean['head/bias'], full['head/bias'])   # classes whole
        # outside attention (no distillation token) the two rules agree exactly
        for path in clean:
            if '/attn/' not in path:
                np.testing.assert_array_equal(clean[path], official[path], err_msg=path)
        # clean: every head keeps its own units of its own projection
        hd = ratio * D // H
        hs = slice(0, int(hd)) if side == 'left' else slice(D // H - int(hd), D // H)
        np.testing.assert_array_equal(clean['blocks/attn/k/kernel'], full['blocks/attn/k/kernel'][:, e][..., hs])
    # official at 0.5 (right): q is the second half of the full k, k and v come from full v
    off = pytree.flatten(scala.subnet(params, cfg, 0.5, rule='official')[0])
    fused = np.concatenate([np.asarray(full[f'blocks/attn/{p}/kernel']).reshape(DEPTH, D, D)
                            for p in 'qkv'], axis=-1)[:, D - d:, 3 * D - 3 * d:]
    np.testing.assert_array_equal(np.asarray(off['blocks/attn/q/kernel']).reshape(DEPTH, d, d), fused[..., :d])
    k_full = np.asarray(full['blocks/attn/k/kernel']).reshape(DEPTH, D, D)
    np.testing.assert_array_equal(fused[..., :d], k_full[:, D - d:, D - d:])
    assert off['blocks/attn/q/kernel'].shape == (DEPTH, d, H, dh)
    assert off['blocks/mlp/fc1/kernel'].shape == (DEPTH, d, m)


def test_sliced_masked_jit_and_eager_agree_with_one_compile_per_width(model):
    cfg, params = model
    x = images(seed=1)

    @jax.jit
    def masked(p, ratio):                      # traced ratio: one program for every width
        return scala.masked_apply(p, x, cfg, scala.unit_masks(cfg, ratio))[0]

    @chex.assert_max_traces(n=len(GRID))
    def sliced_impl(p, ratio):
        sub, sub_cfg = scala.subnet(p, cfg, ratio)
        return apply(sub, x, sub_cfg)[0]
    sliced = jax.jit(sliced_impl, static_argnums=1)
    for ratio in GRID + GRID:                  # the second pass must not retrace
        want = sliced(params, ratio)
        np.testing.assert_allclose(masked(params, jnp.float32(ratio)), want, atol=1e-5, rtol=1e-5)
    # eager (concrete ratio, checked sizes) for one width
    sub, sub_cfg = scala.subnet(params, cfg, 0.5)
    np.testing.assert_allclose(apply(sub, x, sub_cfg)[0], sliced(params, 0.5), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(scala.masked_apply(params, x, cfg, scala.unit_masks(cfg, 0.5))[0],
                               sliced(params, 0.5), atol=1e-5, rtol=1e-5)
    # MatFormer's Mix'n'Match sub-network (per-layer FFN widths, list layout) masked
    per_layer = scala.mix_n_match(0.375, (0.25, 0.5, 0.75, 1.0), DEPTH)
    assert per_layer == (0.25, 0.5)
    sub, sub_cfg = scala.ffn_subnet(params, cfg, per_layer)
    np.testing.assert_allclose(scala.masked_apply(params, x, cfg, scala.ffn_masks(cfg, per_layer))[0],
                               apply(sub, x, sub_cfg)[0], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------
# The official checkpoint layout (timm distilled DeiT) and its forward.

def _timm_state_dict(seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)   # noqa: E731
    sd = {'cls_token': r(1, 1, D), 'dist_token': r(1, 1, D), 'pos_embed': r(1, 6, D),
          'patch_embed.proj.weight': r(D, 3, 4, 4), 'patch_embed.proj.bias': r(D),
          'norm.weight': 1 + r(D), 'norm.bias': r(D), 'head.weight': r(K, D), 'head.bias': r(K),
          'head_dist.weight': r(K, D), 'head_dist.bias': r(K)}
    for i in range(DEPTH):
        b = f'blocks.{i}.'
        sd.update({b + 'norm1.weight': 1 + r(D), b + 'norm1.bias': r(D),
                   b + 'attn.qkv.weight': r(3 * D, D), b + 'attn.qkv.bias': r(3 * D),
                   b + 'attn.proj.weight': r(D, D), b + 'attn.proj.bias': r(D),
                   b + 'norm2.weight': 1 + r(D), b + 'norm2.bias': r(D),
                   b + 'mlp.fc1.weight': r(M, D), b + 'mlp.fc1.bias': r(M),
                   b + 'mlp.fc2.weight': r(D, M), b + 'mlp.fc2.bias': r(D)})
    return sd


def _official_forward(sd, x, ratio, smallest):
    """The official distilled model's sliced eval forward, in numpy on the torch layout."""
    d, hidden = int(ratio * D), int(ratio * M)
    inner_left = ratio in (smallest, 1.0)
    outer_left = ratio in (0.25, 1.0)
    cut = lambda n, size, left: slice(0, n) if left else slice(size - n, size)   # noqa: E731
    e, eo, hs = cut(d, D, inner_left), cut(d, D, outer_left), cut(hidden, M, inner_left)
    qkv_rows = cut(3 * d, 3 * D, inner_left)

    def ln(t, w, b):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    B = x.shape[0]
    patches = x.reshape(B, 2, 4, 2, 4, 3).transpose(0, 1, 3, 5, 2, 4).reshape(B, 4, 3, 4, 4)
    t = np.einsum('bncij,dcij->bnd', patches, sd['patch_embed.proj.weight'][e]) + sd['patch_embed.proj.bias'][e]
    prefix = np.concatenate([sd['cls_token'][..., eo], sd['dist_token'][..., eo]], 1).repeat(B, 0)
    t = np.concatenate([prefix, t], 1) + sd['pos_embed'][..., eo]
    for i in range(DEPTH):
        g = lambda k, i=i: sd[f'blocks.{i}.{k}']   # noqa: E731
        h = ln(t, g('norm1.weight')[e], g('norm1.bias')[e])
        qkv = h @ g('attn.qkv.weight')[qkv_rows, e].T + g('attn.qkv.bias')[qkv_rows]
        q, k, v = qkv.reshape(B, -1, 3, H, d // H).transpose(2, 0, 3, 1, 4)
        a = q @ k.transpose(0, 1, 3, 2) * (D // H) ** -0.5
        a = np.exp(a - a.max(-1, keepdims=True))
        a = a / a.sum(-1, keepdims=True)
        o = (a @ v).transpose(0, 2, 1, 3).reshape(B, -1, d)
        t = t + o @ g('attn.proj.weight')[e, e].T + g('attn.proj.bias')[e]
        h = ln(t, g('norm2.weight')[e], g('norm2.bias')[e])
        h = h @ g('mlp.fc1.weight')[hs, e].T + g('mlp.fc1.bias')[hs]
        h = h * 0.5 * (1 + erf(h / np.sqrt(2)))
        t = t + h @ g('mlp.fc2.weight')[e, hs].T + g('mlp.fc2.bias')[e]
    t = ln(t, sd['norm.weight'][eo], sd['norm.bias'][eo])
    cls = t[:, 0] @ sd['head.weight'][:, eo].T + sd['head.bias']
    dist = t[:, 1] @ sd['head_dist.weight'][:, eo].T + sd['head_dist.bias']
    return (cls + dist) / 2


def test_official_checkpoint_loads_and_gives_the_official_logits():
    sd = _timm_state_dict()
    cfg, params = timm.from_timm(sd, num_heads=H)
    assert cfg.distill_token and cfg.width == D
    x = np.asarray(images(seed=1), np.float64)

    @jax.jit
    def all_widths(p):
        out = {}
        for ratio, smallest in ((0.25, 0.25), (0.5, 0.25), (0.75, 0.25), (1.0, 0.25), (0.5, 0.5)):
            sub, sub_cfg = scala.subnet(p, cfg, ratio, rule='official', smallest=smallest)
            out[ratio, smallest] = apply(sub, jnp.asarray(x, jnp.float32), sub_cfg)[0]
        return out
    for (ratio, smallest), logits in all_widths(params).items():
        want = _official_forward({k: v.astype(np.float64) for k, v in sd.items()}, x, ratio, smallest)
        np.testing.assert_allclose(logits, want, atol=2e-4, rtol=2e-4, err_msg=f'{ratio}, {smallest}')
    # any clean sub-network exports to timm as a plain (distilled) ViT and back
    sub, sub_cfg = scala.subnet(params, cfg, 0.5)
    back_cfg, back = timm.from_timm(timm.to_timm(sub, sub_cfg), num_heads=H)
    assert back_cfg.width == D // 2 and back_cfg.head_dim == sub_cfg.head_dim
    chex.assert_trees_all_equal(back, sub)


# ----------------------------------------------------------------------------------------
# The registered methods.

def test_methods_descend_to_sub_networks(model):
    cfg, params = model
    sc, us, mf = genes.get('scala'), genes.get('us_net'), genes.get('matformer')
    target = scala.subnet_config(cfg, 0.5)
    chex.assert_trees_all_equal(sc.descend(params, target), scala.subnet(params, cfg, 0.5)[0])
    chex.assert_trees_all_equal(us.descend(params, target),
                                scala.subnet(params, cfg, 0.5, side='left')[0])
    chex.assert_trees_all_equal(sc.materialize(params, None, cfg), params)
    chex.assert_trees_all_equal(mf.descend(params, cfg.replace(mlp_dim=M // 4)),
                                scala.ffn_subnet(params, cfg, 0.25)[0])
    chex.assert_trees_all_equal(jax.eval_shape(lambda: sc.descend(params, target)),
                                jax.eval_shape(lambda: init(target, jax.random.key(0))))
    assert sc.gene_param_count(params, include_head=True) == pytree.count_params(params, groups=None)['total']
    with pytest.raises(GeneError, match='num_heads=2.*1'):
        sc.descend(params, vit_config('Ti', width=16, num_heads=1, mlp_dim=32, depth=DEPTH,
                                      image_size=8, patch_size=4, num_classes=K))
    with pytest.raises(GeneError, match='depth=2.*got 1'):
        sc.descend(params, target.replace(depth=1))
    with pytest.raises(GeneError, match='matformer.*width 32.*got 16'):
        mf.descend(params, target)


# ----------------------------------------------------------------------------------------
# Losses.

def test_scala_loss_is_the_sum_of_its_progressive_terms(model):
    cfg, params = model
    batch = {'image': images(4, seed=1), 'label': jnp.array([0, 1, 2, 3])}
    key = jax.random.key(7)
    loss_fn = scala.scala_loss(cfg, GRID)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    (loss, metrics), grads = grad_fn(params, batch, key)
    assert float(metrics['ratio_upper']) == 0.75 and float(metrics['ratio_lower']) == 0.5

    @jax.jit
    def by_hand(p):   # full CE, then each width's KL to the next larger width + CE
        keys = jax.random.split(key, 5)
        logits = {r: scala.width_forward(cfg, r)(p, batch['image'], k)[0]
                  for r, k in zip((1.0, 0.75, 0.5, 0.25), keys[1:])}
        total = losses.cross_entropy(logits[1.0], batch['label'])
        for big, small in ((1.0, 0.75), (0.75, 0.5), (0.5, 0.25)):
            total += losses.kl_per_example(logits[small], logits[big]).mean() + losses.cross_entropy(
                logits[small], batch['label'])
        return total
    np.testing.assert_allclose(loss, by_hand(params), rtol=1e-5)
    # every parameter gets a gradient (X = 4: the four widths cover all channels)
    assert all(np.abs(np.asarray(g)).sum() > 0 for g in jax.tree.leaves(grads))


def test_baseline_losses_and_teacher_distillation(model):
    cfg, params = model
    batch = {'image': images(4, seed=1), 'label': jnp.array([0, 1, 2, 3])}
    key = jax.random.key(8)
    grid = scala.width_grid(0.25, 0.125)
    us = jax.jit(scala.usnet_loss(cfg, grid))(params, batch, key)[1]
    assert {float(us['ratio_a']), float(us['ratio_b'])} <= set(grid[1:-1])
    mf = jax.jit(scala.matformer_loss(cfg))(params, batch, key)
    np.testing.assert_allclose(mf[0], sum(v for k, v in mf[1].items() if k.startswith('loss_ffn')), rtol=1e-6)
    dcfg = make_cfg(distill_token=True, depth=1)
    student = init(dcfg, jax.random.key(4))
    teacher = (init(make_cfg(depth=1), jax.random.key(5)), make_cfg(depth=1))
    loss, m = jax.jit(scala.scala_loss(dcfg, GRID, teacher=teacher, rule='official'))(student, batch, key)
    assert np.isfinite(float(loss)) and float(m['loss_full']) > 0
    with pytest.raises(ValueError, match="transfer='sideways'"):
        scala.scala_loss(cfg, GRID, transfer='sideways')
