"""Scratch, the protocol's baseline and its budget unit S, and every upstream model trained
to convergence (the teacher or ancestor, the source models, the small model to grow).

Three rules, each a pure function here so that it is tested on its own:

* **The sweep does not stop at an edge** (`sweep`): a learning-rate sweep whose choice is its
  smallest or largest value is extended that way, a grid step at a time (the ratio of the
  sweep's outer two values on that side), at most `EXTEND` times; the record lists each
  extension, and whether the choice still sits at the edge after them (`at_cap`).
* **Convergence by doubling** (`converged_at`): a run of n steps is converged when a run of
  2n steps (same setting and seed, its own full schedule) ends less than `scratch.plateau`
  (0.5 pt) higher on held-out accuracy; otherwise double again, up to `scratch.max_steps`.
  The last evaluations of one cosine run are always flat (its learning rate decays to zero
  there), so they cannot show convergence.
* **S is the plateau step** (`plateau`) of the converged run: its first evaluation within
  `scratch.plateau` of its final held-out accuracy; the unit of every budget fraction.

`baseline` puts them together (its docstring says in which order).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jlearngene.experiments import harness
from jlearngene.experiments.results import _mean_std, shape_key, shape_text
from jlearngene.models import ViTConfig, init
from jlearngene.train import tasks

EXTEND = 2   # grid steps a sweep is extended at most, past the edge its choice sits on


def plateau(curve: Sequence[tuple[int, float]], tol: float) -> int:
    """S of a run's curve [(step, accuracy)]: the first evaluation step within `tol` of the
    final accuracy."""
    final = curve[-1][1]
    return next(step for step, acc in curve if acc >= final - tol)


def converged_at(chain: Sequence[tuple[int, float]], tol: float) -> int | None:
    """The steps n of the first run in a doubling chain [(steps, final held-out accuracy)]
    (steps n, 2n, 4n, ... in order) whose 2n run ends less than `tol` higher; None where no
    run of the chain has its 2n run yet, or every one was beaten by more than `tol`."""
    for (n, a), (m, b) in zip(chain, chain[1:]):
        if m != 2 * n:
            raise ValueError(f'a doubling chain goes n, 2n, 4n, ...; got {n} then {m} steps')
        if b - a < tol:
            return n
    return None


def _round(x: float) -> float:
    return float(f'{x:.3g}')


def grid_steps(values: Sequence[float]) -> tuple[float, float]:
    """(low, high): the ratio between a sweep's two smallest values and between its two
    largest (3e-4 / 1e-3 / 3e-3: (3.33, 3)); a sweep of one value has no grid step (1, 1)."""
    v = sorted(float(x) for x in values)
    if len(v) < 2:
        return 1.0, 1.0
    return v[1] / v[0], v[-1] / v[-2]


@dataclasses.dataclass
class Sweep:
    """A finished sweep: its `choice`, the `scores` of every value tried, the `extensions`
    past an edge ([{'value', 'side': 'low' | 'high', 'score'}], in order) and `at_cap`: the
    choice is still the smallest or largest value after `EXTEND` extensions."""
    choice: float
    scores: dict[float, float]
    extensions: list[dict]
    at_cap: bool

    def to_json(self) -> dict:
        """The sweep as a results record: its fields, the scores keyed by each value as text
        (`f'{value:g}'`)."""
        return dict(choice=self.choice, scores={f'{v:g}': s for v, s in self.scores.items()},
                    extensions=self.extensions, at_cap=self.at_cap)


def sweep(values: Sequence[float], score: Callable[[float], float], *, extend: int = EXTEND) -> Sweep:
    """Score every value (`score(value)`, higher is better; ties go to the smaller value);
    while the best is the smallest or the largest value tried, and fewer than `extend`
    extensions were made, score one grid step (`grid_steps`) beyond it, rounded to 3
    significant digits. A sweep of one value is never extended: it has no grid step."""
    low, high = grid_steps(values)
    scores = {float(v): float(score(float(v))) for v in sorted(values)}
    extensions: list[dict] = []

    def best() -> float:
        return max(sorted(scores), key=lambda v: scores[v])

    def edge(v: float) -> str | None:
        if len(scores) < 2:
            return None
        return 'low' if v == min(scores) else 'high' if v == max(scores) else None

    while len(extensions) < extend and (side := edge(best())) is not None and len(values) > 1:
        new = _round(min(scores) / low if side == 'low' else max(scores) * high)
        if new in scores:       # rounding collapsed the step: nothing new to try
            break
        scores[new] = float(score(new))
        extensions.append(dict(value=new, side=side, score=scores[new]))
    choice = best()
    return Sweep(choice, dict(sorted(scores.items())), extensions, edge(choice) is not None and len(values) > 1)


# ctx.memo's key for the upstream models a study trained to convergence besides the teacher
# ('source w32_d4', 'small w16_d3': their baselines), which its record keeps as
# `upstream_models`.
UPSTREAM_MODELS = 'upstream models'


def baseline(ctx: harness.Context, cfgs: dict[tuple, ViTConfig], seeds: Sequence[int], *,
             dset: harness.Data | None = None, tag: str = 'scratch', steps: int | None = None) -> dict:
    """Scratch (or an upstream model trained to convergence) at every shape of `cfgs`, on
    `dset` (default the descendants' data), in this order:

    1. The sweep of `scratch.lrs` (× `scratch.weight_decays` on data with validation images)
       on the first seed at `steps` (default `scratch.steps`), extended past an edge
       (`sweep`); a learning rate scores its best weight decay.
    2. Convergence by doubling (`converged_at`) of the chosen setting on the first seed, up
       to `scratch.max_steps` (the cap; 0: never doubled, so never converged).
    3. Where that converged run is longer than the sweep's, the sweep is read again at its
       length, around the chosen learning rate (one grid step each way, extended past an
       edge): a choice made on a run a fraction of the converged length favours large
       learning rates. A new choice is doubled in turn.
    4. Every other seed at the chosen setting, doubled from the longest steps any seed needed
       so far; every seed ends at the same steps, the most any seed needed (so that the
       seeds differ in initialisation and data order only), each counted converged where
       its own chain converged at or before them.

    Held-out accuracy is the validation accuracy on data with validation images (a transfer
    study's downstream task), else the test accuracy (the source task, the digits studies):
    it makes every choice and the doubling test, and S is read on it; the record keeps the
    final test accuracy (`acc`) and, with validation, the test accuracy at the best
    validation step (`acc_at_best_val`). A config with `scratch.patience` = 0 (the paper
    configs) follows the paper's schedule: one run per seed at `steps`, which is S.

    Returns {shape: {'lr', ['weight_decay'], 'sweep' ({setting: held-out score} at the
    sweep's steps), 'sweeps' (each sweep's steps, scores, extensions, at_cap), 'runs'
    ({seed: record}, each with its `doubling` chain [[steps, held-out, test]] and
    `converged_at`), 'S', 'acc', 'std' (ddof 1), 'accs' and 'doubling' (per seed), 'steps',
    'converged', 'params' (per seed)}}. A tag other than 'ancestor' and 'scratch...' (the
    ceiling's source models, the small model) is also kept in `ctx.memo[UPSTREAM_MODELS]`,
    for the record's `upstream_models`."""
    out = {shape: _Baseline(ctx, shape, cfg, dset, tag, steps).run(list(seeds)) for shape, cfg in cfgs.items()}
    if tag != 'ancestor' and not tag.startswith('scratch'):     # those have their own record fields
        ctx.memo.setdefault(UPSTREAM_MODELS, {}).update({f'{tag} {shape_key(shape)}': b for shape, b in out.items()})
    return out



class _Baseline:
    """One shape's baseline (`baseline`): the runs it trained, memoised by (setting, seed,
    steps), so the sweeps and the doubling chains share them."""

    def __init__(self, ctx, shape, cfg: ViTConfig, dset, tag: str, steps: int | None):
        sc = ctx.config['scratch']
        self.ctx, self.shape, self.cfg, self.dset, self.tag = ctx, shape, cfg, dset, tag
        self.validation = bool(getattr(dset if dset is not None else ctx.dset, 'has_validation', False))
        self.lrs = tuple(float(x) for x in sc['lrs'])
        # the weight-decay sweep is a downstream (validation) choice; a source task keeps optim's
        wds = tuple(float(x) for x in harness.get(sc, 'weight_decays', ()) or ()) if self.validation else ()
        self.wds = wds or (None,)
        self.n0 = steps or ctx.steps(sc, 'scratch')
        self.cap = max(self.n0, int(harness.get(sc, 'max_steps', 0)))
        self.every0 = int(harness.get(sc, 'eval_every', 0)) or self.n0
        self.evals = int(harness.get(sc, 'evals', 0) or 0)     # > 0: evaluations a run, any length
        self.tol = float(sc['plateau'])
        self.paper = int(sc['patience']) <= 0
        self.loss, self.ev = tasks.classification_loss(cfg), harness.eval_fn(cfg)
        self.runs: dict[tuple, tuple] = {}

    # -- runs -------------------------------------------------------------------------------
    def train(self, setting, seed: int, n: int):
        """(params, record) of one run, trained once (memoised)."""
        if (setting, seed, n) in self.runs:
            return self.runs[setting, seed, n]
        ctx, (lr, wd) = self.ctx, setting
        suffix = ('' if wd is None else f'_wd{wd:g}') + ('' if n == self.n0 else f'_n{n}')
        name = f'{self.tag}_{shape_key(self.shape)}_lr{lr:g}_s{seed}{suffix}'
        optim = dict(harness.plain(ctx.config['optim']))
        if wd is not None:
            optim['weight_decay'] = wd
        # the same number of evaluations at every length (S is read on them): `evals`, else
        # as many as `eval_every` gives the sweep's steps
        every = max(1, n // self.evals if self.evals else self.every0 * n // self.n0)
        # what the run depends on beyond its data, settings and initial params: the model
        # and the batch; not the study, so another study asking for it reuses it (the store)
        identity = dict(model=self.cfg.to_dict(), batch_size=ctx.config['batch_size'],
                        eval_batch_size=ctx.config['eval_batch_size'])
        params, curve = ctx.fit(name, self.loss, init(self.cfg, jax.random.key(seed)), self.ev, steps=n,
                                lr=lr, seed=seed, eval_every=every, dset=self.dset, optim=optim,
                                identity=identity)
        held = ctx.val_curves[name] if self.validation else curve
        rec = dict(lr=lr, seed=seed, steps=n, curve=curve, acc=curve[-1][1], heldout=held[-1][1],
                   plateau_step=n if self.paper else plateau(held, self.tol))
        if wd is not None:
            rec['weight_decay'] = wd
        if self.validation:
            best = max(range(len(held)), key=lambda i: held[i][1])
            rec.update(val_curve=held, val=held[-1][1], acc_at_best_val=curve[best][1])
        wd_text = '' if wd is None else f' wd {wd:g}'
        val_text = f" (validation {rec['val']:.4f})" if self.validation else ''
        ctx.say(f'{self.tag:<8} {shape_text(self.shape)} lr {lr:g}{wd_text} seed {seed}: {rec["acc"]:.4f}'
                f'{val_text} after {n} steps')
        self.runs[setting, seed, n] = params, rec
        return params, rec

    def held(self, setting, seed: int, n: int) -> float:
        return self.train(setting, seed, n)[1]['heldout']

    def best_setting(self, lr: float, seed: int, n: int):
        return max(((lr, wd) for wd in self.wds), key=lambda s: self.held(s, seed, n))

    def sweep(self, lrs, seed: int, n: int) -> Sweep:
        return sweep(lrs, lambda lr: self.held(self.best_setting(lr, seed, n), seed, n),
                     extend=0 if self.paper else EXTEND)

    def chain(self, setting, seed: int, start: int) -> tuple[int | None, int]:
        """(converged n or None, the longest steps trained) of the doubling chain from
        `start`: double while no run of the chain is converged and 2n is within the cap."""
        steps = [start]
        while True:
            n = converged_at([(m, self.held(setting, seed, m)) for m in steps], self.tol)
            if n is not None:
                return n, steps[-1]
            if 2 * steps[-1] > self.cap:
                return None, steps[-1]
            steps.append(2 * steps[-1])

    # -- the protocol -----------------------------------------------------------------------
    def run(self, seeds: list[int]) -> dict:
        first, n0 = seeds[0], self.n0
        sweeps = [(self.sweep(self.lrs, first, n0), n0)]
        chosen = self.best_setting(sweeps[0][0].choice, first, n0)
        converged = {}
        if self.paper:
            n_star = n0
            converged = {s: n0 for s in seeds}
        else:
            converged[first], longest = self.chain(chosen, first, n0)
            n_star = converged[first] or longest
            if n_star > n0 and len(self.lrs) > 1:      # 3. the sweep read at the converged length
                low, high = grid_steps(self.lrs)
                lr = chosen[0]
                again = self.sweep(sorted({_round(lr / low), lr, _round(lr * high)}), first, n_star)
                sweeps.append((again, n_star))
                new = self.best_setting(again.choice, first, n_star)
                if new != chosen:
                    chosen = new
                    converged[first], longest = self.chain(chosen, first, n_star)
                    n_star = converged[first] or longest
            for s in seeds[1:]:
                converged[s], longest = self.chain(chosen, s, n_star)
                n_star = max(n_star, converged[s] or longest)
        runs = {s: self.train(chosen, s, n_star) for s in seeds}
        for s, (_, rec) in runs.items():
            mine = sorted(n for (setting, seed, n) in self.runs if setting == chosen and seed == s)
            rec.update(converged=converged[s] is not None and converged[s] <= n_star,
                       converged_at=converged[s],
                       doubling=[[n, self.runs[chosen, s, n][1]['heldout'], self.runs[chosen, s, n][1]['acc']]
                                 for n in mine])
            if not rec['converged']:
                self.ctx.say(f'{self.tag:<8} {shape_text(self.shape)} seed {s}: NOT converged within '
                             f'{self.cap} steps (scratch.max_steps)')
        accs = [r['acc'] for _, r in runs.values()]
        out = dict(lr=chosen[0],
                   sweep={_setting_key((lr, wd)): self.held((lr, wd), first, n0)
                          for lr in sweeps[0][0].scores for wd in self.wds},
                   sweeps=[dict(s.to_json(), steps=n) for s, n in sweeps],
                   runs={s: r for s, (_, r) in runs.items()},
                   params={s: p for s, (p, _) in runs.items()},
                   S=int(round(np.mean([r['plateau_step'] for _, r in runs.values()]))),
                   acc=float(np.mean(accs)), std=_mean_std(accs)[1], steps=n_star,
                   accs={s: r['acc'] for s, (_, r) in runs.items()},
                   doubling={s: r['doubling'] for s, (_, r) in runs.items()},
                   converged=all(r['converged'] for _, r in runs.values()))
        if chosen[1] is not None:
            out['weight_decay'] = chosen[1]
        if self.validation:
            out['chosen_on'] = 'validation'
            out['acc_at_best_val'] = float(np.mean([r['acc_at_best_val'] for _, r in runs.values()]))
        return out


def _setting_key(setting) -> str:
    lr, wd = setting
    return f'{lr:g}' if wd is None else f'lr {lr:g} wd {wd:g}'
