"""The Mango experiment: grow a small trained ViT into a large one, compare growth methods
by test accuracy against training FLOPs (config: `jlearngene/experiments/configs/mango.py`).

Stages (`run`, the method part's own `Part.run`):

1. **small model**: a ViT of `config.small`'s shape trained with cross-entropy;
2. **initial large models**, one per entry of `config.methods`: Scratch (random), Net2Net,
   StackBERT, bert2BERT (`jlearngene.genes.growth`, options from `config.method_options`),
   LiGO and Mango at every rank of `config.mango_ranks` (`jlearngene.genes.mango`): their
   operators train for `config.operator.steps` steps on the large model's cross-entropy,
   the small model frozen (it sits in the trained tree, frozen by the optimiser and behind
   `stop_gradient`), the large model's weights recomputed by the operator every step;
3. **training**: every large model trains for the same `config.large` budget with the same
   optimiser, evaluated every `large.eval_every` steps.

Costs (`costs.training_cost`: 3× forward FLOPs per training image): a method's curve
starts at its growth cost, which is the operator's training (the large model's step plus 3×
the operator's `grow` FLOPs per step: `mango.operator_cost` for Mango, XLA's cost analysis
of the lowered `ligo_grow` for LiGO); one-shot initialisations cost nothing. The small
model's own training is reported separately and, in a second ratio column, added to every
grown method. "FLOPs to reach Scratch" is where a curve first reaches Scratch's final test
accuracy (linear between evaluations); its ratio to Scratch's own is 1 − the saving of the
Mango/bert2BERT/LiGO papers.

Writes results.json, results.md (`markdown`), accuracy_vs_flops.png and
accuracy_vs_steps.png (`plot`), and one training log per run under runs/.
"""
from __future__ import annotations

import os
import time
import jax

from jlearngene import costs
from jlearngene.experiments import harness
from jlearngene.genes import growth, mango
from jlearngene.models import ViTConfig, init
from jlearngene.train import tasks

ONE_SHOT = {'net2net': growth.net2net, 'stackbert': growth.stackbert,
            'bert2bert': growth.bert2bert}
LEARNED = ('ligo', 'mango')
KNOWN = ('scratch',) + tuple(ONE_SHOT) + LEARNED
LABELS = {'scratch': 'Scratch', 'net2net': 'Net2Net', 'stackbert': 'StackBERT',
          'bert2bert': 'bert2BERT', 'ligo': 'LiGO'}


def model_configs(config, num_classes: int) -> tuple[ViTConfig, ViTConfig]:
    """(small, large) ViTConfigs: the shared `config.model` with each section's shape."""
    out = []
    for name in ('small', 'large'):
        s = config[name]
        cfg = harness.model_config(config, s['depth'], num_classes)
        out.append(cfg.replace(width=s['width'], num_heads=s['num_heads'], mlp_dim=s['mlp_dim']))
    return out[0], out[1]


def entries(config) -> list[tuple[str, str, dict]]:
    """(run name, method, options) per large model: `config.methods`, Mango once per rank."""
    out = []
    for method in config['methods']:
        if method not in KNOWN:
            raise ValueError(f'mango experiment: unknown method {method!r}; known: {KNOWN}')
        opts = harness.plain(harness.get(config, 'method_options', {}).get(method, {})) or {}
        if method == 'mango':
            for rank in config['mango_ranks']:
                out.append((f'mango_r{rank}', method, {**opts, 'rank': int(rank)}))
        else:
            out.append((method, method, opts))
    return out


def label(method: str, options: dict) -> str:
    if method == 'mango':
        return f"Mango (R={options['rank']})"
    if method == 'stackbert' and options.get('width') == 'net2net':
        return 'StackBERT (+Net2Net width)'
    if method == 'bert2bert':
        return 'bert2BERT (AKI)' if options.get('aki', True) else 'bert2BERT (FPI)'
    return LABELS[method]


def grow_fn(method: str, options: dict, large_cfg: ViTConfig):
    """`grow(operator, small) -> large params` of a learned method."""
    if method == 'mango':
        kw = {k: options[k] for k in ('layer_loop', 'remat') if k in options}
        return lambda op, small: mango.grow(op, small, large_cfg, **kw)
    return lambda op, small: growth.ligo_grow(op, small, large_cfg)


def init_operator(method: str, options: dict, small_cfg, large_cfg, key):
    if method == 'mango':
        return mango.init_operator(small_cfg, large_cfg, options['rank'], key,
                                   **({'noise': options['noise']} if 'noise' in options else {}))
    kw = {k: options[k] for k in ('width_init', 'depth_init') if k in options}
    return growth.ligo_init_operator(small_cfg, large_cfg, key, **kw)


def grow_flops(method: str, options: dict, grow, operator, small, small_cfg, large_cfg) -> float:
    """Forward FLOPs (multiply-accumulates) of one grow."""
    if method == 'mango':
        return float(mango.operator_cost(small_cfg, large_cfg, options['rank'])['flops'])
    analysis = jax.jit(grow).lower(operator, small).cost_analysis()
    return float(analysis['flops']) / 2


def train_operator(name, method, options, small, small_cfg, large_cfg, dset, config, workdir,
                   quiet):
    """Train the method's operator on the large model's loss (small model frozen); returns
    (grown large params, operator, seconds, steps, grow FLOPs)."""
    oc, seed = config['operator'], config['seed']
    steps = harness.budget(oc, dset.num_examples, config['batch_size'], 'operator')
    grow = grow_fn(method, options, large_cfg)
    inner = tasks.classification_loss(large_cfg)

    def grown(trainable):
        return grow(trainable['operator'], jax.lax.stop_gradient(trainable['small']))

    def loss_fn(trainable, batch, rng):
        return inner(grown(trainable), batch, rng)

    operator = init_operator(method, options, small_cfg, large_cfg, jax.random.key(seed + 3))
    optim = dict(harness.plain(config['optim']), weight_decay=oc['weight_decay'],
                 decay=('operator/.*',), freeze=('small/.*',))
    trained, _, secs = harness.fit(
        f'operator_{name}', loss_fn, {'operator': operator, 'small': small}, None, dset,
        steps=steps, lr=oc['lr'], config={'optim': optim}, workdir=workdir, seed=seed + 3,
        eval_every=None)
    flops = grow_flops(method, options, grow, operator, small, small_cfg, large_cfg)
    harness.say(f'operator {label(method, options):<26}: {steps} steps ({secs:.0f}s)', quiet)
    return jax.jit(grow)(trained['operator'], small), trained['operator'], secs, steps, flops


def reach(points: list[tuple[float, float]], target: float) -> float | None:
    """The first x at which the curve of (x, accuracy) points reaches `target`, linear
    between points; None if it never does."""
    for i, (x, y) in enumerate(points):
        if y >= target:
            if i == 0:
                return x
            x0, y0 = points[i - 1]
            return x0 + (x - x0) * (target - y0) / (y - y0)
    return None


def run(config, workdir: str, quiet: bool = False) -> dict:
    """Run the growth comparison `config` describes; returns the results dict (also written
    to `workdir`) with its Markdown table under 'table'."""
    plan = entries(config)
    t_start = harness.prepare(config, workdir)
    dset = harness.Data(config)
    n, bs, seed = dset.num_examples, config['batch_size'], config['seed']
    small_cfg, large_cfg = model_configs(config, dset.num_classes)
    for method in {m for _, m, _ in plan} - {'scratch'}:   # shape checks before any training
        if method == 'mango':
            mango.operator_cost(small_cfg, large_cfg, 1)
        else:
            growth.check_growth(jax.eval_shape(lambda: init(small_cfg, jax.random.key(0))),
                                large_cfg, method)

    # 1. The small model.
    sc = config['small']
    s_steps = harness.budget(sc, n, bs, 'small')
    small, s_curve, s_secs = harness.fit(
        'small', tasks.classification_loss(small_cfg), init(small_cfg, jax.random.key(seed)),
        harness.eval_fn(small_cfg), dset, steps=s_steps, lr=config['optim']['lr'],
        config=config, workdir=workdir, seed=seed, eval_every=None)
    small_flops = costs.training_cost([costs.Run('small', small_cfg, s_steps * bs / n, n)])['flops']
    harness.say(f'small    width {small_cfg.width} depth {small_cfg.depth}: test accuracy '
                f'{s_curve[-1][1]:.4f} ({s_secs:.0f}s)', quiet)

    # 2. + 3. Initial large models, then the same training for each.
    lc = config['large']
    l_steps = harness.budget(lc, n, bs, 'large')
    step_flops = costs.training_cost([costs.Run('large', large_cfg, bs / n, n)])['flops']
    large_loss = tasks.classification_loss(large_cfg)
    rows, curves, timings = [], {}, {'small': s_secs}
    for name, method, options in plan:
        key = jax.random.key(seed + 100)
        growth_flops, operator_info = 0.0, None
        if method == 'scratch':
            params0 = init(large_cfg, key)
        elif method in ONE_SHOT:
            params0 = ONE_SHOT[method](small, large_cfg, key, **options)
        else:
            params0, operator, secs, op_steps, g_flops = train_operator(
                name, method, options, small, small_cfg, large_cfg, dset, config, workdir, quiet)
            timings[f'operator_{name}'] = secs
            growth_flops = op_steps * (step_flops + costs.TRAIN_FACTOR * g_flops)
            operator_info = dict(steps=op_steps, grow_flops=g_flops,
                                 params=sum(int(x.size) for x in jax.tree.leaves(operator)))
        acc0 = harness.accuracy(params0, large_cfg, dset)
        _, curve, secs = harness.fit(
            f'large_{name}', large_loss, params0, harness.eval_fn(large_cfg), dset,
            steps=l_steps, lr=lc['lr'], config=config, workdir=workdir, seed=seed + 7,
            eval_every=harness.get(lc, 'eval_every', 0))
        timings[f'large_{name}'] = secs
        curves[name] = [(0, acc0)] + curve
        rows.append(dict(name=name, method=method, label=label(method, options), options=options,
                         acc_init=acc0, acc=curve[-1][1], growth_flops=growth_flops,
                         operator=operator_info, seconds=secs))
        harness.say(f'large    {label(method, options):<26}: init {acc0:.4f} -> '
                    f'{curve[-1][1]:.4f} after {l_steps} steps ({secs:.0f}s)', quiet)

    results = dict(config=harness.plain(config), small=dict(cfg=small_cfg.to_dict(),
                   accuracy=s_curve[-1][1], steps=s_steps, flops=small_flops),
                   large_cfg=large_cfg.to_dict(), large_steps=l_steps, step_flops=step_flops,
                   batch_size=bs, rows=rows, curves=curves, timings=timings)
    add_reach(results)
    results['seconds'] = time.perf_counter() - t_start
    return harness.write_results(results, workdir, markdown(results), plot)


def flops_curve(results: dict, row: dict, *, with_small: bool = False) -> list[tuple[float, float]]:
    """(training FLOPs, accuracy) along a large model's training: growth cost (and, with
    `with_small`, the small model's training for grown methods) plus the steps so far."""
    start = row['growth_flops'] + (results['small']['flops']
                                   if with_small and row['method'] != 'scratch' else 0.0)
    return [(start + step * results['step_flops'], acc) for step, acc in results['curves'][row['name']]]


def add_reach(results: dict) -> None:
    """Each row's FLOPs to reach Scratch's final accuracy and its ratio to Scratch's."""
    scratch = next((r for r in results['rows'] if r['method'] == 'scratch'), None)
    if scratch is None:
        return
    target = scratch['acc']
    base = reach(flops_curve(results, scratch), target)
    results['target_accuracy'] = target
    for r in results['rows']:
        for key, with_small in (('', False), ('_with_small', True)):
            x = reach(flops_curve(results, r, with_small=with_small), target)
            r[f'reach_flops{key}'] = x
            r[f'reach_ratio{key}'] = None if x is None or not base else x / base


def _g(x) -> str:
    return 'not reached' if x is None else f'{x / 1e9:.1f}'


def _ratio(row: dict, key: str) -> str:
    if row.get(f'reach_flops{key}') is None:
        return 'not reached'
    ratio = row.get(f'reach_ratio{key}')
    return '—' if ratio is None else f'{ratio:.2f}'    # '—': Scratch reached it at 0 FLOPs


def markdown(results: dict) -> str:
    """The results table: accuracies, growth cost, FLOPs to reach Scratch and ratios."""
    small, rows = results['small'], results['rows']
    lines = [
        f"Small model (width {small['cfg']['width']}, depth {small['cfg']['depth']}): test "
        f"accuracy {small['accuracy']:.4f} after {small['steps']} steps "
        f"({small['flops'] / 1e9:.1f} GFLOPs). Large models (width {results['large_cfg']['width']}, "
        f"depth {results['large_cfg']['depth']}) trained {results['large_steps']} steps each "
        f"({results['step_flops'] / 1e9:.2f} GFLOPs per step).",
        '',
        '| method | acc. at init | acc. after training | growth cost (GFLOPs) | '
        'GFLOPs to reach Scratch | ratio to Scratch | ratio incl. small model |',
        '|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        lines.append(f"| {r['label']} | {r['acc_init']:.4f} | **{r['acc']:.4f}** | "
                     f"{r['growth_flops'] / 1e9:.1f} | {_g(r.get('reach_flops'))} | "
                     f"{_ratio(r, '')} | {_ratio(r, '_with_small')} |")
    ops = [r for r in rows if r['operator']]
    if ops:
        lines += ['', 'Operators: ' + '; '.join(
            f"{r['label']} {r['operator']['params']:,} params, {r['operator']['steps']} steps, "
            f"{r['operator']['grow_flops'] / 1e6:.1f} MFLOPs per grow" for r in ops)
            + " (the grown model's accuracy after them is its 'acc. at init')."]
    if 'target_accuracy' in results:
        lines += ['', f"Scratch's final accuracy {results['target_accuracy']:.4f} is the target; "
                  'FLOPs to reach it include the growth cost (linear between evaluations); '
                  "ratio = those FLOPs / Scratch's own; the last column adds the small model's "
                  'training to every grown method.']
    lines.append(f"Wall time {results['seconds']:.0f}s. Costs: 3x forward FLOPs per training "
                 'image (fvcore convention, one per multiply-accumulate).')
    return '\n'.join(lines)


def plot(results: dict, workdir: str) -> list[str]:
    """accuracy_vs_flops.png (growth cost included) and accuracy_vs_steps.png."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    paths = []
    for kind in ('flops', 'steps'):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for r in results['rows']:
            if kind == 'flops':
                pts = [(x / 1e9, y) for x, y in flops_curve(results, r)]
            else:
                pts = results['curves'][r['name']]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', ms=2.5, label=r['label'])
        if 'target_accuracy' in results:
            ax.axhline(results['target_accuracy'], color='grey', lw=0.8, ls='--')
        ax.set_xlabel('training GFLOPs (growth cost included)' if kind == 'flops'
                      else 'large-model training steps')
        ax.set_ylabel('test accuracy')
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc='lower right', fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(workdir, f'accuracy_vs_{kind}.png'))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


PART = harness.Part(run=run)
