"""Pytree toolkit: regex selection in both layouts, surgery, counts, comparison."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import pytree
from jlearngene.models import init, unstack_blocks


def test_path_patterns_in_both_layouts(tiny_cfg):
    p = init(tiny_cfg, jax.random.key(0))
    assert list(pytree.select(p, 'blocks/attn/q/kernel')) == ['blocks/attn/q/kernel']
    listed = unstack_blocks(p)
    assert list(pytree.select(listed, 'attn/q/kernel')) == [f'blocks/{i}/attn/q/kernel' for i in range(3)]
    assert pytree.path_matches('.*bias', 'blocks/mlp/fc1/bias')
    assert not pytree.path_matches('q/kernel', 'blocks/attn/qq/kernel')
    assert pytree.trees_equal(pytree.unflatten(pytree.flatten(p)), p)
    with pytest.raises(KeyError, match="'nothing'"):
        pytree.select(p, 'nothing')


def test_mask_replace_merge(tiny_cfg):
    p = init(tiny_cfg, jax.random.key(0))
    m = pytree.mask(p, [r'.*/kernel'])
    assert m['blocks']['attn']['q']['kernel'] and not m['blocks']['attn']['q']['bias']
    zeroed = pytree.replace(p, 'head/.*', jnp.zeros_like)
    assert float(jnp.abs(zeroed['head']['kernel']).sum()) == 0.0
    assert pytree.trees_equal(zeroed['blocks'], p['blocks'])
    one = pytree.merge(p, {'norm/scale': jnp.full((32,), 2.0)})
    np.testing.assert_array_equal(one['norm/scale'.split('/')[0]]['scale'], 2.0)
    with pytest.raises(KeyError, match=r"\['norm/gamma'\]"):
        pytree.merge(p, {'norm/gamma': 1.0})


def test_counts_and_arithmetic(tiny_cfg):
    p = init(tiny_cfg, jax.random.key(0))
    c = pytree.count_params(p)
    assert c['total'] == sum(x.size for x in jax.tree.leaves(p))
    assert c['head'] == 32 * 10 + 10 and c['norm'] == 64
    assert set(c) == {'embeddings', 'blocks', 'norm', 'head', 'total'}
    twice = pytree.tree_add(p, p)
    assert pytree.trees_equal(pytree.tree_scale(2.0, p), twice)
    mid = pytree.tree_lerp(p, twice, 0.5)
    assert max(pytree.max_abs_diff(mid, pytree.tree_scale(1.5, p)).values()) < 1e-6


def test_structure_diff_lists_everything(tiny_cfg):
    a = init(tiny_cfg, jax.random.key(0))
    b = dict(a)
    del b['head']
    b['extra'] = jnp.zeros(3)
    b['norm'] = {'scale': jnp.ones(5), 'bias': a['norm']['bias']}
    d = pytree.structure_diff(a, b)
    assert d['missing'] == ['head/bias', 'head/kernel']
    assert d['unexpected'] == ['extra']
    assert d['shape'] == [('norm/scale', (32,), (5,))]
    with pytest.raises(ValueError, match=r"missing: \['head/bias', 'head/kernel'\]; unexpected: \['extra'\]"):
        pytree.assert_same_structure(a, b)
