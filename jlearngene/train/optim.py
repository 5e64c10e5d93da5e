"""Optimiser from config: AdamW + warmup-cosine, masked weight decay, clipping, freezing and
per-group learning-rate multipliers, all selected by path regex (`jlearngene.pytree` rules).

Config fields (a `ConfigDict` or a plain mapping; defaults in `DEFAULTS`)::

    lr                 peak learning rate
    warmup_steps       linear warmup from `warmup_init * lr` to `lr`
    total_steps        length of the schedule (warmup included); the trainer's steps
    schedule           'cosine' (to `min_lr_ratio * lr`) or 'constant' (after warmup)
    weight_decay       decoupled AdamW decay, applied only to leaves matching `decay`
    decay              regexes of decayed leaves (a list or tuple of strings); default kernels
                       only (timm: no decay on biases, norms, position embedding, class/
                       distillation tokens)
    b1, b2, eps        Adam moments
    clip_norm          global-norm gradient clipping over the trainable leaves (0 = off)
    freeze             regexes of leaves that never change (no optimiser state either; a list
                       or tuple of strings, as `decay`)
    lr_mults           ((regex, multiplier), ...): first match wins, others get 1; each
                       multiplier a finite number >= 0

`resolve` checks every value (a zero or negative learning rate, a negative warmup, ...,
is a ValueError naming the field); a warmup longer than the run is clipped to the run,
with a warning, so a short run (`--config.steps=20`) needs no second override.

The learning rate is injected (`optax.inject_hyperparams`) so `current_lr(opt_state)` can
log it without recomputing the schedule.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from jlearngene import pytree

log = logging.getLogger(__name__)

DEFAULTS = dict(lr=1e-3, warmup_steps=0, total_steps=None, schedule='cosine', min_lr_ratio=0.0,
                warmup_init=0.0, weight_decay=0.05, decay=('kernel',), b1=0.9, b2=0.999, eps=1e-8,
                clip_norm=1.0, freeze=(), lr_mults=())


def _as_dict(config) -> dict[str, Any]:
    if config is None:
        return {}
    return dict(config.to_dict() if hasattr(config, 'to_dict') else config)


def check(config) -> dict[str, Any]:
    """`config` with the defaults filled in, after checking that every field is known and
    every value can train; the run length is not needed.

    Args:
        config: the optimiser config, a `ConfigDict`, a mapping or `None` (all defaults).

    Returns:
        A new dict of every field of `DEFAULTS`, the config's values over the defaults.

    Raises:
        ValueError: a field is unknown, or a value cannot train or has the wrong type (e.g.
          `freeze` or `decay` a single string, an `lr_mults` entry that is not a (regex,
          finite multiplier >= 0) pair); the message names the field.
    """
    c = _as_dict(config)
    unknown = sorted(set(c) - set(DEFAULTS))
    if unknown:
        raise ValueError(f'optimizer config has unknown field(s) {unknown}; known: {sorted(DEFAULTS)}')
    out = {**DEFAULTS, **c}
    _check_values(out)
    return out


def resolve(config, total_steps: int | None = None, *, warn: bool = True) -> dict[str, Any]:
    """Defaults filled in and checked (`check`); a warmup longer than the run is clipped to it.

    A cosine schedule keeps at least one step after the warmup, so its warmup is clipped to
    `total_steps - 1`.

    Args:
        config: the optimiser config, a `ConfigDict`, a mapping or `None`.
        total_steps: the run's steps, used where the config's own `total_steps` is `None`.
        warn: log a warning when the warmup is clipped.

    Returns:
        The resolved config, a dict of every field of `DEFAULTS`, with `total_steps` set and
        `warmup_steps` clipped.

    Raises:
        ValueError: a field is unknown or a value cannot train (as in `check`, including a
          non-positive `total_steps`), or the schedule is 'cosine' without `total_steps`.
    """
    out = check(config)
    if out['total_steps'] is None:
        out['total_steps'] = total_steps
        _check_values(out)
    if out['schedule'] == 'cosine' and not out['total_steps']:
        raise ValueError('optimizer: a cosine schedule needs total_steps')
    total, warm = out['total_steps'], out['warmup_steps']
    # A cosine schedule needs at least one step after the warmup.
    longest = None if not total else total - 1 if out['schedule'] == 'cosine' else total
    if longest is not None and warm > longest:
        if warn:
            log.warning('optimizer: warmup_steps=%d is longer than the run of %d steps; warming '
                        'up over %d steps instead (set optim.warmup_steps to choose)', warm, total,
                        longest)
        out['warmup_steps'] = longest
    return out


def _number(c: Mapping[str, Any], name: str, ok, requirement: str, *, integer: bool = False) -> None:
    v = c[name]
    kind = int if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kind) or not math.isfinite(v) or not ok(v):
        raise ValueError(f'optimizer: {name} must be {requirement}, got {v!r}')


def _check_values(c: Mapping[str, Any]) -> None:
    """ValueError naming the first field whose value cannot train."""
    _number(c, 'lr', lambda v: v > 0, 'a positive number')
    _number(c, 'warmup_steps', lambda v: v >= 0, 'a non-negative integer', integer=True)
    if c['total_steps'] is not None:
        _number(c, 'total_steps', lambda v: v > 0,
                "a positive integer (the run's steps)", integer=True)
    for name in ('min_lr_ratio', 'warmup_init'):
        _number(c, name, lambda v: 0 <= v <= 1, 'a fraction of lr in [0, 1]')
    for name in ('b1', 'b2'):
        _number(c, name, lambda v: 0 <= v < 1, 'in [0, 1)')
    _number(c, 'eps', lambda v: v > 0, 'a positive number')
    for name in ('weight_decay', 'clip_norm'):
        _number(c, name, lambda v: v >= 0, 'a non-negative number (0 = off)')
    if c['schedule'] not in ('cosine', 'constant'):
        raise ValueError(f"optimizer schedule must be 'cosine' or 'constant', got {c['schedule']!r}")
    for name in ('freeze', 'decay'):
        v = c[name]
        if not isinstance(v, (list, tuple)) or not all(isinstance(rx, str) for rx in v):
            raise ValueError(f'optimizer: {name} must be a list or tuple of regex strings, got {v!r}'
                             + (f' (one regex: write ({v!r},))' if isinstance(v, str) else ''))
    if not isinstance(c['lr_mults'], (list, tuple)):
        raise ValueError(f"optimizer: lr_mults must be a list or tuple of (regex, multiplier) pairs, "
                         f"got {c['lr_mults']!r}")
    for pair in c['lr_mults']:
        if not _mult_pair(pair):
            raise ValueError('optimizer lr_mults entries must be (regex, multiplier) with a regex string '
                             f'and a finite multiplier >= 0, got {pair!r}')


def _mult_pair(pair) -> bool:
    """Whether an `lr_mults` entry is a (regex string, finite non-negative number) pair."""
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return False
    rx, mult = pair
    return (isinstance(rx, str) and isinstance(mult, (int, float)) and not isinstance(mult, bool)
            and math.isfinite(mult) and mult >= 0)


def make_schedule(c: Mapping[str, Any]) -> optax.Schedule:
    """The learning-rate schedule of a resolved optimiser config.

    Linear warmup from `warmup_init · lr` over `warmup_steps`, then 'cosine' (to
    `min_lr_ratio · lr` at `total_steps`) or 'constant'.

    Args:
        c: a resolved optimiser config (`resolve`); a cosine schedule needs `total_steps`.

    Returns:
        The `optax.Schedule`, a function of the step count.
    """
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
    """Multiply updates by the factor of the first regex matching each leaf's path.

    Args:
        rules: (regex, multiplier) pairs, matched as `jlearngene.pytree.path_matches` does;
          leaves no rule matches keep a factor of 1.

    Returns:
        A stateless `optax.GradientTransformation`.
    """
    def factor(path: str) -> float:
        return next((float(mult) for rx, mult in rules if pytree.path_matches(rx, path)), 1.0)

    def update(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(
            lambda p, u: u * jnp.asarray(factor(pytree.path_str(p)), u.dtype), updates), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def labels(params, freeze: Sequence[str]) -> Any:
    """'frozen' / 'train' per leaf, the labels of `optax.partition`.

    Args:
        params: the parameter tree.
        freeze: regexes of the frozen leaves (`jlearngene.pytree.path_matches`).

    Returns:
        A tree of `params`' structure with 'frozen' where a path matches and 'train' elsewhere.
    """
    return jax.tree.map(lambda f: 'frozen' if f else 'train', pytree.mask(params, tuple(freeze)))


def make_optimizer(config, params, *, total_steps: int | None = None) -> optax.GradientTransformation:
    """The optax transformation described by `config` for the tree `params`.

    Trainable leaves get global-norm clipping (when `clip_norm` > 0), AdamW with the injected
    schedule and decay masked to `decay`, then the `lr_mults` factors; frozen leaves get zero
    updates and no optimiser state.

    Args:
        config: the optimiser config, a `ConfigDict`, a mapping or `None` (see the module
          docstring).
        params: the parameter tree (arrays or shapes); its paths select frozen and decayed
          leaves.
        total_steps: the run's steps, used where the config's own `total_steps` is `None`.

    Returns:
        The `optax.GradientTransformation` (an `optax.partition` over 'train' and 'frozen').

    Raises:
        ValueError: the config does not resolve (`resolve`), or `freeze` freezes every
          parameter.
    """
    c = resolve(config, total_steps)
    lab = labels(params, c['freeze'])
    if c['freeze'] and 'train' not in jax.tree.leaves(lab):
        raise ValueError(f"optimizer: freeze={tuple(c['freeze'])} freezes every parameter")
    decay = tuple(c['decay'])
    train = [optax.clip_by_global_norm(c['clip_norm'])] if c['clip_norm'] else []
    train.append(optax.inject_hyperparams(optax.adamw, static_args=('mask',))(
        learning_rate=make_schedule(c), b1=c['b1'], b2=c['b2'], eps=c['eps'],
        weight_decay=c['weight_decay'], mask=lambda tree: pytree.mask(tree, decay)))
    if c['lr_mults']:
        train.append(scale_by_path([tuple(p) for p in c['lr_mults']]))
    transforms = {'train': optax.chain(*train)}
    if c['freeze']:
        transforms['frozen'] = optax.set_to_zero()
    return optax.partition(transforms, lab)


def cache_key(config, params, *, total_steps: int | None = None) -> tuple:
    """A hashable name of `make_optimizer(config, params, total_steps=...)`'s transformation.

    Equal for equal resolved configs on trees of one structure and frozen set, so it can go
    into the trainer's `FitConfig.compile_key` (runs of equal keys share a compiled step).

    Args:
        config: the optimiser config, as for `make_optimizer`.
        params: the parameter tree.
        total_steps: the run's steps, as for `make_optimizer`.

    Returns:
        A tuple ('optimizer', the resolved config as sorted JSON, the labels' tree structure,
        the labels' leaves).

    Raises:
        ValueError: the config does not resolve (`resolve`).
    """
    c = resolve(config, total_steps, warn=False)
    lab = labels(params, c['freeze'])
    return ('optimizer', json.dumps(c, sort_keys=True), jax.tree.structure(lab),
            tuple(jax.tree.leaves(lab)))


def current_lr(opt_state) -> jax.Array | None:
    """The injected learning rate.

    Args:
        opt_state: the optimiser state of a `make_optimizer` transformation (or any state
          holding `optax.inject_hyperparams` states).

    Returns:
        The first injected 'learning_rate' found (a scalar array), or `None` when the
        state has none.
    """
    kinds = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
    found = [s.hyperparams['learning_rate'] for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
             if isinstance(s, kinds) and 'learning_rate' in s.hyperparams]
    return found[0] if found else None
