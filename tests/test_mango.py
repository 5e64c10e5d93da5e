"""Mango: weight tensors, the staged ring contraction, its cost, sharding, the method contract
and the experiment's smoke run."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jlearngene import genes, parallel, pytree
from jlearngene.genes import common, growth, mango
from jlearngene.models import apply, init, vit_config

from helpers import images, perturbed


SMALL = vit_config('Ti', width=8, num_heads=2, mlp_dim=16, depth=2, image_size=8, patch_size=4,
                   num_classes=5)
LARGE = SMALL.replace(width=16, num_heads=4, mlp_dim=32, depth=3)   # same head_dim 4


@pytest.fixture(scope='module')
def small():
    return perturbed(jax.jit(init, static_argnums=0)(SMALL, jax.random.key(0)), 1)


@pytest.fixture(scope='module')
def operator():
    return mango.init_operator(SMALL, LARGE, 2, jax.random.key(1), noise=0.3)


@pytest.fixture(scope='module')
def checked(small, operator):
    """One compiled program: the grown tree and the operator's gradient of a loss on it."""
    @jax.jit
    def run(op, p):
        grow = functools.partial(mango.grow, large_cfg=LARGE)
        loss = lambda o: sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(grow(o, p)))
        return dict(grown=grow(op, p), grads=jax.grad(loss)(op))
    return run(operator, small)


def test_weight_tensor_slices_and_round_trip(small):
    m, v = mango.weight_tensor(small), mango.vector_tensor(small)
    p = mango.packing(small)
    assert m.shape == (2, p.num_slices, 8, 8) and p.num_slices == 4 + 2 + 2   # q k v out, fc1, fc2
    assert v.shape == (2, p.num_vectors, 8)
    flat, start = pytree.flatten(small['blocks']), 0
    for path, a, b in p.kernels:   # slice (i, j) = rows i·D.., columns j·D.. of the matrix view
        mat = np.asarray(jnp.reshape(flat[path], (2, a * 8, b * 8)))
        for i in range(a):
            for j in range(b):
                np.testing.assert_array_equal(m[:, start], mat[:, i * 8:(i + 1) * 8, j * 8:(j + 1) * 8])
                start += 1
    back = mango.blocks_from_tensors(m, v, small)
    assert pytree.trees_equal(back, small['blocks'])


def test_staged_contraction_equals_direct_is_linear_and_jit_agrees(small, operator, checked):
    grown = checked['grown']
    chex.assert_trees_all_equal_shapes_and_dtypes(grown, common.target_shapes(LARGE))
    eager = mango.grow(operator, small, LARGE)
    at_once = mango.grow(operator, small, LARGE, layer_loop=False)
    chex.assert_trees_all_close(grown, eager, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(grown, at_once, rtol=1e-5, atol=1e-6)
    # the direct contraction with the full mapping S formed (float64)
    op = {k: np.asarray(x, np.float64) for k, x in operator.items()}
    full = np.einsum('axyb,bijc,copd,dlma->lxiomyjp', op['S_B'], op['S_I'], op['S_O'], op['S_L'],
                     optimize=True)
    direct = np.einsum('lxiomyjp,lxio->myjp', full, np.asarray(mango.weight_tensor(small), np.float64))
    np.testing.assert_allclose(mango.weight_tensor(grown), direct, rtol=1e-4, atol=1e-5)
    full_v = np.einsum('astc,copd,dlma->lsomtp', op['S_V'], op['S_O'], op['S_L'], optimize=True)
    direct_v = np.einsum('lsomtp,lso->mtp', full_v, np.asarray(mango.vector_tensor(small), np.float64))
    np.testing.assert_allclose(mango.vector_tensor(grown), direct_v, rtol=1e-4, atol=1e-5)
    # M2 (and V2) are linear in M1 (and V1)
    other = perturbed(small, 2)
    tensors = lambda p: (mango.weight_tensor(p), mango.vector_tensor(p))
    (ma, va), (mb, vb) = tensors(small), tensors(other)
    contract = functools.partial(mango.contract, operator, layer_loop=False)
    mixed = contract(2.0 * ma - 0.5 * mb, 2.0 * va - 0.5 * vb)
    chex.assert_trees_all_close(mixed, jax.tree.map(lambda a, b: 2.0 * a - 0.5 * b,
                                                    contract(ma, va), contract(mb, vb)),
                                rtol=1e-4, atol=1e-5)


def test_gradients_reach_every_operator_leaf(checked):
    for name, g in checked['grads'].items():
        assert np.abs(np.asarray(g)).max() > 0, name


def test_init_slot_is_net2net_width_and_stacked_depth(small):
    """noise=0: the r = 0 slot alone. Width growth with D1 | D2 and the same head_dim
    computes the small model's function; depth growth stacks (layer l2 = layer l2 mod L1)."""
    wide = SMALL.replace(width=16, num_heads=4, mlp_dim=32)

    @jax.jit
    def logits(op, p):
        x = images(seed=9)
        return apply(p, x, SMALL)[0], apply(mango.grow(op, p, wide), x, wide)[0]
    want, got = logits(mango.init_operator(SMALL, wide, 3, jax.random.key(2), noise=0.0), small)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    deep = mango.grow(mango.init_operator(SMALL, LARGE, 2, jax.random.key(2), noise=0.0), small,
                      LARGE, layer_loop=False)
    for path, x in pytree.flatten(deep['blocks']).items():
        np.testing.assert_allclose(x[2], x[0], rtol=1e-6, atol=1e-7, err_msg=path)


def test_rank1_identity_slices_is_ligo_with_one_width_pair_and_depth_matrix():
    """R = 1, S_B = I: W2(b, l2) = Σ_l1 w[l2, l1]·A·W1(b, l1)·Aᵀ, i.e. LiGO (x·W layout)
    whose expansions all equal A = [I; C] and whose depth coefficients all equal w."""
    s_cfg = SMALL.replace(mlp_dim=8)                         # one slice per kernel
    l_cfg = LARGE.replace(mlp_dim=16)
    small = perturbed(init(s_cfg, jax.random.key(3)), 4)
    rng = np.random.default_rng(5)
    c = jnp.asarray(rng.uniform(size=(8, 8)), jnp.float32)
    w = jnp.asarray(rng.uniform(size=(3, 2)), jnp.float32)
    ligo = growth.ligo_init_operator(s_cfg, l_cfg, jax.random.key(6))
    ligo = {'width': jax.tree.map(lambda x: jnp.broadcast_to(c, x.shape), ligo['width']),
            'depth': jax.tree.map(lambda _: w, ligo['depth'])}
    a_t = jnp.concatenate([jnp.eye(8), c]).T                 # Aᵀ: (D1, D2)
    op = mango.init_operator(s_cfg, l_cfg, 1, jax.random.key(7), noise=0.0)
    op = dict(op, S_B=jnp.eye(op['S_B'].shape[1])[None, :, :, None],
              S_V=jnp.eye(op['S_V'].shape[1])[None, :, :, None],
              S_I=a_t[None, :, :, None], S_O=a_t[None, :, :, None], S_L=w.T[None, :, :, None],
              embed=a_t, head_in=a_t)
    both = jax.jit(lambda op, ligo, p: (mango.grow(op, p, l_cfg), growth.ligo_grow(ligo, p, l_cfg)))
    chex.assert_trees_all_close(*both(op, ligo, small), rtol=1e-5, atol=1e-5)


def test_operator_cost_formula_xla_and_deit_s_to_b(small, operator):
    cost = mango.operator_cost(SMALL, LARGE, 2)
    assert cost['params'] == sum(x.size for x in jax.tree.leaves(operator))
    s, t = cost['small'], cost['large']
    ring = 4 * (s['slices'] * t['slices'] + 2 * 8 * 16 + 2 * 3)
    assert cost['params'] == ring + 4 * s['vectors'] * t['vectors'] + 2 * 8 * 16
    lowered = jax.jit(functools.partial(mango.grow, large_cfg=LARGE, layer_loop=False)).lower(
        operator, small)
    xla = lowered.cost_analysis()['flops'] / 2          # XLA counts 2 per multiply-accumulate
    assert cost['flops'] == pytest.approx(xla, rel=0.05)
    # the spec's count for DeiT-S -> DeiT-B: ring parameters = 590,112·R²
    deit = mango.operator_cost(vit_config('S'), vit_config('B'), 4)
    assert deit['small']['slices'] == deit['large']['slices'] == 12
    ring_params = deit['params'] - 16 * 13 * 13 - 2 * 384 * 768
    assert ring_params == 590_112 * 16


def test_sharded_over_8_devices_equals_one_device(small, operator, checked):
    mesh = parallel.make_mesh()
    sh = parallel.param_shardings(operator, mesh, 'fsdp', axes=mango.operator_axes(operator),
                                  min_size=0)
    assert sh['S_I'].spec == P(None, None, 'data', None) == sh['S_O'].spec
    assert sh['embed'].spec == P(None, 'data') and sh['S_L'].spec == P()
    placed = jax.device_put(operator, sh)
    out = jax.jit(functools.partial(mango.grow, large_cfg=LARGE), in_shardings=(sh, None))(placed, small)
    chex.assert_trees_all_close(out, checked['grown'], rtol=1e-5, atol=1e-6)


def test_impossible_pairs_and_operators(small, operator):
    key = jax.random.key(0)
    with pytest.raises(genes.GeneError, match="'(embed|heads)'.*shrink"):
        mango.init_operator(LARGE, SMALL.replace(depth=3), 1, key)
    with pytest.raises(genes.GeneError, match="'layers'.*2 to 1"):
        mango.init_operator(SMALL, LARGE.replace(depth=1), 1, key)
    with pytest.raises(genes.GeneError, match="'blocks/mlp/fc1/bias'.*40.*width=16"):
        mango.init_operator(SMALL, LARGE.replace(mlp_dim=40), 1, key)
    with pytest.raises(genes.GeneError, match="'blocks/attn/k/bias'.*24.*width=16"):
        mango.init_operator(SMALL, LARGE.replace(head_dim=6), 1, key)
    with pytest.raises(genes.GeneError, match="'patch_h'.*patch_size"):
        mango.init_operator(SMALL, LARGE.replace(patch_size=8), 1, key)
    with pytest.raises(genes.GeneError, match="'blocks/attn/k/bias'"):
        mango.init_operator(SMALL, LARGE.replace(qkv_bias=False), 1, key)
    with pytest.raises(genes.GeneError, match='rank=0'):
        mango.init_operator(SMALL, LARGE, 0, key)
    with pytest.raises(genes.GeneError, match="head='new'"):
        mango.grow(operator, small, LARGE.replace(num_classes=7))
    with pytest.raises(genes.GeneError, match=r"'S_L'.*\(2, 2, 3, 2\).*\(2, 2, 4, 2\)"):
        mango.grow(operator, small, LARGE.replace(depth=4))
    with pytest.raises(genes.GeneError, match=r"Mango.*\['S_X'\]"):
        mango.grow({'S_X': operator['S_I']}, small, LARGE)


def test_method_contract(small, operator, checked):
    method = genes.get('mango')
    assert method is mango.METHOD and method.source == 'model'
    gene = method.gene_from_model(small, SMALL, operator=operator)
    assert method.gene_param_count(gene) == (common.count(small, include_head=False)
                                             + mango.operator_cost(SMALL, LARGE, 2)['params'])
    chex.assert_trees_all_close(method.descend(gene, LARGE, layer_loop=False), checked['grown'],
                                rtol=1e-5, atol=1e-6)
    new = method.descend(gene, LARGE.replace(num_classes=3), head='new', key=jax.random.key(4),
                         layer_loop=False)
    chex.assert_trees_all_equal_shapes(new, common.target_shapes(LARGE.replace(num_classes=3)))
    chex.assert_trees_all_close(new['blocks'], checked['grown']['blocks'], rtol=1e-5, atol=1e-6)
    with pytest.raises(genes.GeneError, match='PRNG key'):
        method.descend(gene, LARGE.replace(num_classes=3), head='new')
    shapes = method.gene_shapes(SMALL, large_cfg=LARGE, rank=2)
    chex.assert_trees_all_equal_shapes(shapes['operator'], operator)
    with pytest.raises(genes.GeneError, match=r"Mango.*\['small'\]"):
        method.descend({'small': small}, LARGE)
