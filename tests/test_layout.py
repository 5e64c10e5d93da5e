"""Layout helpers: slicing by logical axis and fan-in × fan-out matrix views."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import pytree
from jlearngene.models import apply, init, layout

from helpers import images


@pytest.fixture
def params(tiny_cfg):
    return init(tiny_cfg, jax.random.key(0))


def test_full_sizes_are_the_identity(tiny_cfg, params):
    sizes = {'embed': tiny_cfg.width, 'mlp': tiny_cfg.mlp_dim, 'heads': tiny_cfg.num_heads,
             'head_dim': tiny_cfg.head_dim}
    chex.assert_trees_all_equal(layout.slice_tree(params, sizes), params)
    chex.assert_trees_all_equal(layout.slice_tree(params, sizes, side='right'), params)
    assert layout.slice_config(tiny_cfg, sizes) == tiny_cfg


@pytest.mark.parametrize('sizes', [
    {'embed': 16, 'mlp': 32, 'heads': 1},          # a narrower model, head size kept
    {'head_dim': 8},                               # Scala-style: heads kept, head_dim shrinks
    {'mlp': 48, 'layers': 2},
])
def test_sliced_tree_is_the_sliced_configs_model(tiny_cfg, params, sizes):
    small = layout.slice_tree(params, sizes)
    cfg = layout.slice_config(tiny_cfg, sizes)
    want = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))
    chex.assert_trees_all_equal_shapes(small, want)
    logits, _ = apply(small, images(seed=1, size=cfg.image_size), cfg)
    assert logits.shape == (2, cfg.num_classes) and bool(jnp.all(jnp.isfinite(logits)))


def test_left_right_and_index_selections_take_those_entries(params):
    fc1 = params['blocks']['mlp']['fc1']['kernel']             # (L, D, M)
    left = layout.slice_tree(params, {'mlp': 5})['blocks']['mlp']['fc1']['kernel']
    right = layout.slice_tree(params, {'mlp': 5}, side='right')['blocks']['mlp']['fc1']['kernel']
    picked = layout.slice_tree(params, {'mlp': [7, 2, 2]})['blocks']['mlp']['fc1']['kernel']
    np.testing.assert_array_equal(left, fc1[..., :5])
    np.testing.assert_array_equal(right, fc1[..., -5:])
    np.testing.assert_array_equal(picked, fc1[..., [7, 2, 2]])
    # per-axis sides: embed from the right, mlp from the left
    both = layout.slice_tree(params, {'embed': 4, 'mlp': 3}, side={'embed': 'right'})
    np.testing.assert_array_equal(both['blocks']['mlp']['fc1']['kernel'], fc1[:, -4:, :3])
    np.testing.assert_array_equal(both['blocks']['mlp']['fc2']['kernel'],
                                  params['blocks']['mlp']['fc2']['kernel'][:, :3, -4:])


@pytest.mark.parametrize('sizes', [{'heads': [1, 0]}, {'mlp': list(range(63, -1, -1))}])
def test_permuting_heads_or_mlp_units_keeps_the_function(tiny_cfg, params, sizes):
    """A consistent permutation of heads (q, k, v, out and their biases) or of MLP units
    (fc1 outputs and fc2 inputs) is the same network."""
    permuted = layout.slice_tree(params, sizes)
    assert not pytree.trees_equal(permuted, params)
    x = images(seed=1, size=tiny_cfg.image_size)
    np.testing.assert_allclose(apply(permuted, x, tiny_cfg)[0],
                               apply(params, x, tiny_cfg)[0], rtol=1e-5, atol=1e-5)


def test_layer_gather_and_traced_indices_under_jit(params):
    got = layout.slice_tree(params, {'layers': [0, 0, 2]})
    want = jax.tree.map(lambda x: x[np.array([0, 0, 2])], params['blocks'])
    chex.assert_trees_all_equal(got['blocks'], want)

    @jax.jit
    def pick(p, idx):
        return layout.slice_tree(p, {'heads': idx})
    traced = pick(params, jnp.array([1, 1]))
    chex.assert_trees_all_equal(traced, layout.slice_tree(params, {'heads': [1, 1]}))


def test_list_layout_slices_each_block(params):
    listed = layout.unstack_blocks(params)
    sliced = layout.slice_tree(listed, {'heads': 1, 'mlp': 16})
    chex.assert_trees_all_equal(layout.stack_blocks(sliced),
                                layout.slice_tree(params, {'heads': 1, 'mlp': 16}))
    with pytest.raises(ValueError, match="'layers'.*stacked"):
        layout.slice_tree(listed, {'layers': 2})


def test_slicing_errors_name_the_problem(tiny_cfg, params):
    with pytest.raises(ValueError, match=r"\['width'\]"):
        layout.slice_tree(params, {'width': 3})
    with pytest.raises(ValueError, match="'mlp'.*64.*65"):
        layout.slice_tree(params, {'mlp': 65})
    with pytest.raises(ValueError, match=r'indices \[0, 2\]'):
        layout.slice_tree(params, {'heads': [0, 2]})
    with pytest.raises(ValueError, match="side='middle'"):
        layout.slice_tree(params, {'mlp': 3}, side='middle')
    with pytest.raises(ValueError, match="'tokens'"):
        layout.slice_config(tiny_cfg, {'tokens': 3})


def test_matrix_views_compute_the_layers_products(params):
    x = jax.random.normal(jax.random.key(2), (5, 32))
    q = params['blocks']['attn']['q']['kernel']                  # (L, D, H, Dh)
    mq = layout.to_matrix(q, 'blocks/attn/q/kernel')
    assert mq.shape == (3, 32, 32)
    np.testing.assert_allclose(x @ mq[0], jnp.einsum('td,dhk->thk', x, q[0]).reshape(5, -1),
                               rtol=1e-5, atol=1e-6)
    out = params['blocks']['attn']['out']['kernel']              # (L, H, Dh, D)
    view = layout.matrix_view('blocks/attn/out/kernel', out.shape)
    assert (view.lead, view.fan_in, view.fan_out) == (('layers',), ('heads', 'head_dim'), ('embed',))
    o = x.reshape(5, 2, 16)
    np.testing.assert_allclose(o.reshape(5, -1) @ layout.to_matrix(out, view.path)[1],
                               jnp.einsum('thk,hkd->td', o, out[1]), rtol=1e-5, atol=1e-6)
    patch = params['patch_embed']['kernel']                      # (p, p, C, D)
    assert layout.to_matrix(patch, 'patch_embed/kernel').shape == (4 * 4 * 3, 32)
    # list layout: no leading axis
    view = layout.matrix_view('blocks/1/attn/q/kernel', q.shape[1:])
    assert view.lead == () and view.matrix_shape == (32, 32)


def test_matrix_round_trip_for_every_kernel(params):
    mats = layout.kernel_matrices(params)
    flat = pytree.flatten(params)
    assert sorted(mats) == sorted(p for p in flat if p.endswith('kernel'))
    for path, m in mats.items():
        assert m.ndim == (3 if path.startswith('blocks/') else 2), path
        back = layout.from_matrix(m, layout.matrix_view(path, flat[path].shape))
        np.testing.assert_array_equal(back, flat[path])


def test_from_matrix_to_a_new_width(params):
    """A width transformation produces a matrix of other sizes; the target's view folds it."""
    m = layout.to_matrix(params['blocks']['attn']['q']['kernel'], 'blocks/attn/q/kernel')
    grown = jnp.concatenate([m, m], axis=-1)                    # fan-out 32 -> 64 (4 heads)
    view = layout.matrix_view('blocks/attn/q/kernel', (3, 32, 4, 16))
    assert layout.from_matrix(grown, view).shape == (3, 32, 4, 16)
    with pytest.raises(ValueError, match=r"'blocks/attn/q/kernel'.*\(3, 32, 64\)"):
        layout.from_matrix(m, view)
    with pytest.raises(ValueError, match="'blocks/attn/q/bias'"):
        layout.matrix_view('blocks/attn/q/bias', (3, 2, 16))
