"""Scratch, the protocol's baseline and its budget unit S: a learning-rate sweep on the first
seed, every seed at the chosen lr, trained until the plateau rule says it has converged."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jlearngene.experiments import harness
from jlearngene.experiments.results import _mean_std, shape_key, shape_text
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
             dset: harness.Data | None = None, tag: str = 'scratch', steps: int | None = None) -> dict:
    """Scratch at every shape of `cfgs` (on `dset`, default the descendants' data): the
    sweep of `scratch.lrs` (× `scratch.weight_decays` on data with validation images) on the first seed at
    `steps` (default `scratch.steps`), every seed at the chosen setting; a run at it that
    the plateau rule flags as still rising is trained again from the start at twice the
    steps while that stays within `scratch.max_steps` (0: never retrained), and every seed
    ends at the same steps, the most any seed needed.

    On data with validation images (a transfer study's downstream task) the setting is
    chosen, and the plateau read, on the validation accuracy; the record keeps the final
    test accuracy (`acc`) and the test accuracy at the best validation step
    (`acc_at_best_val`). Otherwise both read the test accuracy, as the digits studies do.
    Returns {shape: {'lr', 'weight_decay', 'sweep', 'runs': {seed: record}, 'S', 'acc',
    'std' (ddof 1), 'steps' (the longest run), 'converged', 'params' (per seed)}}."""
    return {shape: _shape_baseline(ctx, shape, cfg, seeds, dset, tag, steps)
            for shape, cfg in cfgs.items()}


def _shape_baseline(ctx: harness.Context, shape, cfg: ViTConfig, seeds: Sequence[int],
                    dset: harness.Data | None, tag: str, steps: int | None) -> dict:
    sc = ctx.config['scratch']
    validation = bool(getattr(dset if dset is not None else ctx.dset, 'has_validation', False))
    lrs = tuple(float(x) for x in sc['lrs'])
    # the weight-decay sweep is a downstream (validation) choice; a source task keeps optim's
    wds = tuple(float(x) for x in harness.get(sc, 'weight_decays', ()) or ()) if validation else ()
    settings = [(lr, wd) for lr in lrs for wd in (wds or (None,))]
    steps = steps or ctx.steps(sc, 'scratch')
    longest = max(steps, int(harness.get(sc, 'max_steps', 0)))
    every = int(harness.get(sc, 'eval_every', 0)) or steps
    tol, patience = float(sc['plateau']), int(sc['patience'])
    loss, ev = tasks.classification_loss(cfg), harness.eval_fn(cfg)

    def train(setting, seed, n=steps):
        lr, wd = setting
        suffix = ('' if wd is None else f'_wd{wd:g}') + ('' if n == steps else f'_n{n}')
        name = f'{tag}_{shape_key(shape)}_lr{lr:g}_s{seed}{suffix}'
        optim = {} if wd is None else {'optim': dict(harness.plain(ctx.config['optim']), weight_decay=wd)}
        params, curve = ctx.fit(name, loss, init(cfg, jax.random.key(seed)), ev, steps=n, lr=lr,
                                seed=seed, eval_every=every, dset=dset, **optim)
        chosen_on = ctx.val_curves[name] if validation else curve
        # patience 0 (the paper configs): the paper's schedule is S
        s, ok = plateau(chosen_on, tol, patience) if patience > 0 else (n, True)
        rec = dict(lr=lr, seed=seed, steps=n, curve=curve, acc=curve[-1][1],
                   plateau_step=s, converged=ok)
        if wd is not None:
            rec['weight_decay'] = wd
        if validation:
            best = max(range(len(chosen_on)), key=lambda i: chosen_on[i][1])
            rec.update(val_curve=chosen_on, val=chosen_on[-1][1], acc_at_best_val=curve[best][1])
        wd_text = '' if wd is None else f' wd {wd:g}'
        val_text = f" (validation {rec['val']:.4f})" if validation else ''
        ctx.say(f'{tag:<8} {shape_text(shape)} lr {lr:g}{wd_text} seed {seed}: {rec["acc"]:.4f}{val_text}'
                f' after {n} steps (plateau at {rec["plateau_step"]}{"" if ok else ", NOT converged"})')
        return params, rec

    def converged(setting, seed, run):
        while not run[1]['converged'] and 2 * run[1]['steps'] <= longest:
            run = train(setting, seed, 2 * run[1]['steps'])
        return run

    def score(rec):
        return rec['val'] if validation else rec['acc']

    first = {x: train(x, seeds[0]) for x in settings}
    chosen = max(settings, key=lambda x: score(first[x][1]))
    # one schedule for every seed: each starts at the longest any seed before it needed, and
    # a seed that converged sooner trains again at the longest, so that the seeds differ in
    # initialisation and data order only (a seed flat at the end of a short cosine run is
    # not past the plateau of a longer one)
    runs, longest_run = {}, steps
    for s in seeds:
        runs[s] = converged(chosen, s, first[chosen] if s == seeds[0] else train(chosen, s, longest_run))
        longest_run = max(longest_run, runs[s][1]['steps'])
    runs = {s: run if run[1]['steps'] == longest_run else train(chosen, s, longest_run)
            for s, run in runs.items()}
    accs = [r['acc'] for _, r in runs.values()]
    out = dict(lr=chosen[0], sweep={_setting_key(x): score(first[x][1]) for x in settings},
               runs={s: r for s, (_, r) in runs.items()},
               params={s: p for s, (p, _) in runs.items()},
               S=int(round(np.mean([r['plateau_step'] for _, r in runs.values()]))),
               acc=float(np.mean(accs)), std=_mean_std(accs)[1],
               steps=max(r['steps'] for _, r in runs.values()),
               converged=all(r['converged'] for _, r in runs.values()))
    if chosen[1] is not None:
        out['weight_decay'] = chosen[1]
    if validation:
        out['chosen_on'] = 'validation'
        out['acc_at_best_val'] = float(np.mean([r['acc_at_best_val'] for _, r in runs.values()]))
    return out


def _setting_key(setting) -> str:
    lr, wd = setting
    return f'{lr:g}' if wd is None else f'lr {lr:g} wd {wd:g}'

