"""The train state: initialisation, placement on a mesh and resume; and the training
data's position.

Train state: a plain dict {'params', 'opt_state', 'step' (int32), 'rng' (uint32 key data)}
(`init_state`). `create_state` places it on a mesh (parameters replicated or FSDP-sharded)
and `restore_or_start` resumes it from the newest readable run checkpoint. `Batches` reads
the training data with a resumable position; with several processes, every process's
position is stored (`gather_data_state`, `local_data_state`).
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from jlearngene import distributed, parallel
from jlearngene.train import metrics as metrics_lib
from jlearngene.train.checkpoint import from_json, to_json
from jlearngene.train.integrity import CheckpointError, CorruptCheckpointError
from jlearngene.train.run_checkpoint import RunCheckpointer
from jlearngene.train.step import PROGRAMS, CacheKey, keyed

log = logging.getLogger(__name__)


def init_state(trainable, optimizer: optax.GradientTransformation, seed: int = 0) -> dict:
    """A fresh train state; params are copied, so donating the state never deletes the
    caller's arrays.

    Args:
        trainable: the tree of trained parameters.
        optimizer: the optax transformation whose state is initialised on `trainable`.
        seed: seed of the state's random key.

    Returns:
        A dict with 'params', a copy of `trainable`; 'opt_state'; 'step', int32 zero; and 'rng',
        the uint32 key data of `jax.random.key(seed)`.
    """
    return {'params': jax.tree.map(jnp.copy, trainable), 'opt_state': optimizer.init(trainable),
            'step': jnp.zeros((), jnp.int32),
            'rng': jax.random.key_data(jax.random.key(seed))}


def create_state(trainable, optimizer: optax.GradientTransformation, mesh, *,
                 sharding: str = 'replicate', axes=None, fsdp_min_size: int = 2 ** 12,
                 seed: int = 0, key: CacheKey | None = None) -> tuple[dict, Any]:
    """The initial train state (`init_state`) placed on `mesh`.

    Parameters are replicated or FSDP-split by logical axis (`parallel.param_shardings`);
    optimiser moments share their parameter's sharding, everything else is replicated
    (`parallel.state_shardings`).

    Args:
        trainable: the tree of trained parameters.
        optimizer: the optax transformation.
        mesh: the mesh to place the state on.
        sharding: 'replicate' or 'fsdp', the parameters' layout over 'data'.
        axes: a tree of logical-axis tuples matching `trainable`, or `None` for the ViT
          table (see `parallel.param_shardings`).
        fsdp_min_size: leaves with fewer elements stay replicated.
        seed: seed of the state's random key.
        key: names the optimiser (with the same meaning as `FitConfig.compile_key`): states
          of equal keys share one compiled initialisation; `None` compiles it anew.

    Returns:
        The pair `(state, state_shardings)`, the placed train state and the tree of its
        `NamedSharding`s.

    Raises:
        ValueError: from `parallel.param_shardings`: an unknown `sharding`, or an `axes`
          tree that does not match `trainable`.
    """
    trainable_sh = parallel.param_shardings(trainable, mesh, sharding, axes=axes, min_size=fsdp_min_size)
    trainable = jax.device_put(jax.tree.map(_via_host, trainable, trainable_sh), trainable_sh)
    init = PROGRAMS.get(keyed('init', key, seed), lambda: jax.jit(
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


# ----------------------------------------------------------------------------------------
# Resume.

def restore_or_start(ckpt: RunCheckpointer, state: dict, batches: Batches, workdir: str,
                     *, resume: bool, model_config=None, config=None,
                     say: Callable[[str], None] | None = None) -> tuple[dict, int]:
    """Resume the run from its newest readable checkpoint, or start it afresh.

    With `resume` and a checkpoint in `ckpt`, the newest readable one is loaded into
    `state`'s shapes and shardings and `batches` is moved to its position. A newer
    checkpoint that cannot be read is moved aside, never deleted
    (`RunCheckpointer.set_aside`), and `say` is told which one was skipped and why; so is
    every field of `config` that differs from the checkpoint's (e.g. `steps`, which changes
    the learning-rate schedule). Without `resume`, old checkpoints and metrics in `workdir`
    are deleted (`_start_fresh`). With `resume` and no checkpoint, the run starts at 0.

    Args:
        ckpt: the run's checkpointer.
        state: the initial train state; its shapes and shardings are the restore target.
        batches: the training data, moved to the restored position.
        workdir: the run's directory, whose metrics file a fresh start removes.
        resume: resume from a checkpoint; `False` deletes the old ones.
        model_config: the model's config, passed to `RunCheckpointer.restore` to check the
          checkpoint fits.
        config: the run's experiment config (`ConfigDict` or mapping), compared with the
          checkpoint's; `None` compares nothing.
        say: where warnings go; `None` logs them (`log.warning`).

    Returns:
        The pair `(state, first step)`, the restored state and its step, or `state` and 0.

    Raises:
        CorruptCheckpointError: with `resume`, no checkpoint in `ckpt` can be read.
        CheckpointError: a readable checkpoint does not fit (another model or optimiser), or
          it holds the data positions of another number of processes (`local_data_state`).
        ValueError: the checkpoint holds an iterator's position and `batches` cannot set one.
    """
    say = say or log.warning
    if resume and ckpt.latest_step() is not None:
        unreadable = []
        for step in reversed(ckpt.steps()):
            try:
                restored, meta = ckpt.restore(state, step, model_config=model_config)
            except CorruptCheckpointError as e:
                moved = ckpt.set_aside(step)
                unreadable.append(f'step {step}: {e}')
                say(f'skipping the checkpoint of step {step}, which cannot be read: {e}. '
                    f'Moved it to {moved}; trying the previous one.')
                continue
            for change in config_changes(meta.get('config'), config_json(config)):
                say(f'resuming with a changed config: {change}')
            batches.set_state(local_data_state(meta['data_state']))
            return restored, int(meta['step'])
        raise CorruptCheckpointError(
            f'no checkpoint in {ckpt.directory} can be read, so the run cannot resume '
            f'({"; ".join(unreadable)}). They are kept in {ckpt.directory}.unreadable; running '
            'again starts from step 0.')
    if not resume:
        _start_fresh(ckpt, workdir)
    return state, 0


def config_changes(old, new, prefix: str = '') -> list[str]:
    """What differs between two configs, field by field.

    Args:
        old: the stored config as JSON (a checkpoint's, a study workdir's), or None.
        new: the config of the run now (a mapping or ConfigDict), or None.
        prefix: the dotted path of the section being compared (for nested calls).

    Returns:
        One line per field that differs, its dotted key then `old -> new`; empty where
        either config is None.
    """
    if old is None or new is None:
        return []
    new = to_json(new)
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, '(absent)'), new.get(k, '(absent)')
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, f'{prefix}{k}.')
        elif a != b:
            note = ' (the learning-rate schedule and the end of the run follow the new value)' \
                if f'{prefix}{k}' == 'steps' else ''
            out.append(f'{prefix}{k}: {a!r} -> {b!r}{note}')
    return out


def _start_fresh(ckpt: RunCheckpointer, workdir: str) -> None:
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


def config_json(config):
    """An experiment config as a plain dict.

    Args:
        config: a `ConfigDict`, a mapping or `None`.

    Returns:
        `config.to_dict()` for a `ConfigDict`, a shallow `dict` copy of a mapping, or `None`.
    """
    if config is None:
        return None
    return config.to_dict() if hasattr(config, 'to_dict') else dict(config)


# ----------------------------------------------------------------------------------------
# The training data's position.

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
        """The data position to store with a checkpoint.

        Returns:
            A dict with 'kind', 'consumed' and, where the iterator has `get_state`/`set_state`,
            'state', namely `{'kind': 'iterator', 'state': state, 'consumed': n}` with the
            iterator's own state and the number n of batches read; else
            `{'kind': 'count', 'consumed': n}`.
        """
        if self.stateful:
            return {'kind': 'iterator', 'state': self.it.get_state(), 'consumed': self.consumed}
        return {'kind': 'count', 'consumed': self.consumed}

    def set_state(self, state):
        """Resume at a stored position; a count is replayed by reading that many batches.

        Args:
            state: a position as `get_state` returns it; empty or `None` does nothing.

        Raises:
            ValueError: the state is an iterator's but this data cannot set one.
            RuntimeError: the data runs out while a count is replayed.
        """
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
    raw = np.frombuffer(json.dumps(to_json(obj), sort_keys=True).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(raw.size))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:raw.size] = raw
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [from_json(json.loads(bytes(r[:n]).decode())) for r, n in zip(rows, sizes)]


def gather_data_state(state):
    """The data position to store in a checkpoint, from every process's.

    A collective: every process calls it, with its own position.

    Args:
        state: this process's data position (`Batches.get_state`), JSON-able.

    Returns:
        `state` itself when every process's is the same, so that the run can resume with
        any process count (grain's `{'next_index': step}`); else
        `{'kind': 'per_process', 'states': [one per process, in process order]}`.
    """
    states = _allgather_json(state)
    if all(st == states[0] for st in states[1:]):
        return state
    return {'kind': 'per_process', 'states': states}


def local_data_state(stored):
    """This process's part of a stored data position (see `gather_data_state`).

    Args:
        stored: the position stored in a checkpoint.

    Returns:
        This process's entry of a per-process position, else `stored` as it is.

    Raises:
        CheckpointError: `stored` holds per-process positions of another number of processes
          than this run has.
    """
    if isinstance(stored, Mapping) and stored.get('kind') == 'per_process':
        states = stored['states']
        if len(states) != jax.process_count():
            raise CheckpointError(
                f'the checkpoint holds the data positions of {len(states)} processes, which '
                f'differ; this run has {jax.process_count()}: resume with {len(states)} processes')
        return states[jax.process_index()]
    return stored
