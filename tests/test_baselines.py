"""Baselines: Scratch, Share-Init, He-LG, Auto-LG, Pre-Fin."""
import chex
import jax
import numpy as np
import pytest

from jlearngene import pytree
from jlearngene.genes import baselines, tleg
from jlearngene.models import init, unstack_blocks, vit_config


def cfg_(depth=4, **kw):
    base = dict(width=32, num_heads=2, mlp_dim=64, depth=depth, image_size=16, patch_size=4,
                num_classes=10, pool='avg')
    base.update(kw)
    return vit_config('Ti', **base)


@pytest.fixture(scope='module')
def ancestor():
    return jax.device_get(init(cfg_(4), jax.random.key(11)))


def blocks_np(params):
    return pytree.flatten(jax.device_get(params['blocks']))


def test_scratch_is_vit_init():
    assert pytree.trees_equal(baselines.scratch(cfg_(4), jax.random.key(0)), init(cfg_(4), jax.random.key(0)))


def test_layer_window():
    np.testing.assert_array_equal(baselines.layer_window(4, 7, 'middle'), [1, 2, 3, 4])   # floor
    np.testing.assert_array_equal(baselines.layer_window(2, 6, 'last'), [4, 5])
    np.testing.assert_array_equal(baselines.layer_window(3, 3, 'first'), [0, 1, 2])


def test_share_init_identical_layers():
    gene = baselines.share_init_gene(cfg_(4), jax.random.key(0))
    assert 'theta_a' not in gene
    des = baselines.share_init(gene, cfg_(6))
    for path, x in blocks_np(des).items():
        for l in range(6):
            np.testing.assert_array_equal(x[l], pytree.flatten(jax.device_get(gene['theta_b']))[path])
    # a full TLEG gene: θ_A is ignored
    full = tleg.init_gene(cfg_(4), jax.random.key(0))
    x = blocks_np(baselines.share_init(full, cfg_(2)))['mlp/fc1/kernel']
    np.testing.assert_array_equal(x[0], x[1])


@pytest.mark.parametrize('depth', [2, 6])
def test_he_lg_last_k_layers(ancestor, depth):
    des = baselines.he_lg(ancestor, cfg_(depth, num_classes=3), 2, jax.random.key(1))
    src, dst = blocks_np(ancestor), blocks_np(des)
    for path in src:
        np.testing.assert_array_equal(dst[path][depth - 2:], src[path][2:4])
    if depth > 2:
        assert not np.array_equal(dst['attn/q/kernel'][0], src['attn/q/kernel'][0])
    assert not np.array_equal(des['patch_embed']['kernel'], ancestor['patch_embed']['kernel'])
    assert des['head']['kernel'].shape == (32, 3)


def test_auto_lg_first_k_layers(ancestor):
    des = baselines.auto_lg(ancestor, cfg_(6), 3, jax.random.key(1))
    src, dst = blocks_np(ancestor), blocks_np(des)
    for path in src:
        np.testing.assert_array_equal(dst[path][:3], src[path][:3])
    assert not np.array_equal(dst['attn/q/kernel'][3], src['attn/q/kernel'][3])
    chex.assert_trees_all_equal(des['pos_embed'], ancestor['pos_embed'])


def test_list_layout_ancestor_accepted(ancestor):
    des = baselines.he_lg(unstack_blocks(ancestor), cfg_(4), 1, jax.random.key(1))
    np.testing.assert_array_equal(blocks_np(des)['mlp/fc2/kernel'][3], ancestor['blocks']['mlp']['fc2']['kernel'][3])


@pytest.mark.parametrize('depth,choice,window', [
    (6, 'first', (0, 4)), (6, 'last', (2, 6)), (6, 'middle', (1, 5)),
])
def test_pre_fin_deeper_target_windows(ancestor, depth, choice, window):
    des = baselines.pre_fin(ancestor, cfg_(depth), choice=choice, key=jax.random.key(2))
    src, dst = blocks_np(ancestor), blocks_np(des)
    lo, hi = window
    for path in src:
        np.testing.assert_array_equal(dst[path][lo:hi], src[path])
    outside = [l for l in range(depth) if not lo <= l < hi]
    for l in outside:
        assert not np.array_equal(dst['attn/q/kernel'][l], src['attn/q/kernel'][0])
    for k in ('patch_embed', 'pos_embed', 'norm', 'head'):
        chex.assert_trees_all_equal(des[k], ancestor[k])


@pytest.mark.parametrize('choice,layers', [('first', [0, 1]), ('last', [2, 3]), ('middle', [1, 2])])
def test_pre_fin_shallower_target(ancestor, choice, layers):
    des = baselines.pre_fin(ancestor, cfg_(2), choice=choice)
    src, dst = blocks_np(ancestor), blocks_np(des)
    for path in src:
        np.testing.assert_array_equal(dst[path], src[path][layers])


def test_pre_fin_same_shape_is_a_copy(ancestor):
    assert pytree.trees_equal(jax.device_get(baselines.pre_fin(ancestor, cfg_(4))), ancestor)


def test_errors(ancestor):
    with pytest.raises(tleg.GeneError, match=r'k=5.*depth 4.*depth 6'):
        baselines.he_lg(ancestor, cfg_(6), 5, jax.random.key(0))
    with pytest.raises(tleg.GeneError, match='k=0'):
        baselines.auto_lg(ancestor, cfg_(2), 0, jax.random.key(0))
    with pytest.raises(tleg.GeneError, match=r'width=64.*needs \(2, 32\)'):
        baselines.he_lg(ancestor, cfg_(4, width=64), 2, jax.random.key(0))
    with pytest.raises(tleg.GeneError, match='PRNG key'):
        baselines.pre_fin(ancestor, cfg_(6))
    with pytest.raises(tleg.GeneError, match="choice='top'"):
        baselines.pre_fin(ancestor, cfg_(4), choice='top')
    with pytest.raises(tleg.GeneError, match=r"head/.*num_classes=3.*head='new'"):
        baselines.pre_fin(ancestor, cfg_(4, num_classes=3))
    with pytest.raises(tleg.GeneError, match="'cls_token'"):
        baselines.pre_fin(ancestor, cfg_(4, pool='cls'))
    with pytest.raises(tleg.GeneError, match='embeddings='):
        baselines.he_lg(ancestor, cfg_(4), 2, jax.random.key(0), embeddings='copy')
