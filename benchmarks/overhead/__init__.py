"""Method training-step cases for `benchmarks/method_overhead.py`, one module per method.

Each module defines `case(quick: bool) -> dict` with 'name', 'shape' (in words), and
'plain' and 'method' as (jitted fn, args): the plain ViT training step at the shape the
method's step runs, and the method's own step. `train_step` builds either from a loss.
The cases built from `config` run the shape of JLEARNGENE_OVERHEAD_SHAPE when it is set
(e.g. "B/16 224 256 bfloat16", as benchmarks/gpu_224.py sets it); see `parse_shape`.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import compiler
from jlearngene.models import vit_config
from jlearngene.train import optim, tasks
from jlearngene.train.state import init_state
from jlearngene.train.step import make_train_step

SHAPE = dict(variant='Ti', depth=12, batch=64)     # DeiT-Ti at 32 px, patch 4, 100 classes
QUICK = dict(variant='Ti', depth=4, batch=16)

# JLEARNGENE_OVERHEAD_SHAPE selects another shape for every case built from `config`, e.g.
# "S/16 224 256 bfloat16": variant/patch, image size, batch, computation dtype (1000 classes,
# depth 12). Unset, the cases run SHAPE (QUICK with quick=True).
SHAPE_ENV = 'JLEARNGENE_OVERHEAD_SHAPE'


def parse_shape(spec: str) -> dict:
    """'VARIANT/PATCH IMAGE BATCH [DTYPE]' -> the config changes and batch of that shape."""
    from jlearngene.models.config import DTYPES, VARIANTS
    parts = spec.split()
    if len(parts) not in (3, 4) or parts[0].count('/') != 1:
        raise ValueError(f'{SHAPE_ENV}={spec!r}: expected "VARIANT/PATCH IMAGE BATCH [DTYPE]", '
                         'e.g. "S/16 224 256 bfloat16"')
    variant, patch = parts[0].split('/')
    if variant not in VARIANTS:
        raise ValueError(f'{SHAPE_ENV}={spec!r}: unknown variant {variant!r}, '
                         f'expected one of {sorted(VARIANTS)}')
    dtype = parts[3] if len(parts) == 4 else 'float32'
    if dtype not in DTYPES:
        raise ValueError(f'{SHAPE_ENV}={spec!r}: unknown dtype {dtype!r}, expected one of {DTYPES}')
    try:
        patch, image, batch = int(patch), int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f'{SHAPE_ENV}={spec!r}: patch, image size and batch must be integers') \
            from None
    if min(patch, image, batch) < 1 or image % patch:
        raise ValueError(f'{SHAPE_ENV}={spec!r}: needs positive sizes and an image size '
                         f'divisible by the patch size')
    return dict(variant=variant, depth=12, batch=batch, image_size=image, patch_size=patch,
                num_classes=1000, dtype=dtype)


def config(quick: bool, **changes):
    """The benchmark's ViTConfig and batch size: the shape of JLEARNGENE_OVERHEAD_SHAPE when
    set, else SHAPE (quick: a shallower model, smaller batch) at 32 px, patch 4, 100 classes."""
    spec = os.environ.get(SHAPE_ENV, '').strip()
    if spec:
        s = parse_shape(spec)
        extra = {k: s[k] for k in ('image_size', 'patch_size', 'num_classes', 'dtype')}
    else:
        s = QUICK if quick else SHAPE
        extra = dict(image_size=32, patch_size=4, num_classes=100)
    cfg = vit_config(s['variant'], depth=s['depth'], **extra).replace(**changes)
    return cfg, s['batch']


def describe(cfg, batch: int) -> str:
    extra = (f', patch {cfg.patch_size}' if cfg.patch_size != 4 else '') + \
        (f', {cfg.dtype}' if cfg.dtype != 'float32' else '')
    return f'width {cfg.width}, depth {cfg.depth}, batch {batch} at {cfg.image_size} px' + extra


def train_step(loss_fn, trainable, cfg, batch: int, *, freeze: tuple[str, ...] = ()):
    """(jitted step, (state, batch, rng)): `step.make_train_step` with AdamW on
    `trainable` (leaves matching a `freeze` pattern stay fixed), as benchmarks/run.py's
    step, without donation (the runner calls it again with the same arguments)."""
    opt = optim.make_optimizer(dict(lr=1e-3, schedule='constant', weight_decay=0.05,
                                    decay=('.*',), clip_norm=0.0, freeze=freeze), trainable)
    state = init_state(trainable, opt)
    rng = np.random.default_rng(0)
    data = {'image': jnp.asarray(rng.standard_normal(
                (batch, cfg.image_size, cfg.image_size, cfg.channels), np.float32)),
            'label': jnp.asarray(rng.integers(0, cfg.num_classes, (batch,)).astype(np.int32))}
    step = compiler.jit(make_train_step(loss_fn, opt))
    return step, (state, data, jax.random.key_data(jax.random.key(1)))


def plain(cfg, batch: int):
    """The plain ViT training step of `cfg` (cross-entropy)."""
    from jlearngene.models import init
    return train_step(tasks.classification_loss(cfg), init(cfg, jax.random.key(0)), cfg, batch)
