"""Scratch, the protocol's baseline and its budget unit S: a learning-rate sweep on the first
seed, every seed at the chosen lr, trained until the plateau rule says it has converged."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jlearngene.experiments import harness
from jlearngene.experiments.results import shape_key, shape_text
from jlearngene.models import ViTConfig, init
from jlearngene.train import tasks


def plateau(curve: Sequence[tuple[int, float]], tol: float, patience: int) -> tuple[int, bool]:
    """(S, converged) of a run's curve [(step, accuracy)]: S is the first evaluation step
    within `tol` of the final accuracy; converged when the mean of the last `patience`
    evaluations is within `tol` of the mean of the `patience` before them."""
    final = curve[-1][1]
    s = next(step for step, acc in curve if acc >= final - tol)
    accs = [a for _, a in curve]
    if patience <= 0 or len(accs) < 2 * patience:
        return s, patience <= 0
    gain = np.mean(accs[-patience:]) - np.mean(accs[-2 * patience:-patience])
    return s, bool(gain < tol)


def baseline(ctx: harness.Context, cfgs: dict[tuple, ViTConfig], seeds: Sequence[int], *,
             dset: harness.Data | None = None, tag: str = 'scratch') -> dict:
    """Scratch at every shape of `cfgs` (on `dset`, default the descendants' data): the lr
    sweep on the first seed at `scratch.steps`, every seed at the chosen lr; a run at the
    chosen lr that the plateau rule flags as still rising is trained again from the start
    at twice the steps while that stays within `scratch.max_steps` (0: never retrained).
    Returns {shape: {'lr', 'sweep', 'runs': {seed: record}, 'S', 'acc', 'std', 'steps' (the
    longest run), 'converged', 'params' (per seed)}}."""
    return {shape: _shape_baseline(ctx, shape, cfg, seeds, dset, tag) for shape, cfg in cfgs.items()}


def _shape_baseline(ctx: harness.Context, shape, cfg: ViTConfig, seeds: Sequence[int],
                    dset: harness.Data | None, tag: str) -> dict:
    sc = ctx.config['scratch']
    lrs = tuple(float(x) for x in sc['lrs'])
    steps = ctx.steps(sc, 'scratch')
    longest = max(steps, int(harness.get(sc, 'max_steps', 0)))
    every = int(harness.get(sc, 'eval_every', 0)) or steps
    tol, patience = float(sc['plateau']), int(sc['patience'])
    loss, ev = tasks.classification_loss(cfg), harness.eval_fn(cfg)

    def train(lr, seed, n=steps):
        suffix = '' if n == steps else f'_n{n}'
        params, curve = ctx.fit(f'{tag}_{shape_key(shape)}_lr{lr:g}_s{seed}{suffix}', loss,
                                init(cfg, jax.random.key(seed)), ev, steps=n, lr=lr,
                                seed=seed, eval_every=every, dset=dset)
        # patience 0 (the paper configs): the paper's schedule is S
        s, ok = plateau(curve, tol, patience) if patience > 0 else (n, True)
        rec = dict(lr=lr, seed=seed, steps=n, curve=curve, acc=curve[-1][1],
                   plateau_step=s, converged=ok)
        ctx.say(f'{tag:<8} {shape_text(shape)} lr {lr:g} seed {seed}: {rec["acc"]:.4f}'
                f' after {n} steps (plateau at {rec["plateau_step"]}'
                f'{"" if ok else ", NOT converged"})')
        return params, rec

    def converged(lr, seed, run):
        while not run[1]['converged'] and 2 * run[1]['steps'] <= longest:
            run = train(lr, seed, 2 * run[1]['steps'])
        return run

    first = {lr: train(lr, seeds[0]) for lr in lrs}
    lr = max(lrs, key=lambda x: first[x][1]['acc'])
    runs = {seeds[0]: converged(lr, seeds[0], first[lr])}
    runs |= {s: converged(lr, s, train(lr, s)) for s in seeds[1:]}
    accs = [r['acc'] for _, r in runs.values()]
    return dict(lr=lr, sweep={f'{x:g}': first[x][1]['acc'] for x in lrs},
                runs={s: r for s, (_, r) in runs.items()},
                params={s: p for s, (p, _) in runs.items()},
                S=int(round(np.mean([r['plateau_step'] for _, r in runs.values()]))),
                acc=float(np.mean(accs)), std=float(np.std(accs)),
                steps=max(r['steps'] for _, r in runs.values()),
                converged=all(r['converged'] for _, r in runs.values()))
