"""Growth baselines: Net2Net, StackBERT, bert2BERT (FPI, AKI) and LiGO's operator."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import genes, pytree
from jlearngene.genes import common, growth
from jlearngene.models import apply, init, vit_config

from helpers import perturbed


SMALL = vit_config('Ti', width=8, num_heads=2, mlp_dim=16, depth=2, image_size=8, patch_size=4,
                   num_classes=5)
WIDE = SMALL.replace(width=16, num_heads=4, mlp_dim=32)          # same depth, head_dim 4
LARGE = WIDE.replace(depth=4)
KEY = jax.random.key(3)


@pytest.fixture(scope='module')
def small():
    return perturbed(jax.jit(init, static_argnums=0)(SMALL, jax.random.key(0)), 1)


@pytest.fixture(scope='module')
def logits():
    """{cfg: jitted logits}: one compiled forward per config."""
    x = jax.random.normal(jax.random.key(9), (2, 8, 8, 3))
    fns = {}

    def get(params, cfg):
        if cfg not in fns:
            fns[cfg] = jax.jit(lambda p: apply(p, x, cfg)[0])
        return np.asarray(fns[cfg](params))
    return get


def test_net2net_preserves_the_function_and_inserts_identity_layers(small, logits):
    grown = jax.jit(lambda p, k: growth.net2net(p, LARGE, k))(small, KEY)
    chex.assert_trees_all_close(grown, growth.net2net(small, LARGE, KEY), rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_equal_shapes(grown, common.target_shapes(LARGE))
    np.testing.assert_allclose(logits(grown, LARGE), logits(small, SMALL), rtol=1e-4, atol=1e-5)
    blocks = pytree.flatten(grown['blocks'])
    for path in ('attn/out/kernel', 'attn/out/bias', 'mlp/fc2/kernel', 'mlp/fc2/bias'):
        assert not np.any(blocks[path][1::2]) and np.any(blocks[path][0::2]), path
    np.testing.assert_array_equal(blocks['attn/q/kernel'][1], blocks['attn/q/kernel'][0])
    # the old units are kept; a widened fan-in is divided by the replication count
    q_small, q = small['blocks']['attn']['q']['kernel'], blocks['attn/q/kernel']
    np.testing.assert_allclose(q[0][:8, :2] * 2, q_small[0], rtol=1e-6)   # D1 | D2: each unit twice


def test_bert2bert_fpi_aki_and_stacking(small, logits):
    fpi = growth.bert2bert(small, WIDE, KEY, aki=False)
    np.testing.assert_allclose(logits(fpi, WIDE), logits(small, SMALL), rtol=1e-4, atol=1e-5)
    aki = growth.bert2bert(small, WIDE, KEY)
    f, a = pytree.flatten(fpi['blocks']), pytree.flatten(aki['blocks'])
    every = slice(None)
    for path, old, new in (('attn/q/kernel', (every, slice(0, 2)), (every, slice(2, None))),
                           ('attn/v/bias', (slice(0, 2),), (slice(2, None),)),
                           ('mlp/fc1/kernel', (every, slice(0, 16)), (every, slice(16, None))),
                           ('mlp/fc1/bias', (slice(0, 16),), (slice(16, None),))):
        np.testing.assert_allclose(a[path][0][new], f[path][1][new], err_msg=path)   # from layer l+1
        np.testing.assert_allclose(a[path][1][new], f[path][1][new], err_msg=path)   # top: itself
        np.testing.assert_allclose(a[path][0][old], f[path][0][old], err_msg=path)   # old units: FPI
    for path in ('attn/out/kernel', 'mlp/fc2/kernel', 'norm1/scale'):   # fan-in / residual: FPI
        np.testing.assert_array_equal(a[path], f[path])
    assert not np.allclose(logits(aki, WIDE), logits(small, SMALL), atol=1e-4)
    deep = growth.bert2bert(small, LARGE, KEY)
    for x, y in zip(jax.tree.leaves(deep['blocks']), jax.tree.leaves(aki['blocks'])):
        np.testing.assert_array_equal(x, y[np.arange(4) % 2])


def test_stackbert_layer_l_is_small_layer_l_mod_L1(small):
    deep = growth.stackbert(small, SMALL.replace(depth=5))
    for x, y in zip(jax.tree.leaves(deep['blocks']), jax.tree.leaves(small['blocks'])):
        for l in range(5):
            np.testing.assert_array_equal(x[l], y[l % 2])
    assert pytree.trees_equal(common.top_level(deep), common.top_level(small))
    with pytest.raises(genes.GeneError, match="'heads'.*width='net2net'"):
        growth.stackbert(small, LARGE)
    wide = growth.stackbert(small, LARGE, KEY, width='net2net')
    chex.assert_trees_all_close(wide, growth.bert2bert(small, LARGE, KEY, aki=False))


def test_ligo_operator_init_tying_and_kept_units(small):
    op = growth.ligo_init_operator(SMALL, LARGE, jax.random.key(4))
    assert set(op['width']) == {'embed', 'head', 'q', 'k', 'v', 'mlp'}
    assert op['width']['embed'].shape == (8, 8) and op['width']['q'].shape == (4, 8, 8)
    np.testing.assert_array_equal(op['width']['head'], op['width']['embed'])   # starts tied
    assert op['width']['mlp'].shape == (4, 16, 16)
    for c in jax.tree.leaves(op['width']):                          # 'rand': U(0, 1) rows summing to 1
        assert np.all(np.asarray(c) >= 0)
        np.testing.assert_allclose(np.asarray(c).sum(-1), 1.0, rtol=1e-5)
    for w in jax.tree.leaves(op['depth']):                          # stackbert_noisy
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)
        np.testing.assert_array_equal(np.argmax(w, -1), np.arange(4) % 2)
    grow = jax.jit(functools.partial(growth.ligo_grow, large_cfg=LARGE))
    base = grow(op, small)
    chex.assert_trees_all_equal_shapes(base, common.target_shapes(LARGE))
    chex.assert_trees_all_close(base, growth.ligo_grow(op, small, LARGE), rtol=1e-6, atol=1e-6)
    # with one-hot depth coefficients the old units are kept verbatim (A = [I; C])
    exact = growth.ligo_init_operator(SMALL, LARGE, jax.random.key(4), depth_init='stackbert')
    kept = grow(exact, small)
    for l in range(4):
        np.testing.assert_allclose(kept['blocks']['attn']['q']['kernel'][l][:8, :2],
                                   small['blocks']['attn']['q']['kernel'][l % 2], rtol=1e-6)
        np.testing.assert_allclose(kept['blocks']['mlp']['fc2']['kernel'][l][:16, :8],
                                   small['blocks']['mlp']['fc2']['kernel'][l % 2], rtol=1e-6)
    np.testing.assert_allclose(kept['pos_embed'][..., :8], small['pos_embed'], rtol=1e-6)
    # tying: which leaves each expansion reaches
    reach = {'v': {'attn/v/kernel', 'attn/v/bias', 'attn/out/kernel'},
             'q': {'attn/q/kernel', 'attn/q/bias'},
             'mlp': {'mlp/fc1/kernel', 'mlp/fc1/bias', 'mlp/fc2/kernel'}}
    for name, want in reach.items():
        moved = dict(op, width=dict(op['width'], **{name: op['width'][name] + 1.0}))
        diff = pytree.max_abs_diff(grow(moved, small), base)
        assert {p[len('blocks/'):] for p, d in diff.items() if d > 0} == want, name
    moved = dict(op, width=dict(op['width'], embed=op['width']['embed'] + 1.0))
    diff = pytree.max_abs_diff(grow(moved, small), base)
    assert all(diff[p] > 0 for p in ('patch_embed/kernel', 'pos_embed', 'cls_token', 'norm/scale',
                                     'blocks/norm1/bias', 'blocks/attn/q/kernel',
                                     'blocks/attn/out/kernel', 'blocks/mlp/fc2/bias'))
    assert diff['head/kernel'] == diff['head/bias'] == 0 and diff['blocks/attn/q/bias'] == 0
    # the head's input has its own expansion, reaching the head kernel only
    moved = dict(op, width=dict(op['width'], head=op['width']['head'] + 1.0))
    diff = pytree.max_abs_diff(grow(moved, small), base)
    assert {p for p, d in diff.items() if d > 0} == {'head/kernel'}
    a = np.concatenate([np.eye(8), np.asarray(op['width']['embed'])])          # [I; C_embed]
    np.testing.assert_allclose(base['head']['kernel'], a @ np.asarray(small['head']['kernel']),
                               rtol=1e-5, atol=1e-6)
    # the head's matrix is drawn apart from the others: without a head they are the same
    headless = growth.ligo_init_operator(SMALL.replace(num_classes=0), LARGE.replace(num_classes=0),
                                         jax.random.key(4))
    assert 'head' not in headless['width']
    chex.assert_trees_all_equal(headless, dict(op, width={k: v for k, v in op['width'].items()
                                                          if k != 'head'}))


def test_ligo_head_expansion_is_its_own_trainable_leaf(small):
    op = growth.ligo_init_operator(SMALL, LARGE, jax.random.key(4))
    x = jax.random.normal(jax.random.key(9), (2, 8, 8, 3))

    def loss(part):
        def f(op):
            grown = growth.ligo_grow(op, small, LARGE)
            if part == 'logits':
                return jnp.sum(apply(grown, x, LARGE)[0] ** 2)
            return jnp.sum(grown['head']['kernel'] if part == 'head' else grown['pos_embed'])
        return jax.jit(jax.grad(f))(op)['width']

    g = loss('logits')
    assert np.abs(g['head']).max() > 0 and np.abs(g['embed']).max() > 0
    assert not np.allclose(g['head'], g['embed'])
    g = loss('head')                                          # only the head's matrix moves it
    assert np.abs(g['head']).max() > 0 and not np.any(g['embed'])
    g = loss('embeddings')                                    # the head's matrix does not
    assert np.abs(g['embed']).max() > 0 and not np.any(g['head'])


def test_impossible_pairs(small):
    with pytest.raises(genes.GeneError, match='needs a PRNG key'):
        growth.net2net(small, LARGE)
    with pytest.raises(genes.GeneError, match="'head_dim'.*4.*8"):
        growth.net2net(small, LARGE.replace(num_heads=2), KEY)
    with pytest.raises(genes.GeneError, match="'layers'.*2 to 1"):
        growth.bert2bert(small, WIDE.replace(depth=1), KEY)
    with pytest.raises(genes.GeneError, match="'classes'.*head='new'"):
        growth.net2net(small, LARGE.replace(num_classes=3), KEY)
    with pytest.raises(genes.GeneError, match="'patch_h'.*patch_size"):
        growth.bert2bert(small, LARGE.replace(patch_size=8, image_size=16), KEY)
    with pytest.raises(genes.GeneError, match="'cls_token'"):
        growth.net2net(small, LARGE.replace(pool='avg', class_token=False), KEY)
    with pytest.raises(genes.GeneError, match="width='wide'"):
        growth.stackbert(small, LARGE, width='wide')
    with pytest.raises(genes.GeneError, match="width_init='zeros'"):
        growth.ligo_init_operator(SMALL, LARGE, KEY, width_init='zeros')
    with pytest.raises(genes.GeneError, match="'(embed|heads)'.*shrink"):
        growth.ligo_init_operator(WIDE, SMALL, KEY)
    op = growth.ligo_init_operator(SMALL, LARGE, KEY)
    with pytest.raises(genes.GeneError, match=r"'depth/attn/k/bias'.*\(4, 2\).*\(3, 2\)"):
        growth.ligo_grow(op, small, LARGE.replace(depth=3))


def test_registered_methods_descend(small):
    options = {'stackbert': {'width': 'net2net'}}
    target = LARGE.replace(num_classes=3)
    for name in ('net2net', 'stackbert', 'bert2bert', 'ligo'):
        method = genes.get(name)
        assert method.source == 'model'
        extra = {'large_cfg': LARGE} if name == 'ligo' else {}
        gene = method.gene_from_model(small, SMALL, **extra)
        des = method.descend(gene, target, key=KEY, head='new', **options.get(name, {}))
        chex.assert_trees_all_equal_shapes(des, common.target_shapes(target))
        same = method.descend(gene, LARGE, key=KEY, **options.get(name, {}))
        chex.assert_trees_all_close(same['blocks'], des['blocks'])
        want = common.count(small, include_head=False)
        if name == 'ligo':        # the head input's expansion goes with the head
            head = common.count(gene['operator']['width']['head'])
            want += common.count(gene['operator']) - head
            assert method.gene_param_count(gene, include_head=True) == (
                want + head + common.count(small['head']))
        assert method.gene_param_count(gene) == want
