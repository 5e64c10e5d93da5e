"""The pieces the study protocol (`jlearngene.experiments.study`) and the recipes
(`jlearngene.experiments.recipes`) run experiments from: `module` (the experiment module a
config names), `Data` (train iterators and a reusable test pass, optionally of some classes
only), `fit` (one training run through `trainer.fit`, reused when it finished before),
`distil` (a gene through its Aux-Net by soft distillation), `Context` (one study's shared
state), the config's shapes (`reference_config`, `shape_configs`, `fraction_steps`),
`budget`, `accuracy` and `write_results` (results.json first, then the
table and plots).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import logging
import os
import shutil
import sys
import time
from typing import Any
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from jlearngene import compiler, costs, data, distributed, genes, losses, pytree
from jlearngene.models import ViTConfig, apply, model_config, vit
from jlearngene.train import checkpoint, files, integrity, run_checkpoint, tasks, trainer
from jlearngene.train import optim as optimisers
from jlearngene.train.evaluate import evaluate
from jlearngene.train import metrics as metrics_lib
from jlearngene.train.hooks import Evaluation, Hook, StopWhen
from jlearngene.train.state import config_changes

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


OWNER = 'study.json'   # which study and config a study's workdir belongs to
# what a plain training run (`jlearngene train` of a classification config) leaves in its
# workdir; a study's runs live in runs/<name>, never there
PLAIN_RUN_FILES = ('metrics.jsonl', 'checkpoints', 'config.json', 'model')


def holds_study_runs(path: str) -> bool:
    """Whether the folder `path` holds a study's runs (its `study.json`, or a `runs/` folder
    as `jlearngene demo` leaves), finished or not."""
    return os.path.isfile(os.path.join(path, OWNER)) or os.path.isdir(os.path.join(path, 'runs'))


def check_not_a_study(workdir: str) -> None:
    """A one-line ValueError where `workdir` belongs to a study (its `study.json`): a plain
    training run there would mix its checkpoints and metrics with the study's runs."""
    path = os.path.join(workdir, OWNER)
    if os.path.exists(path):
        raise ValueError(f'workdir {workdir!r} belongs to a study ({path}); give this run another --workdir')


def claim_workdir(workdir: str, config: Config) -> None:
    """Record that `workdir` belongs to the study `config` (`study.json`: its experiment
    and a digest of its config), or a one-line ValueError if it belongs to another study or
    to this one with another config: a workdir holds one study's runs, results and plot."""
    path = os.path.join(workdir, OWNER)
    mine = dict(experiment=config['experiment'], config_sha256=_fingerprint(config=plain(config)))
    keys = tuple(mine)   # what must match; the config itself is kept to name what differs
    try:
        with open(path, encoding='utf-8') as f:
            owner = json.load(f)
    except FileNotFoundError:
        owner = None
    except (OSError, ValueError) as e:
        raise ValueError(f'{path}: unreadable ({e}); it names the study that owns {workdir!r}') from None
    plain_run = [f for f in PLAIN_RUN_FILES if os.path.exists(os.path.join(workdir, f))]
    if plain_run:
        raise ValueError(f'workdir {workdir!r} holds a training run ({", ".join(plain_run)}), not a '
                         'study; give this study another --workdir')
    if owner is None:
        if os.path.exists(os.path.join(workdir, 'results.json')) or os.path.isdir(os.path.join(workdir, 'runs')):
            raise ValueError(f'workdir {workdir!r} holds runs or results of a study that is not '
                             'recorded there; give this study another --workdir')
        files.write_text(path, json.dumps(dict(mine, config=checkpoint.to_json(plain(config))), indent=1))
    elif {k: owner.get(k) for k in keys} != mine:
        if owner.get('experiment') != mine['experiment']:
            what = 'the study ' + repr(owner.get('experiment'))
        else:
            changes = config_changes(owner.get('config'), plain(config))
            what = f"the {mine['experiment']} study with another config" + (
                f" ({'; '.join(changes[:4])}{'; ...' if len(changes) > 4 else ''})" if changes else '')
        raise ValueError(f'workdir {workdir!r} belongs to {what} ({path}); give this study '
                         f'another --workdir (with ${STORE_VAR} set, runs of the same settings are '
                         'shared between workdirs), or delete that folder to start over')


# ----------------------------------------------------------------------------------------
# Data and training runs.

class Data:
    """Train iterators and a reusable test pass for the config's dataset, or a part of it
    (`data.subset`): `classes`, relabelled 0..k−1 in the order given (a study's two tasks:
    an ancestor trained on some classes, descendants on others); or a `task` mapping with
    `classes`, `label_fraction` (a seeded labelled part of the training split) and
    `validation_per_class` (that many training images per class held out of every labelled
    part: `validation()`, what a transfer study chooses its settings on), chosen by
    `subset_seed`."""

    def __init__(self, config: Config, classes: Sequence[int] | None = None, *,
                 task: Mapping[str, Any] | None = None):
        self.config = config
        dc = plain(config['data'])
        if dc.get('name') == 'tfds' and not dc.get('data_dir'):
            raise ValueError('a tfds dataset needs the prepared data: set --config.data.data_dir '
                             '(and --config.data.tfds_name); nothing is downloaded')
        self.data_config = dc
        task = dict(task or {}) if classes is None else {**(task or {}), 'classes': classes}
        self.task = task
        self.classes = None if task.get('classes') is None else tuple(int(c) for c in task['classes'])
        self.sources = self._sources(dc, task) if task else {}
        _, info = data.from_config(dc, 'train', batch_size=config['batch_size'],
                                   seed=config['seed'], train=True, source=self.sources.get('train'))
        self.info = info
        self.num_classes, self.num_examples = info.num_classes, info.num_examples
        self.mean = tuple(dc['mean']) if dc.get('mean') is not None else info.mean
        self.std = tuple(dc['std']) if dc.get('std') is not None else info.std

    def _sources(self, dc: dict, task: dict) -> dict:
        opts = dict(classes=self.classes, label_fraction=float(task.get('label_fraction', 1.0)),
                    validation_per_class=int(task.get('validation_per_class', 0)),
                    seed=int(task.get('subset_seed', 0)))
        train, test = (data.source_from_config(dc, split) for split in ('train', 'test'))
        name = train.info.name + ('' if self.classes is None else f'{list(self.classes)}')
        parts = {'train': (train, 'labelled'), 'test': (test, 'all')}
        if opts['validation_per_class']:
            parts['validation'] = (train, 'validation')
        try:
            return {split: data.subset(source, part, split=split, name=name, **opts)
                    for split, (source, part) in parts.items()}
        except data.DataError as e:
            raise ValueError(f'study task {task}: {e}') from None

    @property
    def has_validation(self) -> bool:
        """Whether the task holds validation images out of its training split (`validation`)."""
        return 'validation' in self.sources

    def train(self, seed: int):
        """An endless iterator of training batches (of the task's labelled part), shuffled
        and augmented as `seed` draws."""
        return data.from_config(self.data_config, 'train', batch_size=self.config['batch_size'],
                                seed=seed, train=True, source=self.sources.get('train'))[0]

    def _eval(self, split: str):
        return data.from_config(self.data_config, split, batch_size=self.config['eval_batch_size'],
                                seed=0, train=False, source=self.sources.get(split))[0]

    def test(self):
        """A fresh pass over the test split (of the task's classes): every image once, in
        padded batches."""
        return self._eval('test')

    def validation(self):
        """The held-out validation images (a task with `validation_per_class`)."""
        if not self.has_validation:
            raise ValueError('this task holds out no validation images (validation_per_class)')
        return self._eval('validation')

    def identity(self) -> list:
        """What names this data for a finished run's fingerprint (`fit`): its name, classes,
        size, config and task, and a digest of what its splits hold (`data_digest`), so that
        changed files are other data."""
        extra = {k: v for k, v in self.task.items() if k != 'classes'}
        return ([self.info.name, self.classes, self.num_examples, self.data_config]
                + ([extra] if extra else []) + [self.digest])

    @functools.cached_property
    def digest(self) -> str:
        """`data_digest` of this data's config, read once per `Data`."""
        return data_digest(json.dumps(self.data_config, sort_keys=True, default=repr))

    def raw_batches(self, n: int, batch: int):
        """The first `n` training images in [0, 1], unaugmented, `batch` at a time."""
        source = self.sources.get('train') or data.source_from_config(self.data_config, 'train')
        images = np.stack([source[i]['image'] for i in range(min(n, len(source)))])
        return [images[i:i + batch].astype(np.float32) / 255.0 for i in range(0, len(images), batch)]


STORE_VAR = 'JLEARNGENE_STORE'   # a folder of finished runs shared between workdirs (`fit`'s store)
def data_location(dset: Data) -> str:
    """The folder a study's data was read from (`DataInfo.location`), or 'memory' for data
    that has none (the bundled digits, arrays)."""
    return getattr(dset.info, 'location', None) or 'memory'


def data_digest(data_config_json: str) -> str:
    """sha256 of what the train and test splits of a data config (as JSON) hold: the images
    and labels of in-memory sources (the digits, Fashion-MNIST's IDX files, arrays); the
    path, size and modification time of every file of an image folder or a prepared tfds
    dataset (reading those whole would cost as much as an epoch)."""
    dc = json.loads(data_config_json)
    h = hashlib.sha256()
    for split in ('train', 'test'):
        src = data.source_from_config(dc, split)
        h.update(split.encode())
        if isinstance(getattr(src, 'images', None), np.ndarray):
            h.update(np.ascontiguousarray(src.images).tobytes())
            h.update(np.ascontiguousarray(np.asarray(src.labels)).tobytes())
        elif hasattr(src, 'files'):
            for f, label in zip(src.files, src.labels):
                st = os.stat(f)
                h.update(f'{f}|{st.st_size}|{st.st_mtime_ns}|{label}'.encode())
        else:
            root = os.path.join(dc.get('data_dir') or '', str(dc.get('tfds_name', '')).split(':')[0].split('/')[0])
            for folder, _, names in sorted(os.walk(root)):
                for f in sorted(names):
                    st = os.stat(os.path.join(folder, f))
                    h.update(f'{os.path.relpath(os.path.join(folder, f), root)}|{st.st_size}|{st.st_mtime_ns}'.encode())
    return h.hexdigest()


FINISHED = 'finished.json'   # a finished run's fingerprint, curve, seconds (wall, CPU) and final step (`fit`)
PROGRESS = 'progress.json'   # an unfinished run's fingerprint and seconds at each checkpoint (`fit`)
RESUME_EVERY = 2000          # steps between the checkpoints an interrupted run resumes from (`fit`)


# Sources a finished run's numbers cannot depend on: what reports, renders, converts, lists
# or plans runs (the protocol names a run by its settings, all in its fingerprint), so that
# fixing a table or a message leaves every finished run reusable.
NOT_TRAINING_CODE = ('cli.py', 'commands', 'interop', 'zoo', 'artefacts', 'diagnostics.py', 'costs.py',
                     'experiments/report.py', 'experiments/headline.py', 'experiments/results.py',
                     'experiments/study.py', 'experiments/scratch.py', 'experiments/configs')


@functools.cache
def source_digest() -> str:
    """sha256 of the jlearngene sources a run trains with (every .py file but those of
    `NOT_TRAINING_CODE`): a finished run is reused only by the code that made it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, _, names in sorted(os.walk(root)):
        for f in sorted(names):
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, root).replace(os.sep, '/')
            if not f.endswith('.py') or any(rel == x or rel.startswith(x + '/') for x in NOT_TRAINING_CODE):
                continue
            h.update(rel.encode())
            with open(path, 'rb') as fh:
                h.update(fh.read())
    return h.hexdigest()


SOFTWARE_FIELDS = ('jax', 'jaxlib', 'flax', 'optax', 'numpy', 'backend', 'device kind',
                   'device count', 'XLA_FLAGS')


def software_and_devices() -> list:
    """The versions, devices and XLA flags a run's numbers depend on, beside the sources
    (one value per `SOFTWARE_FIELDS` name)."""
    import flax
    import jaxlib
    import optax
    return [jax.__version__, jaxlib.__version__, flax.__version__, optax.__version__, np.__version__,
            jax.default_backend(), jax.devices()[0].device_kind, jax.device_count(),
            os.environ.get('XLA_FLAGS', '')]


def tree_digest(tree) -> dict:
    """A pytree's {path: [shape, dtype, checksum]} (`integrity.tree_checksums`)."""
    sums = integrity.tree_checksums(tree)
    return {p: [list(np.shape(x)), str(x.dtype), sums[p]] for p, x in pytree.flatten(tree).items()}


def _fingerprint(**parts) -> str:
    return hashlib.sha256(json.dumps(checkpoint.to_json(parts), sort_keys=True, default=repr)
                          .encode()).hexdigest()


# what each part of a run's fingerprint is, for the line that says why a run trains again
_PART_NAMES = dict(name='run name', steps='steps', opt='optimiser settings', seed='seed',
                   eval_every='evaluation interval', stop_at='stop target',
                   identity='study config', data='data', trainable='initial params',
                   source='jlearngene sources', software='software and devices')


def _part_digests(parts: Mapping[str, Any]) -> dict:
    """{part: digest}: a finished run's record keeps them, and its fingerprint is theirs, so
    a mismatch can name the parts that differ."""
    return {k: _fingerprint(part=v) for k, v in parts.items()}


def _why_not_reused(run_dir: str, parts: Mapping[str, Any], digests: Mapping[str, str]) -> str:
    """What differs between the finished record in `run_dir` and this run's `parts` (their
    `digests`)."""
    try:
        with open(os.path.join(run_dir, FINISHED), encoding='utf-8') as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return 'its record is unreadable'
    old = meta.get('parts') if isinstance(meta, dict) else None
    if not isinstance(old, dict):
        return 'its record does not name its parts'
    differ = [k for k in digests if old.get(k) != digests[k]]
    if not differ:
        return 'its checkpoint is unreadable'
    said = [_PART_NAMES.get(k, k) for k in differ]
    if 'data' in differ and isinstance(parts.get('data'), list):
        said[differ.index('data')] += f' ({parts["data"][0]}: other files, or other contents)'
    if 'software' in differ and isinstance(meta.get('software'), list):
        said[differ.index('software')] += ': ' + ', '.join(
            f'{field} {a!r} there, {b!r} here' for field, a, b in
            zip(SOFTWARE_FIELDS, meta['software'], parts['software']) if a != b)
    return 'other ' + '; '.join(said)


def _set_aside(workdir: str, name: str, parts: Mapping[str, Any], digests: Mapping[str, str]) -> None:
    """Move the finished run `runs/<name>` that this run cannot reuse to
    `superseded/<name>[.k]`, saying why in one line: a study resumed with other code,
    libraries, devices or XLA flags keeps what it had trained."""
    run_dir = os.path.join(workdir, 'runs', name)
    why = _why_not_reused(run_dir, parts, digests)
    base = target = os.path.join(workdir, 'superseded', name)
    k = 1
    while os.path.exists(target):
        k += 1
        target = f'{base}.{k}'
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(run_dir, target)
    logging.getLogger(__name__).warning('runs/%s: not reused (%s); it trains again, and the '
                                        'finished run is kept in %s', name, why,
                                        os.path.relpath(target, workdir))


def _reuse(run_dir: str, fingerprint: str, like):
    """(params, curve, seconds, validation curve or None) of the finished run in `run_dir`
    with this fingerprint: its final run checkpoint read into `like`'s structure; None for a
    missing, other or unreadable record or checkpoint (the run trains again)."""
    try:
        with open(os.path.join(run_dir, FINISHED), encoding='utf-8') as f:
            meta = json.load(f)
        if meta.get('fingerprint') != fingerprint:
            return None
        with run_checkpoint.RunCheckpointer(os.path.join(run_dir, 'checkpoints'), keep=1) as ckpt:
            params, _ = ckpt.restore_params(like, int(meta['step']))
    except (OSError, ValueError, KeyError, TypeError, integrity.CheckpointError):
        return None
    val = meta.get('val_curve')
    return (params, [(int(s), float(a)) for s, a in meta['curve']], float(meta['seconds']),
            None if val is None else [(int(s), float(a)) for s, a in val])


def fit(name: str, loss_fn, trainable, eval_fn, dset: Data, *, steps: int, lr: float,
        optim: Mapping[str, Any], workdir: str, seed: int, eval_every: int | None,
        stop_at: float | None = None, identity: Any = None, reused: list | None = None,
        val_curves: dict | None = None, store: str | None = None):
    """Train `trainable` on `loss_fn` for `steps` with the optimiser settings `optim` (an
    `optim` config section) at learning rate `lr`
    (warm-up at most a fifth of the run), evaluating with `eval_fn` every `eval_every` steps
    and at the end, stopping early at the first evaluation with test accuracy ≥ `stop_at`;
    returns (params, [(step, test accuracy)], seconds). The run's log and checkpoint go to
    `workdir/runs/<name>`.

    A finished run leaves `runs/<name>/finished.json` (its fingerprint, curve, wall and CPU
    seconds and the step of its final checkpoint, which holds the params). Run
    again with the same name, settings, `identity` (what else the loss depends on, e.g. the
    whole study config), data, initial `trainable`, jlearngene sources, library versions and
    devices, it is read back instead of trained (its name appended to `reused`), so an
    interrupted study picks up after its last finished run. Anything different, several
    processes or data other than a `Data` trains again; a new workdir reruns everything. A
    finished run that is not reused moves to `workdir/superseded/<name>`, with a line naming
    what differs (e.g. the XLA flags), so that resuming with other code or libraries loses
    nothing.

    An interrupted run resumes: a reusable run of more than `RESUME_EVERY` steps saves a
    checkpoint every `resume_interval` steps, and run again with the same fingerprint it
    continues from the newest one (the data position and keys restored, so it ends as an
    uninterrupted run would). Its curve is read from its metrics, and its seconds are those
    of the steps it keeps (`runs/<name>/progress.json` holds them at each checkpoint).

    A `Data` with validation images (`Data.has_validation`) is evaluated on them too, at
    the same steps: that curve [(step, validation accuracy)] goes to `val_curves[name]`.

    `store` (a folder, e.g. $JLEARNGENE_STORE) shares finished runs between workdirs: a
    finished run is copied to `store/<fingerprint>`, and a run whose fingerprint is there is
    copied into `runs/<name>` and read back instead of trained, so every study that asks for
    the same model (same name, settings, data, initial params, `identity`, code and
    software) trains it once."""
    opt_cfg = dict(plain(optim), lr=lr)
    opt_cfg['warmup_steps'] = min(int(opt_cfg.get('warmup_steps', 0)), max(steps // 5, 0))
    run_dir = os.path.join(workdir, 'runs', name)
    finished = os.path.join(run_dir, FINISHED)
    # one process, on a `Data` (its identity): other data iterators are never reused
    reusable = jax.process_count() == 1 and hasattr(dset, 'identity')
    parts = dict(
        name=name, steps=steps, opt=opt_cfg, seed=seed, eval_every=eval_every, stop_at=stop_at,
        identity=identity, data=dset.identity(), trainable=tree_digest(trainable),
        source=source_digest(), software=software_and_devices()) if reusable else None
    digests = _part_digests(parts) if reusable else None
    fingerprint = _fingerprint(**digests) if reusable else None
    validation = eval_fn is not None and getattr(dset, 'has_validation', False)
    done = _reuse(run_dir, fingerprint, trainable) if reusable else None
    if done is None and reusable and store and _fetch(store, fingerprint, workdir, name, parts, digests):
        done = _reuse(run_dir, fingerprint, trainable)
    if done is not None:
        if reused is not None:
            reused.append(name)
        if validation and val_curves is not None:
            val_curves[name] = done[3]
        return done[:3]
    optimizer = optimisers.make_optimizer(opt_cfg, trainable, total_steps=steps)
    loss_key = getattr(loss_fn, 'key', None)   # runs of one loss and shape compile once
    if reusable and os.path.exists(finished):
        _set_aside(workdir, name, parts, digests)   # another run's record: kept, and trained again below
    every = resume_interval(steps, eval_every) if reusable else None
    resume = every is not None and _progress(run_dir, fingerprint) is not None
    run = trainer.FitConfig(
        workdir=run_dir, steps=steps, log_every=max(1, min(50, steps)), checkpoint_every=every,
        seed=seed, resume=resume, progress=False, console=False, tensorboard=False,
        handle_sigterm=False, keep_checkpoints=1,
        compile_key=None if loss_key is None else
        (loss_key, optimisers.cache_key(opt_cfg, trainable, total_steps=steps)))
    also = {'val': dset.validation} if validation else None
    hooks = [] if eval_fn is None else [Evaluation(eval_fn, dset.test, every=eval_every or None, also=also)]
    if stop_at is not None:
        hooks.append(StopWhen(lambda rec: rec['eval/accuracy'] >= stop_at,
                              f'test accuracy >= {stop_at:g}'))
    clock = _Clock(run_dir, fingerprint, every)
    if every is not None:
        if not resume:
            clock.write()               # this fingerprint's run, from step 0
        hooks.append(clock)
    try:
        params, history = trainer.fit(loss_fn, trainable, dset.train(seed), optimizer, run, hooks)
    except integrity.CorruptCheckpointError as e:   # no checkpoint to resume from: from step 0
        if not run.resume:
            raise
        logging.getLogger(__name__).warning('runs/%s: %s', name, e)
        clock = _Clock(run_dir, fingerprint, every)
        clock.write()
        hooks[-1] = clock
        run = dataclasses.replace(run, resume=False)
        params, history = trainer.fit(loss_fn, trainable, dset.train(seed), optimizer, run, hooks)
    evals = metrics_lib.read_metrics(run_dir, kind='eval') if clock.resumed else history['eval']
    curve = [(int(r['step']), float(r['eval/accuracy'])) for r in evals]
    val_curve = ([(int(r['step']), float(r['eval/val_accuracy'])) for r in evals]
                 if validation else None)
    if validation and val_curves is not None:
        val_curves[name] = val_curve
    secs, cpu_secs = clock.seconds()
    if reusable:   # the final checkpoint holds the params; this marks the run finished
        # seconds: wall clock; cpu_seconds: this process's CPU time over all its threads,
        # which a paused or crowded machine does not inflate
        record = dict(fingerprint=fingerprint, curve=curve, seconds=secs, cpu_seconds=cpu_secs,
                      step=curve[-1][0] if curve else steps, parts=digests,
                      software=parts['software'])
        if validation:
            record['val_curve'] = val_curve
        files.write_text(finished, json.dumps(record))
        if store:
            _deposit(store, fingerprint, run_dir)
    return params, curve, secs


def resume_interval(steps: int, eval_every: int | None) -> int | None:
    """Steps between the checkpoints of a study run that an interrupted run resumes from.

    Args:
        steps: the run's steps.
        eval_every: its evaluation interval (None: at the end only).

    Returns:
        The first multiple of `eval_every` (of 1 without it) of at least `RESUME_EVERY`
        steps, or None for a run of no more steps than that (interrupted, it starts again).
    """
    if steps <= RESUME_EVERY:
        return None
    unit = eval_every or 1
    return -(-RESUME_EVERY // unit) * unit


def _progress(run_dir: str, fingerprint: str) -> dict | None:
    """{step: [wall, CPU seconds]} of the unfinished run in `run_dir` with this fingerprint,
    as its checkpoints saved them; None where there is no such run (or no checkpoint)."""
    try:
        with open(os.path.join(run_dir, PROGRESS), encoding='utf-8') as f:
            meta = json.load(f)
        has_checkpoint = any(n.isdigit() for n in os.listdir(os.path.join(run_dir, 'checkpoints')))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get('fingerprint') != fingerprint or not has_checkpoint:
        return None
    clock = meta.get('clock')
    return clock if isinstance(clock, dict) else None


class _Clock(Hook):
    """The wall and CPU seconds of the steps a study run keeps, over its attempts: written
    to `runs/<name>/progress.json` at every step a checkpoint is saved (`every`), just
    before it, and read back at the step a resumed run starts from."""

    def __init__(self, run_dir: str, fingerprint: str | None, every: int | None):
        self.path, self.fingerprint, self.every = os.path.join(run_dir, PROGRESS), fingerprint, every
        self.clock: dict[str, list[float]] = {}
        self.kept, self.resumed = (0.0, 0.0), False
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def start(self, run) -> None:
        """Take the seconds kept up to the step `run` starts from."""
        if run.start:
            self.resumed = True
            self.clock = {k: v for k, v in (_progress(os.path.dirname(self.path), self.fingerprint) or {}).items()
                          if int(k) <= run.start}
            if str(run.start) not in self.clock:
                logging.getLogger(__name__).warning('%s: no seconds for step %d; the record counts '
                                                    'this attempt only', self.path, run.start)
            self.kept = tuple(self.clock.get(str(run.start), (0.0, 0.0)))

    def seconds(self) -> tuple[float, float]:
        """(wall, CPU) seconds of the kept steps and of this attempt so far."""
        return (self.kept[0] + time.perf_counter() - self.t0,
                self.kept[1] + time.process_time() - self.cpu0)

    def after_call(self, run, step: int, state) -> None:
        """At a checkpoint step, write the seconds so far."""
        del state
        if self.every and step % self.every == 0 and step != run.steps:
            self.clock[str(step)] = list(self.seconds())
            self.write()

    def write(self) -> None:
        """Write `progress.json`: the fingerprint and {step: [wall, CPU seconds]}."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        files.write_text(self.path, json.dumps({'fingerprint': self.fingerprint, 'clock': self.clock}))


def _fetch(store: str, fingerprint: str, workdir: str, name: str, parts, digests) -> bool:
    """Copy the finished run `store/<fingerprint>` into `workdir/runs/<name>` (a finished
    run of another fingerprint there is set aside first, an unfinished one is replaced);
    False where the store has no such run."""
    src = os.path.join(store, fingerprint)
    if not os.path.isfile(os.path.join(src, FINISHED)):
        return False
    run_dir = os.path.join(workdir, 'runs', name)
    if os.path.exists(os.path.join(run_dir, FINISHED)):
        _set_aside(workdir, name, parts, digests)
    tmp = files.partial_path(run_dir)
    files.remove_stale(run_dir)
    shutil.copytree(src, tmp)
    files.replace_dir(tmp, run_dir)     # an interrupted run of this name is replaced whole
    logging.getLogger(__name__).info('runs/%s: taken from the store %s', name, src)
    return True


def _deposit(store: str, fingerprint: str, run_dir: str) -> None:
    """Copy the finished run `run_dir` to `store/<fingerprint>`, renamed into place once
    complete (a run already there is kept)."""
    target = os.path.join(store, fingerprint)
    if os.path.exists(target):
        return
    os.makedirs(store, exist_ok=True)
    tmp = files.partial_path(target)
    files.remove_stale(target)
    shutil.copytree(run_dir, tmp)
    try:
        os.rename(tmp, target)
    except OSError:                      # another process put it there first
        files.remove_partial(tmp)


@functools.cache
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
# A study's context: what every recipe and the protocol share.

@dataclasses.dataclass(frozen=True)
class LabelBudget:
    """One label budget of a transfer study: the `fraction` of the descendants' training
    images that is labelled, the descendants' `seeds` at it, Scratch's `steps` before its
    plateau check, and its `key` in results ('0.01')."""
    fraction: float
    seeds: tuple[int, ...]
    steps: int

    @property
    def key(self) -> str:
        """The fraction as results name it (`f'{fraction:g}'`: 0.01 -> '0.01', 0.1 -> '0.1')."""
        return f'{self.fraction:g}'


def label_budgets(config: Config) -> list[LabelBudget]:
    """The transfer study's label budgets (`labels` section: `fractions`, `seeds` per
    fraction, `scratch_steps` per fraction), or [] for a study without one; a one-line
    ValueError for a section that does not line up."""
    lc = get(config, 'labels', None)
    if not lc:
        return []
    if not get(config, 'tasks', None):
        raise ValueError('study: labels (label budgets) needs tasks (ancestor and descendant classes)')
    fractions, seeds, steps = (tuple(lc[k]) for k in ('fractions', 'seeds', 'scratch_steps'))
    if not fractions or len(seeds) != len(fractions) or len(steps) != len(fractions):
        raise ValueError(f'study: labels.fractions {fractions}, labels.seeds and labels.scratch_steps '
                         'need one entry per label budget')
    if not int(get(lc, 'validation_per_class', 0)):
        raise ValueError('study: labels.validation_per_class must be > 0: every choice reads the '
                         'validation images, never the test images')
    out = []
    for f, s, n in zip(fractions, seeds, steps):
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ValueError(f'study: labels.fractions has {f!r}; each is the labelled fraction of the '
                             'training images, in (0, 1]')
        if not isinstance(s, (tuple, list)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in s):
            raise ValueError(f'study: labels.seeds at {f:g} is {s!r}; give a tuple of seeds per label '
                             'budget, e.g. labels.seeds=((0,1,2,3,4),(0,1,2))')
        s = tuple(int(x) for x in s)
        if not s or len(set(s)) != len(s):
            raise ValueError(f'study: labels.seeds at {f:g} is {s}; give distinct seeds')
        out.append(LabelBudget(float(f), s, int(n)))
    keys = [b.key for b in out]
    if len(set(keys)) != len(keys):
        raise ValueError(f'study: labels.fractions {fractions} repeats a label budget ({keys}); '
                         'each budget is one section of the record')
    return out


def check_tasks(config: Config) -> None:
    """A study's two tasks (`tasks.ancestor`, `tasks.descendant`), each a one-line
    ValueError before anything trains: both given and not empty (an empty one would mean
    every class), no class repeated, and no class in both (the source model would train on
    the descendants' validation images and labelled budget)."""
    tc = get(config, 'tasks', None)
    if not tc:
        return
    named = {}
    for which in ('ancestor', 'descendant'):
        classes = get(tc, which, None)
        if (not isinstance(classes, (tuple, list)) or not classes
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in classes)):
            raise ValueError(f'study: tasks.{which}={classes!r}; give the class numbers of the '
                             f'{"source" if which == "ancestor" else "downstream"} task, e.g. (0,1,2,3,4)')
        if len(set(classes)) != len(classes):
            raise ValueError(f'study: tasks.{which}={tuple(classes)} repeats a class')
        named[which] = set(classes)
    both = sorted(named['ancestor'] & named['descendant'])
    if both:
        raise ValueError(f'study: tasks.ancestor and tasks.descendant share the classes {both}: the '
                         'source model would train on the downstream task\'s images; give disjoint classes')


def fraction_steps(fraction: float, S: int) -> int:
    """Steps of a stage budgeted at `fraction` of S (at least 1 for a positive fraction)."""
    return 0 if fraction <= 0 else max(1, int(round(fraction * S)))


def reference_config(config: Config, num_classes: int) -> ViTConfig:
    """The teacher's (Aux-Nets', slimmable network's) config: `model` at `depth`."""
    return model_config(config['model'], depth=config['depth'], num_classes=num_classes)


def shape_configs(config: Config, shape: Sequence[int], num_classes: int,
                  adjust: Callable[[ViTConfig, Config], ViTConfig] | None = None) -> tuple[ViTConfig, ...]:
    """The head splits of the shape (width, depth): whole heads of the model's head_dim, then
    the model's head count (the other way round with `keep_heads`, as a slimmable network's
    sub-networks keep every head); a shape (width, depth, heads) has that many heads of the
    model's head_dim. MLP `mlp_ratio` × width; each through `adjust(cfg, config)` (the
    study's `descendant_config`). The first is Scratch's."""
    width, depth = shape[:2]
    ref = reference_config(config, num_classes)
    mlp = int(config['mlp_ratio']) * width
    out = []
    splits = [(width // ref.head_dim, ref.head_dim) if width % ref.head_dim == 0 else None,
              (ref.num_heads, width // ref.num_heads) if width % ref.num_heads == 0 else None]
    if get(config, 'keep_heads', False):
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
    return tuple(out if adjust is None else (adjust(c, config) for c in out))


@functools.cache
def _jit_descend(method: str, cfg: ViTConfig, options: tuple):
    """The method's descend for `cfg`, compiled once and quickly (`compiler.run_once_jit`)."""
    fn = functools.partial(genes.get(method).descend, target_cfg=cfg, **dict(options))
    return compiler.run_once_jit(lambda gene, key: fn(gene, key=key),
                                 lambda gene, key: vit.block_elements(cfg))


class Context:
    """One study's shared state, handed to the protocol and every recipe: the config (read
    only), the data (`dset`, the descendants' task; `ancestor_dset`, the source task, the
    same object on one task), the reference and teacher configs, the Scratch baseline once
    trained (`base`), one training run (`fit`), FLOP counts, progress lines and a per-study
    memo (`memo`) for upstream runs that several recipes share (the small model).

    Without `load_data` only what follows from the config is there (`plan`)."""

    def __init__(self, config: Config, workdir: str | None = None, *, quiet: bool = True,
                 adjust: Callable[[ViTConfig, Config], ViTConfig] | None = None,
                 num_classes: int | None = None):
        self.config, self.workdir, self.quiet, self.adjust = config, workdir, quiet, adjust
        self.dset = self.ancestor_dset = None
        self.K = num_classes
        if num_classes is None:
            tasks_ = get(config, 'tasks', None)
            budgets = label_budgets(config)
            self.dset = (self.downstream(budgets[0]) if budgets else
                         Data(config, tasks_['descendant'] if tasks_ else None))
            self.ancestor_dset = Data(config, tasks_['ancestor']) if tasks_ else self.dset
            self.K = self.dset.num_classes
        self.bs = config['batch_size']
        self.ref = reference_config(config, self.K)
        self.t_cfg = self.ref           # the teacher's: set by the protocol once it is built
        self.base: dict = {}            # Scratch's baseline by shape, once trained
        self.timings: dict[str, float] = {}
        self.identity = plain(config)   # what a finished run in workdir must match to be reused
        # finished runs shared between studies (`fit`'s store): $JLEARNGENE_STORE, or none
        self.store = os.environ.get(STORE_VAR) or None
        self.reused: list[str] = []     # runs finished by an earlier process, read back
        self.trained: set[str] = set()  # runs this process trained
        self.memo: dict = {}
        # set by the protocol as the study proceeds
        self.rows: list = []           # the study's rows (`recipes.Row`)
        self.plan: dict = {}           # {row name: {shape: config or why not}}
        self.shapes: list = []         # the descendant shapes
        self.scratch_cfgs: dict = {}   # Scratch's config by shape
        self.S_ref = 0                 # the reference (teacher) shape's S
        self.teachers: dict = {}       # the teacher's params by seed
        self.val_curves: dict = {}     # validation curves by run name (tasks with validation)
        self.source: dict = {}         # the teacher's Scratch record (lr, S, runs per seed)
        self.descend_sweeps: dict = {}  # a label budget's descendant lr sweeps (validation accuracy)
        self.descend_extensions: dict = {}  # each of those sweeps' extensions past an edge

    def downstream(self, budget: LabelBudget) -> Data:
        """The descendants' task at a label budget (`label_budgets`): its labelled images,
        its validation images and all of its test images."""
        lc = self.config['labels']
        return Data(self.config, task=dict(classes=self.config['tasks']['descendant'],
                                      label_fraction=budget.fraction,
                                      validation_per_class=int(lc['validation_per_class']),
                                      subset_seed=int(get(lc, 'subset_seed', 0))))

    def teacher(self, seed: int):
        """The teacher (the reference shape's Scratch run, or the ancestor) of `seed`."""
        return self.teachers[seed]

    @property
    def n(self) -> int:
        """The descendants' training images (`dset.num_examples`), what epochs count."""
        return self.dset.num_examples

    @property
    def two_tasks(self) -> bool:
        """Whether the config has `tasks`: an ancestor task and a descendants' task."""
        return bool(get(self.config, 'tasks', None))

    def say(self, msg: str) -> None:
        """A progress line on stderr unless the study is quiet (`say`)."""
        say(msg, self.quiet)

    def steps(self, section: Config, name: str) -> int:
        """The optimiser steps of the config section `section` (named `name` in errors):
        its `steps`, else its `epochs` over `n` images at the study's batch (`budget`)."""
        return budget(section, self.n, self.bs, name)

    def shape_configs(self, shape: Sequence[int]) -> tuple[ViTConfig, ...]:
        """The configs of `shape` in this study (`shape_configs`, through the study's
        `adjust`); the first is Scratch's."""
        return shape_configs(self.config, shape, self.K, self.adjust)

    def fit(self, name, loss_fn, params, eval_fn, *, steps, lr, seed, eval_every=None, optim=None,
            stop_at=None, dset=None, identity=None):
        """`fit` in the study's workdir, with the study's optimiser unless `optim` is given;
        `identity`: what the run depends on beyond its data, settings and initial params
        (default the whole study config; a narrower one lets other studies reuse the run
        through the store, `$JLEARNGENE_STORE`)."""
        read_back = []
        if self.workdir and not os.path.isfile(os.path.join(self.workdir, 'runs', name, FINISHED)):
            self.say(f'{name}: training {steps} steps (lr {lr:g}, seed {seed}) ...')
        params, curve, secs = fit(name, loss_fn, params, eval_fn, dset or self.dset, steps=steps,
                                  lr=lr, optim=self.config['optim'] if optim is None else optim,
                                  workdir=self.workdir, seed=seed, eval_every=eval_every,
                                  stop_at=stop_at, identity=self.identity if identity is None else identity,
                                  reused=read_back, val_curves=self.val_curves, store=self.store)
        # `reused`: the runs an earlier process finished, each once; a run this process
        # trained and reads back again is neither
        if read_back and name not in self.trained and name not in self.reused:
            self.reused.append(name)
        if not read_back:
            self.trained.add(name)
        self.timings[name] = secs
        return params, curve

    def step_flops(self, cfg: ViTConfig, params=None) -> float:
        """Training FLOPs of one optimiser step of `cfg` at the study's batch (forward and
        backward, `costs.TRAIN_FACTOR`); `params`, when given, are the sizes that count
        (`costs.flops_per_image`)."""
        return float(costs.TRAIN_FACTOR * costs.flops_per_image(cfg, params) * self.bs)

    def run_flops(self, cfg: ViTConfig, steps: float, teacher: ViTConfig | None = None) -> float:
        """Training FLOPs of `steps` optimiser steps of `cfg` at the study's batch, plus the
        forward passes of a distillation `teacher` on every image (`costs.training_cost`)."""
        return float(costs.training_cost([costs.Run('r', cfg, steps * self.bs / self.n, self.n,
                                                    teacher=teacher)])['flops'])

    def jit_descend(self, method: str, cfg: ViTConfig, options: Mapping[str, Any]):
        """`descend(gene, key)` of `method` for `cfg`, compiled once per (method, cfg, options)."""
        return _jit_descend(method, cfg, tuple(sorted(options.items())))

    def default_budgets(self, S: int) -> list[tuple[float, int, float]]:
        """[(fraction, steps, lr)] of `descend.fractions` of S at `descend.lr`."""
        lr = float(self.config['descend']['lr'])
        return [(float(f), fraction_steps(float(f), S), lr) for f in self.config['descend']['fractions']]


# ----------------------------------------------------------------------------------------
# Results.

def write_results(results: dict, workdir: str, table: str | Callable[[dict], str],
                  plot_fn: Callable[[dict, str], Any] | None = None) -> dict:
    """Write `results.json`, then `results.md` (`table`, or `table(results)`) and the plots of
    `plot_fn(results, workdir)` (process 0 only, in a multi-process run); returns `results`
    with the table under 'table'. The records are on disk before any rendering runs; each
    file is renamed into place once complete (`train.files.write_text`)."""
    main = distributed.is_main_process()
    if main:
        files.write_text(os.path.join(workdir, 'results.json'),
                          json.dumps(checkpoint.to_json(results), indent=1))
    results['table'] = table(results) if callable(table) else table
    if not main:
        return results
    files.write_text(os.path.join(workdir, 'results.md'), results['table'] + '\n')
    if plot_fn is not None:
        plot_fn(results, workdir)
    return results


def distil(name: str, materialize: Callable, gene0, teacher, t_cfg: ViTConfig,
           aux_cfg: ViTConfig, dset: Data, *, steps: int, tau: float, alpha: float,
           optim: Mapping[str, Any], seed: int, workdir: str, identity: Any = None,
           decay: tuple[str, ...] | None = None, reused: list | None = None):
    """Train the gene `gene0` through the Aux-Net `materialize(gene)` (config `aux_cfg`) by
    soft distillation from `teacher` (temperature `tau`, weight `alpha` on the KD term) for
    `steps` at `optim`'s lr; only the gene trains, `decay` (path regexes) limits weight decay
    to those leaves (`identity`, `reused`: as `fit`'s). Returns (gene, the Aux-Net's test
    accuracy, seconds)."""
    def kd_loss(gene, batch, rng):
        student, _ = apply(materialize(gene), batch['image'], aux_cfg, train=True, rng=rng)
        target = apply(teacher, batch['image'], t_cfg)[0]
        loss = losses.soft_distillation(student, target, batch['label'], tau=tau, alpha=alpha)
        return loss, {'accuracy': losses.accuracy(student, batch['label'])}

    def aux_eval(gene, batch):
        return eval_fn(aux_cfg)(materialize(gene), batch)

    optim_cfg = dict(plain(optim))
    if decay is not None:
        optim_cfg['decay'] = decay
    identity = dict(identity=identity, tau=tau, alpha=alpha, aux_cfg=aux_cfg.to_dict(),
                    t_cfg=t_cfg.to_dict(), teacher=tree_digest(teacher), decay=decay)
    gene, curve, secs = fit(name, kd_loss, gene0, aux_eval, dset, steps=steps,
                             lr=float(optim_cfg['lr']), optim=optim_cfg, workdir=workdir, seed=seed,
                             eval_every=None, identity=identity, reused=reused)
    return gene, curve[-1][1], secs


# ----------------------------------------------------------------------------------------
# Reporting.

def summary(results: dict, workdir: str) -> str:
    """The lines printed at the end of a run: the table and what was written."""
    plots = sorted(f for f in os.listdir(workdir) if f.endswith('.png'))
    return (f"\n{results['table']}\n\nwrote {os.path.join(workdir, 'results.md')}, results.json"
            + ''.join(f', {f}' for f in plots))
