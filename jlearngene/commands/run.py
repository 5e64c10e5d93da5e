"""What `jlearngene train` executes: the config-driven classification run
(`run_classification`, with the checks it makes before the first step), and the
process-wide switch of jax's persistent compilation cache (`enable_compile_cache`), which
only a command turns on."""
from __future__ import annotations

import logging
import os

import jax
from jax.experimental.compilation_cache import compilation_cache

from jlearngene import compiler, data, distributed
from jlearngene.data import DataError
from jlearngene.models import ViTConfig, init, model_config
from jlearngene.train import checkpoint, hooks, optim, step, trainer
from jlearngene.train import metrics as metrics_lib
from jlearngene.train.tasks import classification_eval, classification_loss

log = logging.getLogger(__name__)


def enable_compile_cache(path: str) -> bool:
    """Persist compiled programs under `path` for the rest of the process: the descendants
    of one depth share their train and eval programs across methods, so most compiles
    become cache reads. Has no effect (returns False) when a cache directory is already
    set. jax creates the directory at its first compile. Process 0 first removes entries an
    earlier run left cut off (`compiler.repair_compile_cache`), which jax would otherwise
    warn about on every run."""
    if jax.config.jax_compilation_cache_dir:
        return False
    if distributed.is_main_process():
        removed = compiler.repair_compile_cache(path)
        if removed:
            log.warning('removed %d compilation cache entries of %s that do not decompress '
                        '(cut off by a kill or a full disk?): %s', len(removed), path,
                        ', '.join(removed))
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    compilation_cache.reset_cache()   # jax reads the directory once per process
    return True


def check_data_fits(cfg: ViTConfig, info, split: str) -> None:
    """Raise a one-line ValueError naming each way the data (`info`, a `DataInfo`) of
    `split` does not fit the model `cfg`: its class count, its image shape."""
    problems = []
    if info.num_classes != cfg.num_classes:
        problems.append(f'num_classes: data {info.num_classes} vs model {cfg.num_classes}')
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if tuple(info.image_shape) != want:
        problems.append(f'image shape: data {tuple(info.image_shape)} vs model {want} '
                        '(image_size, image_size, channels)')
    if problems:
        raise ValueError(f'data {info.name}[{split}] does not fit the model: ' + '; '.join(problems))


def initial_params(config, cfg: ViTConfig):
    """Fresh parameters (seeded) or the model artefact named by `config.init`."""
    path = config.get('init', '') if hasattr(config, 'get') else ''
    if path:
        from jlearngene.interop.state_dict import check_values
        params = checkpoint.load_model(path, expect_cfg=cfg)[0]
        check_values(params, f'--config.init {path!r}')
        return params
    return jax.jit(init, static_argnums=0)(cfg, jax.random.key(config.seed))


def eval_data_fn(config, source=None):
    """A zero-argument callable giving a fresh pass over the evaluation split (`source`: the
    split's source when already built, e.g. by `check_run_data`)."""
    return lambda: data.from_config(config.data, config.eval_split, batch_size=config.eval_batch_size,
                                    seed=config.seed, train=False, source=source)[0]


def check_run_data(config, cfg: ViTConfig) -> dict:
    """Builds and checks, before the first step, every split a classification run reads ->
    {'train': source, 'eval': source}: each exists, fits the model (`check_data_fits`),
    is divisible over the devices and, for training, holds at least `batch_size` examples,
    and its first example decodes (`data.check_split`). A one-line DataError names the
    split (and the config field) otherwise."""
    d = config.data.to_dict() if hasattr(config.data, 'to_dict') else dict(config.data)
    image_size = data.pipeline_image_size(d)
    devices = jax.device_count() // max(int(config.get('model_parallel', 1) or 1), 1)
    out = {}
    for role, split, field, batch_size in (
            ('train', 'train', 'batch_size', config.batch_size),
            ('eval', config.eval_split, 'eval_batch_size', config.eval_batch_size)):
        what = "train split 'train'" if role == 'train' else f'eval_split {split!r}'
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
                or batch_size % devices):
            raise DataError(f'{what}: {field} {batch_size!r} must be a positive multiple of the '
                            f"{devices} devices of the mesh's 'data' axis")
        try:
            source = data.source_from_config(d, split)
        except DataError as e:
            raise DataError(f'{what}: {e}') from None
        check_data_fits(cfg, source.info, split)
        data.check_split(source, what=what, batch_size=batch_size, image_size=image_size,
                         resize_method=d.get('resize_method', 'bilinear'),
                         full_batches=role == 'train')
        out[role] = source
    return out


def record_data_location(config, info) -> str | None:
    """When the config leaves `data.root` empty and the data were read from a folder that
    the source chose itself (fashion_mnist: $JLEARNGENE_DATA/fashion_mnist or Debian's
    copy; `DataInfo.location`), say which on stdout (process 0) and set `data.root` to it,
    so that config.json and the checkpoints record the copy that was read. Returns the
    folder, or None when the config names its data itself."""
    location = getattr(info, 'location', None)
    if not location or 'root' not in config.data or config.data.root:
        return None
    if distributed.is_main_process():
        print(f'data: {config.data.name} read from {location} (data.root is empty)', flush=True)
    config.data.root = location
    return location


def _steps_per_call(value):
    """A config's `steps_per_call`: 'auto' or a positive integer, also as the text that a
    command-line override of the 'auto' default gives."""
    if isinstance(value, str) and value != 'auto':
        if not value.strip().isdigit():
            raise ValueError(f"steps_per_call must be 'auto' or a positive integer, got {value!r}")
        value = int(value)
    if value != 'auto':
        step.check_steps_per_call(value)
    return value


def run_classification(config, workdir: str, *, progress: bool = True):
    """Train a ViT classifier as `config` describes (see jlearngene/experiments/configs/digits_vit.py);
    the final parameters are also saved as a model artefact in `workdir/model`."""
    cfg = model_config(config.model)
    microbatches = config.get('microbatches', 1)
    step.check_microbatches(microbatches)     # before anything is read or written
    if config.batch_size % microbatches:
        raise ValueError(f'batch_size {config.batch_size} is not a multiple of '
                         f'microbatches {microbatches}')
    steps_per_call = _steps_per_call(config.get('steps_per_call', 'auto'))
    from jlearngene.experiments import harness
    harness.check_not_a_study(workdir)      # a study's workdir holds its runs, not this one's
    # workdir/model is replaced at the end: only when it is a model, checked before training
    checkpoint.check_model_output(os.path.join(workdir, 'model'), overwrite=True)
    sources = check_run_data(config, cfg)   # every split, before the first step
    record_data_location(config, sources['train'].info)
    train_it, _ = data.from_config(config.data, 'train', batch_size=config.batch_size,
                                   seed=config.seed, train=True, source=sources['train'])
    params = initial_params(config, cfg)
    tx = optim.make_optimizer(config.optim, params, total_steps=config.steps)
    run = trainer.FitConfig(
        workdir=workdir, steps=config.steps, log_every=config.log_every,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        best_metric=config.best_metric or None, seed=config.seed, experiment_config=config,
        model_config=cfg, sharding=config.sharding, model_parallel=config.get('model_parallel', 1),
        microbatches=microbatches, steps_per_call=steps_per_call, progress=progress)
    evaluation = hooks.Evaluation(classification_eval(cfg), eval_data_fn(config, sources['eval']),
                                  every=config.eval_every)
    params, history = trainer.fit(
        classification_loss(cfg, label_smoothing=config.label_smoothing), params, train_it, tx,
        run, hooks=[evaluation])
    model_dir = os.path.join(workdir, 'model')
    if not history['train'] and not history['eval']:   # resumed at its last step: nothing ran
        history['eval'] = [{k: v for k, v in r.items() if k == 'step' or k.startswith('eval/')}
                           for r in metrics_lib.read_metrics(workdir, kind='eval')[-1:]]
        history['finished_before'] = True
        if _saved_steps(model_dir) == int(config.steps):   # its model is there already
            return params, history
    final = history['eval'][-1] if history['eval'] else {}
    checkpoint.save_model(model_dir, params, cfg, overwrite=True,
                          extra={'source': 'jlearngene train', 'steps': int(config.steps), **final})
    return params, history


def _saved_steps(model_dir: str) -> int | None:
    """The steps of the run that saved the model in `model_dir`, None where there is none
    (or it cannot be read: it is then written again)."""
    try:
        steps = checkpoint.model_metadata(model_dir).get('extra', {}).get('steps')
    except (checkpoint.CheckpointError, AttributeError):
        return None
    return steps if isinstance(steps, int) else None
