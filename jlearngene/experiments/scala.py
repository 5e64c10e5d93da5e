"""The Scala experiment (config: `jlearngene/experiments/configs/scala.py`): one slimmable
ViT trained at many widths, against US-Net, MatFormer and separately trained networks, at
equal total training FLOPs.

Stages (`run`, the `Part.run` of this experiment):

1. **Scala**: `train.warmup_steps` steps of the full network alone at
   `warmup_lr_factor` × the learning rate, then `train.steps` steps of
   `slimmable.scala_loss` (full + stable-sampled upper and lower widths + smallest).
   With `teacher.steps` > 0 a full-size ViT is first trained on the labels and the full
   network distils from it (DeiT hard distillation; its cost is counted for Scala).
2. **US-Net** (`slimmable.usnet_loss`), **MatFormer** (`slimmable.matformer_loss`, FFN
   granularities `slim.matformer`) and **separate** networks (one plain ViT per grid width,
   all with the same number of steps): each gets the steps whose training FLOPs
   (`costs.training_cost`, expected over the drawn widths) equal Scala's.
3. Evaluation of every method at every grid width and at the unseen widths halfway between
   grid widths (for MatFormer: FFN ratios, by Mix'n'Match between its granularities; its
   attention and embeddings stay full, so its FLOPs at a ratio are larger).

Writes results.json, results.md (the accuracy-at-every-width table) and
accuracy_vs_width.png (against the ratio and against the forward FLOPs).
"""
from __future__ import annotations

import functools
import os
import time

import jax

from jlearngene import costs
from jlearngene.experiments import harness
from jlearngene.genes import scala
from jlearngene.models import ViTConfig, init
from jlearngene.train import slimmable, tasks
from jlearngene.train.evaluate import evaluate

METHODS = ('scala', 'us_net', 'matformer', 'separate')
LABELS = {'scala': 'Scala', 'us_net': 'US-Net', 'matformer': 'MatFormer', 'separate': 'Separate'}


def unseen_widths(cfg: ViTConfig, grid) -> tuple[float, ...]:
    """The ratios halfway between neighbouring grid widths that split into whole heads."""
    out = []
    for a, b in zip(grid[:-1], grid[1:]):
        try:
            scala.sizes(cfg, (a + b) / 2)
        except scala.GeneError:
            continue
        out.append((a + b) / 2)
    return tuple(out)


def _runs(name: str, cfgs_steps, bs: int, n: int, teacher: ViTConfig | None = None):
    """costs.Run records of `steps` steps at each (cfg, steps) pair."""
    return [costs.Run(f'{name}_{i}', c, s * bs / n, n, teacher=teacher)
            for i, (c, s) in enumerate(cfgs_steps) if s > 0]


def _flops(runs) -> float:
    return costs.training_cost(runs)['flops'] if runs else 0.0


def _per_step(cfgs, weights, bs, n):
    """Training FLOPs of one step that runs `cfgs` with expected counts `weights`."""
    return _flops([costs.Run('s', c, w * bs / n, n) for c, w in zip(cfgs, weights)])


@functools.lru_cache(maxsize=None)
def _width_eval(cfg: ViTConfig, ratio: float, rule: str, smallest: float, side=None):
    """The eval_fn of the width-`ratio` sub-network (one function object per width)."""
    if rule == 'clean' and ratio == 1.0:
        return harness.eval_fn(cfg)

    def eval_fn(params, batch):
        sub, sub_cfg = scala.subnet(params, cfg, ratio, rule=rule, smallest=smallest, side=side)
        return harness.eval_fn(sub_cfg)(sub, batch)
    return eval_fn


@functools.lru_cache(maxsize=None)
def _masked_eval(cfg: ViTConfig):
    return slimmable.masked_eval(cfg)


def run(config, workdir: str, quiet: bool = False) -> dict:
    t_start = harness.prepare(config, workdir)
    dset = harness.Data(config)
    K, bs, seed, n = dset.num_classes, config['batch_size'], config['seed'], dset.num_examples
    sc, tc, lr = config['slim'], config['train'], config['optim']['lr']
    cfg = harness.model_config(config, config['depth'], K)
    rule, smallest = sc['rule'], float(sc['smallest'])
    grid = scala.width_grid(smallest, sc['granularity'])
    upper, lower = scala.stable_halves(grid)
    unseen = unseen_widths(cfg, grid)
    granularities = tuple(float(g) for g in sc['matformer'])
    methods = tuple(harness.get(config, 'methods', METHODS))
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f'unknown method(s) {unknown} for the scala experiment; known: {METHODS}')
    sub_cfg = {r: scala.subnet_config(cfg, r, rule=rule) for r in grid + unseen}
    ffn_cfg = {g: cfg.replace(mlp_dim=scala.sizes(cfg, g)['mlp']) for g in granularities}
    key = jax.random.key(seed)
    timings, trained, runs = {}, {}, {}

    def fit(name, loss_fn, params, steps, eval_fn, *, lr=lr, seed_offset=0):
        params, curve, secs = harness.fit(name, loss_fn, params, eval_fn, dset, steps=steps,
                                          lr=lr, config=config, workdir=workdir,
                                          seed=seed + seed_offset, eval_every=None)
        timings[name] = secs
        harness.say(f'{name:<16} {steps:>5} steps: full-width test accuracy {curve[-1][1]:.4f} '
                    f'({secs:.0f}s)', quiet)
        return params

    # 1. Scala (its optional teacher, warm-up, then the four-width steps).
    warm, main = int(tc['warmup_steps']), int(tc['steps'])
    teacher = None
    t_steps = int(harness.get(config['teacher'], 'steps', 0) or 0)
    t_cfg = cfg.replace(distill_token=False) if t_steps else None
    if t_steps:
        t_params = fit('teacher', tasks.classification_loss(t_cfg), init(t_cfg, jax.random.key(seed + 3)),
                       t_steps, harness.eval_fn(t_cfg))
        teacher = (t_params, t_cfg)
        runs['teacher'] = _runs('teacher', [(t_cfg, t_steps)], bs, n)
    full_eval = _width_eval(cfg, 1.0, rule, smallest)
    params = init(cfg, key)
    if 'scala' in methods:
        if warm:
            params = fit('scala_warmup', slimmable.full_loss(cfg, rule=rule, teacher=teacher),
                         params, warm, full_eval, lr=lr * float(tc['warmup_lr_factor']))
        loss = slimmable.scala_loss(cfg, grid, rule=rule, ce_weight=sc['ce_weight'],
                                    transfer=sc['transfer'], isolated=sc['isolated'], teacher=teacher)
        trained['scala'] = fit('scala', loss, params, main, full_eval)
        plan = [(sub_cfg[1.0], warm + main), (sub_cfg[smallest], main)]
        plan += [(sub_cfg[r], main / len(upper)) for r in upper]
        plan += [(sub_cfg[r], main / len(lower)) for r in lower]
        runs['scala'] = _runs('scala', plan, bs, n, teacher=t_cfg) + runs.get('teacher', [])
    budget = _flops(runs['scala']) if 'scala' in runs else None

    def steps_for(per_step: float, default: int) -> int:
        return max(1, int(round(budget / per_step))) if budget else default

    # 2. The baselines at Scala's training FLOPs.
    if 'us_net' in methods:
        interior = grid[1:-1]
        us_cfgs = [sub_cfg[1.0], sub_cfg[smallest]] + [sub_cfg[r] for r in interior]
        us_counts = [1, 1] + [2 / len(interior)] * len(interior)
        steps = steps_for(_per_step(us_cfgs, us_counts, bs, n), warm + main)
        trained['us_net'] = fit('us_net', slimmable.usnet_loss(cfg, grid), init(cfg, key), steps,
                                _width_eval(cfg, 1.0, 'clean', smallest, 'left'))
        runs['us_net'] = _runs('us_net', [(c, w * steps) for c, w in zip(us_cfgs, us_counts)], bs, n)
    if 'matformer' in methods:
        per = _per_step([ffn_cfg[g] for g in granularities], [1] * len(granularities), bs, n)
        steps = steps_for(per, warm + main)
        trained['matformer'] = fit('matformer', slimmable.matformer_loss(cfg, granularities),
                                   init(cfg, key), steps, harness.eval_fn(cfg))
        runs['matformer'] = _runs('matformer', [(ffn_cfg[g], steps) for g in granularities], bs, n)
    if 'separate' in methods:
        per = _per_step([sub_cfg[r] for r in grid], [1] * len(grid), bs, n)
        steps = steps_for(per, warm + main)
        trained['separate'] = {
            r: fit(f'separate_{r:g}', tasks.classification_loss(sub_cfg[r]),
                   init(sub_cfg[r], jax.random.fold_in(key, i)), steps, harness.eval_fn(sub_cfg[r]))
            for i, r in enumerate(grid)}
        runs['separate'] = _runs('separate', [(sub_cfg[r], steps) for r in grid], bs, n)

    # 3. Accuracy at every width. The clean rule's sub-networks are evaluated masked: one
    # compiled program for every width of Scala, US-Net and MatFormer.
    masked = rule == 'clean'

    def acc(params, ratio, side=None, ffn=None):
        if masked:
            masks = (scala.unit_masks(cfg, ratio, smallest=smallest, side=side) if ffn is None
                     else scala.ffn_masks(cfg, ffn))
            return evaluate(_masked_eval(cfg), (params, masks), dset.test())['accuracy']
        if ffn is None:
            return harness.accuracy(*scala.subnet(params, cfg, ratio, smallest=smallest, side=side,
                                                  rule='clean' if side else rule), dset)
        return harness.accuracy(*scala.ffn_subnet(params, cfg, ffn), dset)

    rows = []
    for r in sorted(grid + unseen):
        row = dict(ratio=r, seen=r in grid, mflops=costs.flops_per_image(sub_cfg[r]) / 1e6)
        if 'scala' in trained:
            row['scala'] = acc(trained['scala'], r)
        if 'us_net' in trained:
            row['us_net'] = acc(trained['us_net'], r, side='left')
        if 'matformer' in trained and granularities[0] <= r <= granularities[-1]:
            per_layer = scala.mix_n_match(r, granularities, cfg.depth)
            row['matformer'] = acc(trained['matformer'], r, ffn=per_layer)
            sub_shapes = jax.eval_shape(lambda p: scala.ffn_subnet(p, cfg, per_layer)[0],
                                        trained['matformer'])
            row['matformer_mflops'] = costs.flops_per_image(cfg, sub_shapes) / 1e6
        if 'separate' in trained and r in trained['separate']:
            row['separate'] = harness.accuracy(trained['separate'][r], sub_cfg[r], dset)
        rows.append(row)
        harness.say('ratio {:.4f}{}: '.format(r, '' if row['seen'] else ' (unseen)') + ', '.join(
            f'{LABELS[m]} {row[m]:.4f}' for m in METHODS if m in row), quiet)

    cost = {m: costs.training_cost(r) for m, r in runs.items() if m != 'teacher'}
    results = dict(config=harness.plain(config), model=cfg.to_dict(), grid=grid, unseen=unseen,
                   upper=upper, lower=lower, granularities=granularities, rows=rows,
                   training_flops={m: c['flops'] for m, c in cost.items()},
                   methods=[m for m in METHODS if m in trained], timings=timings,
                   seconds=time.perf_counter() - t_start)
    return harness.write_results(results, workdir, markdown(results), plot)


def markdown(results: dict) -> str:
    """Test accuracy at every width, one column per method; unseen widths marked *."""
    methods = results['methods']
    head = '| ratio | MFLOPs/img | ' + ' | '.join(LABELS[m] for m in methods)
    if 'matformer' in methods:
        head += ' | MatFormer MFLOPs/img'
    lines = [head + ' |', '|' + '---|' * (head.count('|'))]
    for row in results['rows']:
        cells = [f"{row['ratio']:.4f}{'' if row['seen'] else ' *'}", f"{row['mflops']:.2f}"]
        cells += [f'{row[m]:.4f}' if m in row else '–' for m in methods]
        if 'matformer' in methods:
            cells.append(f"{row['matformer_mflops']:.2f}" if 'matformer_mflops' in row else '–')
        lines.append('| ' + ' | '.join(cells) + ' |')
    flops = results['training_flops']
    lines += ['', '\\* a width never trained (halfway between grid widths). MatFormer slices only '
              "the FFN: its ratio is the FFN's, by Mix'n'Match between its granularities "
              f"{list(results['granularities'])}.",
              'Training GFLOPs (3 × forward, expected over the drawn widths): '
              + ', '.join(f'{LABELS[m]} {flops[m] / 1e9:.4g}' for m in methods) + '.',
              f"Grid {list(results['grid'])}; stable sampling halves upper {list(results['upper'])}, "
              f"lower {list(results['lower'])}. Wall time {results['seconds']:.0f}s."]
    return '\n'.join(lines)


def plot(results: dict, workdir: str) -> str:
    """accuracy_vs_width.png: test accuracy against the width ratio and against forward
    MFLOPs per image; hollow markers are unseen widths."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for m in results['methods']:
        pts = [r for r in results['rows'] if m in r]
        flops_key = 'matformer_mflops' if m == 'matformer' else 'mflops'
        for ax, xkey in zip(axes, ('ratio', flops_key)):
            line, = ax.plot([r[xkey] for r in pts if r['seen']], [r[m] for r in pts if r['seen']],
                            marker='o', ms=4, label=LABELS[m])
            ax.plot([r[xkey] for r in pts if not r['seen']], [r[m] for r in pts if not r['seen']],
                    ls='none', marker='o', ms=5, mfc='none', color=line.get_color())
    axes[0].set_xlabel('width ratio (MatFormer: FFN ratio)')
    axes[1].set_xlabel('forward MFLOPs per image')
    for ax in axes:
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel('test accuracy')
    axes[1].legend(loc='lower right', fontsize=8)
    fig.tight_layout()
    path = os.path.join(workdir, 'accuracy_vs_width.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


PART = harness.Part(run=run)
