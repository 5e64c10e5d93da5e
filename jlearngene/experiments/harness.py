"""The experiment harness's pieces, and `run`, which every experiment config goes through.

`run(config, workdir)` runs the experiment module `jlearngene.experiments.<config.experiment>`:
a study (`STUDY = study.Study(...)`: TLEG, LeTra, the comparison) runs through the study
harness `jlearngene.experiments.study` under the fair protocol; a module with its own
stages (`PART = harness.Part(run=...)`: Cluster-Learngene, Scala, Mango) runs itself from
the pieces here: `Data` (train iterators and a reusable test pass), `fit` (one training
run through `trainer.fit`), `distil` (a gene through its Aux-Net by soft distillation),
`budget`, `model_config`, `accuracy` and `write_results` (results.json first, then the table
and plots).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import sys
import time
from typing import Any, Callable, Mapping

import jax

from jlearngene import data, distributed
from jlearngene.models import ViTConfig, apply, vit_config
from jlearngene.train import checkpoint, losses, optim, tasks, trainer
from jlearngene.train.evaluate import evaluate

Config = Any   # an ml_collections.ConfigDict (or a dict of the same shape)


# ----------------------------------------------------------------------------------------
# Experiment modules.

@dataclasses.dataclass(frozen=True)
class Part:
    """An experiment that runs its own stages: `run(config, workdir, quiet) -> results`,
    built from this module's pieces."""
    run: Callable[[Config, str, bool], dict]


def module(name: str):
    """The experiment module `jlearngene.experiments.<name>`: a study (`STUDY =
    study.Study(...)`, run by `jlearngene.experiments.study`) or a method part (`PART`)."""
    try:
        mod = importlib.import_module(f'jlearngene.experiments.{name}')
    except ModuleNotFoundError as e:
        if e.name != f'jlearngene.experiments.{name}':
            raise
        raise ValueError(f'unknown experiment {name!r}: no module jlearngene.experiments.{name}') from None
    if not isinstance(getattr(mod, 'PART', None), Part) and not hasattr(mod, 'STUDY'):
        raise ValueError(f'jlearngene.experiments.{name} defines neither STUDY = study.Study(...) '
                         'nor PART = harness.Part(...)')
    return mod


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
        config: Config, workdir: str, seed: int, eval_every: int | None,
        stop_at: float | None = None):
    """Train `trainable` on `loss_fn` for `steps` with `config.optim` at learning rate `lr`
    (warm-up at most a fifth of the run), evaluating with `eval_fn` every `eval_every` steps
    and at the end, stopping early at the first evaluation with test accuracy ≥ `stop_at`;
    returns (params, [(step, test accuracy)], seconds). The run's log and checkpoint go to
    `workdir/runs/<name>`."""
    opt_cfg = dict(plain(config['optim']), lr=lr)
    opt_cfg['warmup_steps'] = min(int(opt_cfg.get('warmup_steps', 0)), max(steps // 5, 0))
    optimizer = optim.make_optimizer(opt_cfg, trainable, total_steps=steps)
    t0 = time.perf_counter()
    params, history = trainer.fit(
        loss_fn, trainable, dset.train(seed), optimizer, workdir=os.path.join(workdir, 'runs', name),
        steps=steps, eval_fn=eval_fn, eval_data=dset.test, eval_every=eval_every or None,
        log_every=max(1, min(50, steps)), seed=seed, resume=False, progress=False, console=False,
        tensorboard=False, handle_sigterm=False, keep_checkpoints=1,
        stop_when=None if stop_at is None else (lambda rec: rec['eval/accuracy'] >= stop_at))
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
    """A progress line on stderr unless `quiet` (stdout carries only the results table)."""
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------
# The experiment.

def run(config: Config, workdir: str, *, quiet: bool = False) -> dict:
    """Run the experiment `config` describes (its `experiment` module); returns the results
    dict (also written to the workdir, with the tables and plots), its Markdown under 'table'."""
    mod = module(config['experiment'])
    if hasattr(mod, 'STUDY'):
        from jlearngene.experiments import study
        return study.run(config, workdir, mod.STUDY, quiet=quiet)
    return mod.PART.run(config, workdir, quiet)


def write_results(results: dict, workdir: str, table: str | Callable[[dict], str],
                  plot_fn: Callable[[dict, str], Any] | None = None) -> dict:
    """Write `results.json`, then `results.md` (`table`, or `table(results)`) and the plots of
    `plot_fn(results, workdir)` (process 0 only, in a multi-process run); returns `results`
    with the table under 'table'. The records are on disk before any rendering runs."""
    main = distributed.is_main_process()
    if main:
        with open(os.path.join(workdir, 'results.json'), 'w', encoding='utf-8') as f:
            json.dump(checkpoint.to_json(results), f, indent=1)
    results['table'] = table(results) if callable(table) else table
    if not main:
        return results
    with open(os.path.join(workdir, 'results.md'), 'w', encoding='utf-8') as f:
        f.write(results['table'] + '\n')
    if plot_fn is not None:
        plot_fn(results, workdir)
    return results


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

def summary(results: dict, workdir: str) -> str:
    """The lines printed at the end of a run: the table and what was written."""
    plots = sorted(f for f in os.listdir(workdir) if f.endswith('.png'))
    return (f"\n{results['table']}\n\nwrote {os.path.join(workdir, 'results.md')}, results.json"
            + ''.join(f', {f}' for f in plots))
