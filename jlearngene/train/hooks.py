"""What the training loop does after each compiled call: `Hook`s that share one `Run`.

`TrainLog` syncs the train metrics with the host every `log_every` steps (the only syncs
besides evaluation and checkpoint steps), writes their mean and stops on a non-finite loss
(`NonFiniteLossError`) before anything is saved, so the last checkpoint is always a finite
one. `Evaluation` evaluates, `StopWhen` ends the run on an evaluation record, `Checkpoints`
saves run checkpoints with the data position, and `Preemption` turns a SIGTERM or Ctrl-C
into a checkpoint and `Preempted`, agreed across processes: a signal on any process stops
all of them at the same step.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import signal
import sys
import threading
import time
from typing import Any
from collections.abc import Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from jlearngene import compiler, parallel
from jlearngene.train.evaluate import evaluate
from jlearngene.train.run_checkpoint import RunCheckpointer
from jlearngene.train.state import Batches, config_json, gather_data_state
from jlearngene.train.step import PROGRAMS, CacheKey, check_int, keyed, sharding_key


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message names the step."""


class Preempted(SystemExit):
    """Raised after the checkpoint that a SIGTERM (preemption) or SIGINT (Ctrl-C) asked for
    is written; the exit status is 128 + the signal number (143, 130)."""

    def __init__(self, step: int, path: str | None, signal_name: str = 'SIGTERM'):
        super().__init__(128 + int(getattr(signal, signal_name, signal.SIGTERM)))
        self.step, self.path, self.signal_name = step, path, signal_name

    def __str__(self):
        what = ('interrupted (Ctrl-C)' if self.signal_name == 'SIGINT'
                else f'preempted ({self.signal_name})')
        where = ('the run keeps no checkpoints' if self.path is None
                 else f'checkpoint saved to {self.path}')
        return f'{what} at step {self.step}; {where}'


@dataclasses.dataclass
class Run:
    """What the hooks of one run share: the run (`steps`, the first step `start`, the
    metric writer, the history, the mesh and the state's shardings, the progress bar), the
    run's `TrainLog` and `Checkpoints` once they have started, and the current call's
    record: its device `metrics`, whether a hook synced with the host (`synced`, a step
    every process reaches together), the checkpoint saved (`saved`), the evaluation record
    (`eval_record`) and a reason to stop after it (`stop`)."""
    steps: int
    writer: Any
    history: dict = dataclasses.field(default_factory=lambda: {'train': [], 'eval': []})
    start: int = 0
    mesh: Any = None
    state_shardings: Any = None
    bar: Any = None
    log: TrainLog | None = None
    checkpoints: Checkpoints | None = None
    metrics: Any = None
    synced: bool = False
    saved: str | None = None
    eval_record: dict | None = None
    stop: str | None = None

    def begin_call(self, metrics) -> None:
        """A new call's record: its device metrics, nothing synced, saved or evaluated.

        Args:
            metrics: the call's device metrics, as the step program returns them (stacked on
              a leading axis for a call of several steps).
        """
        self.metrics, self.synced, self.saved, self.eval_record = metrics, False, None, None

    def flush(self, step: int) -> dict | None:
        """Sync the train metrics (`TrainLog.flush`) when the run has a TrainLog.

        Args:
            step: the step the run is at.

        Returns:
            The written train record, or None without a TrainLog or pending metrics.

        Raises:
            NonFiniteLossError: a pending loss is not finite (`TrainLog.flush`).
        """
        return None if self.log is None else self.log.flush(step)


class Hook(abc.ABC):
    """One thing the loop does after every compiled call: `start(run)` binds it to the run
    (once, before the first call), `after_call(run, step, state)` acts on the call's record
    (`Run`); a hook defines at least `after_call`. `every`: an interval in steps that no call
    of several steps runs past, so the hook sees the state at each multiple (None: none)."""
    every: int | None = None

    def start(self, run: Run) -> None:
        """Bind the hook to `run`, once, before the first call (the default does nothing).

        Args:
            run: what the run's hooks share.
        """
        del run

    @abc.abstractmethod
    def after_call(self, run: Run, step: int, state: dict) -> None:
        """Act on the call that ended at `step`.

        Args:
            run: what the run's hooks share, with the call's record.
            step: the steps done after the call.
            state: the train state after the call.
        """


class TrainLog(Hook):
    """Collects the device metrics of each call and, every `every` steps and at the end,
    syncs them in one transfer (`flush`), stops on a non-finite loss and writes their mean
    (plus steps/s). `last_checkpoint()` is the sentence of a non-finite stop about the
    run's checkpoints."""

    def __init__(self, every: int = 50, *, last_checkpoint: Callable[[], str] = lambda: ''):
        check_int('log_every', every, 1)
        self.every = every
        self._last_checkpoint = last_checkpoint
        self._pending: list = []
        self.run: Run | None = None
        self.first_loss: float | None = None   # the loss of step 1, when this run took it

    def start(self, run: Run) -> None:
        """Bind to `run` (it becomes `run.log`) and start the steps/s clock.

        Args:
            run: what the run's hooks share.
        """
        self.run, run.log = run, self
        self._last = (run.start, time.perf_counter())

    def due(self, step: int) -> bool:
        """Whether the metrics are synced and written after `step`.

        Args:
            step: the steps done.

        Returns:
            True every `every` steps and at the run's last step.
        """
        return step % self.every == 0 or step == self.run.steps

    def after_call(self, run: Run, step: int, state: dict) -> None:
        """Keep the call's device metrics; at a due step sync and write them (`flush`).

        Args:
            run: what the run's hooks share; `run.metrics` is kept, and `run.synced` set at a
              due step.
            step: the steps done after the call.
            state: unused.

        Raises:
            NonFiniteLossError: at a due step, a pending loss is not finite (`flush`).
        """
        del state
        self._pending.append(run.metrics)
        if self.due(step):
            run.synced = True
            rec = self.flush(step)
            if rec and run.bar is not None:
                run.bar.update(0, loss=rec['loss'])

    def flush(self, step: int) -> dict | None:
        """Sync the pending metrics and write their mean.

        Args:
            step: the step the last pending call ended at.

        Returns:
            The record written (each metric's mean over the pending steps, 'lr' the last
            step's, plus 'steps_per_sec'), or None when nothing is pending.

        Raises:
            NonFiniteLossError: a pending step's loss is NaN or infinite; the message names
              the step (the metrics stay pending).
        """
        if not self._pending:
            return None
        run = self.run
        records = _step_records(_to_host(self._pending))
        first = step - len(records) + 1
        for i, r in enumerate(records):
            if not math.isfinite(r['loss']):
                note = self._last_checkpoint()
                raise NonFiniteLossError(
                    f"loss is {r['loss']} at step {first + i} (of {run.steps}); stopping. "
                    + (f'{note} ' if note else '') + 'Lower the learning rate, enable '
                    'clip_norm, or check the data.')
        self._pending = []
        if first == 1:
            self.first_loss = float(records[0]['loss'])
        now = time.perf_counter()
        rec = _mean_records(records)
        rec['steps_per_sec'] = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (step, now)
        run.writer.write(step, rec, 'train')
        run.history['train'].append({'step': step, **rec})
        return rec


def _to_host(tree):
    return jax.tree.map(lambda x: np.asarray(x).item() if np.ndim(x) == 0 else np.asarray(x), jax.device_get(tree))


def _step_records(calls: list[dict]) -> list[dict]:
    """Host metrics of the calls since the last sync -> one record per step (a call of
    several steps returns its metrics stacked)."""
    records = []
    for m in calls:
        n = np.shape(m['loss'])
        if not n:
            records.append(m)
        else:   # one call of several steps: one record per step
            records.extend({k: v[i].item() for k, v in m.items()} for i in range(n[0]))
    return records


def _mean_records(records: list[dict]) -> dict[str, float]:
    out = {k: float(np.mean([r[k] for r in records])) for k in records[0]}
    if 'lr' in out:
        out['lr'] = float(records[-1]['lr'])  # the current value, not the interval mean
    return out


class Evaluation(Hook):
    """Evaluates the params every `every` steps and at the end (`evaluate` over
    `eval_data`), records 'eval/<name>' = sum / count and leaves the record in
    `run.eval_record` for the hooks after it.

    `eval_fn(params, batch) -> {name: sum over valid examples, ..., 'count': n}` (see
    `tasks.classification_eval`) is jitted for the run's params and batch shardings;
    `eval_data` is a zero-argument callable returning an iterator of eval batches, or a
    re-iterable (a one-shot iterator is cached in host memory after its first pass).
    `key` (default: `eval_fn.key` where the factory declares one) names what `eval_fn`
    computes: runs of equal keys and shardings share its compiled program (`PROGRAMS`).
    `also` = {split: eval data} evaluates further splits at the same steps, recorded as
    'eval/<split>_<name>' (a transfer study's 'val' split beside its test split)."""

    def __init__(self, eval_fn: Callable, eval_data, *, every: int | None = None,
                 key: CacheKey | None = None, also: Mapping[str, Any] | None = None):
        if eval_data is None or any(d is None for d in (also or {}).values()):
            raise ValueError('Evaluation needs eval_data')
        check_int('eval_every', every, 0, optional=True)
        self.eval_fn, self.eval_data, self.every = eval_fn, eval_data, every or None
        self.also = dict(also or {})
        self.key = getattr(eval_fn, 'key', None) if key is None else key
        self._cache: list = []
        self._also_cache: dict[str, list] = {name: [] for name in self.also}
        self.run: Run | None = None
        self.jitted = None

    def start(self, run: Run) -> None:
        """Bind to `run`; on a mesh, compile the evaluation with the run's shardings.

        Args:
            run: what the run's hooks share; where it has a mesh, its `state_shardings`
              place the params (programs of equal keys are shared through `PROGRAMS`).
        """
        self.run = run
        if run.mesh is None:
            return
        params_sh = run.state_shardings['params']
        batch_sh, repl = parallel.batch_sharding(run.mesh), parallel.replicated(run.mesh)
        self.jitted = PROGRAMS.get(
            keyed('eval', self.key, sharding_key(params_sh), batch_sh, repl),
            lambda: compiler.jit(self.eval_fn, in_shardings=(params_sh, batch_sh),
                                 out_shardings=repl))

    def due(self, step: int) -> bool:
        """Whether `step` is evaluated.

        Args:
            step: the steps done.

        Returns:
            True every `every` steps (when set) and at the run's last step.
        """
        return bool(self.every and step % self.every == 0) or step == self.run.steps

    def after_call(self, run: Run, step: int, state: dict) -> None:
        """At a due step, sync the train metrics, evaluate the state's params and set
        `run.eval_record`.

        Args:
            run: what the run's hooks share.
            step: the steps done after the call.
            state: the train state; its 'params' are evaluated.

        Raises:
            NonFiniteLossError: at a due step, a pending loss is not finite (`Run.flush`).
            ValueError: a one-shot eval iterator yields no batches.
        """
        if self.due(step):
            run.synced = True
            run.flush(step)
            run.eval_record = self(step, state['params'])

    def __call__(self, step: int, params) -> dict:
        """Evaluate `params` on the eval data (and each `also` set), write and return the record."""
        def run(data, cache):
            return evaluate(self.eval_fn, params, _eval_iter(data, cache), mesh=self.run.mesh,
                            jitted=self.jitted)

        rec = {f'eval/{k}': v for k, v in run(self.eval_data, self._cache).items()}
        for name, data in self.also.items():
            rec |= {f'eval/{name}_{k}': v for k, v in run(data, self._also_cache[name]).items()}
        self.run.writer.write(step, rec, 'eval')
        self.run.history['eval'].append({'step': step, **rec})
        return rec


def _eval_iter(eval_data, cache: list):
    if callable(eval_data):
        return iter(eval_data())
    if hasattr(eval_data, '__next__'):  # one-shot iterator: keep its batches for later evals
        if not cache:
            cache.extend(eval_data)
            if not cache:
                raise ValueError('eval_data yielded no batches')
        return iter(cache)
    return iter(eval_data)


class StopWhen(Hook):
    """Ends the run after an evaluation whose record satisfies `predicate(record)` (e.g. a
    target accuracy reached; a checkpoint is written there). Place it after the
    `Evaluation` it reads. The eval record is global, so every process stops at the same
    step."""

    def __init__(self, predicate: Callable[[dict], bool], reason: str = 'the stop condition is met'):
        self.predicate, self.reason = predicate, reason

    def after_call(self, run: Run, step: int, state: dict) -> None:
        """Stop the run (`run.stop`) after an evaluation whose record satisfies the predicate.

        The last step is never a stop: the run ends there anyway.

        Args:
            run: what the run's hooks share; `run.eval_record` is read.
            step: the steps done after the call.
            state: unused.
        """
        del state
        if run.eval_record is not None and step < run.steps and self.predicate(run.eval_record):
            run.stop = self.reason


class Checkpoints(Hook):
    """Saves the state every `every` steps, at the end, and after each evaluation when a
    `best_metric` ranks the checkpoints, with the data position of `batches` and the
    configs. The pending train metrics are synced first, so a checkpoint never follows a
    non-finite loss."""

    def __init__(self, ckpt: RunCheckpointer, batches: Batches, *,
                 every: int | None = None, config=None, model_config=None):
        check_int('checkpoint_every', every, 0, optional=True)
        self.ckpt, self.batches, self.every = ckpt, batches, every or None
        self.config, self.model_config = config_json(config), model_config
        self.run: Run | None = None

    def start(self, run: Run) -> None:
        """Bind to `run` (it becomes `run.checkpoints`, which a preemption saves through).

        Args:
            run: what the run's hooks share.
        """
        self.run, run.checkpoints = run, self

    def due(self, step: int, evaluated: bool) -> bool:
        """Whether to save after `step`.

        Args:
            step: the steps done.
            evaluated: whether this call was evaluated.

        Returns:
            True at the last step, every `every` steps (when set), and after an evaluation
            when a `best_metric` ranks the checkpoints.
        """
        return step == self.run.steps or bool(self.every and step % self.every == 0) or \
            (evaluated and bool(self.ckpt.best_metric))

    def after_call(self, run: Run, step: int, state: dict) -> None:
        """Save the state at a due step (`save`); `run.saved` is its path.

        Args:
            run: what the run's hooks share; its `eval_record` is the checkpoint's metrics.
            step: the steps done after the call.
            state: the train state to save.
        """
        if self.due(step, run.eval_record is not None):
            run.synced = True
            run.saved = self.save(step, state, run.eval_record)

    def save(self, step: int, state: dict, metrics: dict | None = None) -> str:
        """Sync the pending train metrics, then save a checkpoint of `step`.

        Args:
            step: the step the state is at.
            state: the train state ({'params', 'opt_state', 'step', 'rng'}).
            metrics: the evaluation record of this step, which `best_metric` ranks by.

        Returns:
            The checkpoint's directory.
        """
        self.run.flush(step)
        return self.ckpt.save(step, state, data_state=gather_data_state(self.batches.get_state()),
                              config=self.config,
                              model_config=self.model_config, metrics=metrics)


# ----------------------------------------------------------------------------------------
# Preemption.

def agree_to_stop(flags) -> bool:
    """The processes' joint decision from their gathered stop flags: every process stops,
    at the same step, when any one of them was asked to.

    Args:
        flags: the flags, one per process (any array-like of bools or ints).

    Returns:
        Whether any flag is set.
    """
    return bool(np.any(np.asarray(flags)))


def _gather_flags(flag: bool) -> np.ndarray:
    return np.asarray(multihost_utils.process_allgather(np.asarray(flag, np.int32)))


def _preemption_sync_point(step: int) -> bool | None:
    """jax's preemption service's verdict for `step` (True at the agreed save step), or None
    when the distributed runtime runs without the service."""
    try:
        return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:
        return None


class Preemption(Hook):
    """SIGTERM (and Ctrl-C) handling agreed across processes (a context manager; the
    handlers are only installed, and the previous ones restored on exit, in the main
    thread). `SIGNALS` ask for a checkpoint and a stop; a second Ctrl-C raises
    KeyboardInterrupt at once, without saving.

    `requested(step, sync_point=...)` says whether the run stops after `step`:

    * one process: whenever its SIGTERM flag is set (no extra cost);
    * several: at sync points (the log, eval and checkpoint steps, which every process
      reaches together) the flags are all-gathered and every process stops when any one
      was signalled (`agree_to_stop`), so all save the same step; where jax's preemption
      service is on, its agreed sync step (`reached_preemption_sync_point`, asked after
      every call) stops every process as well. While the handlers are installed they
      receive the SIGTERMs that the service's own notifier would get (a signal has one
      handler); on exit that notifier's handler, installed outside Python, gives way to
      the default one.

    Args:
        enabled: install the handlers at all (False: a hook that never asks to stop).
        process_count: the number of processes (default `jax.process_count()`).
        gather: this process's flag -> every process's flags (default
          `multihost_utils.process_allgather`).
        sync_point: step -> the preemption service's verdict, None without the service
          (default `multihost_utils.reached_preemption_sync_point`).
    """
    SIGNALS = ('SIGTERM', 'SIGINT')

    def __init__(self, enabled: bool = True, *, process_count: int | None = None,
                 gather: Callable[[bool], Any] | None = None,
                 sync_point: Callable[[int], bool | None] | None = None):
        self.flag = False
        self.signal_name = 'SIGTERM'   # the signal that set the flag (another process: SIGTERM)
        self.enabled = enabled
        self.process_count = jax.process_count() if process_count is None else process_count
        self._gather = gather or _gather_flags
        self._service = (sync_point or _preemption_sync_point) if self.process_count > 1 else None
        self._install = enabled and threading.current_thread() is threading.main_thread()
        self._old: dict = {}

    def __enter__(self):
        if self._install:
            for name in self.SIGNALS:
                self._old[name] = signal.signal(getattr(signal, name), self._handle)
        return self

    def _handle(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if name == 'SIGINT':
            if self.flag and self.signal_name == 'SIGINT':   # pressed again: stop now
                raise KeyboardInterrupt
            sys.stderr.write('\nCtrl-C: saving a checkpoint after the current step '
                             '(press Ctrl-C again to stop without saving)\n')
        self.flag, self.signal_name = True, name

    def __exit__(self, *exc):
        if self._install:
            for name, old in self._old.items():
                # None: the handler was installed outside Python (jax's preemption notifier
                # in a multi-process run), which Python cannot put back; the default then.
                signal.signal(getattr(signal, name), signal.SIG_DFL if old is None else old)
            self._old = {}

    def requested(self, step: int, *, sync_point: bool) -> bool:
        """Whether the run stops after `step`.

        Args:
            step: the step just run.
            sync_point: whether every process reaches this step's decision (a log, eval or
              checkpoint step): only there are the processes' flags all-gathered.

        Returns:
            True when this process was signalled (one process), when jax's preemption service
            says so, or, at a sync point, when any process was signalled.
        """
        if not self.enabled:
            return False
        if self.process_count == 1:
            return self.flag
        if self._service is not None:
            verdict = self._service(step)
            if verdict is None:
                self._service = None   # no preemption service in this runtime
            elif verdict:
                return True
        return sync_point and agree_to_stop(self._gather(self.flag))


    def after_call(self, run: Run, step: int, state: dict) -> None:
        """After an agreed stop request: save (unless this call saved), print it and raise
        `Preempted`.

        Args:
            run: what the run's hooks share; `run.synced` says whether this step is a sync
              point, and `run.checkpoints` (where set) saves.
            step: the steps done after the call.
            state: the train state to save.

        Raises:
            Preempted: a stop was requested (`requested`); `err` is raised after the
              checkpoint is saved (its path is None when the run keeps none) and the event
              is logged.
        """
        if self.requested(step, sync_point=run.synced):
            saved = run.saved
            if saved is None and run.checkpoints is not None:
                saved = run.checkpoints.save(step, state, run.eval_record)
            err = Preempted(step, saved, self.signal_name)
            run.writer.event(step, str(err))
            raise err
