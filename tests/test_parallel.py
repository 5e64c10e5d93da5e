"""Meshes and sharding rules on 8 fake CPU devices."""
import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jlearngene import parallel
from jlearngene.models import init
from jlearngene.train.state import init_state


def test_mesh():
    assert parallel.data_size(parallel.make_mesh()) == 8
    assert parallel.data_size(parallel.make_mesh(1)) == 1
    with pytest.raises(ValueError, match='9 devices.*8'):
        parallel.make_mesh(9)


def test_fsdp_spec_rules():
    names = ('layers', 'embed', 'heads', 'head_dim')
    assert parallel.fsdp_spec((3, 32, 2, 16), names, 8, min_size=0) == P(None, 'data', None, None)
    assert parallel.fsdp_spec((3, 32, 2, 16), names, 1, min_size=0) == P()
    assert parallel.fsdp_spec((3, 32, 2, 16), names, 8) == P()                    # small: replicated
    assert parallel.fsdp_spec((12, 6, 10), ('layers', 'embed', 'classes'), 4, min_size=0) == P()
    assert parallel.fsdp_spec((64, 24), None, 8, min_size=0) == P('data', None)  # generic rule


def test_param_and_state_shardings(tiny_cfg):
    mesh = parallel.make_mesh()
    params = jax.eval_shape(lambda: init(tiny_cfg, jax.random.key(0)))
    rep = parallel.param_shardings(params, mesh, 'replicate')
    assert all(s.spec == P() for s in jax.tree.leaves(rep))
    sh = parallel.param_shardings(params, mesh, 'fsdp', min_size=0)
    assert sh['blocks']['attn']['q']['kernel'].spec == P(None, 'data', None, None)
    assert sh['blocks']['mlp']['fc1']['kernel'].spec == P(None, None, 'data')
    assert sh['pos_embed'].spec == P(None, None, 'data')
    assert sh['head']['bias'].spec == P()                 # 10 classes do not split over 8
    tx = optax.adamw(1e-3)
    state = jax.eval_shape(lambda p: init_state(p, tx), params)
    ssh = parallel.state_shardings(state, sh, mesh)
    mu = ssh['opt_state'][0].mu
    assert mu['blocks']['mlp']['fc1']['kernel'] == sh['blocks']['mlp']['fc1']['kernel']
    assert ssh['opt_state'][0].count.spec == P() and ssh['step'].spec == P()
    with pytest.raises(ValueError, match="'tp'"):
        parallel.param_shardings(params, mesh, 'tp')


def test_fsdp_generic_tree_and_explicit_axes():
    mesh = parallel.make_mesh()
    tree = {'theta_a': {'w': np.zeros((64, 24))}, 'theta_b': np.zeros((24, 8))}
    sh = parallel.param_shardings(tree, mesh, 'fsdp', min_size=0)
    assert sh['theta_a']['w'].spec == P('data', None) and sh['theta_b'].spec == P('data', None)
    sh = parallel.param_shardings(tree, mesh, 'fsdp', min_size=0,
                                  axes={'theta_a': {'w': ('embed', 'mlp')}, 'theta_b': ('mlp', 'embed')})
    assert sh['theta_a']['w'].spec == P('data', None) and sh['theta_b'].spec == P('data', None)


def test_shard_batch():
    mesh = parallel.make_mesh()
    batch = {'image': np.arange(16 * 2, dtype=np.float32).reshape(16, 2), 'label': np.arange(16),
             'name': np.array(['x'] * 16)}
    out = parallel.shard_batch(batch, mesh)
    assert set(out) == {'image', 'label'}                 # strings stay on the host
    assert out['image'].sharding.spec == P('data')
    np.testing.assert_array_equal(np.asarray(out['image']), batch['image'])
    with pytest.raises(ValueError, match=r"'image'.*\(12,\).*8"):
        parallel.shard_batch({'image': np.zeros((12, 2))}, mesh)
