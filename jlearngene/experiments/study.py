"""The study harness: every learngene study runs here, under the fair protocol.

A study is data: its config names the reference shape (`model` at `depth`: the teacher or
ancestor, the Aux-Nets, Scala's slimmable network), the descendant `shapes`, the `methods`
(with `variants`, e.g. LeTra's selection strategies) and each upstream stage's budget as a
fraction of Scratch's converged budget S. The experiment module adds at most one small
function (`Study.descendant_config`) and the study's paper claims (`Study.claims`), which
the harness turns into verdict lines. The protocol (`../shared/specs/fair_studies.md`):

1. **Scratch first** (`scratch_baseline`), for every descendant shape and the reference
   shape: a learning-rate sweep (`scratch.lrs`, at least three values; the chosen lr is the
   best final test accuracy on the first seed), every seed at the chosen lr for
   `scratch.steps` (or `epochs`), evaluated every `scratch.eval_every` steps. S is the plateau
   step: the first evaluation within `scratch.plateau` (0.5 pt) of the run's final accuracy;
   the run counts as converged when the mean of its last `scratch.patience` evaluations is
   within `scratch.plateau` of the mean of the `patience` before them. The target for every
   method is Scratch's mean final accuracy minus `target_gap` (0.5 pt). Only the paper
   configs (scale 'paper') may give a single lr: there Scratch follows the paper's schedule
   and S is that schedule.
2. **Upstream, per seed** (`upstream`): the teacher is the reference shape's Scratch run of
   that seed; Aux-Net genes by soft distillation (`aux.fraction` · S_ref, or a method's own
   `aux.fractions.<method>`); one slimmable network per Scala / US-Net row (`slim`);
   Cluster-Learngene's attention-distance pass; the small model the growth methods grow (the
   converged Scratch run of its shape with `small.converged`, else `small.fraction` · S_ref);
   each counted in training FLOPs.
3. **Descendants, per seed**: every (row, shape) the plan allows (`plan`, shapes only),
   initialised by the method, evaluated, fine-tuned for each of `descend.fractions` · S_shape
   steps (0: the initialisation alone) at `descend.lr`, stopping at the target with
   `descend.stop_at_target`; Mango and LiGO first train an operator per shape
   (`operator.fraction` · S_shape, a per-descendant cost); a 'separate' row trains a fresh
   network for the slimmable network's steps or FLOPs, at the lr Scratch's sweep chose for
   its width (it is Scratch on another budget, not a fine-tune).
4. **Reporting** (`finish`, `report`): per row mean ± std over seeds, FLOPs until the target
   is first reached (linear between evaluations), upstream FLOPs with and without the
   pretrained source (the teacher, the small model), the amortised cost per descendant for
   N = `amortise`, the break-even N, the claims' verdicts (a difference counts only beyond
   twice the seeds' spread); `results.json` (one record per run, written first),
   `results.md`, `accuracy_vs_flops.png`. `render(workdir)` redoes step 4 from results.json.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jlearngene import compiler, costs, genes
from jlearngene.experiments import harness, report
from jlearngene.experiments.report import shape_key, shape_text
from jlearngene.genes import cluster, growth, letra, mango, scala
from jlearngene.models import ViTConfig, init, vit
from jlearngene.train import checkpoint, tasks

Config = Any

TEACHER_GENES = ('cluster', 'he_lg', 'auto_lg', 'pre_fin', 'imwlm')   # gene from the teacher
DISTILLED = ('tleg', 'share_init', 'mini_init', 'letra')             # gene through an Aux-Net
GROWN = ('net2net', 'stackbert', 'bert2bert')                         # the small model, one shot
OPERATORS = ('mango', 'ligo')                                         # an operator per shape
SLIMMABLE = ('scala', 'us_net')                                       # one slimmable network
KNOWN = DISTILLED + SLIMMABLE + TEACHER_GENES + GROWN + OPERATORS + ('separate',)
# descend options every run of a method gets: a gene's head is inherited on the same task,
# except He-LG's and Auto-LG's (their learngene is the layers: the papers draw a new head)
DESCEND = {'he_lg': {'head': 'new'}, 'auto_lg': {'head': 'new'}}
MIN_SWEEP = 3   # learning rates Scratch's sweep needs outside the paper configs
# the pretrained source a method starts from: the papers leave its training out of their
# counts, so every cost is reported both without and with it
PRETRAINED = ('teacher', 'small')


# ----------------------------------------------------------------------------------------
# What a study module declares.

@dataclasses.dataclass(frozen=True)
class Claim:
    """One paper claim as a test on the rows.

    kind 'reaches': `method` at `fraction` reaches the target (Scratch's converged mean − 0.5
      pt) at every shape; with `flops_ratio`, also with at most that fraction of Scratch's
      total training FLOPs (the sum over shapes of S·step; the method's upstream without the
      teacher, as the papers count, plus its descendants' own FLOPs).
    kind 'beats': `method` at `fraction` above `other` (at `other_fraction`, default the same)
      at every shape, beyond twice the larger seed spread.
    kind 'close': `method` at `fraction` no more than `tolerance` below `other` at every shape
      (mean against mean; the spreads are reported).
    kind 'cheaper': `method` at `fraction` reaches the target with fewer training FLOPs than
      `other` (default Scratch's converged runs) at every shape: per seed, its own FLOPs to
      the target plus its upstream without the pretrained source; beyond twice the larger
      seed spread, and with `flops_ratio` at most that fraction of the other's mean.
    `shapes` limits a claim to those shapes ((width, depth) or (width, depth, heads); default:
    every shape).
    """
    text: str
    kind: str
    method: str
    fraction: float
    other: str = ''
    other_fraction: float | None = None
    flops_ratio: float | None = None
    tolerance: float = 0.01
    shapes: tuple[tuple[int, ...], ...] | None = None


def _same(cfg: ViTConfig, config: Config) -> ViTConfig:
    return cfg


@dataclasses.dataclass(frozen=True)
class Study:
    """A study's own part: `descendant_config(cfg, config)` adjusts every descendant config
    (Scratch's too) before it is built; `claims` are the paper's claims it tests."""
    descendant_config: Callable[[ViTConfig, Config], ViTConfig] = _same
    claims: tuple[Claim, ...] = ()


# ----------------------------------------------------------------------------------------
# Methods, variants, shapes and the plan (nothing trained).

def variants(config: Config) -> list[tuple[str, str, dict]]:
    """[(row name, method, {'gene': {...}, 'descend': {...}})] of `config.methods`: a method
    with a `variants.<method>.<gene|descend>.<option> = (values)` section gives one row per
    value ('letra/step', 'mango/2'); Scratch is the harness's own baseline and is not listed."""
    out = []
    for method in config['methods']:
        if method == 'scratch':
            raise ValueError("study: 'scratch' is the harness's own baseline (scratch section); "
                             'do not list it in methods')
        if method not in KNOWN:
            raise ValueError(f'study: unknown method {method!r}; known: {", ".join(KNOWN)}')
        spec = harness.plain(harness.get(config, 'variants', {}).get(method, {})) or {}
        if not spec:
            out.append((method, method, {'gene': {}, 'descend': {}}))
            continue
        options = [(section, option, values) for section, opts in spec.items()
                   for option, values in (opts.items() if isinstance(opts, dict) else [(None, None)])]
        if len(options) != 1 or options[0][0] not in ('gene', 'descend') or options[0][1] is None:
            raise ValueError(f'study: variants.{method} must name one gene or descend option '
                             f'and its values, e.g. descend=dict(selection=(...)); got {spec}')
        (section, option, values), = options
        out += [(f'{method}/{v}', method, {'gene': {}, 'descend': {}, section: {option: v}})
                for v in values]
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f'study: methods {tuple(config["methods"])} repeat a method')
    return out


def _options(config: Config, method: str) -> dict[str, dict]:
    opts = harness.plain(harness.get(config, 'method_options', {}).get(method, {})) or {}
    unknown = sorted(set(opts) - {'gene', 'descend'})
    if unknown:
        raise ValueError(f"study: method_options.{method} has {unknown}; it takes 'gene' and "
                         "'descend' sections")
    fixed = dict(DESCEND.get(method, {}))
    if harness.get(config, 'tasks', None) and method in TEACHER_GENES + DISTILLED + GROWN + OPERATORS:
        fixed['head'] = 'new'       # the descendants' task is not the ancestor's
    return {'gene': dict(opts.get('gene', {})), 'descend': {**fixed, **opts.get('descend', {})}}


def reference_config(config: Config, num_classes: int) -> ViTConfig:
    """The teacher's (Aux-Nets', slimmable network's) config: `model` at `depth`."""
    return harness.model_config(config, config['depth'], num_classes)


def small_config(config: Config, num_classes: int) -> ViTConfig:
    """The small model the growth methods grow (`small`'s shape)."""
    s = config['small']
    return reference_config(config, num_classes).replace(
        width=s['width'], num_heads=s['num_heads'], mlp_dim=s['mlp_dim'], depth=s['depth'])


def study_shapes(config: Config) -> list[tuple[int, ...]]:
    """The descendant shapes of `config.shapes`: (width, depth), or (width, depth, heads) for
    a head count at the model's head_dim (Cluster-Learngene's ω)."""
    out = [tuple(int(x) for x in s) for s in config['shapes']]
    bad = [s for s in out if len(s) not in (2, 3) or min(s) < 1]
    if bad:
        raise ValueError(f'study: shapes {bad[0]}: expected (width, depth) or (width, depth, '
                         'heads) of positive integers')
    return out


def shape_configs(config: Config, shape: Sequence[int], num_classes: int,
                  study: Study = Study()) -> tuple[ViTConfig, ...]:
    """The head splits of the shape (width, depth): whole heads of the model's head_dim, then
    the model's head count (the other way round with `keep_heads`, as a slimmable network's
    sub-networks keep every head); a shape (width, depth, heads) has that many heads of the
    model's head_dim. MLP `mlp_ratio` × width; each through `study.descendant_config`. The
    first is Scratch's."""
    width, depth = shape[:2]
    ref = reference_config(config, num_classes)
    mlp = int(config['mlp_ratio']) * width
    out = []
    splits = [(width // ref.head_dim, ref.head_dim) if width % ref.head_dim == 0 else None,
              (ref.num_heads, width // ref.num_heads) if width % ref.num_heads == 0 else None]
    if harness.get(config, 'keep_heads', False):
        splits.reverse()
    if len(shape) == 3:
        splits = [(shape[2], ref.head_dim)]
    for heads, head_dim in (x for x in splits if x is not None):
        cfg = ref.replace(width=width, num_heads=heads, head_dim=head_dim, mlp_dim=mlp, depth=depth)
        if cfg not in out:
            out.append(cfg)
    if not out:
        raise ValueError(f'study: shape (width {width}, depth {depth}) splits neither into '
                         f'heads of {ref.head_dim} nor into {ref.num_heads} heads')
    return tuple(study.descendant_config(c, config) for c in out)


def gene_options(config: Config, method: str, target: ViTConfig, ref: ViTConfig,
                 variant: dict | None = None) -> dict:
    """Keyword options of the method's gene for a descendant `target` (He-LG / Auto-LG: k = 0
    means ⌈depth / 2⌉, at most the teacher's depth; LeTra: the learngene's size; Mango and
    LiGO: the operator's), a variant's gene options over the configured ones."""
    opts = {**_options(config, method)['gene'], **((variant or {}).get('gene') or {})}
    if method in ('he_lg', 'auto_lg'):
        k = opts.get('k') or math.ceil(target.depth / 2)
        opts['k'] = min(int(k), ref.depth, target.depth)
    if method == 'letra':
        opts.update(learngene_heads=config['aux']['learngene_heads'],
                    learngene_depth=config['aux']['learngene_depth'])
    return {} if method in SLIMMABLE + ('separate',) else opts


def descend_options(config: Config, method: str, variant: dict | None = None) -> dict:
    """Keyword options of the method's descend (Scala: the slicing `rule`, default
    `slim.rule`, and the grid's smallest ratio), a variant's over the configured ones."""
    opts = {**_options(config, method)['descend'], **((variant or {}).get('descend') or {})}
    if method == 'scala':
        opts = {'rule': config['slim']['rule'], **opts, 'smallest': float(config['slim']['smallest'])}
    if method == 'separate':
        opts.pop('budget', None)
    return opts


def separate_budget(variant: dict) -> str:
    """A 'separate' row's budget: 'steps' (the slimmable network's steps at every width, as
    Scala's paper trains them) or 'flops' (its training FLOPs shared over the widths)."""
    budget = (variant.get('descend') or {}).get('budget', 'steps')
    if budget not in ('steps', 'flops'):
        raise ValueError(f"study: separate budget {budget!r}; expected 'steps' or 'flops'")
    return budget


def _gene_shapes(config, method, target, ref, small, variant):
    if method == 'separate':
        return None
    m, opts = genes.get(method), gene_options(config, method, target, ref, variant)
    if method in OPERATORS:
        rank = {'rank': int(opts.pop('rank', 1))} if method == 'mango' else {}
        opts.pop('remat', None), opts.pop('layer_loop', None)
        return m.gene_shapes(small, large_cfg=target, **rank, **opts)
    if method in GROWN:
        return m.gene_shapes(small)
    if method == 'cluster':   # every head its own cluster: the clusters change no shape
        return m.gene_shapes(ref, clusters=[tuple(range(ref.num_heads))] * ref.depth,
                             ffn=config['cluster']['ffn'])
    return m.gene_shapes(ref, **opts)


def plan(config: Config, num_classes: int, study: Study = Study()) -> dict[str, dict]:
    """{row name: {(width, depth): the descendant ViTConfig, or the reason (str) it cannot be
    made}}, plus 'scratch', from shapes alone (`jax.eval_shape` of every descend). With
    `on_missing='error'` a shape a method cannot make is a one-line ValueError."""
    rows = variants(config)
    ref = reference_config(config, num_classes)
    small = small_config(config, num_classes) if 'small' in config else None
    mode = harness.get(config, 'on_missing', 'mark')
    if mode not in ('mark', 'error'):
        raise ValueError(f"study: on_missing={mode!r}; expected 'mark' or 'error'")
    shapes = study_shapes(config)
    out: dict[str, dict] = {'scratch': {s: shape_configs(config, s, num_classes, study)[0]
                                        for s in shapes}}
    for name, method, variant in rows:
        m = genes.get('scratch' if method == 'separate' else method)
        opts = descend_options(config, method, variant)
        out[name] = {}
        for shape in shapes:
            width, depth = shape[:2]
            reason = _off_grid(config, ref, width) if method == 'separate' else None
            candidates = () if reason else _candidates(config, method, opts, ref, shape,
                                                        num_classes, study)
            for cfg in candidates:
                try:
                    gene = _gene_shapes(config, method, cfg, ref, small, variant)
                    jax.eval_shape(lambda g, c=cfg: m.descend(g, c, key=jax.random.key(0), **opts),
                                   gene)
                except genes.GeneError as e:
                    reason = reason or str(e)
                    continue
                out[name][shape] = cfg
                break
            else:
                out[name][shape] = reason or (
                    f'{method}: its sub-networks have the slimmable network\'s depth {ref.depth} '
                    f'and a width of at most {ref.width} in whole heads')
                if mode == 'error':
                    heads = f', heads {shape[2]}' if len(shape) == 3 else ''
                    raise ValueError(f'study: {name} cannot make the shape (width {width}, '
                                     f'depth {depth}{heads}): {reason}')
    return out


def _off_grid(config, ref: ViTConfig, width: int) -> str | None:
    """Why a 'separate' row skips `width`, or None: separately trained networks stand in for
    the widths the slimmable network is trained at (its grid), so that its equal-FLOPs budget
    is shared over those widths only; off-grid widths are compared with Scratch alone."""
    sc = harness.get(config, 'slim', None)
    if sc is None:
        return None
    grid = [scala.sizes(ref, r)['embed'] for r in scala.width_grid(float(sc['smallest']),
                                                                      sc['granularity'])]
    if width in grid:
        return None
    return (f'separate: width {width} is off the slimmable grid {grid}; separate training '
            'serves the widths the slimmable network is trained at')


def _candidates(config, method, opts, ref, shape, num_classes, study):
    """The configs a method may make a shape in: a slimmable network's sub-network config
    (`scala.subnet_config`, the slicing rule's) at its own depth, else the head splits."""
    width, depth = shape[:2]
    if method in SLIMMABLE:
        if depth != ref.depth or width > ref.width or len(shape) == 3:
            return ()
        try:
            return (scala.subnet_config(ref, width / ref.width, rule=opts.get('rule', 'clean')),)
        except genes.GeneError:
            return ()
    return shape_configs(config, shape, num_classes, study)


def label(name: str, config: Config) -> str:
    """A row's name in tables and plots ('LeTra (step)', 'Mango (R=2)', 'He-LG')."""
    method, _, value = name.partition('/')
    if method == 'mango':
        return f"Mango (R={value or _options(config, method)['gene'].get('rank', 1)})"
    base = {'scratch': 'Scratch', 'separate': 'Separate'}.get(method) or genes.get(method).label
    if method == 'separate':
        return f'Separate (Scala\'s {value or "steps"})'
    return f'{base} ({value})' if value else base


def upstream_names(method: str, name: str | None = None) -> tuple[str, ...]:
    """The upstream runs whose cost is `method`'s (the teacher counts for each user; a
    slimmable row's network is its own, `name`)."""
    if method in DISTILLED:
        return ('teacher', f'aux_{method}')
    if method == 'cluster':
        return ('teacher', 'attention_distance')
    if method in TEACHER_GENES:
        return ('teacher',)
    if method in GROWN + OPERATORS:
        return ('small',)
    return (name or method,) if method in SLIMMABLE else ()


def check(config: Config) -> None:
    """The protocol's rules on a config: Scratch sweeps ≥ 3 learning rates except in the
    paper configs, at least one seed, budgets given as fractions (one-line ValueError)."""
    lrs = tuple(config['scratch']['lrs'])
    paper = harness.get(config, 'scale', '') == 'paper'
    if not lrs or (len(lrs) < MIN_SWEEP and not paper):
        raise ValueError(f'study: scratch.lrs={lrs}: Scratch sweeps at least {MIN_SWEEP} '
                         "learning rates (only a 'paper' config follows the paper's single lr)")
    if not tuple(config['seeds']):
        raise ValueError('study: seeds is empty; give at least one seed (3 for a result)')
    if not tuple(config['descend']['fractions']):
        raise ValueError('study: descend.fractions is empty')


# ----------------------------------------------------------------------------------------
# Scratch: the baseline and the budget unit S.

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


class Runner:
    """One study's data, fit and bookkeeping (timings, progress lines). With `tasks`
    (class subsets of the dataset), `dset` is the descendants' task and `ancestor_dset` the
    ancestor's; else both are the whole dataset."""

    def __init__(self, config: Config, workdir: str, quiet: bool):
        self.config, self.workdir, self.quiet = config, workdir, quiet
        tasks_ = harness.get(config, 'tasks', None)
        self.dset = harness.Data(config, tasks_['descendant'] if tasks_ else None)
        self.ancestor_dset = harness.Data(config, tasks_['ancestor']) if tasks_ else self.dset
        self.K, self.n, self.bs = self.dset.num_classes, self.dset.num_examples, config['batch_size']
        self.timings: dict[str, float] = {}
        self.identity = harness.plain(config)   # what a finished run in workdir must match to be reused
        self.reused: list[str] = []

    def say(self, msg: str) -> None:
        harness.say(msg, self.quiet)

    def steps(self, section: Config, name: str) -> int:
        return harness.budget(section, self.n, self.bs, name)

    def fit(self, name, loss_fn, params, eval_fn, *, steps, lr, seed, eval_every=None, config=None,
            stop_at=None, dset=None):
        params, curve, secs = harness.fit(name, loss_fn, params, eval_fn, dset or self.dset, steps=steps,
                                          lr=lr, config=config or self.config,
                                          workdir=self.workdir, seed=seed, eval_every=eval_every,
                                          stop_at=stop_at, identity=self.identity, reused=self.reused)
        self.timings[name] = secs
        return params, curve

    def step_flops(self, cfg: ViTConfig, params=None) -> float:
        return float(costs.TRAIN_FACTOR * costs.flops_per_image(cfg, params) * self.bs)

    def run_flops(self, cfg: ViTConfig, steps: int, teacher: ViTConfig | None = None) -> float:
        return float(costs.training_cost([costs.Run('r', cfg, steps * self.bs / self.n, self.n,
                                                    teacher=teacher)])['flops'])


def scratch_baseline(runner: Runner, cfgs: dict[tuple, ViTConfig], seeds: Sequence[int], *,
                     dset: harness.Data | None = None, tag: str = 'scratch') -> dict:
    """Scratch at every shape of `cfgs` (on `dset`, default the descendants' data): the lr
    sweep on the first seed at `scratch.steps`, every seed at the chosen lr; a run at the
    chosen lr that the plateau rule flags as still rising is trained again from the start
    at twice the steps while that stays within `scratch.max_steps` (0: never retrained).
    Returns {shape: {'lr', 'sweep', 'runs': {seed: record}, 'S', 'acc', 'std', 'steps' (the
    longest run), 'converged', 'params' (per seed)}}."""
    sc = runner.config['scratch']
    lrs = tuple(float(x) for x in sc['lrs'])
    steps = runner.steps(sc, 'scratch')
    longest = max(steps, int(harness.get(sc, 'max_steps', 0)))
    every = int(harness.get(sc, 'eval_every', 0)) or steps
    tol, patience = float(sc['plateau']), int(sc['patience'])
    out = {}
    for shape, cfg in cfgs.items():
        loss, ev = tasks.classification_loss(cfg), harness.eval_fn(cfg)

        def train(lr, seed, n=steps):
            suffix = '' if n == steps else f'_n{n}'
            params, curve = runner.fit(f'{tag}_{shape_key(shape)}_lr{lr:g}_s{seed}{suffix}', loss,
                                       init(cfg, jax.random.key(seed)), ev, steps=n, lr=lr,
                                       seed=seed, eval_every=every, dset=dset)
            # patience 0 (the paper configs): the paper's schedule is S
            s, ok = plateau(curve, tol, patience) if patience > 0 else (n, True)
            rec = dict(lr=lr, seed=seed, steps=n, curve=curve, acc=curve[-1][1],
                       plateau_step=s, converged=ok)
            runner.say(f'{tag:<8} {shape_text(shape)} lr {lr:g} seed {seed}: {rec["acc"]:.4f}'
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
        out[shape] = dict(lr=lr, sweep={f'{x:g}': first[x][1]['acc'] for x in lrs},
                          runs={s: r for s, (_, r) in runs.items()},
                          params={s: p for s, (p, _) in runs.items()},
                          S=int(round(np.mean([r['plateau_step'] for _, r in runs.values()]))),
                          acc=float(np.mean(accs)), std=float(np.std(accs)),
                          steps=max(r['steps'] for _, r in runs.values()),
                          converged=all(r['converged'] for _, r in runs.values()))
    return out


# ----------------------------------------------------------------------------------------
# Upstream runs, per seed.

def fraction_steps(fraction: float, S: int) -> int:
    """Steps of a stage budgeted at `fraction` of S (at least 1 for a positive fraction)."""
    return 0 if fraction <= 0 else max(1, int(round(fraction * S)))


def upstream(runner: Runner, rows: list, ref: ViTConfig, S_ref: int, teacher, t_cfg: ViTConfig,
             seed: int, base: dict) -> dict:
    """Every upstream stage the study's methods need, for one seed: {'products': {name:
    params or gene}, 'flops': {name: training FLOPs}, 'info': {...}, 'small_cfg',
    'teacher_cfg'}. `ref` is the model section's config (Aux-Nets, slimmable networks),
    `t_cfg` the teacher's: the reference shape's Scratch config (through the study's
    `descendant_config`, e.g. TLEG's official Des-Net pooling). The
    small model the growth methods grow is the converged Scratch run of its shape where
    `small.converged` (its shape then joins Scratch's), else trained `small.fraction`·S."""
    config = runner.config
    methods = {m for _, m, _ in rows}
    needed = {u for m in methods for u in upstream_names(m)}
    products, flops, info = {'teacher': teacher}, {}, {}
    checkpoint.save_model(os.path.join(runner.workdir, 'teacher', f'seed_{seed}'), teacher, t_cfg,
                          overwrite=True, extra={'kind': 'teacher', 'seed': seed})
    for method in sorted(methods & set(DISTILLED)):
        mt = genes.get(method)
        own = harness.plain(harness.get(config['aux'], 'fractions', {})) or {}
        steps = fraction_steps(float(own.get(method, config['aux']['fraction'])), S_ref)
        gene0 = mt.init_gene(ref, jax.random.key(seed + 1), **gene_options(config, method, ref, ref))
        section = dict(harness.plain(config), seed=seed,
                       aux=dict(harness.plain(config['aux']), steps=steps, epochs=0.0, fractions={}))
        gene, acc, secs, _ = harness.distil(
            f'aux_{method}_s{seed}', lambda g, mt=mt: mt.materialize(g, None, ref), gene0, teacher,
            t_cfg, ref, runner.dset, section, runner.workdir,
            decay=letra.DECAY if method == 'letra' else None, reused=runner.reused)
        products[method], info[f'aux_{method}_accuracy'] = gene, acc
        checkpoint.save_model(os.path.join(runner.workdir, 'genes', method, f'seed_{seed}'), gene, ref,
                              overwrite=True, extra={'kind': f'{method}_gene', 'method': method,
                                                     'seed': seed, 'aux_test_accuracy': acc})
        runner.timings[f'aux_{method}_s{seed}'] = secs
        flops[f'aux_{method}'] = runner.run_flops(ref, steps, teacher=t_cfg)
        runner.say(f'aux-net  {method:<10} seed {seed}: {steps} steps, test accuracy {acc:.4f} ({secs:.0f}s)')
    for name, method, variant in rows:
        if method in SLIMMABLE:
            rule = descend_options(config, method, variant).get('rule', 'clean')
            products[name], flops[name], info[f'{name}_steps'] = train_slimmable(
                runner, name, method, rule, ref, S_ref, seed)
    cluster_rows = [(n, v) for n, m, v in rows if m == 'cluster']
    if cluster_rows:
        made, flops['attention_distance'], info['attention_distance'] = cluster_genes(
            runner, cluster_rows, teacher, t_cfg, seed)
        products.update(made)
        runner.say(f"clusters seed {seed}: centroids per layer "
                   f"{info['attention_distance']['centroids']}, FFN groups "
                   f"{info['attention_distance']['ffn_groups']}")
    small_cfg = None
    if 'small' in needed:
        small_cfg = small_config(config, runner.K)
        shape = (small_cfg.width, small_cfg.depth)
        if shape in base:      # the converged Scratch run of the small shape
            products['small'] = base[shape]['params'][seed]
            run = base[shape]['runs'][seed]
            steps, info['small_accuracy'] = run['steps'], run['acc']
        else:
            steps = fraction_steps(float(config['small']['fraction']), S_ref)
            products['small'], curve = runner.fit(
                f'small_s{seed}', tasks.classification_loss(small_cfg),
                init(small_cfg, jax.random.key(seed + 2)), harness.eval_fn(small_cfg), steps=steps,
                lr=float(config['optim']['lr']), seed=seed + 2)
            info['small_accuracy'] = curve[-1][1]
        flops['small'] = runner.run_flops(small_cfg, steps)
        runner.say(f'small    seed {seed}: {steps} steps, test accuracy {info["small_accuracy"]:.4f}')
    return dict(products=products, flops=flops, info=info, small_cfg=small_cfg, teacher_cfg=t_cfg)


def train_slimmable(runner: Runner, name: str, method: str, rule: str, ref: ViTConfig,
                    S_ref: int, seed: int):
    """One slimmable network of the reference shape: `slim.warmup_fraction`·S full-width
    steps at `warmup_lr_factor` × lr, then `slim.fraction`·S steps of its loss (Scala: full +
    stable-sampled upper and lower widths + smallest; US-Net: the sandwich rule with
    in-place distillation, left-aligned); returns (params, training FLOPs, total steps)."""
    sc, lr = runner.config['slim'], float(runner.config['optim']['lr'])
    smallest = float(sc['smallest'])
    grid = scala.width_grid(smallest, sc['granularity'])
    warm = fraction_steps(float(sc['warmup_fraction']), S_ref)
    main = fraction_steps(float(sc['fraction']), S_ref)
    tag = name.replace('/', '_')
    params, full_eval = init(ref, jax.random.key(seed + 3)), harness.eval_fn(ref)
    if warm:
        params, _ = runner.fit(f'{tag}_warmup_s{seed}', scala.full_loss(ref, rule=rule), params,
                               full_eval, steps=warm, lr=lr * float(sc['warmup_lr_factor']), seed=seed + 3)
    sub = {r: scala.subnet_config(ref, r, rule=rule) for r in grid}
    if method == 'scala':
        upper, lower = scala.stable_halves(grid)
        loss = scala.scala_loss(ref, grid, rule=rule, ce_weight=sc['ce_weight'],
                                transfer=sc['transfer'], isolated=sc['isolated'])
        plan_ = [(sub[1.0], warm + main), (sub[smallest], main)]
        plan_ += [(sub[r], main / len(upper)) for r in upper] + [(sub[r], main / len(lower)) for r in lower]
    else:
        interior = grid[1:-1]
        loss = scala.usnet_loss(ref, grid)
        plan_ = [(sub[1.0], warm + main), (sub[smallest], main)]
        plan_ += [(sub[r], 2 * main / len(interior)) for r in interior]
    params, curve = runner.fit(f'{tag}_s{seed}', loss, params, full_eval, steps=main, lr=lr, seed=seed + 3)
    runner.say(f'{name:<8} seed {seed}: {warm} + {main} steps, full width {curve[-1][1]:.4f}')
    return params, sum(runner.run_flops(c, s) for c, s in plan_ if s), warm + main


def separate_steps(runner: Runner, rows_spec, made: dict, up: dict, shapes, budget: str) -> int:
    """Steps of each separately trained width: the first slimmable row's total steps, or
    its training FLOPs over the summed step FLOPs of every width (`made`: the row's plan)."""
    slim = next((n for n, m, _ in rows_spec if m in SLIMMABLE), None)
    if slim is None:
        raise ValueError("study: 'separate' takes its budget from a slimmable method (scala, "
                         'us_net); add one to methods')
    if budget == 'steps':
        return int(up['info'][f'{slim}_steps'])
    per = sum(runner.step_flops(c) for c in (made[s] for s in shapes) if not isinstance(c, str))
    return max(1, int(round(up['flops'][slim] / per)))


def cluster_genes(runner: Runner, rows, teacher, t_cfg: ViTConfig, seed: int):
    """Cluster-Learngene's genes, one per row [(name, variant)]: the teacher's mean attention
    distances over the first `cluster.images` images of its own training data, density
    clusters at `cluster.eps`; a row with the gene option centroids='random' (the random-head
    control) takes as many heads per layer, drawn at random (`cluster.random_centroids`).
    Returns (genes by row name, the pass's FLOPs, info: the distances, their spread per
    layer, ε, the centroid counts and FFN groups)."""
    config, cc, dset = runner.config, runner.config['cluster'], runner.ancestor_dset
    n_mad = min(int(cc['images']), dset.num_examples)
    mad = np.asarray(cluster.mean_attention_distance(
        teacher, t_cfg, dset.raw_batches(n_mad, config['eval_batch_size']), mean=dset.mean,
        std=dset.std))
    clusters = cluster.cluster_heads(mad, cc['eps'], cc['min_heads'])
    made = {}
    for name, variant in rows:
        opts = gene_options(config, 'cluster', t_cfg, t_cfg, variant)
        chosen = opts.pop('centroids', 'clustered')
        if chosen not in ('clustered', 'random'):
            raise ValueError(f"study: cluster centroids={chosen!r}; expected 'clustered' or 'random'")
        cents = (clusters if chosen == 'clustered'
                 else cluster.random_centroids(clusters, t_cfg.num_heads, seed))
        made[name] = cluster.gene_from_model(teacher, t_cfg, clusters=cents, ffn=cc['ffn'], **opts)
    counts = [len(c.centroids) for c in clusters]
    info = dict(distances=np.round(mad, 3).tolist(), eps=float(cc['eps']), images=n_mad,
                spread=np.round(mad.max(1) - mad.min(1), 3).tolist(), centroids=counts,
                ffn_groups=[list(g) for g in cluster.ffn_groups(counts, cc['ffn'],
                                                                   heads=t_cfg.num_heads)])
    return made, float(costs.flops_per_image(t_cfg) * n_mad), info


@functools.lru_cache(maxsize=None)
def _jit_descend(method: str, cfg: ViTConfig, options: tuple):
    """The method's descend for `cfg`, compiled once and quickly (`compiler.run_once_jit`)."""
    fn = functools.partial(genes.get(method).descend, target_cfg=cfg, **dict(options))
    return compiler.run_once_jit(lambda gene, key: fn(gene, key=key),
                                 lambda gene, key: vit.block_elements(cfg))


def descendant(runner: Runner, name: str, method: str, variant: dict, d_cfg: ViTConfig, key,
               up: dict, ref: ViTConfig, S: int, seed: int):
    """(params0, per-descendant extra FLOPs) of a method's descendant `d_cfg`."""
    config, products = runner.config, up['products']
    opts = descend_options(config, method, variant)
    gopts = gene_options(config, method, d_cfg, ref, variant)
    if method in OPERATORS:
        steps = fraction_steps(float(config['operator']['fraction']), S)
        return train_operator(runner, f'{name.replace("/", "_")}_w{d_cfg.width}_d{d_cfg.depth}_s{seed}',
                              method, gopts, products['small'], up['small_cfg'], d_cfg, steps, seed)
    if method == 'separate':
        return init(d_cfg, key), 0.0
    if method in TEACHER_GENES and method != 'cluster':
        gene = genes.get(method).gene_from_model(products['teacher'], up['teacher_cfg'], **gopts)
    else:
        gene = products['small' if method in GROWN
                        else name if method in SLIMMABLE + ('cluster',) else method]
    return _jit_descend(method, d_cfg, tuple(sorted(opts.items())))(gene, key), 0.0


# ----------------------------------------------------------------------------------------
# Mango's and LiGO's operators: trained per descendant on its loss, the small model frozen.

def grow_fn(method: str, options: dict, large_cfg: ViTConfig):
    """`grow(operator, small) -> large params` of an operator method."""
    if method == 'mango':
        kw = {k: options[k] for k in ('layer_loop', 'remat') if k in options}
        return lambda op, small: mango.grow(op, small, large_cfg, **kw)
    return lambda op, small: growth.ligo_grow(op, small, large_cfg)


def init_operator(method: str, options: dict, small_cfg: ViTConfig, large_cfg: ViTConfig, key):
    if method == 'mango':
        return mango.init_operator(small_cfg, large_cfg, int(options.get('rank', 1)), key,
                                   **({'noise': options['noise']} if 'noise' in options else {}))
    kw = {k: options[k] for k in ('width_init', 'depth_init') if k in options}
    return growth.ligo_init_operator(small_cfg, large_cfg, key, **kw)


def grow_flops(method: str, options: dict, grow, operator, small, small_cfg, large_cfg) -> float:
    """Forward FLOPs (multiply-accumulates) of one grow: Mango's `operator_cost`, XLA's cost
    analysis of the lowered grow for LiGO."""
    if method == 'mango':
        return float(mango.operator_cost(small_cfg, large_cfg, int(options.get('rank', 1)))['flops'])
    analysis = jax.jit(grow).lower(operator, small).cost_analysis()
    return float(analysis['flops']) / 2


def train_operator(runner: Runner, name: str, method: str, options: dict, small, small_cfg,
                   large_cfg: ViTConfig, steps: int, seed: int):
    """Train the method's operator `steps` steps on the large model's loss (the small model
    frozen: in the trained tree, frozen by the optimiser and behind `stop_gradient`); returns
    (the grown large params, the operator's training FLOPs: the large model's step plus 3×
    the grow's FLOPs per step)."""
    oc = runner.config['operator']
    grow = grow_fn(method, options, large_cfg)
    inner = tasks.classification_loss(large_cfg)

    def loss_fn(trainable, batch, rng):
        return inner(grow(trainable['operator'], jax.lax.stop_gradient(trainable['small'])), batch, rng)

    operator = init_operator(method, options, small_cfg, large_cfg, jax.random.key(seed + 3))
    optim_cfg = dict(harness.plain(runner.config['optim']), weight_decay=oc['weight_decay'],
                     decay=('operator/.*',), freeze=('small/.*',))
    trained, _ = runner.fit(f'operator_{name}', loss_fn, {'operator': operator, 'small': small}, None,
                            steps=steps, lr=float(oc['lr']), seed=seed + 3, config={'optim': optim_cfg})
    g_flops = grow_flops(method, options, grow, operator, small, small_cfg, large_cfg)
    runner.say(f'operator {name}: {steps} steps ({runner.timings[f"operator_{name}"]:.0f}s)')
    extra = steps * (runner.step_flops(large_cfg) + costs.TRAIN_FACTOR * g_flops)
    return jax.jit(grow)(trained['operator'], small), float(extra)


# ----------------------------------------------------------------------------------------
# The study.

def reach(curve, start: float, per_step: float, target: float) -> float | None:
    """FLOPs at which a curve [(step, accuracy)] first reaches `target`: `start` plus the
    steps taken, linear between evaluations; None if it never does."""
    pts = [(start + s * per_step, a) for s, a in curve]
    for i, (x, y) in enumerate(pts):
        if y >= target:
            if i == 0:
                return x
            x0, y0 = pts[i - 1]
            return x0 + (x - x0) * (target - y0) / (y - y0)
    return None


def run_experiment(config: Config, workdir: str, *, quiet: bool = False) -> dict:
    """Run the experiment `config` names (`jlearngene.experiments.<config.experiment>`'s
    `STUDY`); every experiment config goes through here (`jlearngene train`, `demo`,
    `compare`). Returns the results, the Markdown table under 'table'."""
    return run(config, workdir, harness.module(config['experiment']).STUDY, quiet=quiet)


def run(config: Config, workdir: str, study: Study, *, quiet: bool = False) -> dict:
    """Run the study `config` declares (module docstring); returns the results (also written
    to `workdir` with the table and plot), the table under 'table'."""
    check(config)
    rows_spec = variants(config)   # unknown methods fail before anything is written
    runner = Runner(config, workdir, quiet)   # the data are checked before the workdir exists
    t_start = harness.prepare(config, workdir)
    K, seeds = runner.K, [int(s) for s in config['seeds']]
    the_plan = plan(config, K, study)
    ref = reference_config(config, K)
    ref_shape = (ref.width, ref.depth)
    own_task = runner.ancestor_dset is runner.dset
    scratch_cfgs = dict(the_plan['scratch'])
    if own_task:
        scratch_cfgs.setdefault(ref_shape, ref)
    if harness.get(harness.get(config, 'small', {}), 'converged', False):
        small_cfg = small_config(config, K)
        scratch_cfgs.setdefault((small_cfg.width, small_cfg.depth), small_cfg)
    # 1. Scratch, the target and S; the teacher (ancestor) is the reference shape's Scratch
    # run, on the ancestor's task where the study has two
    base = scratch_baseline(runner, scratch_cfgs, seeds)
    if own_task:
        t_cfg, source = scratch_cfgs[ref_shape], base[ref_shape]
    else:
        t_cfg = shape_configs(config, ref_shape, runner.ancestor_dset.num_classes, study)[0]
        source = scratch_baseline(runner, {ref_shape: t_cfg}, seeds, dset=runner.ancestor_dset,
                                  tag='ancestor')[ref_shape]
    S_ref, gap = source['S'], float(config['target_gap'])
    records, upstream_flops, infos = [], {}, {}
    shapes = study_shapes(config)
    for shape in shapes:
        b, cfg = base[shape], scratch_cfgs[shape]
        for seed, r in b['runs'].items():
            records.append(dict(method='scratch', name='scratch', label='Scratch', shape=list(shape),
                                seed=seed, fraction=1.0, steps=r['steps'], steps_taken=r['steps'],
                                lr=r['lr'], plateau_step=r['plateau_step'], converged=r['converged'],
                                acc_init=None, acc=r['acc'], curve=r['curve'],
                                params=costs.param_count(cfg), extra_flops=0.0,
                                step_flops=runner.step_flops(cfg),
                                finetune_flops=r['steps'] * runner.step_flops(cfg), upstream=[]))
    # 2-3. Per seed: upstream, then every descendant at every budget fraction.
    d_lr = float(config['descend']['lr'])
    fractions = [float(f) for f in config['descend']['fractions']]
    evals = int(config['descend']['evals'])
    stop = bool(harness.get(config['descend'], 'stop_at_target', False))
    for seed in seeds:
        teacher = source['params'][seed]
        up = upstream(runner, rows_spec, ref, S_ref, teacher, t_cfg, seed, base)
        upstream_flops[seed] = dict(up['flops'], teacher=source['runs'][seed]['steps']
                                    * runner.step_flops(t_cfg))
        infos[seed] = up['info']
        for shape in shapes:
            S = base[shape]['S']
            key = jax.random.key(seed + 100 + 10 * shape[0] + shape[1]
                                 + (1000 * shape[2] if len(shape) == 3 else 0))
            for name, method, variant in rows_spec:
                d_cfg = the_plan[name][shape]
                if isinstance(d_cfg, str):
                    continue
                params0, extra = descendant(runner, name, method, variant, d_cfg, key, up, ref, S, seed)
                acc0 = harness.accuracy(params0, d_cfg, runner.dset)
                per_step = runner.step_flops(d_cfg, params0)
                target = base[shape]['acc'] - gap
                budgets = [(f, fraction_steps(f, S)) for f in fractions]
                lr = d_lr
                if method == 'separate':   # one budget: the slimmable network's; Scratch's lr
                    lr = base[shape]['lr']
                    budgets = [(1.0, separate_steps(runner, rows_spec, the_plan[name], up, shapes,
                                                    separate_budget(variant)))]
                for fraction, steps in budgets:
                    curve = [(0, acc0)]
                    if steps and not (stop and acc0 >= target):
                        _, tuned = runner.fit(
                            f'{name.replace("/", "_")}_{shape_key(shape)}_f{fraction:g}_s{seed}',
                            tasks.classification_loss(d_cfg), params0, harness.eval_fn(d_cfg),
                            steps=steps, lr=lr, seed=seed + 7, eval_every=max(1, steps // evals),
                            stop_at=target if stop else None)
                        curve += tuned
                    taken = curve[-1][0]
                    records.append(dict(method=method, name=name, label=label(name, config),
                                        shape=list(shape), seed=seed, fraction=fraction, steps=steps,
                                        steps_taken=taken, lr=lr, acc_init=acc0, acc=curve[-1][1],
                                        curve=curve, params=costs.param_count(params0),
                                        extra_flops=extra, step_flops=per_step,
                                        finetune_flops=taken * per_step,
                                        upstream=list(upstream_names(method, name))))
                    runner.say(f'des {shape_text(shape)} {label(name, config):<20} seed {seed} '
                               f'{fraction:g}·S = {steps} steps: {acc0:.4f} -> {curve[-1][1]:.4f}')
    scratch = {shape_key(s): {k: v for k, v in base[s].items() if k not in ('params', 'runs')}
               for s in base}
    results = dict(
        config=harness.plain(config), shapes=[list(s) for s in shapes], seeds=seeds,
        rows_spec=[n for n, _, _ in rows_spec], labels={n: label(n, config) for n, _, _ in rows_spec},
        cannot={n: {shape_key(s): v for s, v in the_plan[n].items() if isinstance(v, str)}
                for n, _, _ in rows_spec},
        reference=dict(width=ref.width, depth=ref.depth, S=S_ref), scratch=scratch,
        ancestor=None if own_task else dict(
            classes=list(runner.ancestor_dset.classes), descendant_classes=list(runner.dset.classes),
            **{k: v for k, v in source.items() if k not in ('params', 'runs')}),
        upstream_flops={str(k): v for k, v in upstream_flops.items()}, info={str(k): v for k, v in infos.items()},
        rows=records, timings=runner.timings, reused=sorted(runner.reused),
        seconds=time.perf_counter() - t_start)
    return harness.write_results(finish(results, study), workdir, report.markdown, report.plot)


def finish(results: dict, study: Study) -> dict:
    """`results` with what follows from its raw records computed: each record's target,
    FLOPs to the target and upstream FLOPs (with and without the pretrained source), the
    'summary' and the 'verdicts'."""
    gap = float(results['config']['target_gap'])
    for r in results['rows']:
        r['target'] = results['scratch'][shape_key(r['shape'])]['acc'] - gap
        r['reach_flops'] = reach(r['curve'], r['extra_flops'], r['step_flops'], r['target'])
        ups = results['upstream_flops'].get(str(r['seed']), {})
        r['upstream_flops'] = sum(ups.get(u, 0.0) for u in r['upstream'])
        r['upstream_flops_without_source'] = sum(ups.get(u, 0.0) for u in r['upstream']
                                                 if u not in PRETRAINED)
    results['summary'] = summarise(results, [float(x) for x in results['config']['amortise']])
    results['verdicts'] = [verdict(c, results) for c in study.claims]
    return results


def render(workdir: str) -> dict:
    """Recompute a recorded study's summary, verdicts, `results.md` and plot from its
    `results.json` (nothing is trained); returns the results."""
    with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
        results = json.load(f)
    results.pop('table', None)
    mod = harness.module(results['config']['experiment'])
    return harness.write_results(finish(results, mod.STUDY), workdir, report.markdown, report.plot)


# ----------------------------------------------------------------------------------------
# Aggregates and verdicts (pure functions of the records).

def _mean_std(xs) -> tuple[float, float]:
    return float(np.mean(xs)), float(np.std(xs))


def summarise(results: dict, amortise: Sequence[float]) -> list[dict]:
    """One record per (row name, shape, fraction): mean ± std of the final and initial
    accuracy over seeds, seeds that reached the target, mean FLOPs to the target (own, and
    with the upstream without the pretrained source amortised over N = amortise[0]), the own
    FLOPs, the upstream with and without the pretrained source, and the amortised total per
    descendant for each N (without the source, the papers' count, and with it)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results['rows']:
        groups.setdefault((r['name'], tuple(r['shape']), r['fraction']), []).append(r)
    out = []
    for (name, shape, fraction), rs in groups.items():
        acc, std = _mean_std([r['acc'] for r in rs])
        own = float(np.mean([r['extra_flops'] + r['finetune_flops'] for r in rs]))
        up = float(np.mean([r['upstream_flops'] for r in rs]))
        up_wo = float(np.mean([r['upstream_flops_without_source'] for r in rs]))
        reached = [r['reach_flops'] for r in rs if r['reach_flops'] is not None]
        s = dict(name=name, label=rs[0]['label'], shape=list(shape), fraction=fraction,
                 seeds=len(rs), acc=acc, std=std, target=rs[0]['target'],
                 acc_init=None if rs[0]['acc_init'] is None else _mean_std([r['acc_init'] for r in rs])[0],
                 steps=int(round(np.mean([r['steps'] for r in rs]))),
                 steps_taken=float(np.mean([r['steps_taken'] for r in rs])),
                 reached=len(reached), own_flops=own, upstream_flops=up,
                 upstream_flops_without_source=up_wo,
                 reach_flops=float(np.mean(reached)) if len(reached) == len(rs) else None,
                 amortised={f'{n:g}': dict(without_source=up_wo / n + own, with_source=up / n + own)
                            for n in amortise})
        if name == 'scratch':
            s.update(lr=rs[0]['lr'], plateau_step=int(round(np.mean(
                [r['plateau_step'] for r in rs]))), converged=all(r['converged'] for r in rs))
        out.append(s)
    scratch = {tuple(s['shape']): s for s in out if s['name'] == 'scratch'}
    for s in out:
        base = scratch.get(tuple(s['shape']))
        if s['name'] == 'scratch' or base is None or s['reach_flops'] is None or base['reach_flops'] is None:
            continue
        own = s['reach_flops']
        s['break_even'] = {k: break_even(s[u], own, base['reach_flops'])
                           for k, u in (('without_source', 'upstream_flops_without_source'),
                                        ('with_source', 'upstream_flops'))}
    return out


def break_even(upstream: float, per_descendant: float, scratch_per_descendant: float) -> int | None:
    """The least number of descendants N ≥ 1 at which a method (upstream U, c per
    descendant) costs less than Scratch (c_s per descendant): U + N·c < N·c_s; None when
    c ≥ c_s (never)."""
    saving = scratch_per_descendant - per_descendant
    if saving <= 0:
        return None
    return max(1, math.floor(upstream / saving) + 1)


def _runs(rows, name, shape, fraction) -> list[dict]:
    """The records (one per seed) of a row at a shape and budget."""
    return [r for r in rows if r['name'] == name and tuple(r['shape']) == tuple(shape)
            and r['fraction'] == fraction]


def _reached(rows, name, shape, fraction) -> tuple[int, int]:
    """(seeds that reached the target, seeds) of a row at a shape."""
    mine = _runs(rows, name, shape, fraction)
    return sum(r['reach_flops'] is not None for r in mine), len(mine)


def _to_target(rows, name, shape, fraction) -> list[float] | None:
    """Per seed: own FLOPs to the target plus the upstream without the pretrained source;
    None unless every seed reached it."""
    mine = _runs(rows, name, shape, fraction)
    if not mine or any(r['reach_flops'] is None for r in mine):
        return None
    return [r['reach_flops'] + r['upstream_flops_without_source'] for r in mine]


def _find(summary, name, shape, fraction):
    return next((s for s in summary if s['name'] == name and tuple(s['shape']) == tuple(shape)
                 and s['fraction'] == fraction), None)


def verdict(claim: Claim, results: dict) -> dict:
    """{'claim', 'verdict': 'reproduced' | 'not reproduced' | 'not testable here', 'detail'}:
    the claim checked at every shape the method makes, in numbers."""
    summary, shapes = results['summary'], [tuple(s) for s in results['shapes']]
    if claim.shapes is not None:
        shapes = [s for s in shapes if s in {tuple(x) for x in claim.shapes}]
    mine = [(sh, _find(summary, claim.method, sh, claim.fraction)) for sh in shapes]
    mine = [(sh, s) for sh, s in mine if s is not None]
    if not mine:
        return dict(claim=claim.text, verdict='not testable here',
                    detail=f'{claim.method} makes none of the shapes at {claim.fraction:g}·S')
    parts, ok = [], True
    if claim.kind == 'reaches':
        for sh, s in mine:
            good = s['acc'] >= s['target']
            ok &= good
            parts.append(f"{shape_text(sh)}: {s['acc']:.3f} ± {s['std']:.3f} vs target "
                         f"{s['target']:.3f} ({'met' if good else 'missed'})")
        if claim.flops_ratio is not None:
            scratch_total = sum(_find(summary, 'scratch', sh, 1.0)['own_flops'] for sh, _ in mine)
            total = mine[0][1]['upstream_flops_without_source'] + sum(s['own_flops'] for _, s in mine)
            with_source = mine[0][1]['upstream_flops'] + sum(s['own_flops'] for _, s in mine)
            ratio = total / scratch_total
            ok &= ratio <= claim.flops_ratio
            parts.append(f'total FLOPs {ratio:.2f}× Scratch\'s converged runs without the pretrained source '
                         f'({with_source / scratch_total:.2f}× with it; claim ≤ {claim.flops_ratio:g}×)')
    elif claim.kind in ('beats', 'close'):
        other_f = claim.fraction if claim.other_fraction is None else claim.other_fraction
        for sh, s in mine:
            o = _find(summary, claim.other, sh, other_f)
            if o is None:
                continue
            diff, noise = s['acc'] - o['acc'], 2 * max(s['std'], o['std'])
            good = diff > noise if claim.kind == 'beats' else diff >= -claim.tolerance
            ok &= good
            parts.append(f"{shape_text(sh)}: {s['acc']:.3f} ± {s['std']:.3f} vs {o['acc']:.3f} ± "
                         f"{o['std']:.3f} (Δ {diff:+.3f}, 2σ {noise:.3f})")
        if not parts:
            return dict(claim=claim.text, verdict='not testable here',
                        detail=f'{claim.other} makes none of the shapes')
    elif claim.kind == 'cheaper':
        other = claim.other or 'scratch'
        other_f = 1.0 if other == 'scratch' else (
            claim.fraction if claim.other_fraction is None else claim.other_fraction)
        untestable = []
        for sh, _ in mine:
            a = _to_target(results['rows'], claim.method, sh, claim.fraction)
            b = _to_target(results['rows'], other, sh, other_f)
            if b is None:      # no baseline cost to compare with, unless the method does worse
                na, nb = (_reached(results['rows'], n, sh, f) for n, f in
                          ((claim.method, claim.fraction), (other, other_f)))
                text = (f'{shape_text(sh)}: {claim.method} reached the target in {na[0]}/{na[1]} '
                        f'seeds, {other} in {nb[0]}/{nb[1]}')
                if na[0] < nb[0]:
                    ok = False
                    parts.append(text)
                else:
                    untestable.append(text + ': not every seed of either')
                continue
            if a is None:
                ok = False
                parts.append(f'{shape_text(sh)}: not every {claim.method} seed reached the target')
                continue
            (ma, sa), (mb, sb) = _mean_std(a), _mean_std(b)
            good = mb - ma > 2 * max(sa, sb) and (claim.flops_ratio is None or ma / mb <= claim.flops_ratio)
            ok &= good
            parts.append(f"{shape_text(sh)}: {ma / 1e9:.3g} ± {sa / 1e9:.2g} vs {mb / 1e9:.3g} ± "
                         f"{sb / 1e9:.2g} GFLOPs to the target ({ma / mb:.2f}×)")
        if untestable and not parts:
            return dict(claim=claim.text, verdict='not testable here', detail='; '.join(untestable))
        parts += untestable
    else:
        raise ValueError(f'claim kind {claim.kind!r}; expected reaches, beats, close or cheaper')
    return dict(claim=claim.text, verdict='reproduced' if ok else 'not reproduced',
                detail='; '.join(parts))
