"""The generic trainer: `fit(loss_fn, trainable, data, optimizer, config, hooks=[...])`.

Every method plugs in through `loss_fn(trainable, batch, rng) -> (loss, metrics)`; the
trainer owns the rest: a jitted step with buffer donation and explicit shardings (batches
over the 'data' mesh axis, parameters replicated or FSDP-sharded), optax, orbax
checkpoints with exact resume, metrics (JSONL, console, TensorBoard), a progress bar,
evaluation, a non-finite-loss guard and a checkpoint on SIGTERM or Ctrl-C agreed across
processes. `config` is a `FitConfig` (where, how long, intervals, placement, switches);
`hooks` an open list of what runs after each call.

`fit` is the one-call entry; its pieces, usable on their own: the state (`init_state`,
`create_state`, `restore_or_start`), the step (`make_train_step`; `StepProgram`, its
jitted calls, shared between runs through `PROGRAMS`; `steps_in_call`), the loop
(`train_loop` over `Batches`) and its hooks (`Hook`s sharing one `Run`: `TrainLog`,
`Evaluation`, `StopWhen`, `Checkpoints`, `Preemption`).

Train state: a plain dict {'params', 'opt_state', 'step' (int32), 'rng' (uint32 key data)}.
The step's randomness is `fold_in(rng, step)`, so a resumed run draws the same keys as an
uninterrupted one. Host syncs happen only every `log_every` steps (and at eval/checkpoint
steps); the non-finite check runs there, before anything is saved, so the last checkpoint
is always a finite one. Several steps may run in one compiled call (`steps_per_call`; on
CPU by default), with the same steps, keys and per-step metrics as one step per call.

Several processes (`jlearngene.distributed.initialize`, before `fit`) run `fit` unchanged,
each with its own share of every batch: the mesh spans every process's devices, process 0
alone writes metrics, console lines, config files and the progress bar, all processes
write each orbax checkpoint together (into a directory they all see), every process's
data-iterator position is stored, and a preemption signal on any process stops all of them
at the same step.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from jlearngene import compiler, distributed, parallel
from jlearngene.train import checkpoint as ckpt_lib
from jlearngene.train import metrics as metrics_lib
from jlearngene.train.evaluate import evaluate
from jlearngene.train.optim import current_lr

log = logging.getLogger(__name__)

LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]


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


# ----------------------------------------------------------------------------------------
# The step.

def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *,
                    microbatches: int = 1, steps_per_call: int = 1) -> Callable:
    """The pure step `(state, batch, rng) -> (state, metrics)`; `fit` jits it with donation.

    `rng` is the run's base key data (uint32); the step folds in `state['step']`.
    Metrics: the loss, `loss_fn`'s metrics, the gradient's global norm and, when the
    optimiser injects it, the learning rate used for this step.

    `microbatches` > 1 accumulates the gradient over that many equal parts of the batch (a
    `lax.scan`) before the one optimiser update: activation memory shrinks by the factor,
    and on CPU the smaller working set is often faster. The loss, metrics and gradient are
    the means over the parts, which equal the whole batch's when `loss_fn` returns unweighted
    means over examples (as the classification and distillation losses do); the update then
    differs from the one-pass update only by float rounding. Part i takes rows i, i+n,
    i+2n, ... of the batch, so a batch sharded over devices stays evenly spread, and draws
    the key `fold_in(step key, i)` (so dropout masks differ from the one-pass step's).

    `steps_per_call` > 1 returns `steps_per_call` consecutive steps as one function (a
    `lax.scan` over the step): its batch has a leading axis of that size (entry i feeds step
    i) and so do its metrics. The steps are the one-step function's, in order, with the
    same keys. One call of several steps pays the per-call costs once: dispatch, and on
    CPU the fresh, page-faulted temporary buffer that XLA:CPU allocates for every call.
    """
    check_microbatches(microbatches)
    check_steps_per_call(steps_per_call)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if microbatches > 1:
        grad_fn = _accumulated(grad_fn, microbatches)

    def step(state, batch, rng):
        key = jax.random.fold_in(jax.random.wrap_key_data(rng), state['step'])
        (loss, aux), grads = grad_fn(state['params'], batch, key)
        updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
        lr = current_lr(opt_state)  # injected hyperparameters are set during the update
        params = optax.apply_updates(state['params'], updates)
        out = {'loss': loss, **aux, 'grad_norm': optax.tree.norm(grads)}
        if lr is not None:
            out['lr'] = lr
        new_state = {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1,
                     'rng': state['rng']}
        return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}
    if steps_per_call == 1:
        return step

    def steps(state, batches, rng):
        _check_leading_axis(batches, lambda n: n == steps_per_call, 'leading size {}',
                            f'steps_per_call={steps_per_call} needs batches stacked on a '
                            'leading axis of that size')
        return jax.lax.scan(lambda s, batch: step(s, batch, rng), state, batches)
    return steps


def _check_leading_axis(batch, fits: Callable[[int], bool], size: str, problem: str) -> None:
    """ValueError `problem: <entry> has <size>` for the first leaf of `batch` whose leading
    axis does not `fit` (or that is a scalar); `size` formats the leading size."""
    for path, x in jax.tree.leaves_with_path(batch):
        if jnp.ndim(x) == 0 or not fits(x.shape[0]):
            have = 'a scalar' if jnp.ndim(x) == 0 else size.format(x.shape[0])
            raise ValueError(f'{problem}: {jax.tree_util.keystr(path)} has {have}')


def _check_int(name: str, n, minimum: int, *, optional: bool = False) -> None:
    """ValueError unless `n` is an integer >= `minimum` (or, when `optional`, None)."""
    if (n is not None or not optional) and (
            not isinstance(n, int) or isinstance(n, bool) or n < minimum):
        kind = 'a positive' if minimum else 'a non-negative'
        raise ValueError(f'{name} must be {kind} integer, got {n!r}')


def check_microbatches(n) -> None:
    """Raise a ValueError unless `n` is a positive integer (a `microbatches` value)."""
    _check_int('microbatches', n, 1)


def check_steps_per_call(n) -> None:
    """Raise a ValueError unless `n` is a positive integer (a `steps_per_call` value)."""
    _check_int('steps_per_call', n, 1)


# The largest number of steps `fit(steps_per_call='auto')` runs in one call on CPU: beyond
# it the per-call costs are already small next to the steps (Ti-12 batch 128: 250k page
# faults per call).
AUTO_STEPS_PER_CALL_MAX = 8


def auto_steps_per_call(platform: str, intervals: Iterable[int] = ()) -> int:
    """`fit(steps_per_call='auto')`: on CPU, the largest K <= AUTO_STEPS_PER_CALL_MAX that
    divides every interval given (fit passes its log, eval and checkpoint intervals and its
    total steps), so one compiled program serves the whole run and its resumes; 1
    elsewhere, where it has not been measured."""
    if platform != 'cpu':
        return 1
    common = math.gcd(*(int(every) for every in intervals))   # 0 (no interval): any K divides
    return max(k for k in range(1, AUTO_STEPS_PER_CALL_MAX + 1) if common % k == 0)


def _accumulated(grad_fn: Callable, n: int) -> Callable:
    """`grad_fn` averaged over `n` strided parts of the batch, one part at a time."""
    def mean_grad(params, batch, key):
        _check_leading_axis(batch, lambda rows: rows % n == 0, '{} rows',
                            f'microbatches={n} does not divide the batch')
        # (B, ...) -> (B/n, n, ...): part i is [:, i], a slice that stays on each device.
        parts = jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]), batch)

        def body(total, i):
            part = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, 1, keepdims=False), parts)
            out = grad_fn(params, part, jax.random.fold_in(key, i))
            return jax.tree.map(jnp.add, total, out), None

        first = jax.tree.map(lambda x: x[:, 0], parts)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             jax.eval_shape(grad_fn, params, first, key))
        total, _ = jax.lax.scan(body, zeros, jnp.arange(n))
        return jax.tree.map(lambda t: t / n, total)
    return mean_grad


def init_state(trainable, optimizer: optax.GradientTransformation, seed: int = 0) -> dict:
    """{'params', 'opt_state', 'step', 'rng'}; params are copied, so donating the state
    never deletes the caller's arrays."""
    return {'params': jax.tree.map(jnp.copy, trainable), 'opt_state': optimizer.init(trainable),
            'step': jnp.zeros((), jnp.int32),
            'rng': jax.random.key_data(jax.random.key(seed))}


# Compiled programs shared between runs, by an explicit key (see `ProgramCache`).
CacheKey = Hashable


class ProgramCache:
    """Jitted programs by an explicit, hashable key, so runs that declare equal keys (a
    study's many runs of one shape) compile once: jax's own cache then serves every call
    of equal shapes and dtypes. The key names what the program computes (e.g. the loss's
    and optimiser's configs, `FitConfig.compile_key`) and how it is laid out (shardings,
    steps per call); a None key caches nothing. The newest `size` programs are kept."""

    def __init__(self, size: int = 32):
        self.size = size
        self._programs: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: CacheKey | None, build: Callable[[], Callable]) -> Callable:
        """The program cached under `key`, else `build()` (cached unless `key` is None)."""
        if key is None:
            return build()
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        program = self._programs[key] = build()
        while len(self._programs) > self.size:
            self._programs.popitem(last=False)
        return program


PROGRAMS = ProgramCache()


def _sharding_key(tree):
    return jax.tree.structure(tree), tuple(jax.tree.leaves(tree))


def _keyed(kind: str, key: CacheKey | None, *layout) -> tuple | None:
    return None if key is None else (kind, key, *layout)


# ----------------------------------------------------------------------------------------
# Data helpers.

class Batches:
    """The training data as the loop reads it: `next()`, and a resumable position (grain state when the
    iterator has `get_state`/`set_state`, otherwise a count of consumed batches that is
    replayed on resume — exact for deterministic iterators)."""

    def __init__(self, data):
        self.it = data if hasattr(data, '__next__') else iter(data)
        self.stateful = hasattr(self.it, 'get_state') and hasattr(self.it, 'set_state')
        self.consumed = 0

    def __next__(self):
        try:
            batch = next(self.it)
        except StopIteration:
            raise RuntimeError(f'training data ran out after {self.consumed} batches; '
                               'pass an endless iterator (e.g. jlearngene.data.train_iterator)') from None
        self.consumed += 1
        return batch

    def get_state(self):
        if self.stateful:
            return {'kind': 'iterator', 'state': self.it.get_state(), 'consumed': self.consumed}
        return {'kind': 'count', 'consumed': self.consumed}

    def set_state(self, state):
        if not state:
            return
        if state.get('kind') == 'iterator':
            if not self.stateful:
                raise ValueError('the checkpoint holds an iterator state but the data has no set_state')
            self.it.set_state(state['state'])
            self.consumed = state['consumed']
        else:
            log.warning('data has no get_state/set_state: replaying %d batches to resume', state['consumed'])
            for _ in range(state['consumed']):
                next(self)


def _allgather_json(obj) -> list:
    """Every process's JSON-able `obj`, in process order (one process: `[obj]`)."""
    if jax.process_count() == 1:
        return [obj]
    raw = np.frombuffer(json.dumps(ckpt_lib.to_json(obj), sort_keys=True).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(raw.size))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:raw.size] = raw
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [ckpt_lib.from_json(json.loads(bytes(r[:n]).decode())) for r, n in zip(rows, sizes)]


def gather_data_state(state):
    """The data position to store in a checkpoint: this process's iterator state when every
    process's is the same (grain's `{'next_index': step}`; the run can then resume with any
    process count), else `{'kind': 'per_process', 'states': [one per process]}`."""
    states = _allgather_json(state)
    if all(st == states[0] for st in states[1:]):
        return state
    return {'kind': 'per_process', 'states': states}


def local_data_state(stored):
    """This process's part of a stored data position (see `gather_data_state`)."""
    if isinstance(stored, Mapping) and stored.get('kind') == 'per_process':
        states = stored['states']
        if len(states) != jax.process_count():
            raise ckpt_lib.CheckpointError(
                f'the checkpoint holds the data positions of {len(states)} processes, which '
                f'differ; this run has {jax.process_count()}: resume with {len(states)} processes')
        return states[jax.process_index()]
    return stored


def _stack_batches(batches: list) -> dict:
    """Host batches -> one batch with a leading axis over them (for a call of several steps)."""
    keys = list(batches[0])
    for i, b in enumerate(batches[1:], 1):
        if list(b) != keys:
            raise ValueError(f'batch {i} of a call has entries {sorted(b)}, the first has '
                             f'{sorted(keys)}; consecutive batches must have the same entries')
    out = {}
    for k in keys:
        arrays = [np.asarray(b[k]) for b in batches]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f'batch entry {k!r} changes shape between consecutive batches '
                             f'({sorted(shapes)}); steps_per_call={len(batches)} stacks that many '
                             'batches into one call: pass batches of one shape or steps_per_call=1')
        out[k] = np.stack(arrays)
    return out


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


def _start_fresh(ckpt: ckpt_lib.RunCheckpointer, workdir: str) -> None:
    """resume=False in a used workdir: drop its checkpoints and metrics, so stale later
    steps can neither outlive the new run's checkpoints nor mix into its curves."""
    old = ckpt.steps()
    if old:
        log.warning('resume=False: deleting %d old checkpoint(s) %s in %s', len(old), old, ckpt.directory)
        for step in old:
            ckpt.delete(step)
    path = os.path.join(workdir, metrics_lib.METRICS_FILE)
    if distributed.is_main_process() and os.path.exists(path):
        os.remove(path)


def _write_config(workdir: str, config) -> None:
    if config is None or not distributed.is_main_process():   # one copy, by process 0
        return
    with open(os.path.join(workdir, 'config.json'), 'w', encoding='utf-8') as f:
        json.dump(ckpt_lib.to_json(_config_json(config)), f, indent=2, sort_keys=True)
    if hasattr(config, 'to_dict'):  # ml_collections' readable form as well
        with open(os.path.join(workdir, 'config.txt'), 'w', encoding='utf-8') as f:
            f.write(str(config))


# ----------------------------------------------------------------------------------------
# State: placement, initialisation, resume.

def create_state(trainable, optimizer: optax.GradientTransformation, mesh, *,
                 sharding: str = 'replicate', axes=None, fsdp_min_size: int = 2 ** 12,
                 seed: int = 0, key: CacheKey | None = None) -> tuple[dict, Any]:
    """The initial train state (`init_state`) placed on `mesh` -> (state, state_shardings).

    Parameters are replicated or FSDP-split by logical axis (`parallel.param_shardings`);
    optimiser moments share their parameter's sharding, everything else is replicated
    (`parallel.state_shardings`). `key` names the optimiser (with the same meaning as
    `FitConfig.compile_key`): states of equal keys share one compiled initialisation."""
    trainable_sh = parallel.param_shardings(trainable, mesh, sharding, axes=axes, min_size=fsdp_min_size)
    trainable = jax.device_put(jax.tree.map(_via_host, trainable, trainable_sh), trainable_sh)
    init = PROGRAMS.get(_keyed('init', key, seed), lambda: jax.jit(
        functools.partial(init_state, optimizer=optimizer, seed=seed)))
    state = init(trainable)
    state_sh = parallel.state_shardings(state, trainable_sh, mesh)
    return jax.device_put(state, state_sh), state_sh


def _via_host(x, sharding):
    """A leaf on one device that goes elsewhere comes through the host: putting a numpy
    array on a mesh copies each shard, where moving a device array compiles a slicing
    program per shape (and cannot reach other processes' devices)."""
    if isinstance(x, jax.Array) and len(x.sharding.device_set) == 1 and x.sharding != sharding:
        return np.asarray(x)
    return x


def restore_or_start(ckpt: ckpt_lib.RunCheckpointer, state: dict, batches: Batches, workdir: str,
                     *, resume: bool, model_config=None, config=None,
                     say: Callable[[str], None] | None = None) -> tuple[dict, int]:
    """-> (state, first step). With `resume` and a checkpoint in `ckpt`, the newest readable
    one is loaded into `state`'s shapes and shardings and `batches` is moved to its
    position (refused when it does not fit: another model or optimiser). A newer checkpoint
    that cannot be read (`CorruptCheckpointError`) is moved aside, never deleted
    (`RunCheckpointer.set_aside`), and `say` (default: a log warning) is told which one
    was skipped and why; so is every field of `config` that differs from the checkpoint's
    (e.g. `steps`, which changes the learning-rate schedule). Without `resume`, old
    checkpoints and metrics in `workdir` are deleted (`_start_fresh`)."""
    say = say or log.warning
    if resume and ckpt.latest_step() is not None:
        unreadable = []
        for step in reversed(ckpt.steps()):
            try:
                restored, meta = ckpt.restore(state, step, model_config=model_config)
            except ckpt_lib.CorruptCheckpointError as e:
                moved = ckpt.set_aside(step)
                unreadable.append(f'step {step}: {e}')
                say(f'skipping the checkpoint of step {step}, which cannot be read: {e}. '
                    f'Moved it to {moved}; trying the previous one.')
                continue
            for change in _config_changes(meta.get('config'), _config_json(config)):
                say(f'resuming with a changed config: {change}')
            batches.set_state(local_data_state(meta['data_state']))
            return restored, int(meta['step'])
        raise ckpt_lib.CorruptCheckpointError(
            f'no checkpoint in {ckpt.directory} can be read, so the run cannot resume '
            f'({"; ".join(unreadable)}). They are kept in {ckpt.directory}.unreadable; running '
            'again starts from step 0.')
    if not resume:
        _start_fresh(ckpt, workdir)
    return state, 0


def _config_changes(old, new, prefix: str = '') -> list[str]:
    """'key: old -> new' for every field that differs between two config dicts (the one
    stored in a checkpoint and the one of the resumed run)."""
    if old is None or new is None:
        return []
    new = ckpt_lib.to_json(new)
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, '(absent)'), new.get(k, '(absent)')
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_changes(a, b, f'{prefix}{k}.')
        elif a != b:
            note = ' (the learning-rate schedule and the end of the run follow the new value)' \
                if f'{prefix}{k}' == 'steps' else ''
            out.append(f'{prefix}{k}: {a!r} -> {b!r}{note}')
    return out


# ----------------------------------------------------------------------------------------
# Step compilation.

def steps_in_call(step: int, steps: int, steps_per_call: int, events: Iterable[int]) -> int:
    """How many steps the call starting after `step` runs: `steps_per_call`, unless a step
    that is a multiple of an interval in `events` (log, eval, checkpoint) or the end
    (`steps`) would fall inside the call, then 1 (so those steps see the state)."""
    n = steps_per_call
    fits = step + n <= steps and not any((step // e + 1) * e < step + n for e in events)
    return n if fits else 1


class StepProgram:
    """The jitted training calls of one run: `program(state, host_batches)` runs one step
    per batch in one call (`make_train_step(steps_per_call=n)`), with the state donated and
    the given shardings (batches over the mesh's 'data' axis, stacked on a leading axis
    when n > 1), drawing the step keys from `base_rng`. Each distinct `n` compiles once.

    `key` (hashable) names what `loss_fn` and `optimizer` compute: programs of equal keys,
    microbatches and shardings are shared between runs (`PROGRAMS`), so a study's runs of
    one shape compile their step once. Equal keys must mean equal functions; without a key
    (None) the programs are this run's own."""

    def __init__(self, loss_fn: LossFn, optimizer: optax.GradientTransformation, state_sh, mesh,
                 base_rng: jax.Array, *, microbatches: int = 1, key: CacheKey | None = None):
        check_microbatches(microbatches)
        self.loss_fn, self.optimizer, self.microbatches = loss_fn, optimizer, microbatches
        self.mesh, self.base_rng, self.key, self.state_sh = mesh, base_rng, key, state_sh
        self._fns: dict[int, Callable] = {}

    def compiled(self, n: int) -> Callable:
        """The jitted `(state, batch, rng) -> (state, metrics)` of `n` steps."""
        if n not in self._fns:
            batch_sh = parallel.batch_sharding(self.mesh, stacked=n > 1)
            repl = parallel.replicated(self.mesh)

            def build():
                return compiler.jit(make_train_step(self.loss_fn, self.optimizer,
                                                    microbatches=self.microbatches,
                                                    steps_per_call=n),
                                    in_shardings=(self.state_sh, batch_sh, repl),
                                    out_shardings=(self.state_sh, repl), donate_argnums=(0,))
            self._fns[n] = PROGRAMS.get(
                _keyed('step', self.key, self.microbatches, n, _sharding_key(self.state_sh),
                       batch_sh, repl), build)
        return self._fns[n]

    def __call__(self, state: dict, host_batches: list[dict]) -> tuple[dict, dict]:
        """Run one step per host batch (one call); returns the new state and the device
        metrics (stacked per step when there are several)."""
        n = len(host_batches)
        batch = host_batches[0] if n == 1 else _stack_batches(host_batches)
        batch = parallel.shard_batch(batch, self.mesh, stacked=n > 1)
        return self.compiled(n)(state, batch, self.base_rng)


# ----------------------------------------------------------------------------------------
# The loop's hooks: train metrics, evaluation, checkpoints, preemption.

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
        """A new call's record: its device metrics, nothing synced, saved or evaluated."""
        self.metrics, self.synced, self.saved, self.eval_record = metrics, False, None, None

    def flush(self, step: int) -> dict | None:
        """Sync the train metrics (`TrainLog.flush`) when the run has a TrainLog."""
        return None if self.log is None else self.log.flush(step)


class Hook(abc.ABC):
    """One thing the loop does after every compiled call: `start(run)` binds it to the run
    (once, before the first call), `after_call(run, step, state)` acts on the call's record
    (`Run`); a hook defines at least `after_call`. `every`: an interval in steps that no call
    of several steps runs past, so the hook sees the state at each multiple (None: none)."""
    every: int | None = None

    def start(self, run: Run) -> None:
        del run

    @abc.abstractmethod
    def after_call(self, run: Run, step: int, state: dict) -> None:
        """Act on the call that ended at `step` (`run` holds its record)."""


class TrainLog(Hook):
    """Collects the device metrics of each call and, every `every` steps and at the end,
    syncs them in one transfer (`flush`), stops on a non-finite loss and writes their mean
    (plus steps/s). `last_checkpoint()` is the sentence of a non-finite stop about the
    run's checkpoints."""

    def __init__(self, every: int = 50, *, last_checkpoint: Callable[[], str] = lambda: ''):
        _check_int('log_every', every, 1)
        self.every = every
        self._last_checkpoint = last_checkpoint
        self._pending: list = []
        self.run: Run | None = None

    def start(self, run: Run) -> None:
        self.run, run.log = run, self
        self._last = (run.start, time.perf_counter())

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.run.steps

    def after_call(self, run: Run, step: int, state: dict) -> None:
        del state
        self._pending.append(run.metrics)
        if self.due(step):
            run.synced = True
            rec = self.flush(step)
            if rec and run.bar is not None:
                run.bar.update(0, loss=rec['loss'])

    def flush(self, step: int) -> dict | None:
        """Sync the pending metrics (None when there are none); raises NonFiniteLossError."""
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
        now = time.perf_counter()
        rec = _mean_records(records)
        rec['steps_per_sec'] = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (step, now)
        run.writer.write(step, rec, 'train')
        run.history['train'].append({'step': step, **rec})
        return rec


class Evaluation(Hook):
    """Evaluates the params every `every` steps and at the end (`evaluate` over
    `eval_data`), records 'eval/<name>' = sum / count and leaves the record in
    `run.eval_record` for the hooks after it.

    `eval_fn(params, batch) -> {name: sum over valid examples, ..., 'count': n}` (see
    `tasks.classification_eval`) is jitted for the run's params and batch shardings;
    `eval_data` is a zero-argument callable returning an iterator of eval batches, or a
    re-iterable (a one-shot iterator is cached in host memory after its first pass).
    `key` (default: `eval_fn.key` where the factory declares one) names what `eval_fn`
    computes: runs of equal keys and shardings share its compiled program (`PROGRAMS`)."""

    def __init__(self, eval_fn: Callable, eval_data, *, every: int | None = None,
                 key: CacheKey | None = None):
        if eval_data is None:
            raise ValueError('Evaluation needs eval_data')
        _check_int('eval_every', every, 0, optional=True)
        self.eval_fn, self.eval_data, self.every = eval_fn, eval_data, every or None
        self.key = getattr(eval_fn, 'key', None) if key is None else key
        self._cache: list = []
        self.run: Run | None = None
        self.jitted = None

    def start(self, run: Run) -> None:
        self.run = run
        if run.mesh is None:
            return
        params_sh = run.state_shardings['params']
        batch_sh, repl = parallel.batch_sharding(run.mesh), parallel.replicated(run.mesh)
        self.jitted = PROGRAMS.get(
            _keyed('eval', self.key, _sharding_key(params_sh), batch_sh, repl),
            lambda: compiler.jit(self.eval_fn, in_shardings=(params_sh, batch_sh),
                                 out_shardings=repl))

    def due(self, step: int) -> bool:
        return bool(self.every and step % self.every == 0) or step == self.run.steps

    def after_call(self, run: Run, step: int, state: dict) -> None:
        if self.due(step):
            run.synced = True
            run.flush(step)
            run.eval_record = self(step, state['params'])

    def __call__(self, step: int, params) -> dict:
        result = evaluate(self.eval_fn, params, _eval_iter(self.eval_data, self._cache),
                          mesh=self.run.mesh, jitted=self.jitted)
        rec = {f'eval/{k}': v for k, v in result.items()}
        self.run.writer.write(step, rec, 'eval')
        self.run.history['eval'].append({'step': step, **rec})
        return rec


class StopWhen(Hook):
    """Ends the run after an evaluation whose record satisfies `predicate(record)` (e.g. a
    target accuracy reached; a checkpoint is written there). Place it after the
    `Evaluation` it reads. The eval record is global, so every process stops at the same
    step."""

    def __init__(self, predicate: Callable[[dict], bool], reason: str = 'the stop condition is met'):
        self.predicate, self.reason = predicate, reason

    def after_call(self, run: Run, step: int, state: dict) -> None:
        del state
        if run.eval_record is not None and step < run.steps and self.predicate(run.eval_record):
            run.stop = self.reason


class Checkpoints(Hook):
    """Saves the state every `every` steps, at the end, and after each evaluation when a
    `best_metric` ranks the checkpoints, with the data position of `batches` and the
    configs. The pending train metrics are synced first, so a checkpoint never follows a
    non-finite loss."""

    def __init__(self, ckpt: ckpt_lib.RunCheckpointer, batches: Batches, *,
                 every: int | None = None, config=None, model_config=None):
        _check_int('checkpoint_every', every, 0, optional=True)
        self.ckpt, self.batches, self.every = ckpt, batches, every or None
        self.config, self.model_config = _config_json(config), model_config
        self.run: Run | None = None

    def start(self, run: Run) -> None:
        self.run, run.checkpoints = run, self

    def due(self, step: int, evaluated: bool) -> bool:
        return step == self.run.steps or bool(self.every and step % self.every == 0) or \
            (evaluated and bool(self.ckpt.best_metric))

    def after_call(self, run: Run, step: int, state: dict) -> None:
        if self.due(step, run.eval_record is not None):
            run.synced = True
            run.saved = self.save(step, state, run.eval_record)

    def save(self, step: int, state: dict, metrics: dict | None = None) -> str:
        self.run.flush(step)
        return self.ckpt.save(step, state, data_state=gather_data_state(self.batches.get_state()),
                              config=self.config,
                              model_config=self.model_config, metrics=metrics)


def agree_to_stop(flags) -> bool:
    """The processes' joint decision from their gathered stop flags (one per process):
    every process stops, at the same step, when any one of them was asked to."""
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
    `process_count`, `gather` (this process's flag -> every process's flags) and
    `sync_point` (step -> the service's verdict, None without the service) default to jax's
    (`jax.process_count`, `multihost_utils.process_allgather`,
    `multihost_utils.reached_preemption_sync_point`).
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
        `Preempted`."""
        if self.requested(step, sync_point=run.synced):
            saved = run.saved
            if saved is None and run.checkpoints is not None:
                saved = run.checkpoints.save(step, state, run.eval_record)
            err = Preempted(step, saved, self.signal_name)
            run.writer.event(step, str(err))
            raise err


def train_loop(state: dict, program: Callable[[dict, list], tuple[dict, Any]], batches,
               hooks: Sequence[Hook], run: Run, *, steps_per_call: int = 1) -> dict:
    """Run steps `run.start`..`run.steps` in calls of `steps_in_call` steps (`program(state,
    host batches) -> (state, device metrics)`, e.g. a `StepProgram`; `batches` an iterator
    of host batches, e.g. `Batches`), each call followed by every hook in order
    (`Hook.after_call`; they are started first). When a hook sets `run.stop`, the run ends
    there, with a checkpoint when it has `Checkpoints` (unless that call saved one).
    Returns the final state."""
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
        _check_int('steps', self.steps, 0)
        _check_int('log_every', self.log_every, 1)
        _check_int('checkpoint_every', self.checkpoint_every, 0, optional=True)
        check_microbatches(self.microbatches)
        if self.steps_per_call != 'auto':
            check_steps_per_call(self.steps_per_call)

    @classmethod
    def of(cls, config: 'FitConfig | Mapping[str, Any]') -> 'FitConfig':
        """`config` itself, or the FitConfig of a mapping of its fields (ValueError naming
        unknown ones)."""
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
    """Train `trainable` for `config.steps` optimiser steps; returns `(trainable, history)`.

    The pieces, in order: `create_state` (placement, init), `restore_or_start` (resume),
    `StepProgram` (the jitted calls), `train_loop` with the hooks `TrainLog`, then
    `hooks` in order (e.g. `Evaluation`, `StopWhen`), then `Checkpoints` and `Preemption`.

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
    """
    c = FitConfig.of(config)
    os.makedirs(c.workdir, exist_ok=True)
    mesh = c.mesh or parallel.make_mesh(model=c.model_parallel)
    state, state_sh = create_state(trainable, optimizer, mesh, sharding=c.sharding, axes=c.axes,
                                   fsdp_min_size=c.fsdp_min_size, seed=c.seed, key=c.compile_key)
    batches = Batches(data)
    ckpt = ckpt_lib.RunCheckpointer(os.path.join(c.workdir, 'checkpoints'), keep=c.keep_checkpoints,
                                    best_metric=c.best_metric, best_mode=c.best_mode)
    writer = bar = None
    try:
        state, start = restore_or_start(ckpt, state, batches, c.workdir, resume=c.resume,
                                        model_config=c.model_config, config=c.experiment_config,
                                        say=_console_say if c.console else None)
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
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        ckpt.close()
    return state['params'], run.history


def _last_checkpoint(ckpt: ckpt_lib.RunCheckpointer) -> str:
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


def _config_json(config):
    if config is None:
        return None
    return config.to_dict() if hasattr(config, 'to_dict') else dict(config)
