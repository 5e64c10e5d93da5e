"""Model parallelism by logical axis on a 2-D ('data', 'model') mesh of 8 fake CPU devices:
the layout rules, per-device memory of ViT-L/H-sized targets, training against one device
and a Mango target grown inside a jitted function."""
import itertools

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jlearngene import parallel, pytree
from jlearngene.models import init, vit_config
from jlearngene.train import tasks, trainer


@pytest.fixture
def cfg4():
    """Width 32, 4 heads of 8, MLP 64, depth 2, 8 px images in 4 px patches, 4 classes."""
    return vit_config('Ti', width=32, num_heads=4, mlp_dim=64, depth=2, image_size=8,
                      patch_size=4, num_classes=4)


def test_mesh_2d():
    mesh = parallel.make_mesh(model=4)
    assert mesh.axis_names == ('data', 'model') and dict(mesh.shape) == {'data': 2, 'model': 4}
    assert parallel.data_size(mesh) == 2 and parallel.model_size(mesh) == 4
    assert parallel.model_size(parallel.make_mesh()) == 1
    with pytest.raises(ValueError, match="'model'.*3.*8"):
        parallel.make_mesh(model=3)
    with pytest.raises(ValueError, match='model.*got 0'):
        parallel.make_mesh(model=0)


def test_model_axis_follows_the_axes_table(cfg4):
    mesh = parallel.make_mesh(model=4)
    params = jax.eval_shape(lambda: init(cfg4, jax.random.key(0)))
    sh = parallel.param_shardings(params, mesh, 'fsdp', min_size=0)
    spec = {k: s.spec for k, s in pytree.flatten(sh).items()}
    assert spec['blocks/attn/q/kernel'] == P(None, 'data', 'model', None)     # heads | embed
    assert spec['blocks/attn/q/bias'] == P(None, 'model', 'data')            # heads | head_dim
    assert spec['blocks/attn/out/kernel'] == P(None, 'model', None, 'data')
    assert spec['blocks/mlp/fc1/kernel'] == P(None, 'data', 'model')          # mlp | embed
    assert spec['blocks/mlp/fc2/kernel'] == P(None, 'model', 'data')
    assert spec['blocks/mlp/fc1/bias'] == P(None, 'model')
    assert spec['patch_embed/kernel'] == P(None, None, None, 'model')         # no heads/mlp: embed
    assert spec['head/kernel'] == P('model', 'data')
    assert spec['blocks/norm1/scale'] == P(None, 'model')
    # 'replicate' over data: the model axis alone.
    rep = parallel.param_shardings(params, mesh, 'replicate', min_size=0)
    assert rep['blocks']['attn']['q']['kernel'].spec == P(None, None, 'model', None)
    assert rep['blocks']['mlp']['fc2']['kernel'].spec == P(None, 'model', None)
    # Sizes the axis does not divide fall to the next name in MODEL_AXES order.
    assert parallel.leaf_spec((6, 8), ('heads', 'embed'), data=1, model=4, min_size=0) == P(None, 'model')
    assert parallel.leaf_spec((6, 10), ('heads', 'embed'), data=4, model=4, min_size=0) == P()
    assert parallel.leaf_spec((64, 24), None, data=2, model=4, min_size=0) == P('model', 'data')
    assert parallel.leaf_spec((32, 64), ('embed', 'mlp'), data=2, model=4) == P()   # small


def _bytes_per_device(params, shardings) -> int:
    total = 0
    for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
        shard = s.shard_shape(x.shape)
        total += int(np.prod(shard)) * x.dtype.itemsize
    return total


@pytest.mark.parametrize('name,fields', [
    ('L/16', dict(width=1024, num_heads=16, mlp_dim=4096, depth=24)),
    ('H/14', dict(width=1280, num_heads=16, mlp_dim=5120, depth=32, patch_size=14)),
])
def test_large_targets_split_over_every_device(name, fields):
    """ViT-L/H (Mango's and LeTra's large targets): with data 2 x model 4 almost every byte
    is split 8 ways; the model axis alone splits 4 ways (abstract shapes, nothing allocated)."""
    cfg = vit_config('L', image_size=224, num_classes=1000, **fields)
    params = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    mesh = parallel.make_mesh(model=4)
    both = _bytes_per_device(params, parallel.param_shardings(params, mesh, 'fsdp'))
    model_only = _bytes_per_device(params, parallel.param_shardings(params, mesh, 'replicate'))
    fsdp_only = _bytes_per_device(params, parallel.param_shardings(params, parallel.make_mesh(2), 'fsdp'))
    assert both < 1.01 * total / 8, (name, both / total)
    assert model_only < 1.01 * total / 4 and fsdp_only < 1.01 * total / 2


def _batches(cfg, n=3, batch=8):
    rng = np.random.default_rng(0)
    return [{'image': rng.normal(size=(batch, cfg.image_size, cfg.image_size, 3)).astype(np.float32),
             'label': rng.integers(0, cfg.num_classes, batch).astype(np.int32)} for _ in range(n)]


@pytest.mark.slow
def test_training_on_data_x_model_mesh_matches_one_device(cfg4, tmp_path):
    cfg = cfg4.replace(depth=1)
    params = init(cfg, jax.random.key(1))
    batches = _batches(cfg)
    # SGD keeps the comparison at float rounding (Adam's m / sqrt(v) magnifies it wherever
    # a gradient is near zero).
    loss, tx = tasks.classification_loss(cfg), optax.sgd(0.5, momentum=0.9)
    kw = dict(steps=2, log_every=2, steps_per_call=1, progress=False, console=False,
              tensorboard=False, handle_sigterm=False)
    one, _ = trainer.fit(loss, params, itertools.cycle(batches), tx, trainer.FitConfig(
        workdir=str(tmp_path / 'one'), mesh=parallel.make_mesh(1), **kw))
    mp, _ = trainer.fit(loss, params, itertools.cycle(batches), tx, trainer.FitConfig(
        workdir=str(tmp_path / 'mp'), sharding='fsdp', fsdp_min_size=0, model_parallel=4, **kw))
    q = mp['blocks']['attn']['q']['kernel']
    assert q.sharding.spec == P(None, 'data', 'model', None) and len(q.sharding.device_set) == 8
    assert q.addressable_shards[0].data.shape == (1, 16, 1, 8)
    def max_diff(x, y):
        return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)))
    moved, diff = max_diff(one, params), max_diff(one, mp)
    print(f'data 2 x model 4 vs 1 device: max |params| difference {diff:.3g} (training moved them {moved:.3g})')
    assert moved > 1e-2 and diff < 1e-5


def test_mango_target_grown_in_jit_is_laid_out_over_the_mesh():
    from jlearngene.genes import mango
    small_cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8,
                           patch_size=4, num_classes=4)
    large_cfg = vit_config('Ti', width=32, num_heads=4, mlp_dim=64, depth=2, image_size=8,
                           patch_size=4, num_classes=4)
    small = init(small_cfg, jax.random.key(2))
    op = mango.init_operator(small_cfg, large_cfg, 2, jax.random.key(3))
    mesh = parallel.make_mesh(model=4)
    grown = jax.jit(lambda o: parallel.constrain(mango.grow(o, small, large_cfg), mesh, 'fsdp',
                                                 min_size=0))(op)
    want = jax.jit(lambda o: mango.grow(o, small, large_cfg))(op)
    q, fc1 = grown['blocks']['attn']['q']['kernel'], grown['blocks']['mlp']['fc1']['kernel']
    assert q.sharding.is_equivalent_to(NamedSharding(mesh, P(None, 'data', 'model', None)), q.ndim)
    assert fc1.sharding.is_equivalent_to(NamedSharding(mesh, P(None, 'data', 'model')), fc1.ndim)
    for a, b in zip(jax.tree.leaves(grown), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
