"""The Flax NNX view of the model: its state is the canonical tree, its call is `models.apply`,
it composes inside a user's module and trains with `nnx.Optimizer`."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jlearngene import pytree
from jlearngene.interop import nnx as jnnx
from jlearngene.interop.state_dict import StateDictError
from jlearngene.models import apply, init, unstack_blocks, vit_config

CFG = vit_config('Ti', width=8, num_heads=2, mlp_dim=16, depth=2, image_size=8, patch_size=4,
                 num_classes=3)


def param_state(model):
    return jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def shapes():
    return jax.eval_shape(lambda: init(CFG, jax.random.key(0)))


@pytest.fixture(scope='module')
def params():
    """Random values in the model's shapes (numpy: nothing to compile)."""
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32), shapes())


@pytest.fixture(scope='module')
def images():
    return jnp.asarray(np.random.default_rng(1).standard_normal((4, 8, 8, 3)), jnp.float32)


def test_state_is_the_canonical_tree_and_call_is_apply(params, images):
    model = jnnx.ViT(CFG, params=params)
    assert pytree.trees_equal(param_state(model), params)
    assert pytree.trees_equal(jax.device_get(model.canonical_params()), params)
    assert all(isinstance(v, nnx.Param) for v in jax.tree.leaves(
        nnx.state(model), is_leaf=lambda x: isinstance(x, nnx.Variable)))
    # split / merge give back the same arrays and the same function.
    graphdef, state = nnx.split(model)
    assert pytree.trees_equal(param_state(nnx.merge(graphdef, state)), params)

    @jax.jit
    def module_and_apply(state, params, x):
        logits, aux = nnx.merge(graphdef, state)(x)
        want, want_aux = apply(params, x, CFG)
        return (logits, aux['pre_logits']), (want, want_aux['pre_logits'])

    got, want = module_and_apply(state, params, images)
    assert np.abs(np.asarray(want[0])).max() > 0.1
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    # A fresh init is models.init's tree (shapes only: nothing is drawn here).
    fresh = nnx.eval_shape(lambda: jnnx.ViT(CFG, rngs=nnx.Rngs(0)))
    assert pytree.structure_diff(nnx.to_pure_dict(nnx.state(fresh, nnx.Param)), shapes()) == {
        'missing': [], 'unexpected': [], 'shape': []}


def test_list_layout_and_bad_arguments(params):
    listed = unstack_blocks(params)
    model = jnnx.ViT(CFG, params=listed)
    assert pytree.trees_equal(jax.device_get(model.canonical_params()), jax.device_get(listed))
    with pytest.raises(ValueError, match='rngs=.*params='):
        jnnx.ViT(CFG)
    with pytest.raises(ValueError, match='rngs=.*params='):
        jnnx.ViT(CFG, rngs=nnx.Rngs(0), params=params)
    bad = dict(params, head={'kernel': params['head']['kernel'][:, :2], 'bias': params['head']['bias']})
    with pytest.raises(StateDictError, match=r'head/kernel.*\(8, 2\).*\(8, 3\)'):
        jnnx.ViT(CFG, params=bad)


class Classifier(nnx.Module):
    """A user's model: the ViT as a backbone under a new linear layer."""

    def __init__(self, params, rngs):
        self.backbone = jnnx.ViT(CFG, params=params)
        self.out = nnx.Linear(CFG.num_classes, 2, rngs=rngs)

    def __call__(self, x):
        logits, _ = self.backbone(x)
        return self.out(logits)


def test_composes_in_a_user_module_and_trains_with_nnx_optimizer(params, images):
    model = Classifier(params, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
    labels = jnp.array([0, 1, 0, 1])

    @nnx.jit
    def step(model, optimizer):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(images), labels).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(6)]
    assert losses[-1] < losses[0]
    trained = jax.device_get(model.backbone.canonical_params())
    assert pytree.structure_diff(trained, params) == {'missing': [], 'unexpected': [], 'shape': []}
    q = 'blocks/attn/q/kernel'
    assert not np.array_equal(pytree.flatten(trained)[q], pytree.flatten(params)[q])
