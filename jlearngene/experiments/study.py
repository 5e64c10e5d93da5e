"""The study protocol: every learngene study runs here, under the fair protocol.

A study is data: its config names the reference shape (`model` at `depth`: the teacher or
ancestor, the Aux-Nets, a slimmable network), the descendant `shapes`, the `methods` (with
`variants`, e.g. LeTra's selection strategies) and each stage's budget as a fraction of
Scratch's converged budget S. The experiment module adds at most one small function
(`Study.descendant_config`) and the paper's claims (`Study.claims`), which become verdict
lines. This module names no method and no family: each row's method declares its family
(`genes.Method.family`), and that family's recipe (`jlearngene.experiments.recipes`) makes
its genes upstream, its descendants and its budgets. The protocol
(the site's Benchmark page, `docs/benchmark/index.md`):

1. **Scratch first** (`scratch.baseline`), for every descendant shape and the reference
   shape: a learning-rate sweep (`scratch.lrs`, at least three values) on the first seed,
   extended a grid step past an edge its choice sits on (at most twice), then convergence by
   doubling: a run of n steps counts as converged when a run of 2n steps ends less than
   `scratch.plateau` (0.5 pt) higher on held-out accuracy, doubled up to `scratch.max_steps`;
   where the converged length is longer than the sweep's, the sweep is read again there;
   every seed at the chosen setting, all at the steps the longest-needing seed needed. S is
   the plateau step of the converged run: the first evaluation within `scratch.plateau` of
   its final accuracy. The target for every method is Scratch's mean final accuracy minus
   `target_gap` (0.5 pt). Only the paper configs (scale 'paper', `scratch.patience` 0) may
   give a single lr: there Scratch follows the paper's schedule and S is that schedule.
2. **Upstream, per seed**: the teacher is the reference shape's Scratch run of that seed (on
   the ancestor's task where the study has two, `tasks`); then each recipe in use makes its
   family's genes (`Recipe.upstream`), each counted in training FLOPs.
3. **Descendants, per seed**: every (row, shape) the plan allows (`plan`, shapes only),
   initialised by its recipe, evaluated, fine-tuned for each of its budgets (`_budgets`: by
   default `descend.fractions` · S_shape steps at `descend.lr`, 0: the initialisation alone;
   with `descend.equal_budget`, also Scratch's own steps at that shape, evaluated at least
   `descend.equal_evals` times), stopping at the target with `descend.stop_at_target`.
4. **Reporting** (`results.finish`, `report`): per row mean ± std over seeds, FLOPs until
   the target is first reached, upstream FLOPs with and without the pretrained source, the
   amortised cost per descendant for N = `amortise`, the break-even N, the claims' verdicts;
   `results.json` (one record per run, written first), `results.md`,
   `accuracy_vs_flops.png`. `render(workdir)` redoes step 4 from results.json.

**The transfer setting** (a config with `tasks` and `labels`; fair_studies.md, "Transfer
setting"): the teacher and every upstream run train on the ancestor's classes, once per
source seed (`seeds`), before any descendant. Then, per label budget (`labels.fractions`,
each with its own seeds and Scratch steps), the descendants' task holds that fraction of its
training images labelled and `labels.validation_per_class` images per class held out of
every budget: Scratch sweeps lr × `scratch.weight_decays` and reads its doubling test and
plateau on the validation accuracy; every (row, shape, budget) sweeps `descend.lrs` (extended
past an edge) on the budget's first seed and keeps the lr of the best final validation
accuracy; the test images give the reported numbers only. A budget seed the source was not
trained with descends from the source seeds in turn (`upstream_seeds`). The 'ceiling' row
fine-tunes a whole source-task model of each descendant shape (each trained as the teacher
is: its own sweep, converged by doubling) for Scratch's own steps. The record holds one
study record per budget under `budgets`, rendered as one section each
(`report.transfer_markdown`).

Finished runs are reused from the workdir (`harness.fit`), and from the folder
`$JLEARNGENE_STORE` names where it is set: there every study that asks for the same model
(the same fingerprint: settings, data, initial params, model, training code) trains it once.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any
from collections.abc import Callable

import jax

from jlearngene import costs, genes
from jlearngene.experiments import harness, recipes, report, results, scratch
from jlearngene.experiments.recipes import Row, Upstream
from jlearngene.experiments.results import Claim, shape_key, shape_text
from jlearngene.models import ViTConfig
from jlearngene.train import checkpoint, tasks, workdir_lock

Config = Any

MIN_SWEEP = 3   # learning rates Scratch's sweep needs outside the paper configs

__all__ = ['Claim', 'Study', 'check', 'describe', 'make_rows', 'plan', 'render', 'run', 'run_experiment',
           'variants']


def _same(cfg: ViTConfig, config: Config) -> ViTConfig:
    return cfg


@dataclasses.dataclass(frozen=True)
class Study:
    """A study's own part: `descendant_config(cfg, config)` adjusts every descendant config
    (Scratch's too) before it is built; `claims` are the paper's claims it tests
    (`results.Claim`)."""
    descendant_config: Callable[[ViTConfig, Config], ViTConfig] = _same
    claims: tuple[Claim, ...] = ()


# ----------------------------------------------------------------------------------------
# Rows, shapes and the plan (nothing trained).

def variants(config: Config) -> list[tuple[str, str, dict]]:
    """[(row name, method, {'gene': {...}, 'descend': {...}})] of `config.methods`: a method
    with a `variants.<method>.<gene|descend>.<option> = (values)` section gives one row per
    value ('letra/step', 'mango/2'); Scratch is the protocol's own baseline and is not listed."""
    out = []
    for method in config['methods']:
        recipes.for_method(method)      # unknown methods and Scratch: a one-line error
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


def make_rows(config: Config) -> list[Row]:
    """The study's rows: each variant with its recipe and its resolved options (the method's
    `descend_defaults`, a new head where the descendants' task is not the source's, then
    `method_options.<method>` and the variant's values, then the recipe's own)."""
    out = []
    for name, method, variant in variants(config):
        recipe = recipes.for_method(method)
        opts = harness.plain(harness.get(config, 'method_options', {}).get(method, {})) or {}
        unknown = sorted(set(opts) - {'gene', 'descend'})
        if unknown:
            raise ValueError(f"study: method_options.{method} has {unknown}; it takes 'gene' and "
                             "'descend' sections")
        fixed = dict(genes.get(method).descend_defaults) if method in genes.names() else {}
        if harness.get(config, 'tasks', None) and recipe.new_task_head:
            fixed['head'] = 'new'       # the descendants' task is not the source model's
        gene = {**opts.get('gene', {}), **(variant.get('gene') or {})}
        descend = {**fixed, **opts.get('descend', {}), **(variant.get('descend') or {})}
        gene, descend = recipe.resolve(config, method, gene, descend, variant)
        out.append(Row(name=name, method=method, recipe=recipe, variant=variant, gene=gene,
                       descend=descend))
    return out


def study_shapes(config: Config) -> list[tuple[int, ...]]:
    """The descendant shapes of `config.shapes`: (width, depth), or (width, depth, heads) for
    a head count at the model's head_dim (Cluster-Learngene's ω)."""
    out = [tuple(int(x) for x in s) for s in config['shapes']]
    bad = [s for s in out if len(s) not in (2, 3) or min(s) < 1]
    if bad:
        raise ValueError(f'study: shapes {bad[0]}: expected (width, depth) or (width, depth, '
                         'heads) of positive integers')
    return out


def _descend_shapes(method: genes.Method, cfg: ViTConfig, options: dict, gene):
    return method.descend(gene, cfg, key=jax.random.key(0), **options)


def _plan(ctx: harness.Context, rows: list[Row]) -> dict[str, dict]:
    mode = harness.get(ctx.config, 'on_missing', 'mark')
    if mode not in ('mark', 'error'):
        raise ValueError(f"study: on_missing={mode!r}; expected 'mark' or 'error'")
    shapes = study_shapes(ctx.config)
    out: dict[str, dict] = {'scratch': {s: ctx.shape_configs(s)[0] for s in shapes}}
    for row in rows:
        m, out[row.name] = row.recipe.method(row), {}
        for shape in shapes:
            candidates = row.recipe.candidates(ctx, row, shape)
            reason = candidates if isinstance(candidates, str) else None
            for cfg in () if reason else candidates:
                try:
                    gene = row.recipe.gene_shapes(ctx, row, cfg)
                    jax.eval_shape(functools.partial(_descend_shapes, m, cfg, row.descend), gene)
                except genes.GeneError as e:
                    reason = reason or str(e)
                    continue
                out[row.name][shape] = cfg
                break
            else:
                out[row.name][shape] = reason
                if mode == 'error':
                    heads = f', heads {shape[2]}' if len(shape) == 3 else ''
                    raise ValueError(f'study: {row.name} cannot make the shape (width {shape[0]}, '
                                     f'depth {shape[1]}{heads}): {reason}')
    return out


def plan(config: Config, num_classes: int, study: Study = Study()) -> dict[str, dict]:
    """{row name: {shape: the descendant ViTConfig, or the reason (str) it cannot be made}},
    plus 'scratch', from shapes alone (`jax.eval_shape` of every descend). With
    `on_missing='error'` a shape a method cannot make is a one-line ValueError."""
    config = harness.plain(config)
    ctx = harness.Context(config, num_classes=num_classes, adjust=study.descendant_config)
    ctx.rows = make_rows(config)
    return _plan(ctx, ctx.rows)


def describe(config: Config, num_classes: int) -> str:
    """What the study `config` trains, from the config alone (nothing is read or trained):
    its rows, shapes and seeds, its tasks and label budgets, how Scratch and every upstream
    model are swept and converged, the descendants' budgets, and the descendant each row
    makes at each shape or why it cannot (`plan`), for descendants of `num_classes` classes.
    `jlearngene info NAME:ARG` prints it. The config's rules are checked first (`check`)."""
    config = harness.plain(config)
    check(config)
    rows = make_rows(config)
    table = plan(config, num_classes, harness.module(config['experiment']).STUDY)
    shapes = study_shapes(config)
    sc, dc = config['scratch'], config['descend']
    seeds = [int(s) for s in config['seeds']]
    tasks_ = harness.get(config, 'tasks', None)
    ref = harness.reference_config(config, len(tasks_['ancestor']) if tasks_ else num_classes)

    def values(xs) -> str:
        return ' / '.join(f'{float(x):g}' for x in xs)

    lines = [f"the {config['experiment']} study: {len(rows)} rows against Scratch "
             f"({', '.join(label(r) for r in rows)}); shapes {', '.join(shape_text(s) for s in shapes)}; "
             f"seeds {', '.join(map(str, seeds))}",
             f'reference shape (the teacher, Aux-Nets or slimmable network): {shape_text((ref.width, ref.depth))}, '
             f'{ref.num_heads} heads, MLP {ref.mlp_dim}, patch {ref.patch_size} of {ref.image_size} px, '
             f'{ref.num_classes} classes, {costs.param_count(ref) / 1e6:.2f} M parameters']
    if tasks_:
        lines.append(f"source task: classes {list(tasks_['ancestor'])}, where the teacher and every "
                     f'upstream model train, once per seed; descendant task: classes '
                     f"{list(tasks_['descendant'])}")
    for b in harness.label_budgets(config):
        lines.append(f'  label budget {b.fraction:.0%}: seeds {", ".join(map(str, b.seeds))}, '
                     f'Scratch swept at {b.steps:,} steps')
    paper = int(sc['patience']) <= 0
    wds = tuple(harness.get(sc, 'weight_decays', ()) or ()) if tasks_ else ()
    if paper:
        lines.append(f"Scratch: the paper's schedule at lr {values(sc['lrs'])}, one run per seed (S is "
                     'its length)')
    else:
        cap = int(harness.get(sc, 'max_steps', 0))
        steps = (f'{int(sc["steps"]):,} steps' if int(sc['steps'])
                 else f'{float(harness.get(sc, "epochs", 0)):g} epochs')
        if tasks_:
            lines += [f'upstream models trained to convergence (the teacher, source models): lr '
                      f"{values(sc['lrs'])} at weight decay {float(config['optim']['weight_decay']):g}, "
                      f"swept at {steps}, held-out accuracy on the source task's test images",
                      f"Scratch: lr {values(sc['lrs'])} × weight decay {values(wds)}, swept at each label "
                      "budget's steps, held-out accuracy on the validation images"]
        else:
            lines.append(f"Scratch and every upstream model trained to convergence: lr {values(sc['lrs'])}, "
                         f'swept at {steps}, held-out accuracy on the test images')
        lines.append(f'every sweep extended a grid step past an edge at most {scratch.EXTEND} times; '
                     + (f'each chosen setting doubled until twice the steps ends less than '
                        f'{float(sc["plateau"]) * 100:g} pt higher on held-out accuracy, up to {cap:,} steps'
                        if cap else 'none doubled (scratch.max_steps 0)'))
    fractions = ', '.join(f'{float(f):g}·S' for f in dc['fractions'])
    lrs = (f'lr {values(dc["lrs"])} (extended past an edge)' if harness.get(dc, 'lrs', None)
           else f'lr {float(dc["lr"]):g}')
    lines.append(f'descendants: {fractions} (the papers\' budgets)'
                 + (", and Scratch's own steps" if harness.get(dc, 'equal_budget', False) else '')
                 + f', at {lrs}')
    lines += ['', '| row | ' + ' | '.join(shape_text(s) for s in shapes) + ' |',
              '|---' * (len(shapes) + 1) + '|']
    for name, key in [('Scratch', 'scratch')] + [(label(r), r.name) for r in rows]:
        cells = [(f'{c.num_heads} heads, {costs.param_count(c) / 1e6:.2f} M' if isinstance(c, ViTConfig)
                  else f'cannot: {c}') for c in (table[key][s] for s in shapes)]
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def label(row: Row) -> str:
    """A row's name in tables and plots ('LeTra (step)', 'Mango (R=2)', 'He-LG')."""
    return row.recipe.label(row)


def check(config: Config) -> None:
    """The protocol's rules on a config, each a one-line ValueError before anything is read
    or written: Scratch sweeps ≥ 3 learning rates except in the paper configs; at least one
    seed, none repeated (a repeated seed is no replication); at least one method; budget
    fractions given and not negative (0: the initialisation alone); every method's family
    finds its config section; a study with two tasks names disjoint, non-empty class lists
    (`harness.check_tasks`); label budgets line up and none repeats (`harness.label_budgets`);
    every swept value (learning rates, weight decays) is a number, none repeated."""
    lrs = _sweep_values('scratch.lrs', config['scratch']['lrs'])
    paper = harness.get(config, 'scale', '') == 'paper'
    if not lrs or (len(lrs) < MIN_SWEEP and not paper):
        raise ValueError(f'study: scratch.lrs={lrs}: Scratch sweeps at least {MIN_SWEEP} '
                         "learning rates (only a 'paper' config follows the paper's single lr)")
    seeds = [int(s) for s in config['seeds']]
    if not seeds:
        raise ValueError('study: seeds is empty; give at least one seed (3 for a result)')
    if len(set(seeds)) != len(seeds):
        raise ValueError(f'study: seeds={tuple(seeds)} repeats a seed; a repeated seed is the '
                         'same run again, not a replication')
    if not tuple(config['methods']):
        raise ValueError('study: methods is empty; name at least one method to compare with Scratch')
    fractions = tuple(float(f) for f in config['descend']['fractions'])
    if not fractions:
        raise ValueError('study: descend.fractions is empty')
    if min(fractions) < 0:
        raise ValueError(f'study: descend.fractions={fractions} has a negative budget; give '
                         'fractions of S ≥ 0 (0: the initialisation alone)')
    harness.check_tasks(config)
    if harness.label_budgets(config):
        _check_transfer(config)
    for method in config['methods']:
        recipe = recipes.for_method(method)
        if recipe.section and recipe.section not in config:
            raise ValueError(f"study: {method} ({recipe.family} family) reads the config section "
                             f"'{recipe.section}', which the {config['experiment']} study lacks; "
                             f'{_studies_with(recipe.section, method)}')


def _sweep_values(name: str, values, *, positive: bool = True) -> tuple[float, ...]:
    """A swept setting's values as floats, or a one-line ValueError: a value that is not a
    number, not positive (a weight decay may be 0), or repeated."""
    if not isinstance(values, (tuple, list)):
        values = (values,)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))
           or not (v > 0 if positive else v >= 0)]
    if bad:
        raise ValueError(f'study: {name}={tuple(values)} has {bad[0]!r}; give '
                         + ('positive numbers' if positive else 'numbers ≥ 0'))
    if len(set(values)) != len(values):
        raise ValueError(f'study: {name}={tuple(values)} repeats a value')
    return tuple(float(v) for v in values)


def _check_transfer(config: Config) -> None:
    """A transfer study's own rules (fair_studies.md, "Transfer setting"): Scratch sweeps
    ≥ 2 weight decays, the descendants ≥ 3 learning rates, and nothing stops at the target
    (the target is read on test images; every choice reads the validation images)."""
    wds = _sweep_values('scratch.weight_decays', harness.get(config['scratch'], 'weight_decays', ()) or (),
                        positive=False)
    if len(wds) < 2:
        raise ValueError(f'study: scratch.weight_decays={wds}: with label budgets Scratch sweeps at '
                         'least 2 weight decays')
    lrs = _sweep_values('descend.lrs', harness.get(config['descend'], 'lrs', ()) or ())
    if len(lrs) < MIN_SWEEP:
        raise ValueError(f'study: descend.lrs={lrs}: with label budgets every method sweeps at '
                         f'least {MIN_SWEEP} learning rates on the first seed')
    if harness.get(config['descend'], 'stop_at_target', False):
        raise ValueError('study: descend.stop_at_target reads the test images; with label budgets '
                         'every choice reads the validation images: set it False')


def _studies_with(section: str, method: str) -> str:
    """Which bundled study configs run `method` (or, failing that, have `section`)."""
    from jlearngene.experiments import configs
    found, having = [], []
    for name in configs.names():
        try:
            c = configs.load(name)
        except (ValueError, TypeError):
            continue
        if section in c and 'methods' in c:
            having.append(name)
            if method in tuple(c['methods']):
                found.append(name)
    names = found or having
    if not names:
        return 'no bundled study has it'
    return 'run it with ' + ' or '.join(f'--config {n}:digits' for n in names)


# ----------------------------------------------------------------------------------------
# The study.

def run_experiment(config: Config, workdir: str, *, quiet: bool = False) -> dict:
    """Run the experiment `config` names (`jlearngene.experiments.<config.experiment>`'s
    `STUDY`); every experiment config goes through here (`jlearngene train`,
    `compare`). Returns the results, the Markdown table under 'table'."""
    return run(config, workdir, harness.module(config['experiment']).STUDY, quiet=quiet)


def _scratch_records(base: dict, shapes, ctx: harness.Context) -> list[dict]:
    out = []
    for shape in shapes:
        b, cfg = base[shape], ctx.scratch_cfgs[shape]
        for seed, r in b['runs'].items():
            out.append(dict(method='scratch', name='scratch', label='Scratch', shape=list(shape),
                            seed=seed, fraction=1.0, steps=r['steps'], steps_taken=r['steps'],
                            lr=r['lr'], plateau_step=r['plateau_step'], converged=r['converged'],
                            acc_init=None, acc=r['acc'], curve=r['curve'],
                            params=costs.param_count(cfg), extra_flops=0.0,
                            step_flops=ctx.step_flops(cfg),
                            finetune_flops=r['steps'] * ctx.step_flops(cfg), upstream=[],
                            **{k: r[k] for k in ('val', 'val_curve', 'acc_at_best_val', 'weight_decay',
                                                 'converged_at', 'doubling') if k in r}))
    return out


def run(config: Config, workdir: str, study: Study, *, quiet: bool = False) -> dict:
    """Run the study `config` declares (module docstring); returns the results (also written
    to `workdir` with the table and plot), the table under 'table'."""
    config = harness.plain(config)      # plain data from here on
    check(config)
    rows = make_rows(config)            # unknown methods fail before anything is written
    ctx = harness.Context(config, workdir, quiet=quiet, adjust=study.descendant_config)
    ctx.rows = rows
    used = [r for r in recipes.REGISTRY.values() if any(row.recipe is r for row in rows)]
    rows_of = {r.family: [row for row in rows if row.recipe is r] for r in used}
    for recipe in used:
        recipe.check(ctx, rows_of[recipe.family])
    ctx.plan, ctx.shapes = _plan(ctx, rows), study_shapes(config)
    for row in rows:                    # a row that makes nothing is no comparison
        reasons = list(ctx.plan[row.name].values())
        if all(isinstance(r, str) for r in reasons):
            raise ValueError(f'study: {row.name} makes none of the shapes {ctx.shapes}: {reasons[0]}')
    t_start = harness.prepare(config, workdir)
    with workdir_lock.hold_workdir(workdir):        # one process per workdir
        harness.claim_workdir(workdir, config)
        ctx.say(f"{config['experiment']} study in {workdir}: {len(rows)} rows, shapes {ctx.shapes}, seeds "
                f"{list(config['seeds'])}; data {ctx.dset.info.name} ({ctx.dset.num_examples} training "
                f"images) read from {harness.data_location(ctx.dset)}; each run prints a line as it starts "
                'training and as it finishes')
        return _run(config, workdir, study, ctx, rows, used, rows_of, t_start)


def _run(config: Config, workdir: str, study: Study, ctx: harness.Context, rows: list[Row],
         used: list, rows_of: dict, t_start: float) -> dict:
    seeds = [int(s) for s in config['seeds']]
    budgets = harness.label_budgets(config)
    ref = ctx.ref
    ref_shape = (ref.width, ref.depth)
    own_task = not ctx.two_tasks
    scratch_cfgs = dict(ctx.plan['scratch'])
    if own_task:
        scratch_cfgs.setdefault(ref_shape, ref)
    for recipe in used:
        for shape, cfg in recipe.scratch_shapes(ctx).items():
            scratch_cfgs.setdefault(shape, cfg)
    ctx.scratch_cfgs = scratch_cfgs
    # 1. Scratch, the target and S; the teacher (ancestor) is the reference shape's Scratch
    # run, on the ancestor's task where the study has two
    if not budgets:
        ctx.base = scratch.baseline(ctx, scratch_cfgs, seeds)
    if own_task:
        t_cfg, source = scratch_cfgs[ref_shape], ctx.base[ref_shape]
    else:
        t_cfg = harness.shape_configs(config, ref_shape, ctx.ancestor_dset.num_classes,
                                      study.descendant_config)[0]
        source = scratch.baseline(ctx, {ref_shape: t_cfg}, seeds, dset=ctx.ancestor_dset,
                                  tag='ancestor')[ref_shape]
    ctx.t_cfg, ctx.S_ref, ctx.teachers, ctx.source = t_cfg, source['S'], source['params'], source
    # 2. Upstream, per seed (before any descendant where the study has label budgets: every
    # budget's descendants share it)
    ups, upstream_flops = {}, {}
    for seed in (seeds if budgets else ()):
        ups[seed], upstream_flops[seed] = _upstream(ctx, workdir, used, rows_of, seed)
    # 3. Descendants, per seed
    if not budgets:
        records = _scratch_records(ctx.base, ctx.shapes, ctx)
        for seed in seeds:
            ups[seed], upstream_flops[seed] = _upstream(ctx, workdir, used, rows_of, seed)
            _descendants(ctx, rows, seed, ups[seed], records)
        out = _record(ctx, rows, seeds, records, upstream_flops, {s: u.info for s, u in ups.items()})
    else:
        out = dict(config=config, budgets={}, ancestor=_ancestor(ctx))
        for budget in budgets:
            ctx.dset = ctx.downstream(budget)
            ctx.base = scratch.baseline(ctx, scratch_cfgs, budget.seeds, steps=budget.steps,
                                        tag=f'scratch_l{budget.key}')
            records, ctx.descend_sweeps = _scratch_records(ctx.base, ctx.shapes, ctx), {}
            ctx.descend_extensions = {}
            pairs = upstream_seeds(seeds, budget.seeds)
            for seed in budget.seeds:
                _descendants(ctx, rows, seed, ups[pairs[seed]], records, label_key=budget.key)
            sub = _record(ctx, rows, list(budget.seeds), records,
                          {s: upstream_flops[pairs[s]] for s in budget.seeds},
                          {s: ups[pairs[s]].info for s in budget.seeds})
            sub.update(label_fraction=budget.fraction, labelled=ctx.dset.num_examples,
                       upstream_seed={str(s): pairs[s] for s in budget.seeds},
                       descend_sweeps=ctx.descend_sweeps, descend_extensions=ctx.descend_extensions)
            out['budgets'][budget.key] = sub
        out.update(timings=ctx.timings, reused=sorted(ctx.reused))
    out['seconds'] = time.perf_counter() - t_start
    out['data_read_from'] = harness.data_location(ctx.dset)
    return harness.write_results(finish(out, study.claims), workdir, report.markdown, report.plot)


def upstream_seeds(source_seeds, seeds) -> dict[int, int]:
    """{descendant seed: the source seed whose upstream it descends from}: the same seed where
    the source was trained with it, else the source seeds in turn (a label budget may run
    more seeds than the source task: its spread is then initialisation and data order)."""
    source_seeds = list(source_seeds)
    extra = [s for s in seeds if s not in source_seeds]
    return {s: s if s in source_seeds else source_seeds[extra.index(s) % len(source_seeds)] for s in seeds}


def _upstream(ctx: harness.Context, workdir: str, used: list, rows_of: dict, seed: int):
    """(Upstream, its training FLOPs by run) of one seed: the teacher, saved, then every
    recipe's upstream runs."""
    teacher, t_cfg = ctx.teacher(seed), ctx.t_cfg
    checkpoint.save_model(os.path.join(workdir, 'teacher', f'seed_{seed}'), teacher, t_cfg,
                          overwrite=True, extra={'kind': 'teacher', 'seed': seed})
    up = Upstream(genes={'teacher': teacher})
    for recipe in used:
        up.update(recipe.upstream(ctx, rows_of[recipe.family], seed))
    return up, dict(up.flops, teacher=ctx.source['runs'][seed]['steps'] * ctx.step_flops(t_cfg))


def _budgets(ctx: harness.Context, row: Row, shape, S: int, up: Upstream) -> list[tuple[float, int, float, str]]:
    """[(fraction of S, steps, lr, kind)] a descendant trains for: its recipe's paper budgets
    ('paper'), then, with `descend.equal_budget` (or a recipe that only has it, the
    ceiling), Scratch's own steps at that shape ('equal', the fraction those steps are of S)."""
    out = [(f, n, lr, 'paper') for f, n, lr in row.recipe.budgets(ctx, row, shape, S, up)]
    if row.recipe.equal_budget_only or harness.get(ctx.config['descend'], 'equal_budget', False):
        steps = int(ctx.base[shape]['steps'])
        out.append((round(steps / max(S, 1), 3), steps, float(ctx.config['descend']['lr']), 'equal'))
    return out


def _descendants(ctx: harness.Context, rows: list[Row], seed: int, up: Upstream, records: list,
                 *, label_key: str | None = None) -> None:
    """Every (row, shape) of the plan for one seed, at each of its budgets (`_budgets`),
    appended to `records`. With a label budget (`label_key`) the descendants' task holds
    validation images: on the budget's first seed each (row, shape, budget) sweeps
    `descend.lrs`, extended past an edge (`scratch.sweep`), and keeps the lr of the best final
    validation accuracy (`ctx.descend_sweeps`), which the later seeds use. An equal-budget run
    is evaluated at least `descend.equal_evals` times (its FLOPs to the target are read there)."""
    config, base = ctx.config, ctx.base
    gap = float(config['target_gap'])
    evals = int(config['descend']['evals'])
    equal_evals = max(evals, int(harness.get(config['descend'], 'equal_evals', evals)))
    stop = bool(harness.get(config['descend'], 'stop_at_target', False))
    lrs = tuple(float(x) for x in harness.get(config['descend'], 'lrs', ()) or ())
    validation = ctx.dset.has_validation
    for shape in ctx.shapes:
        S = base[shape]['S']
        key = jax.random.key(seed + 100 + 10 * shape[0] + shape[1]
                             + (1000 * shape[2] if len(shape) == 3 else 0))
        for row in rows:
            d_cfg = ctx.plan[row.name][shape]
            if isinstance(d_cfg, str):
                continue
            params0, extra = row.recipe.descendant(ctx, row, up, d_cfg, key, S, seed)
            acc0 = harness.accuracy(params0, d_cfg, ctx.dset)
            per_step = ctx.step_flops(d_cfg, params0)
            target = base[shape]['acc'] - gap
            # the fine-tuning run depends on its initial params (in its fingerprint), the
            # model and the batch: not the study, so another study's same run is reused
            identity = dict(model=d_cfg.to_dict(), batch_size=config['batch_size'],
                            eval_batch_size=config['eval_batch_size'])
            for fraction, steps, lr, kind in _budgets(ctx, row, shape, S, up):
                budget_tag = 'eq' if kind == 'equal' else f'f{fraction:g}'
                name = f'{row.tag}_{shape_key(shape)}_{budget_tag}_s{seed}'
                if label_key is not None:
                    name += f'_l{label_key}'

                tune = functools.partial(_tune, ctx, d_cfg=d_cfg, params0=params0, acc0=acc0,
                                         steps=steps, seed=seed,
                                         evals=equal_evals if kind == 'equal' else evals,
                                         stop_at=target if stop else None, identity=identity)
                sweep_key = f'{row.name} {shape_key(shape)} ' + ('equal' if kind == 'equal' else f'{fraction:g}')
                if lrs and steps:
                    if sweep_key not in ctx.descend_sweeps:
                        tried = {}

                        def score(x, name=name, tune=tune, tried=tried):
                            tried[x] = tune(f'{name}_lr{x:g}', lr=x)
                            return _final(tried[x][1] or tried[x][0])

                        found = scratch.sweep(lrs, score)
                        ctx.descend_sweeps[sweep_key] = {f'{x:g}': v for x, v in found.scores.items()}
                        ctx.descend_extensions[sweep_key] = dict(extensions=found.extensions,
                                                                 at_cap=found.at_cap)
                        lr = found.choice
                        curve, val = tried[lr]
                    else:
                        sweep = ctx.descend_sweeps[sweep_key]
                        lr = float(max(sweep, key=sweep.get))
                        curve, val = tune(f'{name}_lr{lr:g}', lr=lr)
                else:
                    curve, val = tune(name, lr=lr)
                taken = curve[-1][0]
                rec = dict(method=row.method, name=row.name, label=label(row), shape=list(shape),
                           seed=seed, fraction=fraction, budget=kind, steps=steps, steps_taken=taken,
                           lr=lr, acc_init=acc0, acc=curve[-1][1], curve=curve,
                           params=costs.param_count(params0), extra_flops=extra, step_flops=per_step,
                           finetune_flops=taken * per_step,
                           upstream=list(row.recipe.billed_at(row, shape)))
                if validation and val:
                    best = max(range(len(val)), key=lambda i: val[i][1])
                    rec.update(val=val[-1][1], val_curve=val, acc_at_best_val=curve[1:][best][1])
                records.append(rec)
                what = 'Scratch\'s steps' if kind == 'equal' else f'{fraction:g}·S'
                ctx.say(f'des {shape_text(shape)} {label(row):<20} seed {seed} '
                        f'{what} = {steps} steps (lr {lr:g}): {acc0:.4f} -> {curve[-1][1]:.4f}')


def _tune(ctx: harness.Context, name: str, *, d_cfg: ViTConfig, params0, acc0: float, steps: int,
          lr: float, seed: int, evals: int, stop_at: float | None, identity=None):
    """(test curve from the initialisation on, validation curve or None) of one fine-tuning
    run; none where the budget is 0 or the initialisation is at the target already."""
    curve, val = [(0, acc0)], None
    if steps and not (stop_at is not None and acc0 >= stop_at):
        _, tuned = ctx.fit(name, tasks.classification_loss(d_cfg), params0, harness.eval_fn(d_cfg),
                           steps=steps, lr=lr, seed=seed + 7, eval_every=max(1, steps // evals),
                           stop_at=stop_at, identity=identity)
        curve += tuned
        val = ctx.val_curves.get(name)
    return curve, val


def _final(curve) -> float:
    return curve[-1][1]


def _ancestor(ctx: harness.Context) -> dict | None:
    if not ctx.two_tasks:
        return None
    return dict(classes=list(ctx.ancestor_dset.classes), descendant_classes=list(ctx.dset.classes),
                **{k: v for k, v in ctx.source.items() if k not in ('params', 'runs')})


def _upstream_models(ctx: harness.Context) -> dict:
    """{'upstream_models': {'source w32_d4': its baseline without params}} for the models
    trained to convergence besides the teacher (`scratch.UPSTREAM_MODELS`); {} where none."""
    made = ctx.memo.get(scratch.UPSTREAM_MODELS)
    if not made:
        return {}
    return {'upstream_models': {name: {k: v for k, v in b.items() if k not in ('params', 'runs')}
                                for name, b in made.items()}}


def _record(ctx: harness.Context, rows: list[Row], seeds: list[int], records: list,
            upstream_flops: dict, infos: dict) -> dict:
    """One study's (or one label budget's) record, as results.json holds it."""
    ref, base = ctx.ref, ctx.base
    return dict(
        config=ctx.config, shapes=[list(s) for s in ctx.shapes], seeds=seeds,
        rows_spec=[r.name for r in rows], labels={r.name: label(r) for r in rows},
        cannot={r.name: {shape_key(s): v for s, v in ctx.plan[r.name].items() if isinstance(v, str)}
                for r in rows},
        reference=dict(width=ref.width, depth=ref.depth, S=ctx.S_ref),
        scratch={shape_key(s): {k: v for k, v in base[s].items() if k not in ('params', 'runs')}
                 for s in base},
        ancestor=_ancestor(ctx),
        **_upstream_models(ctx),
        upstream_flops={str(k): v for k, v in upstream_flops.items()},
        info={str(k): v for k, v in infos.items()},
        rows=records, timings=ctx.timings, reused=sorted(ctx.reused))


def finish(recorded: dict, claims) -> dict:
    """`results.finish` of a record, or of each label budget's record in a transfer study,
    each budget given the whole study's wall time and run timings (upstream included)."""
    if 'budgets' not in recorded:
        return results.finish(recorded, claims)
    for sub in recorded['budgets'].values():
        sub.update({k: recorded[k] for k in ('seconds', 'timings', 'reused') if k in recorded})
        results.finish(sub, claims)
    return recorded


def render(workdir: str, out: str | None = None) -> dict:
    """Recompute a recorded study's summary, verdicts, `results.md` and plot from its
    `results.json` (nothing is trained), written to `out` (default `workdir`, so a read-only
    record renders elsewhere); returns the results. A file that is not a study's record, or
    whose fields do not fit together, is a one-line `results.ResultsError` naming it and its
    first bad field (`results.read`), before anything renders."""
    recorded = results.read(workdir)
    path = os.path.join(workdir, 'results.json')
    claims = results.claims(recorded, path)
    recorded.pop('table', None)
    if out is not None:
        os.makedirs(out, exist_ok=True)
    return harness.write_results(finish(recorded, claims), out or workdir, report.markdown, report.plot)
