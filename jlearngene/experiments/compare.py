"""Every method and baseline on one task at one budget (config:
`jlearngene/experiments/configs/compare.py`; `jlearngene compare`).

`PART.run` runs, from the harness's pieces and the other experiments' parts:

1. **plan** (`plan`, shapes only, nothing trained): for every method of `config.methods`
   and every descendant shape (width, depth) of `config.shapes`, the descendant config the
   method makes, or the reason (its GeneError) why it cannot. A shape is a width and a
   depth with MLP `mlp_ratio` × width; the head split is the method's: whole heads of the
   model section's head_dim, else (Scala, whose sub-networks keep every head) the model
   section's head count. Both splits have the same Params and FLOPs.
   `on_missing='error'` turns a shape a method cannot make into a one-line error.
2. **upstream**, each trained once and counted for every method that uses it: the teacher
   (ancestor) at the model section's shape (TLEG, Share-Init and LeTra distil from it;
   Cluster-Learngene, He-LG, Auto-LG, Pre-Fin and IMwLM take their gene from it); the TLEG,
   Share-Init and LeTra genes through Aux-Nets of the teacher's shape (`harness.distil`);
   Scala's slimmable network (warm-up, then `slimmable.scala_loss`); Cluster-Learngene's
   mean attention distance pass and clusters; the small model that Net2Net, StackBERT,
   bert2BERT, LiGO and Mango grow.
3. **descendants**: every possible (method, shape), initialised by the method (Mango and
   LiGO first train an operator per shape: `experiments.mango.train_operator`, a
   per-descendant cost), evaluated, fine-tuned `descend.steps` with the same optimiser.
4. **costs** (`summarise`): a method's upstream FLOPs U (`costs.training_cost`), its FLOPs
   per descendant (operator + fine-tuning), U amortised over its descendants, and the
   FLOPs each descendant needs to reach Scratch's final accuracy at its shape c (linear
   between evaluations, `mango.reach`); against Scratch's own c_s on the same shapes the
   break-even count N* = the least N with U + N·c < N·c_s (`break_even`).

Writes results.json, results.md (`markdown`: one table), accuracy_vs_flops.png and
break_even.png (`plot`), and one training log per run under runs/.
"""
from __future__ import annotations

import functools
import math
import os
import time
from typing import Any, Sequence

import jax
import numpy as np

from jlearngene import compiler, costs, genes
from jlearngene.experiments import cluster as cluster_exp
from jlearngene.experiments import harness
from jlearngene.experiments import mango as mango_exp
from jlearngene.genes import cluster, letra, scala
from jlearngene.models import ViTConfig, init, vit
from jlearngene.train import slimmable, tasks

TEACHER_GENES = ('cluster', 'he_lg', 'auto_lg', 'pre_fin', 'imwlm')   # gene from the teacher
DISTILLED = ('tleg', 'share_init', 'letra')                          # gene through an Aux-Net
GROWN = ('net2net', 'stackbert', 'bert2bert')                         # the small model, one shot
OPERATORS = ('mango', 'ligo')                                         # an operator per shape
KNOWN = ('scratch',) + DISTILLED + ('scala',) + TEACHER_GENES + GROWN + OPERATORS
# descend options every run of a method gets (same task: a gene's head is inherited)
DESCEND = {'tleg': {'head': 'inherit'}, 'share_init': {'head': 'inherit'},
           'letra': {'head': 'inherit'}, 'cluster': {'head': 'inherit'},
           'pre_fin': {'head': 'inherit'}, 'imwlm': {'head': 'inherit'}}


def upstream_names(method: str) -> tuple[str, ...]:
    """The upstream runs whose cost is `method`'s (the teacher counts for each user)."""
    if method in DISTILLED:
        return ('teacher', f'aux_{method}')
    if method == 'cluster':
        return ('teacher', 'attention_distance')
    if method in TEACHER_GENES:
        return ('teacher',)
    if method in GROWN + OPERATORS:
        return ('small',)
    return ('scala',) if method == 'scala' else ()


def label(method: str, config) -> str:
    """The method's name in the table and plots."""
    if method == 'mango':
        return f"Mango (R={_options(config, method)['gene'].get('rank', 1)})"
    return genes.get(method).label


def _options(config, method: str) -> dict[str, dict]:
    """`config.method_options.<method>` as {'gene': {...}, 'descend': {...}}, the method's
    fixed descend options (`DESCEND`) under the configured ones."""
    opts = harness.plain(harness.get(config, 'method_options', {}).get(method, {})) or {}
    unknown = sorted(set(opts) - {'gene', 'descend'})
    if unknown:
        raise ValueError(f"compare: method_options.{method} has {unknown}; it takes 'gene' and "
                         "'descend' sections")
    return {'gene': dict(opts.get('gene', {})),
            'descend': {**DESCEND.get(method, {}), **opts.get('descend', {})}}


# ----------------------------------------------------------------------------------------
# Shapes and the plan.

def reference_config(config, num_classes: int) -> ViTConfig:
    """The teacher's (and Aux-Nets', slimmable network's) config: the model section at
    `config.depth`."""
    return harness.model_config(config, config['depth'], num_classes)


def small_config(config, num_classes: int) -> ViTConfig:
    """The small model that the growth methods grow (`config.small`'s shape)."""
    s = config['small']
    return reference_config(config, num_classes).replace(
        width=s['width'], num_heads=s['num_heads'], mlp_dim=s['mlp_dim'], depth=s['depth'])


def shape_configs(config, width: int, depth: int, num_classes: int) -> tuple[ViTConfig, ...]:
    """The head splits of the shape (width, depth): whole heads of the model section's
    head_dim, then the model section's head count; MLP `mlp_ratio` × width."""
    ref = reference_config(config, num_classes)
    mlp = int(config['mlp_ratio']) * width
    out = []
    if width % ref.head_dim == 0:
        out.append(ref.replace(width=width, num_heads=width // ref.head_dim, head_dim=ref.head_dim,
                               mlp_dim=mlp, depth=depth))
    if width % ref.num_heads == 0:
        cfg = ref.replace(width=width, head_dim=width // ref.num_heads, mlp_dim=mlp, depth=depth)
        if cfg not in out:
            out.append(cfg)
    if not out:
        raise ValueError(f'compare: shape (width {width}, depth {depth}) splits neither into '
                         f'heads of {ref.head_dim} nor into {ref.num_heads} heads')
    return tuple(out)


def _he_lg_k(config, method: str, depth: int, teacher_depth: int) -> int:
    k = _options(config, method)['gene'].get('k') or math.ceil(depth / 2)
    return min(int(k), teacher_depth, depth)


def gene_options(config, method: str, target: ViTConfig, ref: ViTConfig) -> dict:
    """Keyword options of the method's gene for a descendant `target` (for Mango and LiGO:
    of the operator's initialisation; for LeTra: of the learngene)."""
    opts = dict(_options(config, method)['gene'])
    if method in ('he_lg', 'auto_lg'):
        opts['k'] = _he_lg_k(config, method, target.depth, ref.depth)
    if method == 'letra':
        opts.update(learngene_heads=config['aux']['learngene_heads'],
                    learngene_depth=config['aux']['learngene_depth'])
    if method == 'scala':
        opts = {}
    return opts


def _descend_options(config, method: str) -> dict:
    opts = dict(_options(config, method)['descend'])
    if method == 'scala':
        opts.update(rule=config['slim']['rule'], smallest=float(config['slim']['smallest']))
    return opts


def _gene_shapes(config, method: str, target: ViTConfig, ref: ViTConfig, small: ViTConfig):
    """The method's gene as shapes, for the plan's checks (nothing allocated)."""
    m = genes.get(method)
    opts = gene_options(config, method, target, ref)
    if method == 'scratch':
        return None
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


def plan(config, num_classes: int) -> dict[str, dict[tuple[int, int], Any]]:
    """{method: {(width, depth): the descendant ViTConfig, or the reason (str) it cannot be
    made}} from shapes alone. Unknown methods, and with `on_missing='error'` any shape a
    method cannot make, are a one-line ValueError naming them."""
    methods = tuple(config['methods'])
    unknown = [m for m in methods if m not in KNOWN]
    if unknown:
        raise ValueError(f'compare: unknown method {unknown[0]!r}; known: {", ".join(KNOWN)}')
    if len(set(methods)) != len(methods):
        raise ValueError(f'compare: methods {methods} repeat a method')
    ref, small = reference_config(config, num_classes), small_config(config, num_classes)
    mode = harness.get(config, 'on_missing', 'mark')
    if mode not in ('mark', 'error'):
        raise ValueError(f"compare: on_missing={mode!r}; expected 'mark' or 'error'")
    shapes = [tuple(int(x) for x in s) for s in config['shapes']]
    out: dict[str, dict] = {}
    for method in methods:
        m, opts = genes.get(method), _descend_options(config, method)
        out[method] = {}
        for width, depth in shapes:
            reason = None
            for cfg in shape_configs(config, width, depth, num_classes):
                try:
                    gene = _gene_shapes(config, method, cfg, ref, small)
                    jax.eval_shape(lambda g, c=cfg: m.descend(g, c, key=jax.random.key(0), **opts),
                                   gene)
                except genes.GeneError as e:
                    reason = reason or str(e)
                    continue
                out[method][(width, depth)] = cfg
                break
            else:
                out[method][(width, depth)] = reason
                if mode == 'error':
                    raise ValueError(f'compare: {method} cannot make the shape (width {width}, '
                                     f'depth {depth}): {reason}')
    return out


# ----------------------------------------------------------------------------------------
# Cost arithmetic (pure functions of numbers).

def total_cost(upstream: float, per_descendant: float, n: int) -> float:
    """Training FLOPs of `n` descendants: the upstream runs once plus n descendants."""
    return upstream + n * per_descendant


def break_even(upstream: float, per_descendant: float, scratch_per_descendant: float) -> int | None:
    """The least number of descendants N ≥ 1 at which a method (upstream U, c per
    descendant) costs less than Scratch (c_s per descendant): U + N·c < N·c_s; None when
    c ≥ c_s (never)."""
    saving = scratch_per_descendant - per_descendant
    if saving <= 0:
        return None
    return max(1, math.floor(upstream / saving) + 1)


def reach_flops(curve: Sequence[tuple[int, float]], start: float, per_step: float,
                target: float) -> float | None:
    """Training FLOPs at which a descendant's curve [(step, accuracy)] first reaches
    `target`: `start` (its per-descendant extra, e.g. an operator) plus the steps taken,
    linear between evaluations; None if it never does."""
    return mango_exp.reach([(start + s * per_step, a) for s, a in curve], target)


def summarise(rows: list[dict], upstream: dict[str, float], methods: Sequence[str]) -> list[dict]:
    """One record per method from the descendant rows: descendants made, mean accuracies
    (and the mean difference to Scratch on the same shapes), Params, upstream FLOPs U,
    FLOPs per descendant c (operator + fine-tuning), U amortised over the descendants made,
    FLOPs per descendant to Scratch's final accuracy at its shape, and the break-even N."""
    made = [r for r in rows if r['made']]
    scratch = {r['shape']: r for r in made if r['method'] == 'scratch'}
    out = []
    for method in methods:
        mine = [r for r in made if r['method'] == method]
        n = len(mine)
        up = sum(upstream.get(u, 0.0) for u in upstream_names(method))
        s = dict(method=method, descendants=n, shapes=len([r for r in rows if r['method'] == method]),
                 upstream_flops=up)
        if not n:
            out.append(s)
            out[-1].update(acc_init=None, acc=None)
            continue
        per = [r['extra_flops'] + r['finetune_flops'] for r in mine]
        s.update(acc_init=float(np.mean([r['acc_init'] for r in mine])),
                 acc=float(np.mean([r['acc'] for r in mine])),
                 params=float(np.mean([r['params'] for r in mine])),
                 per_descendant_flops=float(np.mean(per)), amortised_flops=up / n + float(np.mean(per)))
        same = [r for r in mine if r['shape'] in scratch]
        if same and method != 'scratch':
            s['acc_vs_scratch'] = float(np.mean([r['acc'] - scratch[r['shape']]['acc'] for r in same]))
        reach = [r.get('reach_flops') for r in mine]
        if len(same) == n and all(x is not None for x in reach):
            s['reach_flops'] = float(np.mean(reach))
            s['scratch_reach_flops'] = float(np.mean([scratch[r['shape']]['reach_flops'] for r in mine]))
            s['break_even'] = break_even(up, s['reach_flops'], s['scratch_reach_flops'])
        elif len(same) == n:
            s['not_reached'] = [list(r['shape']) for r in mine if r.get('reach_flops') is None]
        out.append(s)
    return out


# ----------------------------------------------------------------------------------------
# The run.

@functools.lru_cache(maxsize=None)
def _jit_descend(method: str, cfg: ViTConfig, options: tuple):
    """The method's descend for `cfg`, compiled once (eagerly, every op compiles alone) and
    quickly (`compiler.run_once_jit`)."""
    fn = functools.partial(genes.get(method).descend, target_cfg=cfg, **dict(options))
    return compiler.run_once_jit(lambda gene, key: fn(gene, key=key),
                                 lambda gene, key: vit.block_elements(cfg))


def _stored(method: str, genes_used: dict) -> int:
    """S-Params: the parameters stored for all of a method's descendants (each distinct
    gene once; Mango and LiGO store the small model once and one operator per shape)."""
    m = genes.get(method)
    if method in OPERATORS:
        items = list(genes_used.values())
        if not items:
            return 0
        gene, head = items[0]
        small = m.gene_param_count({'small': gene['small'], 'operator': {}}, include_head=head)
        return small + sum(m.gene_param_count(g, include_head=h) - m.gene_param_count(
            {'small': g['small'], 'operator': {}}, include_head=h) for g, h in items)
    return sum(m.gene_param_count(g, include_head=h) for g, h in genes_used.values() if g is not None)


def run(config, workdir: str, quiet: bool = False) -> dict:
    """The comparison (module docstring); returns the results with the table."""
    t_start = harness.prepare(config, workdir)
    dset = harness.Data(config)
    K, bs, seed, n = dset.num_classes, config['batch_size'], config['seed'], dset.num_examples
    methods = tuple(config['methods'])
    the_plan = plan(config, K)
    say = functools.partial(harness.say, quiet=quiet)
    needed = {u for m in methods for u in upstream_names(m)}
    ref, small_cfg = reference_config(config, K), small_config(config, K)
    lr = config['optim']['lr']
    runs: list[costs.Run] = []
    upstream: dict[str, float] = {}
    timings: dict[str, float] = {}
    info: dict[str, Any] = {}

    def fit(name, loss_fn, params, steps, eval_fn, *, lr=lr, seed_offset=0):
        params, curve, secs = harness.fit(name, loss_fn, params, eval_fn, dset, steps=steps,
                                          lr=lr, config=config, workdir=workdir,
                                          seed=seed + seed_offset, eval_every=None)
        timings[name] = secs
        say(f'{name:<14} {steps:>4} steps: test accuracy {curve[-1][1]:.4f} ({secs:.0f}s)')
        return params, curve[-1][1]

    # 1. Upstream: teacher, distilled genes, the slimmable network, clusters, small model.
    teacher = None
    if needed & {'teacher'}:
        steps = harness.budget(config['teacher'], n, bs, 'teacher')
        teacher, info['teacher_accuracy'] = fit('teacher', tasks.classification_loss(ref), init(ref, jax.random.key(seed)),
                                                steps, harness.eval_fn(ref))
        runs.append(costs.Run('teacher', ref, steps * bs / n, n))
    learned = {}
    for method in (m for m in methods if m in DISTILLED):
        mt = genes.get(method)
        gene0 = mt.init_gene(ref, jax.random.key(seed + 1), **gene_options(config, method, ref, ref))
        learned[method], acc, secs, steps = harness.distil(
            f'aux_{method}', lambda g, mt=mt: mt.materialize(g, None, ref), gene0, teacher, ref, ref,
            dset, config, workdir, decay=letra.DECAY if method == 'letra' else None)
        timings[f'aux_{method}'], info[f'aux_{method}_accuracy'] = secs, acc
        runs.append(costs.Run(f'aux_{method}', ref, steps * bs / n, n, teacher=ref))
        say(f'aux_{method:<10} {steps:>4} steps: Aux-Net test accuracy {acc:.4f} ({secs:.0f}s)')
    if 'scala' in methods:
        learned['scala'], scala_runs = _train_scala(config, ref, fit, bs, n, seed)
        runs += scala_runs
    if 'cluster' in methods:
        learned['cluster'], upstream['attention_distance'], info['clusters'] = _cluster_gene(
            config, teacher, ref)
        say(f"clusters       centroids per layer {info['clusters']}")
    small = None
    if needed & {'small'}:
        steps = harness.budget(config['small'], n, bs, 'small')
        small, info['small_accuracy'] = fit('small', tasks.classification_loss(small_cfg),
                                            init(small_cfg, jax.random.key(seed + 2)), steps,
                                            harness.eval_fn(small_cfg))
        runs.append(costs.Run('small', small_cfg, steps * bs / n, n))
    cost = costs.training_cost(runs)
    for r in cost['runs']:
        upstream[r['name'].split('#')[0]] = upstream.get(r['name'].split('#')[0], 0.0) + r['flops']

    # 2. Descendants: every (method, shape) the plan allows, the same fine-tuning.
    dc = config['descend']
    d_steps = harness.budget(dc, n, bs, 'descend')
    rows, stored = [], {m: {} for m in methods}
    for width, depth in (tuple(int(x) for x in s) for s in config['shapes']):
        key = jax.random.key(seed + 100 + 10 * width + depth)
        for method in methods:
            d_cfg = the_plan[method][(width, depth)]
            base = dict(method=method, label=label(method, config), shape=(width, depth))
            if isinstance(d_cfg, str):
                rows.append(dict(base, made=False, reason=d_cfg))
                continue
            params0, extra, gene, head = _descendant(method, d_cfg, key, config, learned, teacher,
                                                     ref, small, small_cfg, dset, workdir, quiet,
                                                     timings)
            stored[method][_gene_key(method, d_cfg, config, ref)] = (gene, head)
            acc0 = harness.accuracy(params0, d_cfg, dset)
            name = f'w{width}_d{depth}_{method}'
            _, curve, secs = harness.fit(name, tasks.classification_loss(d_cfg), params0, harness.eval_fn(d_cfg), dset,
                                         steps=d_steps, lr=dc['lr'], config=config,
                                         workdir=workdir, seed=seed + 7,
                                         eval_every=harness.get(dc, 'eval_every', 0))
            timings[name] = secs
            ft = costs.training_cost([costs.Run(name, d_cfg, d_steps * bs / n, n)])['flops']
            rows.append(dict(base, made=True, heads=d_cfg.num_heads, head_dim=d_cfg.head_dim,
                             acc_init=acc0, acc=curve[-1][1], curve=[(0, acc0)] + curve,
                             params=costs.param_count(params0),
                             flops=costs.flops_per_image(d_cfg, params0), finetune_flops=ft,
                             extra_flops=extra, seconds=secs))
            say(f'w{width} L{depth} {label(method, config):<12}: init {acc0:.4f} -> '
                f'{curve[-1][1]:.4f} after {d_steps} steps ({secs:.0f}s)')

    add_reach(rows, d_steps)
    results = dict(config=harness.plain(config), shapes=[list(map(int, s)) for s in config['shapes']],
                   methods=list(methods), labels={m: label(m, config) for m in methods},
                   finetune_steps=d_steps, batch_size=bs, rows=rows, upstream=upstream,
                   upstream_runs=cost['runs'], info=info, timings=timings,
                   s_params={m: _stored(m, stored[m]) for m in methods})
    results['summary'] = summarise(rows, upstream, methods)
    for s in results['summary']:
        s['s_params'] = results['s_params'][s['method']]
    results['seconds'] = time.perf_counter() - t_start
    return harness.write_results(results, workdir, markdown(results), plot)


def _gene_key(method: str, cfg: ViTConfig, config, ref: ViTConfig) -> str:
    """Descendants whose genes are the same share a key (S-Params count it once)."""
    if method in OPERATORS:
        return f'{cfg.width}x{cfg.depth}'
    return repr(sorted(gene_options(config, method, cfg, ref).items()))


def _train_scala(config, ref: ViTConfig, fit, bs: int, n: int, seed: int):
    """Scala's slimmable network (`experiments.scala`'s stage 1 without a teacher): warm-up
    of the full width, then the four-width loss; returns (params, its costs.Run plan)."""
    sc = config['slim']
    rule, smallest = sc['rule'], float(sc['smallest'])
    grid = scala.width_grid(smallest, sc['granularity'])
    upper, lower = scala.stable_halves(grid)
    warm, main = int(sc['warmup_steps']), int(sc['steps'])
    params = init(ref, jax.random.key(seed + 3))
    full_eval = harness.eval_fn(ref)
    if warm:
        params, _ = fit('scala_warmup', slimmable.full_loss(ref, rule=rule), params, warm, full_eval,
                        lr=config['optim']['lr'] * float(sc['warmup_lr_factor']))
    loss = slimmable.scala_loss(ref, grid, rule=rule, ce_weight=sc['ce_weight'],
                                transfer=sc['transfer'], isolated=sc['isolated'])
    params, _ = fit('scala', loss, params, main, full_eval)
    sub = {r: scala.subnet_config(ref, r, rule=rule) for r in grid}
    plan_ = [(sub[1.0], warm + main), (sub[smallest], main)]
    plan_ += [(sub[r], main / len(upper)) for r in upper] + [(sub[r], main / len(lower)) for r in lower]
    return params, [costs.Run(f'scala#{i}', c, s * bs / n, n) for i, (c, s) in enumerate(plan_) if s]


def _cluster_gene(config, teacher, ref: ViTConfig):
    """Cluster-Learngene's gene from the teacher: mean attention distances over
    `cluster.images` training images, density clusters at `cluster.eps`; returns (gene, the
    distance pass's FLOPs, centroid counts per layer)."""
    cc = config['cluster']
    images = cluster_exp.TaskData(config, range(ref.num_classes))
    n_mad = min(int(cc['images']), images.num_examples)
    mad = cluster.mean_attention_distance(teacher, ref, images.raw_batches(n_mad, config['eval_batch_size']),
                                          mean=images.mean, std=images.std)
    clusters = cluster.cluster_heads(mad, cc['eps'], cc['min_heads'])
    gene = cluster.gene_from_model(teacher, ref, clusters=clusters, ffn=cc['ffn'])
    return gene, float(costs.flops_per_image(ref) * n_mad), [len(c.centroids) for c in clusters]


def _descendant(method, d_cfg, key, config, learned, teacher, ref, small, small_cfg, dset,
                workdir, quiet, timings):
    """(params0, per-descendant extra FLOPs, the gene, whether its head is stored)."""
    opts = _descend_options(config, method)
    head = opts.get('head', 'inherit' if method in GROWN + OPERATORS else 'new') == 'inherit'
    if method in OPERATORS:
        gopts = gene_options(config, method, d_cfg, ref)
        name = f'w{d_cfg.width}_d{d_cfg.depth}_{method}'
        params0, operator, secs, steps, g_flops = mango_exp.train_operator(
            name, method, gopts, small, small_cfg, d_cfg, dset, config, workdir, quiet)
        timings[f'operator_{name}'] = secs
        step = costs.training_cost([costs.Run('step', d_cfg, config['batch_size'] / dset.num_examples,
                                              dset.num_examples)])['flops']
        extra = steps * (step + costs.TRAIN_FACTOR * g_flops)
        return params0, float(extra), {'small': small, 'operator': operator}, True
    if method in learned:
        gene = learned[method]
    elif method in TEACHER_GENES:
        gene = genes.get(method).gene_from_model(teacher, ref, **gene_options(config, method, d_cfg, ref))
    elif method in GROWN:
        gene = small
    else:
        gene = None
    params0 = _jit_descend(method, d_cfg, tuple(sorted(opts.items())))(gene, key)
    return params0, 0.0, gene, head


def add_reach(rows: list[dict], steps: int) -> None:
    """Each made row's FLOPs to reach Scratch's final accuracy at its shape (`reach_flops`,
    None if it never does; Scratch's own: where its curve first reaches its final value)."""
    scratch = {r['shape']: r['acc'] for r in rows if r['made'] and r['method'] == 'scratch'}
    for r in rows:
        if r['made'] and r['shape'] in scratch:
            r['target'] = scratch[r['shape']]
            r['reach_flops'] = reach_flops(r['curve'], r['extra_flops'], r['finetune_flops'] / steps,
                                           r['target'])


# ----------------------------------------------------------------------------------------
# Reporting.

def _g(x) -> str:
    return '–' if x is None else f'{x / 1e9:.1f}'


def markdown(results: dict) -> str:
    """One table: a row per method; per-shape cells 'init → tuned' or 'cannot (k)'."""
    shapes = [tuple(s) for s in results['shapes']]
    rows = results['rows']
    params = {tuple(r['shape']): r['params'] for r in rows if r['made'] and r['method'] == 'scratch'}
    head = ['method', 'made', 'acc. init (mean)', 'acc. tuned (mean)', 'Δ tuned vs Scratch']
    head += [f"w{w} L{d}" + (f" ({params[(w, d)] / 1e6:.3f} M)" if (w, d) in params else '')
             for w, d in shapes]
    head += ['Params (M, mean)', 'S-Params (M)', 'upstream (GFLOPs)', 'per descendant (GFLOPs)',
             'amortised per descendant (GFLOPs)', "to Scratch's acc. per descendant (GFLOPs)",
             'beats Scratch from N =']
    reasons: list[str] = []
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for s in results['summary']:
        m = s['method']
        cells = []
        for shape in shapes:
            r = next(x for x in rows if x['method'] == m and tuple(x['shape']) == shape)
            if r['made']:
                cells.append(f"{r['acc_init']:.3f} → **{r['acc']:.3f}**")
            else:
                reasons.append(f"{results['labels'][m]} at w{shape[0]} L{shape[1]}: {r['reason']}")
                cells.append(f'cannot ({len(reasons)})')
        f3 = lambda x: '–' if x is None else f'{x:.3f}'   # noqa: E731
        d = s.get('acc_vs_scratch')
        if m == 'scratch':
            be = '–'
        elif 'break_even' in s:
            be = 'never' if s['break_even'] is None else str(s['break_even'])
        elif 'not_reached' in s:
            be = 'not reached at ' + ', '.join(f'w{w} L{dd}' for w, dd in s['not_reached'])
        else:
            be = '–'
        lines.append('| ' + ' | '.join(
            [results['labels'][m], f"{s['descendants']}/{s['shapes']}", f3(s['acc_init']),
             f3(s['acc']), '–' if d is None else f'{d:+.3f}'] + cells
            + [f3(s.get('params', 0) / 1e6 if s['descendants'] else None),
               f"{s['s_params'] / 1e6:.3f}", _g(s['upstream_flops']),
               _g(s.get('per_descendant_flops')), _g(s.get('amortised_flops')),
               _g(s.get('reach_flops')), be]) + ' |')
    info = results['info']
    up = results['upstream']
    lines += ['', f"Descendants fine-tuned {results['finetune_steps']} steps each (batch "
              f"{results['batch_size']}, the same optimiser); cells: test accuracy at "
              'initialisation → after fine-tuning. Upstream: ' + ', '.join(
                  f'{k} {v / 1e9:.1f} GFLOPs' for k, v in up.items()) + '; ' + ', '.join(
                  f'{k.replace("_accuracy", "")} accuracy {v:.4f}' for k, v in info.items()
                  if k.endswith('_accuracy')) + '.']
    if reasons:
        lines += ['', 'Shapes a method cannot make:', ''] + [f'{i + 1}. {t}' for i, t in enumerate(reasons)]
    lines += ['', f"Wall time {results['seconds']:.0f}s. Δ: mean tuned accuracy minus Scratch's "
              'on the same shapes. S-Params: parameters stored for all the method\'s descendants '
              '(each distinct gene once; heads when inherited). Costs: 3x forward FLOPs per '
              'training image (`costs.training_cost`); upstream counts every run the method '
              'needs (the teacher once per method that uses it); per descendant: fine-tuning plus '
              "Mango's / LiGO's operator training; amortised = upstream / descendants made + per "
              "descendant. \"To Scratch's acc.\": FLOPs until the descendant first reaches "
              "Scratch's final accuracy at its shape (linear between evaluations); N: the least "
              "number of descendants at which upstream + N x that is below Scratch's N x its own."]
    return '\n'.join(lines)


def plot(results: dict, workdir: str) -> list[str]:
    """accuracy_vs_flops.png (a panel per shape; x = the method's upstream amortised over its
    descendants + operator + fine-tuning so far, log axis) and break_even.png (total
    training FLOPs against the number of descendants, a panel per method against Scratch
    on the same shapes, N* marked); returns their paths."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    shapes = [tuple(s) for s in results['shapes']]
    summary = {s['method']: s for s in results['summary']}
    steps = results['finetune_steps']
    paths = []
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.4 * len(shapes), 3.3), squeeze=False, sharey=True)
    for ax, shape in zip(axes[0], shapes):
        for r in (r for r in results['rows'] if r['made'] and tuple(r['shape']) == shape):
            s = summary[r['method']]
            start = s['upstream_flops'] / s['descendants'] + r['extra_flops']
            pts = [((start + st * r['finetune_flops'] / steps) / 1e9, a) for st, a in r['curve']]
            pts = [p for p in pts if p[0] > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', ms=2.5, label=r['label'],
                    color=f"C{results['methods'].index(r['method']) % 10}")   # one colour per method
        ax.set_xscale('log')
        ax.set_title(f'width {shape[0]}, depth {shape[1]}', fontsize=9)
        ax.set_xlabel('GFLOPs per descendant (amortised)', fontsize=8)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('test accuracy')
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h), labels.append(lab)
    fig.legend(handles, labels, loc='lower center', ncol=min(6, len(labels)), fontsize=7)
    fig.tight_layout(rect=(0, 0.1 + 0.03 * (len(labels) // 7), 1, 1))
    paths.append(os.path.join(workdir, 'accuracy_vs_flops.png'))
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    ms = [m for m in results['methods'] if m != 'scratch' and 'reach_flops' in summary[m]]
    n_max = int(harness.get(results['config'].get('break_even', {}), 'max_descendants', 20))
    cols = min(4, max(1, len(ms)))
    fig, axes = plt.subplots(max(1, math.ceil(len(ms) / cols)), cols, figsize=(3.0 * cols, 2.5 * max(1, math.ceil(len(ms) / cols))),
                             squeeze=False)
    ns = np.arange(1, n_max + 1)
    for ax in axes.flat[len(ms):]:
        ax.axis('off')
    for ax, m in zip(axes.flat, ms):
        s = summary[m]
        ax.plot(ns, [total_cost(s['upstream_flops'], s['reach_flops'], k) / 1e12 for k in ns],
                label=results['labels'][m])
        ax.plot(ns, [total_cost(0.0, s['scratch_reach_flops'], k) / 1e12 for k in ns], ls='--',
                color='grey', label='Scratch (same shapes)')
        be = s.get('break_even')
        title = results['labels'][m] + (': never' if be is None else f': N* = {be}')
        if be is not None and be <= n_max:
            ax.axvline(be, color='green', lw=0.8)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel('descendants N', fontsize=7)
        ax.set_ylabel('TFLOPs to Scratch\'s acc.', fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    paths.append(os.path.join(workdir, 'break_even.png'))
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)
    return paths


PART = harness.Part(run=run)
