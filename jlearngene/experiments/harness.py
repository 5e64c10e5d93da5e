"""The experiment harness: one comparison of learngene methods at equal budgets.

`run(config, workdir)` executes what a config file of `jlearngene/experiments/configs`
describes (e.g. `tleg.py`), for the methods `config.methods` of the `jlearngene.genes`
registry, in three stages:

1. **teacher / ancestor**: a ViT of depth `teacher.depth` trained with cross-entropy (or the
   model artefact `teacher.checkpoint`);
2. **upstream genes**: every method whose `source` is 'learned' gets
   `init_gene(aux_cfg, key, **options)`, trained by soft distillation from the teacher
   through `materialize(gene, None, aux_cfg)` (only the gene trains); 'model' methods derive
   their gene from the teacher (`gene_from_model`) per descendant; 'none' has no gene;
3. **descendants** of every depth in `descend.depths`: `descend(gene, target_cfg, ...)`,
   evaluated at initialisation and fine-tuned for the same steps with the same optimiser.

What differs between experiments sits in a *method part* (`config.experiment` names the
module `jlearngene.experiments.<name>`, which defines `PART = harness.Part(...)`): the
descendants' config, and the options each method's gene and descendant get (which may
follow the descendant's depth).

Writes `results.json`, `results.md` (`markdown`), `accuracy_vs_steps.png` and
`accuracy_vs_flops.png` (`plot`: training FLOPs from `costs.training_cost`, each method's
upstream runs included), each learned gene and the teacher as model artefacts (`genes/<name>/`,
`teacher/`), and one training log per run under `runs/`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import time
from typing import Any, Callable, Mapping

import jax

from jlearngene import costs, data, distributed, genes
from jlearngene.models import ViTConfig, apply, init, vit_config
from jlearngene.train import checkpoint, losses, optim, tasks, trainer
from jlearngene.train.evaluate import evaluate

Config = Any   # an ml_collections.ConfigDict (or a dict of the same shape)


# ----------------------------------------------------------------------------------------
# The method part: what an experiment changes.

def _same_depth(cfg: ViTConfig, config: Config) -> ViTConfig:
    return cfg


def config_options(method: genes.Method, depth: int | None, config: Config,
                   teacher: ViTConfig) -> dict[str, dict]:
    """The default options: `config.method_options.<name>` for the gene, none for `descend`."""
    opts = get(config, 'method_options', {}).get(method.name, {})
    return {'gene': plain(opts), 'descend': {}}


@dataclasses.dataclass(frozen=True)
class Part:
    """An experiment's method part.

    descendant_config(cfg, config) -> ViTConfig: adjust the descendant config (the model
      section at the descendant's depth) before it is built.
    options(method, depth, config, teacher) -> {'gene': {...}, 'descend': {...}}: keyword
      options of `init_gene` / `gene_from_model` and of `descend`; `depth` is None for a
      learned gene (trained once, before any descendant) and the descendant's depth
      otherwise, `teacher` the teacher's ViTConfig. S-Params count the gene's head when the
      descend options say head='inherit'.
    label(method, options) -> str: the method's name in tables and plots.
    run(config, workdir, quiet) -> results: an experiment whose stages differ from the
      three above (one slimmable network, growing a small model, an ancestor on another
      task) runs itself, built from this module's public pieces (`Data`, `fit`, `budget`,
      `model_config`, `accuracy`, `write_results`); `harness.run` then calls it.
    """
    descendant_config: Callable[[ViTConfig, Config], ViTConfig] = _same_depth
    options: Callable[..., dict[str, dict]] = config_options
    label: Callable[[genes.Method, dict[str, dict]], str] = lambda method, options: method.label
    run: Callable[[Config, str, bool], dict] | None = None


def part(name: str) -> Part:
    """The method part `jlearngene.experiments.<name>.PART`."""
    try:
        module = importlib.import_module(f'jlearngene.experiments.{name}')
    except ModuleNotFoundError as e:
        if e.name != f'jlearngene.experiments.{name}':
            raise
        raise ValueError(f'unknown experiment {name!r}: no module jlearngene.experiments.{name}') from None
    if not isinstance(getattr(module, 'PART', None), Part):
        raise ValueError(f'jlearngene.experiments.{name} defines no PART = harness.Part(...)')
    return module.PART


# ----------------------------------------------------------------------------------------
# Config access (ConfigDict or dict).

def get(section: Any, key: str, default: Any = None) -> Any:
    """`section[key]` of a ConfigDict or dict, `default` where absent."""
    return section.get(key, default) if hasattr(section, 'get') else default


def plain(value: Any) -> Any:
    """A ConfigDict (or nested mapping) as plain nested dicts."""
    if hasattr(value, 'to_dict'):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


def model_config(config: Config, depth: int, num_classes: int) -> ViTConfig:
    """The ViTConfig of `config.model` at `depth` with `num_classes`."""
    m = plain(config['model'])
    return vit_config(m.pop('variant', 'Ti'), depth=depth, num_classes=num_classes, **m)


def budget(section: Config, num_examples: int, batch: int, name: str) -> int:
    """Optimiser steps of a stage: `steps` if > 0, else `epochs` (> 0) over the train split."""
    steps, epochs = get(section, 'steps', 0) or 0, get(section, 'epochs', 0.0) or 0.0
    if steps > 0:
        return int(steps)
    if epochs > 0:
        return max(1, int(round(epochs * num_examples / batch)))
    raise ValueError(f'config section {name!r} needs steps > 0 or epochs > 0')


def prepare(config: Config, workdir: str) -> float:
    """Create `workdir`, persist compiled programs in workdir/jax_cache unless
    `config.compile_cache` is False, and return the run's start time (`time.perf_counter`)."""
    os.makedirs(workdir, exist_ok=True)
    if get(config, 'compile_cache', True):
        enable_compile_cache(os.path.join(workdir, 'jax_cache'))
    return time.perf_counter()


def enable_compile_cache(path: str) -> bool:
    """Persist compiled programs under `path`: the descendants of one depth share their train
    and eval programs across methods, so most compiles become cache reads. Has no effect
    (returns False) when a cache directory is already set."""
    if jax.config.jax_compilation_cache_dir:
        return False
    from jax.experimental.compilation_cache import compilation_cache
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    compilation_cache.reset_cache()   # jax reads the directory once per process
    return True


# ----------------------------------------------------------------------------------------
# Data and training runs.

class Data:
    """Train iterators and a reusable test pass for the config's dataset."""

    def __init__(self, config: Config):
        self.config = config
        dc = plain(config['data'])
        if dc.get('name') == 'tfds' and not dc.get('data_dir'):
            raise ValueError('a tfds dataset needs the prepared data: set --config.data.data_dir '
                             '(and --config.data.tfds_name); nothing is downloaded')
        self.data_config = dc
        _, info = data.from_config(dc, 'train', batch_size=config['batch_size'],
                                   seed=config['seed'], train=True)
        self.num_classes, self.num_examples = info.num_classes, info.num_examples

    def train(self, seed: int):
        return data.from_config(self.data_config, 'train', batch_size=self.config['batch_size'],
                                seed=seed, train=True)[0]

    def test(self):
        return data.from_config(self.data_config, 'test', batch_size=self.config['eval_batch_size'],
                                seed=0, train=False)[0]


def fit(name: str, loss_fn, trainable, eval_fn, dset: Data, *, steps: int, lr: float,
        config: Config, workdir: str, seed: int, eval_every: int | None):
    """Train `trainable` on `loss_fn` for `steps` with `config.optim` at learning rate `lr`
    (warm-up at most a fifth of the run), evaluating with `eval_fn` every `eval_every` steps
    and at the end; returns (params, [(step, test accuracy)], seconds). The run's log and
    checkpoint go to `workdir/runs/<name>`."""
    opt_cfg = dict(plain(config['optim']), lr=lr)
    opt_cfg['warmup_steps'] = min(int(opt_cfg.get('warmup_steps', 0)), max(steps // 5, 0))
    optimizer = optim.make_optimizer(opt_cfg, trainable, total_steps=steps)
    t0 = time.perf_counter()
    params, history = trainer.fit(
        loss_fn, trainable, dset.train(seed), optimizer, workdir=os.path.join(workdir, 'runs', name),
        steps=steps, eval_fn=eval_fn, eval_data=dset.test, eval_every=eval_every or None,
        log_every=max(1, min(50, steps)), seed=seed, resume=False, progress=False, console=False,
        tensorboard=False, handle_sigterm=False, keep_checkpoints=1)
    curve = [(int(r['step']), float(r['eval/accuracy'])) for r in history['eval']]
    return params, curve, time.perf_counter() - t0


@functools.lru_cache(maxsize=None)
def eval_fn(cfg: ViTConfig) -> Callable:
    """`tasks.classification_eval(cfg)`, one function object (one compile) per config."""
    return tasks.classification_eval(cfg)


def accuracy(params, cfg: ViTConfig, dset: Data) -> float:
    """Test accuracy of canonical params."""
    return evaluate(eval_fn(cfg), params, dset.test())['accuracy']


def say(msg: str, quiet: bool) -> None:
    """Print a progress line unless `quiet`."""
    if not quiet:
        print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# The experiment.

def run(config: Config, workdir: str, *, quiet: bool = False) -> dict:
    """Run the comparison `config` describes; returns the results dict (also written to the
    workdir, with the tables and plots) plus its Markdown table under 'table'."""
    exp = part(config['experiment'])
    if exp.run is not None:
        return exp.run(config, workdir, quiet)
    methods = [genes.get(name) for name in config['methods']]    # unknown names fail here
    t_start = prepare(config, workdir)
    dset = Data(config)
    K, bs, seed, n = dset.num_classes, config['batch_size'], config['seed'], dset.num_examples
    timings: dict[str, float] = {}
    upstream: list[costs.Run] = []

    # 1. Teacher / ancestor.
    tc = config['teacher']
    t_cfg = model_config(config, tc['depth'], K)
    if get(tc, 'checkpoint', ''):
        teacher, stored_cfg, _ = checkpoint.load_model(tc['checkpoint'])
        t_cfg = stored_cfg or t_cfg
        t_acc, timings['teacher'] = accuracy(teacher, t_cfg, dset), 0.0
    else:
        steps = budget(tc, n, bs, 'teacher')
        teacher, curve, timings['teacher'] = fit(
            'teacher', tasks.classification_loss(t_cfg), init(t_cfg, jax.random.key(seed)),
            eval_fn(t_cfg), dset, steps=steps, lr=config['optim']['lr'],
            config=config, workdir=workdir, seed=seed, eval_every=None)
        t_acc = curve[-1][1]
        upstream.append(costs.Run('teacher', t_cfg, steps * bs / n, n))
        checkpoint.save_model(os.path.join(workdir, 'teacher'), teacher, t_cfg, overwrite=True,
                              extra={'test_accuracy': t_acc})
    say(f'teacher  depth {t_cfg.depth}: test accuracy {t_acc:.4f} ({timings["teacher"]:.0f}s)', quiet)

    # 2. Learned genes through the Aux-Net (soft KD from the teacher; only the gene trains).
    ac = config['aux']
    aux_cfg = model_config(config, ac['depth'], K)
    learned, aux_acc = {}, {}
    for method in (m for m in methods if m.source == 'learned'):
        options = exp.options(method, None, config, t_cfg)['gene']
        learned[method.name], aux_acc[method.name], secs, steps = _learn_gene(
            method, options, teacher, t_cfg, aux_cfg, dset, config, workdir)
        timings[f'aux_{method.name}'] = secs
        upstream.append(costs.Run(f'aux_{method.name}', aux_cfg, steps * bs / n, n, teacher=t_cfg))
        checkpoint.save_model(os.path.join(workdir, 'genes', method.name), learned[method.name],
                              aux_cfg, overwrite=True,
                              extra={'kind': f'{method.name}_gene', 'method': method.name,
                                     'options': options, 'aux_test_accuracy': aux_acc[method.name]})
        say(f'aux-net  {method.label:<10} depth {aux_cfg.depth}: test accuracy '
             f'{aux_acc[method.name]:.4f} ({secs:.0f}s)', quiet)
    up_cost = costs.training_cost(upstream)
    up_flops = {r['name']: r['flops'] for r in up_cost['runs']}

    # 3. Descendants: the same budget for every method.
    dc = config['descend']
    d_steps = budget(dc, n, bs, 'descend')
    rows, curves = [], {}
    for depth in dc['depths']:
        d_cfg = exp.descendant_config(model_config(config, depth, K), config)
        key = jax.random.key(seed + 100 + depth)
        for method in methods:
            options = exp.options(method, depth, config, t_cfg)
            gene = _gene(method, options['gene'], learned, teacher, t_cfg)
            params0 = method.descend(gene, d_cfg, key=key, **options['descend'])
            s_params = 0 if gene is None else method.gene_param_count(
                gene, include_head=options['descend'].get('head') == 'inherit')
            ups = upstream_runs(method)
            acc0 = accuracy(params0, d_cfg, dset)
            name = f'des{depth}_{method.name}'
            _, curve, secs = fit(name, tasks.classification_loss(d_cfg), params0,
                                  eval_fn(d_cfg), dset, steps=d_steps, lr=dc['lr'],
                                  config=config, workdir=workdir, seed=seed + 7,
                                  eval_every=get(dc, 'eval_every', 0))
            timings[name] = secs
            curves[name] = [(0, acc0)] + curve
            ft = costs.training_cost([costs.Run(name, d_cfg, d_steps * bs / n, n)])
            label = exp.label(method, options)
            rows.append(dict(depth=depth, method=method.name, label=label, acc_init=acc0,
                             acc=curve[-1][1], params=costs.param_count(d_cfg), s_params=s_params,
                             flops=costs.flops_per_image(d_cfg), finetune_flops=ft['flops'],
                             finetune_epochs=ft['epochs'], upstream=ups,
                             upstream_flops=sum(up_flops.get(u, 0.0) for u in ups),
                             options=options, seconds=secs))
            say(f'des L{depth} {label:<10}: init {acc0:.4f} -> {curve[-1][1]:.4f} '
                 f'after {d_steps} steps ({secs:.0f}s)', quiet)

    results = dict(
        config=plain(config), teacher=dict(depth=t_cfg.depth, accuracy=t_acc), aux=aux_acc,
        aux_config=aux_cfg.to_dict(), labels={m.name: m.label for m in methods},
        finetune_steps=d_steps, batch_size=bs, rows=rows, curves=curves, upstream=up_cost,
        timings=timings, seconds=time.perf_counter() - t_start,
        gene_params={m.name: m.gene_param_count(learned[m.name], include_head=True)
                     for m in methods if m.name in learned},
    )
    return write_results(results, workdir, markdown(results), plot)


def write_results(results: dict, workdir: str, table: str,
                  plot_fn: Callable[[dict, str], Any] | None = None) -> dict:
    """Write `results.json`, `results.md` (`table`) and the plots of `plot_fn(results,
    workdir)` (process 0 only, in a multi-process run); returns `results` with the table
    under 'table'."""
    results['table'] = table
    if not distributed.is_main_process():
        return results
    with open(os.path.join(workdir, 'results.json'), 'w', encoding='utf-8') as f:
        json.dump(checkpoint.to_json(results), f, indent=1)
    with open(os.path.join(workdir, 'results.md'), 'w', encoding='utf-8') as f:
        f.write(table + '\n')
    if plot_fn is not None:
        plot_fn(results, workdir)
    return results


def _gene(method: genes.Method, options: dict, learned: dict, teacher, t_cfg: ViTConfig):
    """A descendant's gene: the trained one, one derived from the teacher, or None."""
    if method.source == 'learned':
        return learned[method.name]
    if method.source == 'model':
        return method.gene_from_model(teacher, t_cfg, **options)
    return None


def upstream_runs(method: genes.Method) -> list[str]:
    """Names of the upstream runs a method's descendants need (their cost is the method's):
    the teacher for a gene from a model, teacher and Aux-Net for a learned gene."""
    return {'learned': ['teacher', f'aux_{method.name}'], 'model': ['teacher'],
            'none': []}[method.source]


def _learn_gene(method, options, teacher, t_cfg, aux_cfg, dset, config, workdir):
    """Train `method`'s gene through the Aux-Net by soft distillation from the teacher."""
    gene0 = method.init_gene(aux_cfg, jax.random.key(config['seed'] + 1), **options)
    return distil(f'aux_{method.name}', lambda g: method.materialize(g, None, aux_cfg), gene0,
                  teacher, t_cfg, aux_cfg, dset, config, workdir)


def distil(name: str, materialize: Callable, gene0, teacher, t_cfg: ViTConfig,
           aux_cfg: ViTConfig, dset: Data, config: Config, workdir: str, *,
           decay: tuple[str, ...] | None = None):
    """Train the gene `gene0` through the Aux-Net `materialize(gene)` (config `aux_cfg`) by
    soft distillation from `teacher` (`config.aux`: steps or epochs, tau, alpha); only the
    gene trains, `decay` (path regexes) limits weight decay to those leaves. Returns (gene,
    the Aux-Net's test accuracy, seconds, steps)."""
    ac, seed = config['aux'], config['seed']
    steps = budget(ac, dset.num_examples, config['batch_size'], 'aux')

    def kd_loss(gene, batch, rng):
        student, _ = apply(materialize(gene), batch['image'], aux_cfg, train=True, rng=rng)
        target = apply(teacher, batch['image'], t_cfg)[0]
        loss = losses.soft_distillation(student, target, batch['label'], tau=ac['tau'], alpha=ac['alpha'])
        return loss, {'accuracy': losses.accuracy(student, batch['label'])}

    def aux_eval(gene, batch):
        return eval_fn(aux_cfg)(materialize(gene), batch)

    optim_cfg = dict(plain(config['optim']))
    if decay is not None:
        optim_cfg['decay'] = decay
    gene, curve, secs = fit(name, kd_loss, gene0, aux_eval, dset, steps=steps,
                             lr=config['optim']['lr'], config={'optim': optim_cfg},
                             workdir=workdir, seed=seed + 1, eval_every=None)
    return gene, curve[-1][1], secs, steps


# ----------------------------------------------------------------------------------------
# Reporting.

def _m(n: float) -> str:
    return f'{n / 1e6:.3f}'


def markdown(results: dict) -> str:
    """The results table (Markdown): one row per descendant and method, plus upstream costs."""
    labels = results.get('labels', {})
    lines = [
        f"Descendants fine-tuned {results['finetune_steps']} steps each "
        f"(teacher depth {results['teacher']['depth']}: {results['teacher']['accuracy']:.4f}"
        + ''.join(f", Aux-Net {labels.get(k, k)}: {v:.4f}" for k, v in results['aux'].items()) + ').',
        '',
        '| depth | method | acc. at init | acc. after fine-tuning | Params (M) | S-Params (M) '
        '| MFLOPs/img | fine-tune cost (GFLOPs) | upstream cost (GFLOPs) |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in results['rows']:
        lines.append(f"| {r['depth']} | {r['label']} | {r['acc_init']:.4f} | **{r['acc']:.4f}** | "
                     f"{_m(r['params'])} | {_m(r['s_params'])} | {r['flops'] / 1e6:.2f} | "
                     f"{r['finetune_flops'] / 1e9:.1f} | {r['upstream_flops'] / 1e9:.1f} |")
    lines += ['', 'Upstream runs (shared by all descendants of a method): '
              + ', '.join(f"{r['name']} {r['epochs']:.1f} epochs = {r['flops'] / 1e9:.1f} GFLOPs"
                          for r in results['upstream']['runs']) + '.',
              f"Wall time {results['seconds']:.0f}s.",
              'S-Params: parameters stored to initialise the descendant (`gene_param_count` of '
              'its gene, the head included when the descendant inherits it). Costs: 3x forward '
              'FLOPs per training image; Aux-Nets add one teacher forward.']
    return '\n'.join(lines)


def flops_curve(results: dict, row: dict) -> list[tuple[float, float]]:
    """(training FLOPs, accuracy) along a descendant's fine-tuning: its method's upstream
    cost plus the fine-tuning FLOPs of the steps taken so far."""
    per_step = row['finetune_flops'] / results['finetune_steps']
    return [(row['upstream_flops'] + step * per_step, acc)
            for step, acc in results['curves'][f"des{row['depth']}_{row['method']}"]]


def plot(results: dict, workdir: str) -> list[str]:
    """accuracy_vs_steps.png and accuracy_vs_flops.png (one panel per descendant depth);
    returns their paths. The FLOPs axis is logarithmic, so a point at zero training FLOPs
    (Scratch's initialisation) is not drawn."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    depths = sorted({r['depth'] for r in results['rows']})
    paths = []
    for kind in ('steps', 'flops'):
        fig, axes = plt.subplots(1, len(depths), figsize=(3.6 * len(depths), 3.2), squeeze=False)
        for ax, depth in zip(axes[0], depths):
            for r in (r for r in results['rows'] if r['depth'] == depth):
                if kind == 'steps':
                    pts = results['curves'][f"des{depth}_{r['method']}"]
                else:
                    pts = [(x / 1e9, y) for x, y in flops_curve(results, r) if x > 0]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', ms=3, label=r['label'])
            ax.set_title(f'descendant depth {depth}')
            ax.set_xlabel('fine-tuning steps' if kind == 'steps'
                          else 'training GFLOPs (upstream + fine-tuning)')
            if kind == 'flops':
                ax.set_xscale('log')
                ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel('test accuracy')
        axes[0][-1].legend(loc='lower right', fontsize=8)
        fig.tight_layout()
        paths.append(os.path.join(workdir, f'accuracy_vs_{kind}.png'))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def summary(results: dict, workdir: str) -> str:
    """The lines printed at the end of a run: the table and what was written."""
    plots = sorted(f for f in os.listdir(workdir) if f.endswith('.png'))
    return (f"\n{results['table']}\n\nwrote {os.path.join(workdir, 'results.md')}, results.json"
            + ''.join(f', {f}' for f in plots))
