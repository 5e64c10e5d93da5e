"""IMwLM weight selection: the uniform rule, consistency across tensors, heads, depth."""
import chex
import jax
import numpy as np
import pytest

from jlearngene import pytree
from jlearngene.genes import selection
from jlearngene.models import init, vit_config


BIG = vit_config('Ti', width=16, num_heads=4, mlp_dim=32, depth=4, image_size=8, patch_size=4,
                 num_classes=5, pool='avg')
SMALL = BIG.replace(width=8, num_heads=2, mlp_dim=16, depth=2)


@pytest.fixture(scope='module')
def teacher():
    return jax.tree.map(np.asarray, jax.jit(init, static_argnums=0)(BIG, jax.random.key(0)))


def test_uniform_indices_is_the_published_rule():
    np.testing.assert_array_equal(selection.uniform_indices(8, 4), [0, 2, 4, 6])
    np.testing.assert_array_equal(selection.uniform_indices(10, 4), [0, 3, 6, 9])
    np.testing.assert_array_equal(selection.uniform_indices(3, 5), [0, 0, 1, 2, 2])


def test_selection_is_consistent_across_tensors(teacher):
    gene = selection.METHOD.gene_from_model(teacher, BIG)
    des = jax.tree.map(np.asarray, selection.descend(gene, SMALL))
    e, m, h = np.arange(0, 16, 2), np.arange(0, 32, 2), [0, 2]        # whole heads 0 and 2
    t = teacher['blocks']
    np.testing.assert_array_equal(des['blocks']['attn']['q']['kernel'], t['attn']['q']['kernel'][:2][:, e][:, :, h])
    np.testing.assert_array_equal(des['blocks']['attn']['out']['kernel'], t['attn']['out']['kernel'][:2][:, h][..., e])
    np.testing.assert_array_equal(des['blocks']['mlp']['fc2']['kernel'], t['mlp']['fc2']['kernel'][:2][:, m][..., e])
    np.testing.assert_array_equal(des['pos_embed'], teacher['pos_embed'][..., e])
    np.testing.assert_array_equal(des['head']['kernel'], teacher['head']['kernel'][e])
    flat = jax.tree.map(np.asarray, selection.descend(gene, SMALL, heads='flat', layers='uniform'))
    q = t['attn']['q']['kernel'][[0, 2]][:, e].reshape(2, 8, 16)[..., ::2].reshape(2, 8, 2, 4)
    np.testing.assert_array_equal(flat['blocks']['attn']['q']['kernel'], q)
    assert selection.METHOD.gene_param_count(gene) == pytree.count_params(teacher, groups=None)['total'] - 16 * 5 - 5


def test_same_size_is_the_model_and_deeper_targets(teacher):
    gene = selection.METHOD.gene_from_model(teacher, BIG)
    assert pytree.trees_equal(jax.tree.map(np.asarray, selection.descend(gene, BIG)), teacher)
    deep = BIG.replace(depth=6)
    with pytest.raises(selection.GeneError, match=r'target layers \[4, 5\]'):
        selection.descend(gene, deep)
    first = selection.descend(gene, deep, key=jax.random.key(1))
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[:4], first['blocks']), teacher['blocks'])
    spread = selection.descend(gene, deep, layers='uniform')
    np.testing.assert_array_equal(spread['blocks']['norm1']['scale'],
                                  teacher['blocks']['norm1']['scale'][[0, 1, 1, 2, 2, 3]])


def test_errors_and_jit(teacher):
    gene = selection.METHOD.gene_from_model(teacher, BIG)
    with pytest.raises(selection.GeneError, match=r"'attn/k/bias'.*\(4, 4\).*width=32.*\(4, 8\)"):
        selection.descend(gene, BIG.replace(width=32, num_heads=4))
    with pytest.raises(selection.GeneError, match=r"'head/bias'.*\(5,\).*\(3,\)"):
        selection.descend(gene, SMALL.replace(num_classes=3))
    assert selection.descend(gene, SMALL.replace(num_classes=3), head='new',
                             key=jax.random.key(0))['head']['kernel'].shape == (8, 3)
    with pytest.raises(selection.GeneError, match="layers='last'"):
        selection.descend(gene, SMALL, layers='last')
    with pytest.raises(selection.GeneError, match='cls_token'):
        selection.descend(gene, SMALL.replace(pool='cls'))
    jitted = jax.jit(lambda g: selection.descend(g, SMALL, heads='flat'))(gene)
    chex.assert_trees_all_equal(jitted, selection.descend(gene, SMALL, heads='flat'))
