"""Baselines: Scratch, Share-Init, Mini-Init, He-LG, Auto-LG, Pre-Fin."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jlearngene import pytree
from jlearngene.genes import baselines, tleg
from jlearngene.models import init, unstack_blocks

from helpers import cfg as cfg_


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


# ----------------------------------------------------------------------------------------
# Mini-Init.

def trained_mini(cfg, n_shared, seed=0):
    """A Mini-Init gene moved off its init constants, as after training."""
    rng = np.random.default_rng(seed)
    gene = baselines.mini_init_gene(cfg, jax.random.key(seed), n_shared=n_shared)
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + 0.1 * rng.standard_normal(x.shape),
                                              jnp.float32), gene)


def common_top(tree):
    return {k: v for k, v in jax.device_get(tree).items() if k != 'blocks'}


def test_mini_init_gene_shapes_and_layer_sharing():
    gene = baselines.mini_init_gene(cfg_(6), jax.random.key(0), n_shared=3)
    chex.assert_trees_all_equal_shapes_and_dtypes(
        gene, jax.eval_shape(lambda: init(cfg_(3), jax.random.key(0))))
    assert baselines.MINI_INIT.gene_shapes(cfg_(12))['blocks']['mlp']['fc1']['kernel'].shape[0] == 6
    np.testing.assert_array_equal(baselines.shared_parts(6, 12), np.arange(12) // 2)   # the paper's
    np.testing.assert_array_equal(baselines.shared_parts(3, 4), [0, 0, 1, 2])
    np.testing.assert_array_equal(baselines.shared_parts(4, 2), [0, 2])          # skips evenly
    gene = trained_mini(cfg_(6), 3)
    aux = baselines.MINI_INIT.materialize(gene, None, cfg_(6))
    src, dst = blocks_np(gene), blocks_np(aux)
    for path in src:
        for l in range(6):
            np.testing.assert_array_equal(dst[path][l], src[path][l // 2])
    for tdepth, parts in ((4, [0, 0, 1, 2]), (8, [0, 0, 0, 1, 1, 1, 2, 2]), (2, [0, 1])):
        des = blocks_np(baselines.descend_mini_init(gene, cfg_(tdepth)))
        np.testing.assert_array_equal(baselines.shared_parts(3, tdepth), parts)
        for path in src:
            np.testing.assert_array_equal(des[path], src[path][parts])
    assert pytree.trees_equal(common_top(aux), common_top(gene))


def test_mini_init_with_n_shared_equal_to_depth_is_the_aux_net():
    gene = trained_mini(cfg_(4), 4)
    aux = baselines.MINI_INIT.materialize(gene, None, cfg_(4))
    assert pytree.trees_equal(jax.device_get(aux), jax.device_get(gene))
    assert pytree.trees_equal(baselines.descend_mini_init(gene, cfg_(4)), aux)


def test_mini_init_share_init_is_the_one_part_case():
    gene = trained_mini(cfg_(4), 1)
    des = blocks_np(baselines.descend_mini_init(gene, cfg_(5)))
    for path, x in blocks_np(gene).items():
        np.testing.assert_array_equal(des[path], np.repeat(x, 5, axis=0))


def test_mini_init_gradient_sums_over_the_layers_of_a_part():
    cfg = cfg_(4)
    gene = trained_mini(cfg, 2)

    def total(g):
        return jnp.sum(baselines.MINI_INIT.materialize(g, None, cfg)['blocks']['mlp']['fc1']['kernel'])

    grad = jax.jit(jax.grad(total))(gene)['blocks']['mlp']['fc1']['kernel']
    np.testing.assert_array_equal(np.asarray(grad), 2.0)      # two layers per part


def test_mini_init_heads_embeddings_and_errors():
    gene = trained_mini(cfg_(4), 2)
    des = baselines.descend_mini_init(gene, cfg_(6, num_classes=3), key=jax.random.key(1),
                                      head='new', embeddings='random')
    assert des['head']['kernel'].shape == (32, 3)
    assert not np.array_equal(des['pos_embed'], gene['pos_embed'])
    with pytest.raises(tleg.GeneError, match=r'n_shared=5.*\[1, depth=4\]'):
        baselines.mini_init_gene(cfg_(4), jax.random.key(0), n_shared=5)
    with pytest.raises(tleg.GeneError, match='n_shared=0'):
        baselines.mini_init_gene(cfg_(4), jax.random.key(0), n_shared=0)
    with pytest.raises(tleg.GeneError, match='2 shared parts.*depth 1'):
        baselines.MINI_INIT.materialize(gene, None, cfg_(1))
    with pytest.raises(tleg.GeneError, match=r"mini_init.*head/.*num_classes=3.*head='new'"):
        baselines.descend_mini_init(gene, cfg_(4, num_classes=3))
    with pytest.raises(tleg.GeneError, match=r"mini_init.*width=64"):
        baselines.descend_mini_init(gene, cfg_(4, width=64))
    with pytest.raises(tleg.GeneError, match=r"mini_init: .*\['theta_b'\]"):
        baselines.descend_mini_init({'theta_b': {}}, cfg_(4))


class MiniInitJitTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(('inherit',), ('new',))
    def test_jit_and_eager_agree_and_draws_are_deterministic(self, head):
        gene = trained_mini(cfg_(4), 2, seed=3)
        tcfg = cfg_(5)
        fn = self.variant(lambda g, k: baselines.descend_mini_init(g, tcfg, key=k, head=head))
        got = fn(gene, jax.random.key(6))
        chex.assert_trees_all_equal(got, baselines.descend_mini_init(gene, tcfg, key=jax.random.key(6),
                                                                     head=head))
        chex.assert_trees_all_equal(fn(gene, jax.random.key(6)), got)


@pytest.mark.parametrize('depth', [2, 6])
def test_he_lg_last_k_layers(ancestor, depth):
    des = baselines.he_lg(ancestor, cfg_(depth, num_classes=3), 2, jax.random.key(1), head='new')
    src, dst = blocks_np(ancestor), blocks_np(des)
    for path in src:
        np.testing.assert_array_equal(dst[path][depth - 2:], src[path][2:4])
    if depth > 2:
        assert not np.array_equal(dst['attn/q/kernel'][0], src['attn/q/kernel'][0])
    for k in ('patch_embed', 'pos_embed', 'norm'):       # the official code copies them
        chex.assert_trees_all_equal(des[k], ancestor[k])
    assert des['head']['kernel'].shape == (32, 3)
    fresh = baselines.he_lg(ancestor, cfg_(depth, num_classes=3), 2, jax.random.key(1),
                            embeddings='random', head='new')
    assert not np.array_equal(fresh['patch_embed']['kernel'], ancestor['patch_embed']['kernel'])
    chex.assert_trees_all_equal(fresh['blocks'], des['blocks'])


def test_auto_lg_first_k_layers(ancestor):
    des = baselines.auto_lg(ancestor, cfg_(6), 3, jax.random.key(1))
    src, dst = blocks_np(ancestor), blocks_np(des)
    for path in src:
        np.testing.assert_array_equal(dst[path][:3], src[path][:3])
    assert not np.array_equal(dst['attn/q/kernel'][3], src['attn/q/kernel'][3])
    chex.assert_trees_all_equal(des['pos_embed'], ancestor['pos_embed'])
    chex.assert_trees_all_equal(des['head'], ancestor['head'])     # inherited by default
    new = baselines.auto_lg(ancestor, cfg_(6), 3, jax.random.key(1), head='new')
    assert not np.array_equal(new['head']['kernel'], ancestor['head']['kernel'])


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
