"""TLEG end to end: teacher -> learngene through an Aux-Net -> descendants of several depths,
compared with Scratch, Share-Init and He-LG at the same fine-tuning budget.

Default (`--scale digits`; 5.5 CPU-minutes, 7 min wall on 2 cores shared with other jobs)::

    python experiments/tleg/run.py --workdir /tmp/tleg     # or: jlearngene demo

1. Ancestor/teacher: a 6-layer ViT (width 64) trained with cross-entropy on the digits.
2. Learngene: a 6-layer Aux-Net θ_l = θ_B + (l/6)·θ_A trained by soft distillation from the
   teacher (τ = 1, α = 1: pure KD, the official recipe); only the gene trains. A Share-Init
   gene (θ_A ≡ 0, one shared layer) is trained the same way.
3. Descendants of depth 2, 3, 4, 6: TLEG (linear expansion with their own L_d), Share-Init,
   He-LG (the ancestor's last ⌈L_d/2⌉ layers over random ones) and Scratch, each fine-tuned
   for the same number of steps with the same optimiser.

Writes into the workdir: `results.json`, `results.md` (accuracy, Params, S-Params, FLOPs,
training cost), `accuracy_vs_steps.png`, the gene and the teacher (`gene/`, `teacher/`,
jlearngene model checkpoints) and one training log per run under `runs/`.

`--scale paper` selects the paper's shapes (DeiT-Ti/S/B width, 12-layer Aux-Net, 224 px,
descendants of depth 3/6/9/12, epoch budgets of TLEG Table 1) on a tfds dataset prepared
in `--data-dir` (no download): for real accelerators, not for a CPU.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jlearngene import compiler, costs, data
from jlearngene.genes import baselines, tleg
from jlearngene.models import ViTConfig, apply, vit_config
from jlearngene.train import checkpoint, losses, optim, tasks, trainer

METHODS = ('tleg', 'share_init', 'he_lg', 'scratch')
LABELS = {'tleg': 'TLEG', 'share_init': 'Share-Init', 'he_lg': 'He-LG', 'scratch': 'Scratch'}


# ----------------------------------------------------------------------------------------
# Configs (plain JSON-able dicts).

def default_config(scale: str = 'digits') -> dict[str, Any]:
    """The experiment config for 'digits' (default, CPU), 'smoke' (a miniature for tests)
    or 'paper' (TLEG's shapes; needs `data.data_dir` and `data.tfds_name`)."""
    cfg: dict[str, Any] = dict(
        scale='digits', seed=0, batch_size=64, eval_batch_size=128,
        data=dict(name='digits', image_size=16, augment=dict(crop_padding=1)),
        model=dict(variant='Ti', width=64, num_heads=4, mlp_dim=128, patch_size=4,
                   image_size=16, channels=1, pool='avg'),
        optimizer=dict(lr=2e-3, warmup_steps=20, weight_decay=0.05, clip_norm=1.0),
        teacher=dict(depth=6, steps=400, checkpoint=None),
        aux=dict(depth=6, steps=500, tau=1.0, alpha=1.0, expand=list(tleg.DEFAULT_EXPAND),
                 from_layer=0, share_init=True),
        descend=dict(depths=[2, 3, 4, 6], steps=100, eval_every=25, lr=1e-3,
                     methods=list(METHODS), he_lg_k=None, official_pool_order=False),
    )
    if scale == 'digits':
        return cfg
    if scale == 'smoke':
        cfg.update(scale='smoke', batch_size=32, eval_batch_size=128)
        cfg['model'].update(width=32, num_heads=2, mlp_dim=64, patch_size=8)
        # identical step programs for teacher and depth-2 descendants (compile cache hits)
        cfg['teacher'].update(depth=2, steps=4)
        cfg['aux'].update(depth=2, steps=4)
        cfg['descend'].update(depths=[1, 2], steps=4, eval_every=2, lr=cfg['optimizer']['lr'])
        cfg['optimizer'].update(warmup_steps=0)
        return cfg
    if scale == 'paper':
        cfg.update(scale='paper', batch_size=512, eval_batch_size=512)
        cfg['data'] = dict(name='tfds', tfds_name='imagenet2012', data_dir=None, image_size=224,
                           mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225],
                           augment=dict(rrc_scale=[0.08, 1.0], flip=True, mixup_alpha=0.8,
                                        cutmix_alpha=1.0, label_smoothing=0.1),
                           splits={'test': 'validation'})
        # official Aux-Net: avg pooling of LN(x) with eps 1e-5; descendants get the official
        # fc_norm order and eps 1e-6 through descend.official_pool_order
        cfg['model'] = dict(variant='S', patch_size=16, image_size=224, channels=3, pool='avg',
                            ln_eps=1e-5, drop_path=0.1)
        cfg['optimizer'] = dict(lr=5e-4, warmup_steps=0, weight_decay=0.05, clip_norm=0.0,
                                min_lr_ratio=0.02)
        cfg['teacher'] = dict(depth=12, epochs=100, checkpoint=None)
        cfg['aux'].update(depth=12, epochs=150, steps=None)
        cfg['descend'].update(depths=[3, 6, 9, 12], epochs=35, steps=None, eval_every=None,
                              lr=5e-4, official_pool_order=True)
        return cfg
    raise ValueError(f"unknown scale {scale!r}; expected 'digits', 'smoke' or 'paper'")


def model_config(config: dict, depth: int, num_classes: int) -> ViTConfig:
    m = dict(config['model'])
    variant = m.pop('variant')
    return vit_config(variant, depth=depth, num_classes=num_classes, **m)


def _steps(section: dict, num_examples: int, batch: int) -> int:
    if section.get('steps'):
        return int(section['steps'])
    if section.get('epochs'):
        return max(1, int(round(section['epochs'] * num_examples / batch)))
    raise ValueError(f'config section {section} needs steps or epochs')


# ----------------------------------------------------------------------------------------
# Helpers around the generic trainer.

class _Data:
    """Train iterators and a reusable test pass for one dataset config."""

    def __init__(self, config: dict):
        self.config = config
        dc = config['data']
        if dc.get('name') == 'tfds' and not dc.get('data_dir'):
            raise ValueError("scale 'paper' needs the prepared tfds data: pass --data-dir "
                             '(and --tfds-name); nothing is downloaded')
        _, self.info = data.from_config(dc, 'train', batch_size=config['batch_size'],
                                        seed=config['seed'], train=True)
        _, self.test_info = data.from_config(dc, 'test', batch_size=config['eval_batch_size'],
                                             seed=0, train=False)
        self.num_classes = self.info.num_classes
        self.num_examples = self.info.num_examples

    def train(self, seed: int):
        return data.from_config(self.config['data'], 'train', batch_size=self.config['batch_size'],
                                seed=seed, train=True)[0]

    def test(self):
        return data.from_config(self.config['data'], 'test',
                                batch_size=self.config['eval_batch_size'], seed=0, train=False)[0]


@functools.lru_cache(maxsize=None)
def _eval_step(cfg: ViTConfig):
    return compiler.jit(tasks.classification_eval(cfg))


def evaluate(params, cfg: ViTConfig, test: Callable) -> float:
    """Test accuracy of canonical params (one compile per config)."""
    fn = _eval_step(cfg)
    total = correct = 0.0
    for batch in test():
        out = fn(params, {k: jnp.asarray(v) for k, v in batch.items()})
        correct += float(out['accuracy'])
        total += float(out['count'])
    return correct / max(total, 1.0)


def _fit(name: str, loss_fn, trainable, eval_fn, dset: _Data, *, steps: int, lr: float,
         config: dict, workdir: str, seed: int, eval_every: int | None):
    opt_cfg = dict(config['optimizer'], lr=lr)
    opt_cfg['warmup_steps'] = min(int(opt_cfg.get('warmup_steps', 0)), max(steps // 5, 0))
    optimizer = optim.make_optimizer(opt_cfg, trainable, total_steps=steps)
    t0 = time.perf_counter()
    params, history = trainer.fit(
        loss_fn, trainable, dset.train(seed), optimizer, workdir=os.path.join(workdir, 'runs', name),
        steps=steps, eval_fn=eval_fn, eval_data=dset.test, eval_every=eval_every,
        log_every=max(1, min(50, steps)), seed=seed, resume=False, progress=False, console=False,
        tensorboard=False, handle_sigterm=False, keep_checkpoints=1)
    seconds = time.perf_counter() - t0
    curve = [(int(r['step']), float(r['eval/accuracy'])) for r in history['eval']]
    return params, curve, seconds


def enable_compile_cache(path: str) -> bool:
    """Persist compiled programs under `path`: the descendants of one depth share their train
    and eval programs across methods, so most compiles become cache reads. Has no effect
    (returns False) when this process compiled something before the cache was configured, or
    when a cache directory is already set."""
    if jax.config.jax_compilation_cache_dir:
        return False
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    return True


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# The experiment.

def run(config: dict | None = None, workdir: str = 'workdirs/tleg', *, quiet: bool = False) -> dict:
    """Run the whole comparison; returns the results dict (also written to the workdir)."""
    config = copy.deepcopy(config or default_config())
    os.makedirs(workdir, exist_ok=True)
    if config.get('compile_cache', True):
        enable_compile_cache(os.path.join(workdir, 'jax_cache'))
    t_start = time.perf_counter()
    dset = _Data(config)
    K, bs, seed = dset.num_classes, config['batch_size'], config['seed']
    timings: dict[str, float] = {}
    upstream: list[costs.Run] = []

    # 1. Teacher / ancestor.
    t_cfg = model_config(config, config['teacher']['depth'], K)
    if config['teacher'].get('checkpoint'):
        teacher, stored_cfg, _ = checkpoint.load_model(config['teacher']['checkpoint'])
        t_cfg = stored_cfg or t_cfg
        t_acc, timings['teacher'] = evaluate(teacher, t_cfg, dset.test), 0.0
    else:
        steps = _steps(config['teacher'], dset.num_examples, bs)
        teacher, curve, timings['teacher'] = _fit(
            'teacher', tasks.classification_loss(t_cfg), baselines.scratch(t_cfg, jax.random.key(seed)),
            tasks.classification_eval(t_cfg), dset, steps=steps, lr=config['optimizer']['lr'],
            config=config, workdir=workdir, seed=seed, eval_every=None)
        t_acc = curve[-1][1]
        upstream.append(costs.Run('teacher', t_cfg, steps * bs / dset.num_examples, dset.num_examples))
        checkpoint.save_model(os.path.join(workdir, 'teacher'), teacher, t_cfg, overwrite=True,
                              extra={'test_accuracy': t_acc})
    _say(f'teacher  depth {t_cfg.depth}: test accuracy {t_acc:.4f} ({timings["teacher"]:.0f}s)', quiet)

    # 2. Learngenes through Aux-Nets (soft KD from the teacher; only the gene trains).
    ac = config['aux']
    aux_cfg = model_config(config, ac['depth'], K)
    if t_cfg.width != aux_cfg.width and 'he_lg' in config['descend']['methods']:
        raise ValueError(f'He-LG inherits ancestor layers: teacher width {t_cfg.width} must equal '
                         f'the descendants\' width {aux_cfg.width}')
    aux_steps = _steps(ac, dset.num_examples, bs)

    def kd_loss(gene, batch, rng):
        student, _ = apply(tleg.materialize(gene, None, aux_cfg), batch['image'], aux_cfg,
                           train=True, rng=rng)
        target = apply(teacher, batch['image'], t_cfg)[0]
        loss = losses.soft_distillation(student, target, batch['label'], tau=ac['tau'], alpha=ac['alpha'])
        return loss, {'accuracy': losses.accuracy(student, batch['label'])}

    def aux_eval(gene, batch):
        return tasks.classification_eval(aux_cfg)(tleg.materialize(gene, None, aux_cfg), batch)

    genes, aux_acc = {}, {}
    kinds = ['tleg'] + (['share_init'] if ac.get('share_init', True) and
                        'share_init' in config['descend']['methods'] else [])
    for kind in kinds:
        key = jax.random.key(seed + 1)
        gene0 = (tleg.init_gene(aux_cfg, key, tuple(ac['expand']), ac['from_layer']) if kind == 'tleg'
                 else baselines.share_init_gene(aux_cfg, key))
        genes[kind], curve, timings[f'aux_{kind}'] = _fit(
            f'aux_{kind}', kd_loss, gene0, aux_eval, dset, steps=aux_steps,
            lr=config['optimizer']['lr'], config=config, workdir=workdir, seed=seed + 1, eval_every=None)
        aux_acc[kind] = curve[-1][1]
        upstream.append(costs.Run(f'aux_{kind}', aux_cfg, aux_steps * bs / dset.num_examples,
                                  dset.num_examples, teacher=t_cfg))
        _say(f'aux-net  {LABELS[kind]:<10} depth {aux_cfg.depth}: test accuracy {aux_acc[kind]:.4f} '
             f'({timings[f"aux_{kind}"]:.0f}s)', quiet)
    checkpoint.save_model(os.path.join(workdir, 'gene'), genes['tleg'], aux_cfg, overwrite=True,
                          extra={'kind': 'tleg_gene', 'expand': list(ac['expand']),
                                 'from_layer': ac['from_layer'], 'aux_test_accuracy': aux_acc['tleg']})

    # 3. Descendants: same budget for every method.
    dc = config['descend']
    d_steps = _steps(dc, dset.num_examples, bs)
    rows, curves = [], {}
    for depth in dc['depths']:
        d_cfg = tleg.descendant_config(aux_cfg, depth, official_pool_order=dc['official_pool_order'])
        k_he = dc['he_lg_k'] or math.ceil(depth / 2)
        key = jax.random.key(seed + 100 + depth)
        for method in dc['methods']:
            if method == 'tleg':
                init = tleg.descend(genes['tleg'], d_cfg, head='inherit', key=key)
                s_p = costs.s_params('tleg', [d_cfg], source=aux_cfg, expand=ac['expand'],
                                     from_layer=ac['from_layer'], include_head=True)
            elif method == 'share_init':
                init = baselines.share_init(genes['share_init'], d_cfg, head='inherit')
                s_p = costs.s_params('share_init', [d_cfg], source=aux_cfg, include_head=True)
            elif method == 'he_lg':
                k_use = min(k_he, t_cfg.depth)
                init = baselines.he_lg(teacher, d_cfg, k_use, key)
                s_p = costs.s_params('he_lg', [d_cfg], source=t_cfg, k=k_use)
            elif method == 'scratch':
                init, s_p = baselines.scratch(d_cfg, key), 0
            else:
                raise ValueError(f'unknown method {method!r}; known: {METHODS}')
            acc0 = evaluate(init, d_cfg, dset.test)
            name = f'des{depth}_{method}'
            _, curve, secs = _fit(name, tasks.classification_loss(d_cfg), init,
                                  tasks.classification_eval(d_cfg), dset, steps=d_steps, lr=dc['lr'],
                                  config=config, workdir=workdir, seed=seed + 7, eval_every=dc['eval_every'])
            timings[name] = secs
            curves[name] = [(0, acc0)] + curve
            ft = costs.training_cost([costs.Run(name, d_cfg, d_steps * bs / dset.num_examples,
                                                dset.num_examples)])
            rows.append(dict(depth=depth, method=method, acc_init=acc0, acc=curve[-1][1],
                             params=costs.param_count(d_cfg), s_params=s_p,
                             flops=costs.flops_per_image(d_cfg), finetune_flops=ft['flops'],
                             finetune_epochs=ft['epochs'], seconds=secs,
                             he_lg_k=k_he if method == 'he_lg' else None))
            _say(f'des L{depth} {LABELS[method]:<10}: init {acc0:.4f} -> {curve[-1][1]:.4f} '
                 f'after {d_steps} steps ({secs:.0f}s)', quiet)

    up = costs.training_cost(upstream)
    results = dict(
        config=config, teacher=dict(depth=t_cfg.depth, accuracy=t_acc), aux=aux_acc,
        aux_config=aux_cfg.to_dict(), finetune_steps=d_steps, rows=rows, curves=curves,
        upstream=up, timings=timings, seconds=time.perf_counter() - t_start,
        gene_params=tleg.gene_param_count(genes['tleg']),
    )
    with open(os.path.join(workdir, 'results.json'), 'w', encoding='utf-8') as f:
        json.dump(checkpoint.to_json(results), f, indent=1)
    table = markdown(results)
    with open(os.path.join(workdir, 'results.md'), 'w', encoding='utf-8') as f:
        f.write(table + '\n')
    plot(results, os.path.join(workdir, 'accuracy_vs_steps.png'))
    results['table'] = table
    return results


# ----------------------------------------------------------------------------------------
# Reporting.

def _m(n: float) -> str:
    return f'{n / 1e6:.3f}'


def markdown(results: dict) -> str:
    """The results table (Markdown): one row per descendant and method, plus upstream costs."""
    up = {r['name']: r for r in results['upstream']['runs']}
    upstream_of = {'tleg': ['teacher', 'aux_tleg'], 'share_init': ['teacher', 'aux_share_init'],
                   'he_lg': ['teacher'], 'scratch': []}
    lines = [
        f"Descendants fine-tuned {results['finetune_steps']} steps each "
        f"(teacher depth {results['teacher']['depth']}: {results['teacher']['accuracy']:.4f}; "
        + ', '.join(f"Aux-Net {LABELS[k]}: {v:.4f}" for k, v in results['aux'].items()) + ').',
        '',
        '| depth | method | acc. at init | acc. after fine-tuning | Params (M) | S-Params (M) '
        '| MFLOPs/img | fine-tune cost (GFLOPs) | upstream cost (GFLOPs) |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in results['rows']:
        ups = sum(up[n]['flops'] for n in upstream_of[r['method']] if n in up)
        name = LABELS[r['method']] + (f" (k={r['he_lg_k']})" if r['he_lg_k'] else '')
        lines.append(f"| {r['depth']} | {name} | {r['acc_init']:.4f} | **{r['acc']:.4f}** | "
                     f"{_m(r['params'])} | {_m(r['s_params'])} | {r['flops'] / 1e6:.2f} | "
                     f"{r['finetune_flops'] / 1e9:.1f} | {ups / 1e9:.1f} |")
    lines += ['', 'Upstream runs (shared by all descendants of a method): '
              + ', '.join(f"{r['name']} {r['epochs']:.1f} epochs = {r['flops'] / 1e9:.1f} GFLOPs"
                          for r in results['upstream']['runs']) + '.',
              f"Wall time {results['seconds']:.0f}s.",
              'S-Params: parameters stored to initialise the descendant (TLEG/Share-Init: the gene '
              'incl. head; He-LG: the inherited layers). Costs: 3x forward FLOPs per training image; '
              'Aux-Nets add one teacher forward.']
    return '\n'.join(lines)


def plot(results: dict, path: str) -> None:
    """Accuracy vs fine-tuning steps, one panel per descendant depth."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    depths = sorted({r['depth'] for r in results['rows']})
    fig, axes = plt.subplots(1, len(depths), figsize=(3.6 * len(depths), 3.2), squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for r in results['rows']:
            if r['depth'] != depth:
                continue
            pts = results['curves'][f"des{depth}_{r['method']}"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', ms=3, label=LABELS[r['method']])
        ax.set_title(f'descendant depth {depth}')
        ax.set_xlabel('fine-tuning steps')
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('test accuracy')
    axes[0][-1].legend(loc='lower right', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------
# Command line.

def parser(prog: str = 'experiments/tleg/run.py', workdir: str = 'workdirs/tleg') -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--workdir', default=workdir, help='output folder (default %(default)s)')
    p.add_argument('--scale', default='digits', choices=('digits', 'smoke', 'paper'))
    p.add_argument('--quick', action='store_true',
                   help='half the step budgets (a pipeline check; ~60%% of the time: compiling dominates)')
    p.add_argument('--seed', type=int, default=None)
    p.add_argument('--variant', choices=('Ti', 'S', 'B'), help="paper scale: DeiT width (default 'S')")
    p.add_argument('--data-dir', help='paper scale: tfds data_dir holding the prepared dataset')
    p.add_argument('--tfds-name', help="paper scale: tfds dataset name (default 'imagenet2012')")
    p.add_argument('--teacher',
                   help='a jlearngene model checkpoint to distil from (and inherit He-LG layers)')
    p.add_argument('--official-pool-order', action='store_true',
                   help='descendants pool LN(mean(x)) as the official TLEG Des-Net (fc_norm)')
    p.add_argument('--quiet', action='store_true')
    return p


def config_from_args(args) -> dict:
    config = default_config(args.scale)
    if args.quick:
        for section in ('teacher', 'aux', 'descend'):
            for unit in ('steps', 'epochs'):
                if config[section].get(unit):
                    config[section][unit] = max(1, config[section][unit] // 2)
        if config['descend'].get('eval_every'):
            config['descend']['eval_every'] = max(1, config['descend']['eval_every'] // 2)
    if args.seed is not None:
        config['seed'] = args.seed
    if args.variant:
        config['model']['variant'] = args.variant
    if args.data_dir:
        config['data']['data_dir'] = args.data_dir
    if args.tfds_name:
        config['data']['tfds_name'] = args.tfds_name
    if args.teacher:
        config['teacher']['checkpoint'] = args.teacher
    if args.official_pool_order:
        config['descend']['official_pool_order'] = True
    return config


def main(argv: list[str] | None = None, prog: str = 'experiments/tleg/run.py',
         workdir: str = 'workdirs/tleg') -> int:
    args = parser(prog, workdir).parse_args(argv)
    results = run(config_from_args(args), args.workdir, quiet=args.quiet)
    print()
    print(results['table'])
    print(f"\nwrote {os.path.join(args.workdir, 'results.md')}, results.json and accuracy_vs_steps.png")
    return 0


if __name__ == '__main__':
    sys.exit(main())
