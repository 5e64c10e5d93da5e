"""Run checkpoints (`RunCheckpointer`, format 'jlearngene.run/2'): the train state, the
data-iterator state and the resolved experiment config, under `workdir/checkpoints/<step>`,
with keep-last-N plus best-by-metric retention.

The state is stored as one nested tree of plain dicts, the checkpointable 'state':
{'params': ..., 'opt_state': ..., 'step', 'rng'}, each node keyed by its path in the train
state (optax NamedTuples and list entries become dicts keyed by field name or index; empty
states have no arrays and are not stored). Plain orbax reads it
(`ocp.load_checkpointables(path)['state']`), and a part of it can be restored alone
(`restore_params`, `restore_subset`). Every array's checksum is stored and verified at
load, after `train.integrity`'s checks of the files.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any
from collections.abc import Mapping

import jax
import numpy as np
from orbax.checkpoint import v1 as ocp

from jlearngene import distributed, pytree
from jlearngene.models.config import ViTConfig
from jlearngene.train import workdir_lock
from jlearngene.train.checkpoint import (abstract_arrays, call_orbax, config_mismatch, from_json,
                                         no_metadata, orbax_context, to_json)
from jlearngene.train.integrity import (CHECKSUM, CheckpointError, CorruptCheckpointError,
                                        check_array_store, check_exists, tree_checksums,
                                        verify_checksums)


RUN_FORMAT = 'jlearngene.run/2'


def _flat_state(state) -> dict[str, Any]:
    """{path: leaf} of a train state; refuses two leaves with one path (they would share a
    node of the stored tree)."""
    flat = pytree.flatten(state)
    if len(flat) != len(jax.tree.leaves(state)):
        raise ValueError('train state has two leaves with the same path; cannot checkpoint it')
    return flat


def _check_fits(stored: Mapping[str, Any], target: Mapping[str, Any], where: str, *,
                exact: bool) -> None:
    """The stored arrays ({path: metadata}) must hold every target leaf with its shape and
    dtype (and, when `exact`, no other array); errors name the paths."""
    only_state = [p for p in target if p not in stored]
    only_ckpt = [p for p in stored if p not in target] if exact else []
    if only_state or only_ckpt:
        raise CheckpointError(
            f'{where} does not fit the train state: only in the checkpoint {only_ckpt[:6]}, '
            f'only in the state {only_state[:6]} ({len(stored)} vs {len(target)} arrays); '
            'it was written for a different model, optimiser or trainable set')
    bad = [f'{p} {tuple(stored[p].shape)}/{np.dtype(stored[p].dtype)} vs '
           f'{tuple(np.shape(t))}/{np.dtype(t.dtype)}'
           for p, t in target.items()
           if tuple(stored[p].shape) != tuple(np.shape(t)) or np.dtype(stored[p].dtype) != np.dtype(t.dtype)]
    if bad:
        raise CheckpointError(f'{where} does not fit the train state (checkpoint vs state): '
                              + '; '.join(bad[:6]) + (f' ... and {len(bad) - 6} more' if len(bad) > 6 else ''))


class RunCheckpointer:
    """Train-state checkpoints of one run: `directory/<step>/`.

    Keeps the latest `keep` checkpoints plus the `keep_best` best by `best_metric`
    (mode 'max' or 'min'; checkpoints saved with that metric only). Saving is synchronous
    so a checkpoint is complete when `save` returns (needed before exiting on SIGTERM).
    The first save takes the directory's lock (`train.workdir_lock`; `close` gives it
    back): another process saving there is refused at once; readers take none.
    """

    def __init__(self, directory: str, *, keep: int = 2, best_metric: str | None = None,
                 best_mode: str = 'max', keep_best: int = 1):
        if best_mode not in ('max', 'min'):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        if keep < 1:
            raise ValueError(f'keep must be >= 1, got {keep}')
        self.directory = os.path.abspath(os.fspath(directory))
        self.best_metric, self.best_mode = best_metric, best_mode
        pp = ocp.training.preservation_policies
        policies = [pp.LatestN(keep)]
        if best_metric:
            policies.append(pp.BestN(get_metric_fn=lambda m: m[best_metric], reverse=(best_mode == 'min'),
                                     n=keep_best, keep_checkpoints_without_metrics=False))
        os.makedirs(self.directory, exist_ok=True)
        self._save_failed = False
        self._lock: str | None = None
        self._ckpt = ocp.training.Checkpointer(self.directory, context=orbax_context(),
                                               preservation_policy=pp.AnyPreservationPolicy(policies))

    # -- queries ----------------------------------------------------------------------
    def steps(self) -> list[int]:
        """The steps of the kept checkpoints, ascending."""
        return sorted(c.step for c in self._ckpt.checkpoints)

    def latest_step(self) -> int | None:
        """The newest checkpoint's step, None without one."""
        latest = self._ckpt.latest
        return None if latest is None else int(latest.step)

    def best_step(self) -> int | None:
        """Step of the best kept checkpoint by `best_metric`, if any has the metric."""
        if not self.best_metric:
            return None
        scored = [(c.metrics[self.best_metric], c.step) for c in self._ckpt.checkpoints
                  if c.metrics and self.best_metric in c.metrics]
        if not scored:
            return None
        return (min if self.best_mode == 'min' else max)(scored)[1]

    def metadata(self, step: int | None = None) -> dict:
        """The JSON metadata of a checkpoint (config, model_config, data_state, ...)."""
        step = self._resolve(step)
        path = self._path(step)
        check_exists(path, 'run checkpoint')
        check_array_store(os.path.join(path, 'state'), f'run checkpoint {path!r}', arrays=set())

        custom = call_orbax(lambda: self._ckpt.metadata(step).custom_metadata,
                            f'run checkpoint {path!r}') or {}
        fmt = custom.get('format')
        if fmt is None:   # a step of this run's directory without the metadata save writes
            raise CorruptCheckpointError(f'run checkpoint {path!r}: _CHECKPOINT_METADATA holds no '
                                         'jlearngene metadata; it is truncated or corrupted')
        if fmt == 'jlearngene.run/1':
            raise CheckpointError(f"run checkpoint {path!r} has the format 'jlearngene.run/1' (flat "
                                  f"arrays), which this version does not read (it reads {RUN_FORMAT!r}); "
                                  'restart the run, or read it with the jlearngene that wrote it')
        if fmt != RUN_FORMAT:
            raise CheckpointError(f'{path!r} is not a jlearngene run checkpoint (format {fmt!r})')
        return custom

    def array_shapes(self, step: int | None = None) -> dict:
        """The stored state as a nested dict of ShapeDtypeStructs, read from the metadata
        alone (no arrays are loaded)."""
        step = self._resolve(step)
        self.metadata(step)
        return pytree.unflatten({p: jax.ShapeDtypeStruct(m.shape, m.dtype)
                                 for p, m in self._stored_arrays(step).items()})

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _resolve(self, step):
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f'no checkpoint in {self.directory!r}')
        return int(step)

    def _stored_arrays(self, step: int) -> dict[str, Any]:
        """{path: orbax ArrayMetadata} of the stored state."""
        path = self._path(step)   # its files were checked by `metadata(step)`, read first

        arrays = call_orbax(lambda: self._ckpt.checkpointables_metadata(step).metadata['state'],
                            f'run checkpoint {path!r}')
        if arrays is None:
            raise no_metadata(f'run checkpoint {path!r}', 'the array metadata of the state')
        return pytree.flatten(arrays)

    # -- save / restore ---------------------------------------------------------------
    def save(self, step: int, state, *, data_state: Any = None, config: Mapping | None = None,
             model_config: ViTConfig | None = None, metrics: Mapping[str, float] | None = None) -> str:
        """Write a checkpoint for `step` and wait until it is complete. The state's arrays
        stay where they are; only their checksums (one uint32 each) come to the host."""
        step = int(step)
        if self._lock is None and distributed.is_main_process():   # one writer per run
            self._lock = workdir_lock.acquire(self.directory, 'the run checkpoint directory')
        flat = _flat_state(state)
        meta = {'format': RUN_FORMAT, 'step': step, 'data_state': to_json(data_state),
                'config': to_json(config) if config is not None else None,
                'model_config': None if model_config is None else model_config.to_dict(),
                'checksum': CHECKSUM, 'checksums': tree_checksums(flat)}
        ranked = metrics and self.best_metric and self.best_metric in metrics
        use_metrics = {k: float(v) for k, v in metrics.items()} if ranked else None
        if step in self.steps():
            self._ckpt.delete(step)
        def write():
            self._ckpt.save_checkpointables(step, {'state': pytree.unflatten(flat)}, force=True,
                                            metrics=use_metrics, custom_metadata=meta)
            self._ckpt.wait()
        try:
            call_orbax(write, f'run checkpoint {self._path(step)!r}', write=True)
        except CheckpointError:
            self._save_failed = True
            raise
        return self._path(step)

    def _load(self, tree, step, model_config, *, exact: bool):
        """Read the arrays of `tree` (arrays or ShapeDtypeStructs, placed on their shardings,
        default the first local device) into its structure and verify their checksums.
        Returns (tree, metadata)."""
        target = _flat_state(tree)
        step = self._resolve(step)
        path = self._path(step)
        where = f'run checkpoint {path!r}'
        meta = self.metadata(step)
        if model_config is not None and meta.get('model_config') is not None:
            config_mismatch(ViTConfig.from_dict(meta['model_config']), model_config, where)
        _check_fits(self._stored_arrays(step), target, where, exact=exact)
        check_array_store(os.path.join(path, 'state'), where, arrays={p.replace('/', '.') for p in target})
        default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = pytree.unflatten({
            p: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, 'sharding', None) or default)
            for p, x in target.items()})

        def read():
            with orbax_context(partial_load=True):
                return ocp.load_checkpointables(path, {'state': abstract})['state']
        flat = pytree.flatten(call_orbax(read, where))
        verify_checksums(flat, meta.get('checksums'), where)
        meta = {**meta, 'data_state': from_json(meta.get('data_state'))}
        return jax.tree.unflatten(jax.tree.structure(tree), [flat[p] for p in target]), meta

    def restore(self, target, step: int | None = None, *, model_config: ViTConfig | None = None):
        """Load the state saved at `step` (default latest) into the structure, shapes and
        shardings of `target` (arrays or ShapeDtypeStructs), which must match the stored
        state array for array. Returns (state, metadata)."""
        return self._load(target, step, model_config, exact=True)

    def restore_subset(self, target: Mapping[str, Any], step: int | None = None, *,
                       model_config: ViTConfig | None = None):
        """Load only the parts of the state that `target` names, e.g. `{'params': abstract}`
        or `{'params': ..., 'step': ...}` (each part in the structure, shapes and shardings
        given); nothing else is read. Returns (dict of the parts, metadata)."""
        return self._load(dict(target), step, model_config, exact=False)

    def restore_params(self, target=None, step: int | None = None, *,
                       model_config: ViTConfig | None = None, sharding=None):
        """Only the parameters of the checkpoint at `step` (default latest); the optimiser
        state is not read. `target` (a params tree of arrays or ShapeDtypeStructs) gives the
        structure and shardings; without it the stored shapes are used, as nested dicts
        (a list layout's blocks then come back keyed '0', '1', ...), placed on `sharding`
        (one sharding; default the first local device). Returns (params, metadata)."""
        if target is None:
            shapes = self.array_shapes(step).get('params')
            if shapes is None:
                raise CheckpointError(f'run checkpoint {self._path(self._resolve(step))!r} '
                                      "stores no 'params'")
            target = abstract_arrays(shapes, sharding)
        parts, meta = self.restore_subset({'params': target}, step, model_config=model_config)
        return parts['params'], meta

    def delete(self, step: int) -> None:
        """Delete the checkpoint of `step`."""
        self._ckpt.delete(int(step))

    def set_aside(self, step: int) -> str:
        """Move the checkpoint of `step` out of the run, to `<directory>.unreadable/<step>`
        (numbered `<step>-2`, ... if that exists), where neither retention nor a later save
        of the same step deletes it; returns its new path. For a checkpoint that cannot be
        read: it stays on disk for inspection, and the run goes on from an older one."""
        step = int(step)
        aside = self.directory + '.unreadable'
        os.makedirs(aside, exist_ok=True)
        dest, n = os.path.join(aside, str(step)), 1
        while os.path.exists(dest):
            n += 1
            dest = os.path.join(aside, f'{step}-{n}')
        try:
            shutil.move(self._path(step), dest)
        except FileNotFoundError:   # another process of the run moved it first
            dest = os.path.join(aside, str(step))
        self._ckpt.reload()
        return dest

    def close(self):
        """Close orbax's checkpointer, which raises the error of a failed save again: not
        raised twice when `save` raised it. The directory's lock (see `save`) goes."""
        try:
            if not self._save_failed:
                call_orbax(self._ckpt.close, f'run checkpoints {self.directory!r}', write=True)
                return
            with contextlib.suppress(Exception):   # the failure `save` raised
                self._ckpt.close()
        finally:
            if self._lock is not None:
                workdir_lock.release(self._lock)
                self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
