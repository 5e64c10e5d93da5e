"""The generic trainer: `fit(loss_fn, trainable, data, optimizer, config, hooks=[...])`.

Every method plugs in through `loss_fn(trainable, batch, rng) -> (loss, metrics)`; the
trainer owns the rest: a jitted step with buffer donation and explicit shardings (batches
over the 'data' mesh axis, parameters replicated or FSDP-sharded), optax, orbax
checkpoints with exact resume, metrics (JSONL, console, TensorBoard), a progress bar,
evaluation, a non-finite-loss guard and a checkpoint on SIGTERM or Ctrl-C agreed across
processes. `config` is a `FitConfig` (where, how long, intervals, placement, switches);
`hooks` an open list of what runs after each call.

`fit` is the one-call entry and `train_loop` its loop. Their pieces, usable on their own,
have a module each: the state (`train.state`: `init_state`, `create_state`,
`restore_or_start`, `Batches`), the step (`train.step`: `make_train_step`; `StepProgram`,
its jitted calls, shared between runs through `PROGRAMS`; `steps_in_call`) and the hooks
(`train.hooks`: `Hook`s sharing one `Run`: `TrainLog`, `Evaluation`, `StopWhen`,
`Checkpoints`, `Preemption`).

Several processes (`jlearngene.distributed.initialize`, before `fit`) run `fit` unchanged,
each with its own share of every batch: the mesh spans every process's devices, process 0
alone writes metrics, console lines, config files and the progress bar, all processes
write each orbax checkpoint together (into a directory they all see), every process's
data-iterator position is stored, and a preemption signal on any process stops all of them
at the same step.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
import optax

from jlearngene import distributed, parallel
from jlearngene.train import files
from jlearngene.train import metrics as metrics_lib
from jlearngene.train.checkpoint import to_json
from jlearngene.train.integrity import CheckpointError
from jlearngene.train.hooks import Checkpoints, Hook, Preemption, Run, TrainLog
from jlearngene.train.run_checkpoint import RunCheckpointer
from jlearngene.train.state import Batches, config_json, create_state, restore_or_start
from jlearngene.train.step import (CacheKey, LossFn, StepProgram, auto_steps_per_call,
                                   check_int, check_microbatches, check_steps_per_call,
                                   steps_in_call)

log = logging.getLogger(__name__)


def train_loop(state: dict, program: Callable[[dict, list], tuple[dict, Any]], batches,
               hooks: Sequence[Hook], run: Run, *, steps_per_call: int = 1) -> dict:
    """Run steps `run.start`..`run.steps` in calls of `steps_in_call` steps.

    Each call is followed by every hook in order (`Hook.after_call`; they are started
    first). No call runs past a hook's interval (`every`). When a hook sets `run.stop`, the
    run ends there, with a checkpoint when it has `Checkpoints` (unless that call saved one).

    Args:
        state: the train state (`create_state`, `restore_or_start`).
        program: `program(state, host batches) -> (state, device metrics)`, e.g. a
          `StepProgram`; it takes a list of as many batches as the call's steps.
        batches: an iterator of host batches, e.g. `Batches`.
        hooks: the hooks, started first and called after each call, in order.
        run: what the hooks share; its `start` and `steps` bound the loop.
        steps_per_call: the most steps of one call.

    Returns:
        The final train state.
    """
    for hook in hooks:
        hook.start(run)
    events = [h.every for h in hooks if getattr(h, 'every', None)]
    step = run.start
    while step < run.steps:
        n = steps_in_call(step, run.steps, steps_per_call, events)
        state, metrics = program(state, [next(batches) for _ in range(n)])
        step += n
        run.begin_call(metrics)
        if run.bar is not None:
            run.bar.update(n)
        for hook in hooks:
            hook.after_call(run, step, state)
        if run.stop is not None:
            if run.saved is None and run.checkpoints is not None:
                run.saved = run.checkpoints.save(step, state, run.eval_record)
            run.writer.event(step, f'stopped at step {step} of {run.steps}: {run.stop}')
            break
    run.flush(step)
    return state


# ----------------------------------------------------------------------------------------
# fit: the one-call entry.

@dataclasses.dataclass(frozen=True)
class FitConfig:
    """How `fit` runs (what it does after each call is its hooks).

    Attributes:
        workdir: metrics.jsonl, config.json, tensorboard/ and checkpoints/ go here. The newest
          readable checkpoint there is resumed when `resume` (refused if it does not fit;
          unreadable newer ones are moved aside, see `restore_or_start`); the console then
          shows 'resumed from <dir> at step N', and any config field that changed.
        steps: total steps of the run (a resumed run continues up to it).
        log_every / checkpoint_every: intervals in steps (checkpoints: None = only at the end;
          a final checkpoint is always written).
        keep_checkpoints, best_metric, best_mode: retention (latest N plus the best by e.g.
          'eval/accuracy', which an `Evaluation` hook records).
        seed: the run's key (the step's key is `fold_in(key, step)`).
        experiment_config: the resolved experiment config (ConfigDict/dict), written to
          workdir/config.json and stored in every checkpoint; `model_config` (a ViTConfig) makes
          a resume into a different model fail with the mismatched fields named.
        sharding: 'replicate' or 'fsdp' (parameters split over the 'data' axis by logical axis;
          `axes` overrides the logical names, default the ViT table; leaves smaller than
          `fsdp_min_size` elements stay replicated).
        mesh: a mesh with a 'data' axis and optionally a 'model' axis (default: all devices,
          `parallel.make_mesh(model=model_parallel)`).
        model_parallel: without `mesh`, the size of the mesh's 'model' axis: parameters are
          then also split over it by logical axis (heads, mlp, else embed; see
          `parallel.param_shardings`), for models too large for FSDP alone. It must divide
          each process's device count.
        microbatches: accumulate each step's gradient over this many equal parts of the batch
          (see `make_train_step`); the batch size must be a multiple of it.
        steps_per_call: optimiser steps per compiled call (the same steps, dispatched less
          often; see `make_train_step`). No call runs past a hook's interval (steps up to one
          run singly, by a second compiled program); a call holds that many batches in memory,
          and a SIGTERM or Ctrl-C is acted on after it. 'auto': `auto_steps_per_call`.
        resume, progress, console, tensorboard, handle_sigterm: switches for resuming from
          workdir, the tqdm bar, console lines (metrics, resume, preemption), TensorBoard events
          and the SIGTERM / Ctrl-C checkpoint (`Preemption`: agreed across processes; it then
          raises `Preempted`, a SystemExit with status 143 or 130).
        compile_key: a hashable name of what `loss_fn` and `optimizer` compute (e.g. their
          configs: `tasks.classification_loss(...).key` and `optim.cache_key(...)`): runs of
          equal keys and shapes share the compiled initialisation and step (`PROGRAMS`); None
          compiles this run's own.
    """
    workdir: str
    steps: int
    log_every: int = 50
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2
    best_metric: str | None = None
    best_mode: str = 'max'
    seed: int = 0
    experiment_config: Any = None
    model_config: Any = None
    sharding: str = 'replicate'
    axes: Any = None
    mesh: Any = None
    model_parallel: int = 1
    fsdp_min_size: int = 2 ** 12
    microbatches: int = 1
    steps_per_call: int | str = 'auto'
    resume: bool = True
    progress: bool = True
    console: bool = True
    tensorboard: bool = True
    handle_sigterm: bool = True
    compile_key: CacheKey | None = None

    def __post_init__(self):
        check_int('steps', self.steps, 0)
        check_int('log_every', self.log_every, 1)
        check_int('checkpoint_every', self.checkpoint_every, 0, optional=True)
        check_microbatches(self.microbatches)
        if self.steps_per_call != 'auto':
            check_steps_per_call(self.steps_per_call)

    @classmethod
    def of(cls, config: FitConfig | Mapping[str, Any]) -> FitConfig:
        """`config` itself, or the FitConfig of a mapping of its fields.

        Args:
            config: a `FitConfig`, or a mapping of its field names to values.

        Returns:
            The `FitConfig`.

        Raises:
            TypeError: `config` is neither a `FitConfig` nor a mapping.
            ValueError: the mapping has unknown fields (the message names them), or a value
              fails the checks of `__post_init__` (e.g. `steps` negative, `log_every` < 1).
        """
        if isinstance(config, cls):
            return config
        if not isinstance(config, Mapping):
            raise TypeError(f'fit config must be a FitConfig or a mapping, got {type(config).__name__}')
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f'fit config has unknown field(s) {unknown}; known: {sorted(known)}')
        return cls(**config)


def fit(loss_fn: LossFn, trainable, data: Iterable[Mapping[str, Any]],
        optimizer: optax.GradientTransformation, config: FitConfig | Mapping[str, Any],
        hooks: Sequence[Hook] = ()):
    """Train `trainable` for `config.steps` optimiser steps.

    The pieces, in order: `create_state` (placement, init), `restore_or_start` (resume),
    `StepProgram` (the jitted calls), `train_loop` with the hooks `TrainLog`, then
    `hooks` in order (e.g. `Evaluation`, `StopWhen`), then `Checkpoints` and `Preemption`.

    A run whose loss ends far above where it started (`diverged`) ends with a warning,
    logged and kept in metrics.jsonl (`jlearngene info` shows it).

    Args:
        loss_fn: `(trainable, batch, rng) -> (loss, metrics)`; metrics are scalars.
        trainable: the pytree the optimiser updates (a ViT's params, a gene, an operator).
        data: endless iterable of host batches (dicts of numpy arrays, leading batch axis,
          this process's share); a grain iterator's `get_state` makes resume exact.
        optimizer: an optax transformation (e.g. `optim.make_optimizer`).
        config: a `FitConfig` (or a mapping of its fields): where and how long it runs,
          intervals, placement, switches.
        hooks: what else runs after each call (`Hook`s), e.g. `Evaluation(eval_fn,
          eval_data, every=...)` (recorded in history['eval']) and `StopWhen(predicate)`.

    Returns:
        The pair `(trainable, history)`, the trained tree (the structure of `trainable`, as placed on
        the mesh) and the history `{'train': [records], 'eval': [records]}` of this attempt's
        logged records, each with its 'step'.

    Raises:
        TypeError: `config` is neither a `FitConfig` nor a mapping.
        ValueError: `config` has unknown fields or invalid values (`FitConfig.of`).
        CheckpointError: a checkpoint to resume from does not fit, or is past `config.steps`;
          its subclass `CorruptCheckpointError` when none of the checkpoints can be read.
        NonFiniteLossError: the loss became NaN or infinite (from `TrainLog`).
        Preempted: a SIGTERM or Ctrl-C stopped the run, after its checkpoint (with
          `handle_sigterm`).
    """
    c = FitConfig.of(config)
    os.makedirs(c.workdir, exist_ok=True)
    mesh = c.mesh or parallel.make_mesh(model=c.model_parallel)
    state, state_sh = create_state(trainable, optimizer, mesh, sharding=c.sharding, axes=c.axes,
                                   fsdp_min_size=c.fsdp_min_size, seed=c.seed, key=c.compile_key)
    batches = Batches(data)
    ckpt = RunCheckpointer(os.path.join(c.workdir, 'checkpoints'), keep=c.keep_checkpoints,
                           best_metric=c.best_metric, best_mode=c.best_mode)
    writer = bar = None
    try:
        state, start = restore_or_start(ckpt, state, batches, c.workdir, resume=c.resume,
                                        model_config=c.model_config, config=c.experiment_config,
                                        say=_console_say if c.console else None)
        if start > c.steps:     # its params are past this run's end: saving them as it would misname them
            raise CheckpointError(f'{ckpt.directory} holds a checkpoint at step {start}, past this run\'s '
                                  f'{c.steps} steps: give at least {start} steps to go on from it, or '
                                  'another workdir')
        _write_config(c.workdir, c.experiment_config)  # after the resume check: a refused run leaves it alone
        # The run's key comes from the (possibly restored) state; a host copy, since the
        # state itself is donated at every step.
        base_rng = jax.device_put(np.asarray(jax.device_get(state['rng'])), parallel.replicated(mesh))
        program = StepProgram(loss_fn, optimizer, state_sh, mesh, base_rng,
                              microbatches=c.microbatches, key=c.compile_key)
        writer = metrics_lib.MetricWriter(c.workdir, console=c.console, tensorboard=c.tensorboard,
                                          start_step=start)
        if start:
            writer.event(start, f'resumed from {ckpt.directory} at step {start}')
        if writer.dropped:
            writer.event(start, f'dropped {writer.dropped} row(s) after step {start} from an '
                                f'earlier attempt from {writer.path}')
        bar = metrics_lib.Progress(c.steps, initial=start, enabled=c.progress)
        run = Run(c.steps, writer, start=start, mesh=mesh, state_shardings=state_sh, bar=bar)
        with Preemption(c.handle_sigterm) as preemption:
            everything = [TrainLog(c.log_every, last_checkpoint=lambda: _last_checkpoint(ckpt)),
                          *hooks,
                          Checkpoints(ckpt, batches, every=c.checkpoint_every,
                                      config=c.experiment_config, model_config=c.model_config),
                          preemption]
            steps_per_call = c.steps_per_call
            if steps_per_call == 'auto':
                steps_per_call = auto_steps_per_call(
                    mesh.devices.flat[0].platform,
                    [h.every for h in everything if getattr(h, 'every', None)] + [c.steps])
            state = train_loop(state, program, batches, everything, run,
                               steps_per_call=steps_per_call)
        _warn_if_diverged(run, everything[0], c.workdir)
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        ckpt.close()
    return state['params'], run.history


DIVERGED_FACTOR, DIVERGED_MARGIN = 2.0, 1.0


def diverged(initial: float, final: float) -> bool:
    """Whether a loss ended far above where it started.

    That is, more than `DIVERGED_FACTOR` times the initial loss and more than
    `DIVERGED_MARGIN` above it (the margin keeps a small initial loss's noise from counting).

    Args:
        initial: the loss at the start of the run.
        final: the loss at its end.

    Returns:
        `True` when `final` is above both bounds.
    """
    return final > DIVERGED_FACTOR * initial and final > initial + DIVERGED_MARGIN


def _warn_if_diverged(run: Run, log: TrainLog, workdir: str) -> None:
    """Warn (`MetricWriter.warning`) when the run `diverged`: its initial loss is that of
    step 1 (on a resumed run, the first train record in metrics.jsonl, a mean over its
    interval); its final loss the mean of the records of the last 10 % of its steps."""
    rows = run.history['train']
    if not rows or not getattr(run.writer, 'primary', False):
        return
    initial = log.first_loss
    if initial is None:
        first = metrics_lib.read_metrics(workdir, kind='train')[:1]
        if not first or not isinstance(first[0].get('loss'), (int, float)):
            return
        initial = float(first[0]['loss'])
    end = rows[-1]['step']
    final = float(np.mean([r['loss'] for r in rows if r['step'] > 0.9 * end] or [rows[-1]['loss']]))
    if diverged(initial, final):
        run.writer.warning(end, f'the loss diverged: {final:.4g} at the end against {initial:.4g} '
                                f'at the start (more than {DIVERGED_FACTOR:g}x and {DIVERGED_MARGIN:g} '
                                'above it); lower the learning rate, or enable clip_norm')


def _last_checkpoint(ckpt: RunCheckpointer) -> str:
    """The sentence of a non-finite-loss stop about the run's checkpoints."""
    step = ckpt.latest_step()
    if step is None:
        return (f'No checkpoint was saved yet (in {ckpt.directory}): a rerun starts from '
                'step 0.')
    return f'The last good checkpoint in {ckpt.directory} (step {step}) is unchanged.'


def _console_say(text: str) -> None:
    """A run event before the metric writer exists: a log record and, on process 0, a
    console line."""
    log.info('%s', text)
    if distributed.is_main_process():
        print(f'[{"run":>5}] {text}', file=sys.stderr, flush=True)


def _write_config(workdir: str, config) -> None:
    if config is None or not distributed.is_main_process():   # one copy, by process 0
        return
    files.write_text(os.path.join(workdir, 'config.json'),
                     json.dumps(to_json(config_json(config)), indent=2, sort_keys=True))
    if hasattr(config, 'to_dict'):  # ml_collections' readable form as well
        files.write_text(os.path.join(workdir, 'config.txt'), str(config))
