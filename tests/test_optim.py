"""Optimiser from config: schedule, masked weight decay, freezing, lr multipliers, clipping."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jlearngene import pytree
from jlearngene.models import init
from jlearngene.train import optim


@pytest.fixture
def params(tiny_cfg):
    return jax.jit(init, static_argnums=0)(tiny_cfg, jax.random.key(0))


def _step(tx, params, grads, state=None):
    state = jax.jit(tx.init)(params) if state is None else state
    updates, state = jax.jit(tx.update)(grads, state, params)
    return optax.apply_updates(params, updates), updates, state


def test_warmup_cosine_schedule_is_logged(params):
    tx = optim.make_optimizer({'lr': 1e-3, 'warmup_steps': 2, 'min_lr_ratio': 0.1}, params, total_steps=6)
    grads = jax.tree.map(jnp.ones_like, params)
    state, lrs, update = tx.init(params), [], jax.jit(tx.update)
    for _ in range(6):
        _, state = update(grads, state, params)
        lrs.append(float(optim.current_lr(state)))
    want = [1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + np.cos(np.pi * (s - 2) / 4)) if s >= 2 else 1e-3 * s / 2
            for s in range(6)]
    np.testing.assert_allclose(lrs, want, rtol=1e-5)


def test_weight_decay_only_on_kernels(params):
    tx = optim.make_optimizer({'lr': 0.1, 'weight_decay': 0.5, 'schedule': 'constant', 'clip_norm': 0},
                              params)
    new, _, _ = _step(tx, params, jax.tree.map(jnp.zeros_like, params))
    changed = {k for k, d in pytree.max_abs_diff(new, params).items() if d > 0}
    kernels = {k for k in pytree.flatten(params) if k.endswith('kernel')}
    assert changed == kernels   # no decay on biases, norms, pos_embed, cls_token
    np.testing.assert_allclose(new['head']['kernel'], params['head']['kernel'] * (1 - 0.1 * 0.5), rtol=1e-6)


def test_freeze_and_lr_multipliers(params):
    cfg = {'lr': 1e-2, 'schedule': 'constant', 'weight_decay': 0.0, 'clip_norm': 0,
           'freeze': ('patch_embed/.*', 'pos_embed'), 'lr_mults': (('head/.*', 0.5),)}
    tx = optim.make_optimizer(cfg, params)
    grads = jax.tree.map(jnp.ones_like, params)
    new, updates, state = _step(tx, params, grads)
    np.testing.assert_array_equal(new['patch_embed']['kernel'], params['patch_embed']['kernel'])
    np.testing.assert_array_equal(new['pos_embed'], params['pos_embed'])
    # Adam's first step is -lr * sign(g); the head gets half of it.
    np.testing.assert_allclose(updates['head']['bias'], -0.5e-2, rtol=1e-4)
    np.testing.assert_allclose(updates['norm']['bias'], -1e-2, rtol=1e-4)
    # Frozen leaves carry no Adam moments.
    mu = optax.tree_utils.tree_get(state, 'mu')
    assert isinstance(mu['patch_embed']['kernel'], optax.MaskedNode)
    with pytest.raises(ValueError, match=r"freeze=\('\.\*',\)"):
        optim.make_optimizer({'freeze': ('.*',)}, params, total_steps=3)


def test_global_norm_clipping_ignores_frozen(params):
    cfg = {'lr': 1e-3, 'schedule': 'constant', 'clip_norm': 1.0, 'b1': 0.9, 'freeze': ('head/.*',)}
    tx = optim.make_optimizer(cfg, params)
    grads = jax.tree.map(lambda x: jnp.full_like(x, 3.0), params)
    grads['head'] = jax.tree.map(lambda x: jnp.full_like(x, 1e6), params['head'])
    _, _, state = _step(tx, params, grads)
    trainable = {k: v for k, v in grads.items() if k != 'head'}
    norm = float(optax.tree.norm(trainable))
    mu = optax.tree_utils.tree_get(state, 'mu')
    np.testing.assert_allclose(mu['norm']['bias'], 0.1 * 3.0 / norm, rtol=1e-5)


def test_config_errors(params):
    with pytest.raises(ValueError, match=r"\['lrr'\]"):
        optim.make_optimizer({'lrr': 1.0}, params, total_steps=3)
    with pytest.raises(ValueError, match='cosine.*total_steps'):
        optim.make_optimizer({'lr': 1.0}, params)
    for field, value in (('lr', -0.001), ('lr', 0.0), ('warmup_steps', -1), ('min_lr_ratio', 2.0),
                         ('b2', 1.0), ('weight_decay', -0.1), ('lr', float('nan'))):
        with pytest.raises(ValueError, match=f'{field} .*got {re.escape(repr(value))}'):
            optim.make_optimizer({field: value}, params, total_steps=10)
    with pytest.raises(ValueError, match='total_steps.*-1'):
        optim.make_optimizer({'warmup_steps': 100}, params, total_steps=-1)


def test_warmup_longer_than_the_run_is_clipped_with_a_warning(caplog):
    for schedule, longest in (('cosine', 2), ('constant', 3)):
        with caplog.at_level('WARNING', logger='jlearngene.train.optim'):
            c = optim.resolve({'warmup_steps': 100, 'schedule': schedule}, total_steps=3)
        assert c['warmup_steps'] == longest
        assert re.search(f'warmup_steps=100.*over {longest}', caplog.text), caplog.text
        caplog.clear()
    params = {'kernel': jnp.ones(3)}
    tx = optim.make_optimizer({'lr': 1.0, 'warmup_steps': 100}, params, total_steps=3)
    state, update = tx.init(params), jax.jit(tx.update)
    lrs = []
    for _ in range(3):
        _, state = update(params, state, params)
        lrs.append(float(optim.current_lr(state)))
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.5) and lrs[2] == pytest.approx(1.0)


def test_cache_key_names_the_transformation(params, caplog):
    """Equal optimiser configs on one tree structure and frozen set have one `cache_key`
    (what the trainer's compile key is built from); any difference gives another. Computing
    it logs nothing (the warm-up clip is `make_optimizer`'s to report)."""
    cfg = dict(lr=1e-3, warmup_steps=2, weight_decay=0.05, freeze=('pos_embed',))
    key = optim.cache_key(cfg, params, total_steps=10)
    hash(key)
    assert optim.cache_key(dict(cfg), params, total_steps=10) == key
    assert optim.cache_key({**cfg, 'freeze': ['pos_embed']}, params, total_steps=10) == key
    assert optim.cache_key(cfg, params, total_steps=11) != key
    assert optim.cache_key(dict(cfg, lr=2e-3), params, total_steps=10) != key
    assert optim.cache_key(dict(cfg, freeze=('head',)), params, total_steps=10) != key
    fewer = {k: v for k, v in params.items() if k != 'head'}
    assert optim.cache_key(cfg, fewer, total_steps=10) != key
    with caplog.at_level('WARNING'):
        optim.cache_key(dict(cfg, warmup_steps=50), params, total_steps=10)
    assert not caplog.records
    # make_optimizer builds a fresh transformation each time (no memoised factory)
    assert optim.make_optimizer(cfg, params, total_steps=10) is not optim.make_optimizer(
        cfg, params, total_steps=10)
