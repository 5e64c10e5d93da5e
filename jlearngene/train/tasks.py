"""Task functions for the generic trainer, built on `jlearngene.models.apply`.

`*_loss(...)` return `loss_fn(params, batch, rng) -> (loss, metrics)` and `*_eval(...)`
return `eval_fn(params, batch) -> sums`: per-batch **sums** over the valid examples plus a
'count' entry, so `evaluate.evaluate` (used by the trainer and `jlearngene eval`) can
average over a whole split exactly even when the last batch is padded (batch['mask'] marks
real examples).
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from jlearngene import compiler
from jlearngene.models import ViTConfig, apply
from jlearngene.train import losses


@functools.lru_cache(maxsize=64)
def classification_loss(cfg: ViTConfig, *, label_smoothing: float = 0.0) -> Callable:
    """Cross-entropy on batch['label_soft'] when present (mixup/cutmix), else batch['label'].
    One function object per (config, smoothing), so runs at one shape share a compiled step."""
    def loss_fn(params, batch, rng):
        logits, _ = apply(params, batch['image'], cfg, train=True, rng=rng)
        targets = batch['label_soft'] if 'label_soft' in batch else batch['label']
        loss = losses.cross_entropy(logits, targets, label_smoothing=label_smoothing)
        return loss, {'accuracy': losses.accuracy(logits, batch['label'])}
    return loss_fn


def classification_eval(cfg: ViTConfig) -> Callable:
    """Sums of correct predictions and cross-entropy over the valid examples, and 'count'."""
    def eval_fn(params, batch):
        logits, _ = apply(params, batch['image'], cfg)
        labels = batch['label']
        mask = batch.get('mask')
        mask = jnp.ones(labels.shape[:1], jnp.float32) if mask is None else mask.astype(jnp.float32)
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        ce = losses.cross_entropy_per_example(logits, labels)
        return {'accuracy': (correct * mask).sum(), 'loss': (ce * mask).sum(), 'count': mask.sum()}
    return eval_fn


def predict_fn(cfg: ViTConfig) -> Callable:
    """Jitted logits of a batch of NHWC images."""
    return compiler.jit(lambda params, images: apply(params, images, cfg)[0])


# ----------------------------------------------------------------------------------------
# Config-driven classification run (what `jlearngene train` executes).

def model_config(model) -> ViTConfig:
    """A ViTConfig from a config's `model` section: `variant` plus any ViTConfig fields."""
    from jlearngene.models import vit_config
    d = model.to_dict() if hasattr(model, 'to_dict') else dict(model)
    return vit_config(d.pop('variant', 'Ti'), **d)


def _check_data_fits(cfg: ViTConfig, info, split: str) -> None:
    problems = []
    if info.num_classes != cfg.num_classes:
        problems.append(f'num_classes: data {info.num_classes} vs model {cfg.num_classes}')
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if tuple(info.image_shape) != want:
        problems.append(f'image shape: data {tuple(info.image_shape)} vs model {want} '
                        '(image_size, image_size, channels)')
    if problems:
        raise ValueError(f'data {info.name}[{split}] does not fit the model: ' + '; '.join(problems))


def initial_params(config, cfg: ViTConfig):
    """Fresh parameters (seeded) or the model artefact named by `config.init`."""
    from jlearngene.train import checkpoint
    path = config.get('init', '') if hasattr(config, 'get') else ''
    if path:
        params, _, _ = checkpoint.load_model(path, expect_cfg=cfg)
        return params
    from jlearngene.models import init
    return jax.jit(init, static_argnums=0)(cfg, jax.random.key(config.seed))


def eval_data_fn(config, source=None):
    """A zero-argument callable giving a fresh pass over the evaluation split (`source`: the
    split's source when already built, e.g. by `check_run_data`)."""
    from jlearngene import data
    return lambda: data.from_config(config.data, config.eval_split, batch_size=config.eval_batch_size,
                                    seed=config.seed, train=False, source=source)[0]


def check_run_data(config, cfg: ViTConfig) -> dict:
    """Builds and checks, before the first step, every split a classification run reads ->
    {'train': source, 'eval': source}: each exists, fits the model (`_check_data_fits`),
    is divisible over the devices and, for training, holds at least `batch_size` examples,
    and its first example decodes (`data.check_split`). A one-line DataError names the
    split (and the config field) otherwise."""
    from jlearngene import data
    from jlearngene.data import DataError
    d = config.data.to_dict() if hasattr(config.data, 'to_dict') else dict(config.data)
    image_size = data.pipeline_image_size(d)
    devices = jax.device_count() // max(int(config.get('model_parallel', 1) or 1), 1)
    out = {}
    for role, split, field, batch_size in (
            ('train', 'train', 'batch_size', config.batch_size),
            ('eval', config.eval_split, 'eval_batch_size', config.eval_batch_size)):
        what = "train split 'train'" if role == 'train' else f'eval_split {split!r}'
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
                or batch_size % devices):
            raise DataError(f'{what}: {field} {batch_size!r} must be a positive multiple of the '
                            f"{devices} devices of the mesh's 'data' axis")
        try:
            source = data.source_from_config(d, split)
        except DataError as e:
            raise DataError(f'{what}: {e}') from None
        _check_data_fits(cfg, source.info, split)
        data.check_split(source, what=what, batch_size=batch_size, image_size=image_size,
                         resize_method=d.get('resize_method', 'bilinear'),
                         full_batches=role == 'train')
        out[role] = source
    return out


def _steps_per_call(value):
    """A config's `steps_per_call`: 'auto' or a positive integer, also as the text that a
    command-line override of the 'auto' default gives."""
    from jlearngene.train import trainer
    if isinstance(value, str) and value != 'auto':
        if not value.strip().isdigit():
            raise ValueError(f"steps_per_call must be 'auto' or a positive integer, got {value!r}")
        value = int(value)
    if value != 'auto':
        trainer.check_steps_per_call(value)
    return value


def run_classification(config, workdir: str, *, progress: bool = True):
    """Train a ViT classifier as `config` describes (see experiments/configs/digits_vit.py);
    the final parameters are also saved as a model artefact in `workdir/model`."""
    import os

    from jlearngene import data
    from jlearngene.train import checkpoint, optim, trainer
    cfg = model_config(config.model)
    microbatches = config.get('microbatches', 1)
    trainer.check_microbatches(microbatches)     # before anything is read or written
    if config.batch_size % microbatches:
        raise ValueError(f'batch_size {config.batch_size} is not a multiple of '
                         f'microbatches {microbatches}')
    steps_per_call = _steps_per_call(config.get('steps_per_call', 'auto'))
    sources = check_run_data(config, cfg)   # every split, before the first step
    train_it, _ = data.from_config(config.data, 'train', batch_size=config.batch_size,
                                   seed=config.seed, train=True, source=sources['train'])
    params = initial_params(config, cfg)
    tx = optim.make_optimizer(config.optim, params, total_steps=config.steps)
    params, history = trainer.fit(
        classification_loss(cfg, label_smoothing=config.label_smoothing), params, train_it, tx,
        workdir=workdir, steps=config.steps, eval_fn=classification_eval(cfg),
        eval_data=eval_data_fn(config, sources['eval']), eval_every=config.eval_every,
        log_every=config.log_every,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        best_metric=config.best_metric or None, seed=config.seed, config=config, model_config=cfg,
        sharding=config.sharding, model_parallel=config.get('model_parallel', 1),
        microbatches=microbatches, steps_per_call=steps_per_call,
        progress=progress)
    final = history['eval'][-1] if history['eval'] else {}
    checkpoint.save_model(os.path.join(workdir, 'model'), params, cfg, overwrite=True,
                          extra={'source': 'jlearngene train', 'steps': int(config.steps), **final})
    return params, history
