"""The pieces the study harness (`jlearngene.experiments.study`) runs experiments from:
`module` (the experiment module a config names), `Data` (train iterators and a reusable
test pass, optionally of some classes only), `fit` (one training run through
`trainer.fit`), `distil` (a gene through its Aux-Net by soft distillation), `budget`,
`model_config`, `accuracy` and `write_results` (results.json first, then the table and
plots).
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jlearngene import data, distributed, losses, pytree
from jlearngene.models import ViTConfig, apply, vit_config
from jlearngene.train import checkpoint, optim, tasks, trainer
from jlearngene.train.evaluate import evaluate

Config = Any   # an ml_collections.ConfigDict (or a dict of the same shape)


# ----------------------------------------------------------------------------------------
# Experiment modules.

def module(name: str):
    """The experiment module `jlearngene.experiments.<name>`: its `STUDY = study.Study(...)`
    (claims and at most one small function), run by `jlearngene.experiments.study`."""
    try:
        mod = importlib.import_module(f'jlearngene.experiments.{name}')
    except ModuleNotFoundError as e:
        if e.name != f'jlearngene.experiments.{name}':
            raise
        raise ValueError(f'unknown experiment {name!r}: no module jlearngene.experiments.{name}') from None
    if not hasattr(mod, 'STUDY'):
        raise ValueError(f'jlearngene.experiments.{name} defines no STUDY = study.Study(...)')
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
    """Create `workdir` and return the run's start time (`time.perf_counter`). (jax's
    persistent compilation cache is the caller's choice: `jlearngene train` turns it on in
    workdir/jax_cache when `config.compile_cache` is set.)"""
    del config
    os.makedirs(workdir, exist_ok=True)
    return time.perf_counter()


# ----------------------------------------------------------------------------------------
# Data and training runs.

class Data:
    """Train iterators and a reusable test pass for the config's dataset; with `classes`,
    only those of its classes, relabelled 0..k−1 in the order given (a study's two tasks:
    an ancestor trained on some classes, descendants on others)."""

    def __init__(self, config: Config, classes: Sequence[int] | None = None):
        self.config = config
        dc = plain(config['data'])
        if dc.get('name') == 'tfds' and not dc.get('data_dir'):
            raise ValueError('a tfds dataset needs the prepared data: set --config.data.data_dir '
                             '(and --config.data.tfds_name); nothing is downloaded')
        self.data_config = dc
        self.classes = None if classes is None else tuple(int(c) for c in classes)
        self.sources = ({} if classes is None else
                        {split: self._subset(data.source_from_config(dc, split), split)
                         for split in ('train', 'test')})
        _, info = data.from_config(dc, 'train', batch_size=config['batch_size'],
                                   seed=config['seed'], train=True, source=self.sources.get('train'))
        self.info = info
        self.num_classes, self.num_examples = info.num_classes, info.num_examples
        self.mean = tuple(dc['mean']) if dc.get('mean') is not None else info.mean
        self.std = tuple(dc['std']) if dc.get('std') is not None else info.std

    def _subset(self, source, split: str):
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f'task classes {self.classes} repeat a class')
        bad = [c for c in self.classes if not 0 <= c < source.info.num_classes]
        if bad:
            raise ValueError(f'task classes {bad} are not classes of {source.info.name} '
                             f'(0..{source.info.num_classes - 1})')
        rows = [source[i] for i in range(len(source))]
        relabel = {c: i for i, c in enumerate(self.classes)}
        keep = [r for r in rows if r['label'] in relabel]
        return data.array_source(np.stack([r['image'] for r in keep]),
                                 np.array([relabel[r['label']] for r in keep]),
                                 num_classes=len(self.classes), split=split,
                                 name=f'{source.info.name}{list(self.classes)}')

    def train(self, seed: int):
        return data.from_config(self.data_config, 'train', batch_size=self.config['batch_size'],
                                seed=seed, train=True, source=self.sources.get('train'))[0]

    def test(self):
        return data.from_config(self.data_config, 'test', batch_size=self.config['eval_batch_size'],
                                seed=0, train=False, source=self.sources.get('test'))[0]

    def identity(self) -> list:
        """What names this data for a finished run's fingerprint (`fit`)."""
        return [self.info.name, self.classes, self.num_examples, self.data_config]

    def raw_batches(self, n: int, batch: int):
        """The first `n` training images in [0, 1], unaugmented, `batch` at a time."""
        source = self.sources.get('train') or data.source_from_config(self.data_config, 'train')
        images = np.stack([source[i]['image'] for i in range(min(n, len(source)))])
        return [images[i:i + batch].astype(np.float32) / 255.0 for i in range(0, len(images), batch)]


FINISHED = 'finished.json'   # a finished run's fingerprint, curve, seconds and final step (`fit`)


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """sha256 of the jlearngene package's Python sources: a finished run is reused only by
    the code that made it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith('.py'):
                path = os.path.join(folder, f)
                h.update(os.path.relpath(path, root).encode())
                with open(path, 'rb') as fh:
                    h.update(fh.read())
    return h.hexdigest()


def software_and_devices() -> list:
    """The versions, devices and XLA flags a run's numbers depend on, beside the sources."""
    import flax
    import jaxlib
    import optax
    return [jax.__version__, jaxlib.__version__, flax.__version__, optax.__version__, np.__version__,
            jax.default_backend(), jax.devices()[0].device_kind, jax.device_count(),
            os.environ.get('XLA_FLAGS', '')]


def tree_digest(tree) -> dict:
    """A pytree's {path: [shape, dtype, checksum]} (`checkpoint.tree_checksums`)."""
    sums = checkpoint.tree_checksums(tree)
    return {p: [list(np.shape(x)), str(x.dtype), sums[p]] for p, x in pytree.flatten(tree).items()}


def _fingerprint(**parts) -> str:
    return hashlib.sha256(json.dumps(checkpoint.to_json(parts), sort_keys=True, default=repr)
                          .encode()).hexdigest()


def _reuse(run_dir: str, fingerprint: str, like):
    """(params, curve, seconds) of the finished run in `run_dir` with this fingerprint: its
    final run checkpoint read into `like`'s structure; None for a missing, other or
    unreadable record or checkpoint (the run trains again)."""
    try:
        with open(os.path.join(run_dir, FINISHED), encoding='utf-8') as f:
            meta = json.load(f)
        if meta.get('fingerprint') != fingerprint:
            return None
        with checkpoint.RunCheckpointer(os.path.join(run_dir, 'checkpoints'), keep=1) as ckpt:
            params, _ = ckpt.restore_params(like, int(meta['step']))
    except (OSError, ValueError, KeyError, TypeError, checkpoint.CheckpointError):
        return None
    return params, [(int(s), float(a)) for s, a in meta['curve']], float(meta['seconds'])


def fit(name: str, loss_fn, trainable, eval_fn, dset: Data, *, steps: int, lr: float,
        config: Config, workdir: str, seed: int, eval_every: int | None,
        stop_at: float | None = None, identity: Any = None, reused: list | None = None):
    """Train `trainable` on `loss_fn` for `steps` with `config.optim` at learning rate `lr`
    (warm-up at most a fifth of the run), evaluating with `eval_fn` every `eval_every` steps
    and at the end, stopping early at the first evaluation with test accuracy ≥ `stop_at`;
    returns (params, [(step, test accuracy)], seconds). The run's log and checkpoint go to
    `workdir/runs/<name>`.

    A finished run leaves `runs/<name>/finished.json` (its fingerprint, curve, seconds and
    the step of its final checkpoint, which holds the params). Run
    again with the same name, settings, `identity` (what else the loss depends on, e.g. the
    whole study config), data, initial `trainable`, jlearngene sources, library versions and
    devices, it is read back instead of trained (its name appended to `reused`), so an
    interrupted study picks up after its last finished run. Anything different, several processes or data other than a
    `Data` trains again; a new workdir reruns everything."""
    opt_cfg = dict(plain(config['optim']), lr=lr)
    opt_cfg['warmup_steps'] = min(int(opt_cfg.get('warmup_steps', 0)), max(steps // 5, 0))
    run_dir = os.path.join(workdir, 'runs', name)
    finished = os.path.join(run_dir, FINISHED)
    # one process, on a `Data` (its identity): other data iterators are never reused
    reusable = jax.process_count() == 1 and hasattr(dset, 'identity')
    fingerprint = _fingerprint(
        name=name, steps=steps, opt=opt_cfg, seed=seed, eval_every=eval_every, stop_at=stop_at,
        identity=identity, data=dset.identity(), trainable=tree_digest(trainable),
        source=source_digest(), software=software_and_devices()) if reusable else None
    done = _reuse(run_dir, fingerprint, trainable) if reusable else None
    if done is not None:
        if reused is not None:
            reused.append(name)
        return done
    optimizer = optim.make_optimizer(opt_cfg, trainable, total_steps=steps)
    loss_key = getattr(loss_fn, 'key', None)   # runs of one loss and shape compile once
    run = trainer.FitConfig(
        workdir=run_dir, steps=steps, log_every=max(1, min(50, steps)),
        seed=seed, resume=False, progress=False, console=False, tensorboard=False,
        handle_sigterm=False, keep_checkpoints=1,
        compile_key=None if loss_key is None else
        (loss_key, optim.cache_key(opt_cfg, trainable, total_steps=steps)))
    hooks = [] if eval_fn is None else [trainer.Evaluation(eval_fn, dset.test, every=eval_every or None)]
    if stop_at is not None:
        hooks.append(trainer.StopWhen(lambda rec: rec['eval/accuracy'] >= stop_at,
                                      f'test accuracy >= {stop_at:g}'))
    if reusable and os.path.exists(finished):
        os.remove(finished)            # another run's record: it is trained again below
    t0 = time.perf_counter()
    params, history = trainer.fit(loss_fn, trainable, dset.train(seed), optimizer, run, hooks)
    curve = [(int(r['step']), float(r['eval/accuracy'])) for r in history['eval']]
    secs = time.perf_counter() - t0
    if reusable:   # the final checkpoint holds the params; this marks the run finished
        tmp = finished + '.tmp'
        with open(tmp, 'w', encoding='utf-8') as f:
            json.dump(dict(fingerprint=fingerprint, curve=curve, seconds=secs,
                           step=curve[-1][0] if curve else steps), f)
        os.replace(tmp, finished)
    return params, curve, secs


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
# Results.

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
           decay: tuple[str, ...] | None = None, reused: list | None = None):
    """Train the gene `gene0` through the Aux-Net `materialize(gene)` (config `aux_cfg`) by
    soft distillation from `teacher` (`config.aux`: steps or epochs, tau, alpha); only the
    gene trains, `decay` (path regexes) limits weight decay to those leaves (`reused`: as
    `fit`'s). Returns (gene,
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
    identity = dict(config=plain(config), aux_cfg=aux_cfg.to_dict(), t_cfg=t_cfg.to_dict(),
                    teacher=tree_digest(teacher), decay=decay)
    gene, curve, secs = fit(name, kd_loss, gene0, aux_eval, dset, steps=steps,
                             lr=config['optim']['lr'], config={'optim': optim_cfg},
                             workdir=workdir, seed=seed + 1, eval_every=None,
                             identity=identity, reused=reused)
    return gene, curve[-1][1], secs, steps


# ----------------------------------------------------------------------------------------
# Reporting.

def summary(results: dict, workdir: str) -> str:
    """The lines printed at the end of a run: the table and what was written."""
    plots = sorted(f for f in os.listdir(workdir) if f.endswith('.png'))
    return (f"\n{results['table']}\n\nwrote {os.path.join(workdir, 'results.md')}, results.json"
            + ''.join(f', {f}' for f in plots))
