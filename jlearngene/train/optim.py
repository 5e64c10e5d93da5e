"""Optimiser from config: AdamW + warmup-cosine, masked weight decay, clipping, freezing and
per-group learning-rate multipliers, all selected by path regex (`jlearngene.pytree` rules).

Config fields (a `ConfigDict` or a plain mapping; defaults in `DEFAULTS`):

    lr                 peak learning rate
    warmup_steps       linear warmup from `warmup_init * lr` to `lr`
    total_steps        length of the schedule (warmup included); the trainer's steps
    schedule           'cosine' (to `min_lr_ratio * lr`) or 'constant' (after warmup)
    weight_decay       decoupled AdamW decay, applied only to leaves matching `decay`
    decay              regexes of decayed leaves; default kernels only (timm: no decay on
                       biases, norms, position embedding, class/distillation tokens)
    b1, b2, eps        Adam moments
    clip_norm          global-norm gradient clipping over the trainable leaves (0 = off)
    freeze             regexes of leaves that never change (no optimiser state either)
    lr_mults           ((regex, multiplier), ...): first match wins, others get 1

The learning rate is injected (`optax.inject_hyperparams`) so `current_lr(opt_state)` can
log it without recomputing the schedule.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from jlearngene import pytree

DEFAULTS = dict(lr=1e-3, warmup_steps=0, total_steps=None, schedule='cosine', min_lr_ratio=0.0,
                warmup_init=0.0, weight_decay=0.05, decay=('kernel',), b1=0.9, b2=0.999, eps=1e-8,
                clip_norm=1.0, freeze=(), lr_mults=())


def _as_dict(config) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, 'to_dict'):
        config = config.to_dict()
    return dict(config)


def resolve(config, total_steps: int | None = None) -> dict[str, Any]:
    """Defaults filled in; unknown fields are an error naming them."""
    c = _as_dict(config)
    unknown = sorted(set(c) - set(DEFAULTS))
    if unknown:
        raise ValueError(f'optimizer config has unknown field(s) {unknown}; known: {sorted(DEFAULTS)}')
    out = {**DEFAULTS, **c}
    if out['total_steps'] is None:
        out['total_steps'] = total_steps
    if out['schedule'] not in ('cosine', 'constant'):
        raise ValueError(f"optimizer schedule must be 'cosine' or 'constant', got {out['schedule']!r}")
    if out['schedule'] == 'cosine' and not out['total_steps']:
        raise ValueError('optimizer: a cosine schedule needs total_steps')
    if out['total_steps'] and out['warmup_steps'] > out['total_steps']:
        raise ValueError(f"optimizer: warmup_steps={out['warmup_steps']} exceeds total_steps={out['total_steps']}")
    for pair in out['lr_mults']:
        if len(pair) != 2:
            raise ValueError(f'optimizer lr_mults entries must be (regex, multiplier), got {pair!r}')
    return out


def make_schedule(c: Mapping[str, Any]) -> optax.Schedule:
    lr, warm = float(c['lr']), int(c['warmup_steps'])
    if c['schedule'] == 'constant':
        if not warm:
            return optax.constant_schedule(lr)
        return optax.join_schedules(
            [optax.linear_schedule(lr * c['warmup_init'], lr, warm), optax.constant_schedule(lr)], [warm])
    return optax.warmup_cosine_decay_schedule(
        init_value=lr * c['warmup_init'], peak_value=lr, warmup_steps=warm,
        decay_steps=int(c['total_steps']), end_value=lr * c['min_lr_ratio'])


def scale_by_path(rules: Sequence[tuple[str, float]]) -> optax.GradientTransformation:
    """Multiply updates by the factor of the first regex matching each leaf's path."""
    def factor(path: str) -> float:
        for rx, mult in rules:
            if pytree.path_matches(rx, path):
                return float(mult)
        return 1.0

    def update(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(
            lambda p, u: u * jnp.asarray(factor(pytree.path_str(p)), u.dtype), updates), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def labels(params, freeze: Sequence[str]) -> Any:
    """'frozen' / 'train' per leaf."""
    if not freeze:
        return jax.tree.map(lambda _: 'train', params)
    return jax.tree.map(lambda f: 'frozen' if f else 'train', pytree.mask(params, tuple(freeze)))


def make_optimizer(config, params, *, total_steps: int | None = None) -> optax.GradientTransformation:
    """The optax transformation described by `config` for the tree `params`."""
    c = resolve(config, total_steps)
    lab = labels(params, c['freeze'])
    if c['freeze'] and 'train' not in jax.tree.leaves(lab):
        raise ValueError(f"optimizer: freeze={tuple(c['freeze'])} freezes every parameter")
    decay = tuple(c['decay'])
    train = [
        optax.inject_hyperparams(optax.adamw, static_args=('mask',))(
            learning_rate=make_schedule(c), b1=c['b1'], b2=c['b2'], eps=c['eps'],
            weight_decay=c['weight_decay'],
            mask=(lambda tree: pytree.mask(tree, decay)) if decay else (lambda tree: jax.tree.map(lambda _: False, tree))),
    ]
    if c['clip_norm']:
        train.insert(0, optax.clip_by_global_norm(c['clip_norm']))
    if c['lr_mults']:
        train.append(scale_by_path([tuple(p) for p in c['lr_mults']]))
    transforms = {'train': optax.chain(*train)}
    if c['freeze']:
        transforms['frozen'] = optax.set_to_zero()
    return optax.partition(transforms, lab)


def current_lr(opt_state) -> jax.Array | None:
    """The injected learning rate (None when the optimiser has none)."""
    kinds = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
    found = [s.hyperparams['learning_rate'] for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
             if isinstance(s, kinds) and 'learning_rate' in s.hyperparams]
    return found[0] if found else None
