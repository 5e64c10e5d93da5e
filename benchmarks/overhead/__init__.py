"""Method training-step cases for `benchmarks/method_overhead.py`, one module per method.

Each module defines `case(quick: bool) -> dict` with 'name', 'shape' (in words), and
'plain' and 'method' as (jitted fn, args): the plain ViT training step at the shape the
method's step runs, and the method's own step. `train_step` builds either from a loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import compiler
from jlearngene.models import vit_config
from jlearngene.train import optim, tasks, trainer

SHAPE = dict(variant='Ti', depth=12, batch=64)     # DeiT-Ti at 32 px, patch 4, 100 classes
QUICK = dict(variant='Ti', depth=4, batch=16)


def config(quick: bool, **changes):
    """The benchmark's ViTConfig and batch size (quick: a shallower model, smaller batch)."""
    s = QUICK if quick else SHAPE
    cfg = vit_config(s['variant'], depth=s['depth'], image_size=32, patch_size=4,
                     num_classes=100).replace(**changes)
    return cfg, s['batch']


def describe(cfg, batch: int) -> str:
    return f'width {cfg.width}, depth {cfg.depth}, batch {batch} at {cfg.image_size} px'


def train_step(loss_fn, trainable, cfg, batch: int):
    """(jitted step, (state, batch, rng)): `trainer.make_train_step` with AdamW on
    `trainable`, as benchmarks/run.py's step, without donation (the runner calls it again
    with the same arguments)."""
    opt = optim.make_optimizer(dict(lr=1e-3, schedule='constant', weight_decay=0.05,
                                    decay=('.*',), clip_norm=0.0), trainable)
    state = trainer.init_state(trainable, opt)
    rng = np.random.default_rng(0)
    data = {'image': jnp.asarray(rng.standard_normal(
                (batch, cfg.image_size, cfg.image_size, cfg.channels), np.float32)),
            'label': jnp.asarray(rng.integers(0, cfg.num_classes, (batch,)).astype(np.int32))}
    step = compiler.jit(trainer.make_train_step(loss_fn, opt))
    return step, (state, data, jax.random.key_data(jax.random.key(1)))


def plain(cfg, batch: int):
    """The plain ViT training step of `cfg` (cross-entropy)."""
    from jlearngene.models import init
    return train_step(tasks.classification_loss(cfg), init(cfg, jax.random.key(0)), cfg, batch)
