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
from jlearngene.train import files, workdir_lock
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


def _newest_aside(aside: str, step: int) -> str | None:
    """The highest-numbered copy of `step` in the folder `aside` (`<step>`, `<step>-2`, ...),
    or None where it holds none."""
    numbers = {str(step): 1}
    for name in os.listdir(aside):
        head, dash, n = name.partition('-')
        if head == str(step) and dash and n.isdigit():
            numbers[name] = int(n)
    found = [(k, name) for name, k in numbers.items() if os.path.exists(os.path.join(aside, name))]
    return os.path.join(aside, max(found)[1]) if found else None


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
        """The steps of the kept checkpoints.

        Returns:
            The steps, ascending (empty without a checkpoint).
        """
        return sorted(c.step for c in self._ckpt.checkpoints)

    def latest_step(self) -> int | None:
        """The newest checkpoint's step.

        Returns:
            The step, or None without a checkpoint.
        """
        latest = self._ckpt.latest
        return None if latest is None else int(latest.step)

    def best_step(self) -> int | None:
        """Step of the best kept checkpoint by `best_metric`.

        Returns:
            The step of the highest (`best_mode` 'max') or lowest ('min') `best_metric` among
            the kept checkpoints saved with it; None without `best_metric` or such a checkpoint.
        """
        if not self.best_metric:
            return None
        scored = [(c.metrics[self.best_metric], c.step) for c in self._ckpt.checkpoints
                  if c.metrics and self.best_metric in c.metrics]
        if not scored:
            return None
        return (min if self.best_mode == 'min' else max)(scored)[1]

    def metadata(self, step: int | None = None) -> dict:
        """The JSON metadata of a checkpoint, after checking its files.

        Args:
            step: the checkpoint's step; None (default): the latest.

        Returns:
            The metadata dict `save` stored, with 'format', 'step', 'data_state' (as `to_json`
            made it), 'config', 'model_config' (a dict or None), 'checksum' and 'checksums'.

        Raises:
            CheckpointError: there is no checkpoint (`step` None), the checkpoint of `step`
              does not exist, or it has another format ('jlearngene.run/1' included).
            CorruptCheckpointError: it is incomplete, its metadata files are damaged, or they
              hold no jlearngene metadata.
        """
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
        """The stored state's shapes, read from the metadata alone (no arrays are loaded).

        Args:
            step: the checkpoint's step; None (default): the latest.

        Returns:
            The stored state as a nested dict (keyed by path part) of `jax.ShapeDtypeStruct`s
            without shardings.

        Raises:
            CheckpointError: as `metadata` does.
            CorruptCheckpointError: as `metadata` does, or orbax cannot read the arrays'
              metadata.
        """
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
        stay where they are; only their checksums (one uint32 each) come to the host.

        A checkpoint already kept for `step` is replaced only once the new one is complete
        (written beside it and swapped in; a failed or killed write leaves the old one); the
        retention of the other checkpoints then follows at the next save. The main process's
        first save takes the directory's lock.

        Args:
            step: the train step it is the state of.
            state: the train state tree (`params`, `opt_state`, `step`, `rng`).
            data_state: the data iterator's state, JSON-able (`to_json`).
            config: the resolved experiment config, JSON-able; None: none.
            model_config: the model's config, stored to check a restore against; None: none.
            metrics: metrics of this step; kept (as floats) for retention only when they hold
              `best_metric`.

        Returns:
            The checkpoint's path, `<directory>/<step>`.

        Raises:
            WorkdirInUseError: another live process holds the directory's lock.
            ValueError: two leaves of `state` have the same path.
            TypeError: `data_state` or `config` is not JSON-able.
            CheckpointError: the write failed (a full disk, a permission, ...); a checkpoint
              already kept for `step` is then left as it was.
        """
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
        checkpointables = {'state': pytree.unflatten(flat)}
        if step in self.steps():
            return self._replace(step, checkpointables, use_metrics, meta)
        def write():
            self._ckpt.save_checkpointables(step, checkpointables, force=True,
                                            metrics=use_metrics, custom_metadata=meta)
            self._ckpt.wait()
        try:
            call_orbax(write, f'run checkpoint {self._path(step)!r}', write=True)
        except CheckpointError:
            self._save_failed = True
            raise
        return self._path(step)

    def _replace(self, step: int, checkpointables: dict, metrics, meta: dict) -> str:
        """Write the kept step `step` anew under a temporary root beside it and swap it into
        place when complete (`train.files`), so that a failed or killed write leaves the old
        one; the processes of a run share the temporary's name."""
        path = self._path(step)
        multi, primary = jax.process_count() > 1, distributed.is_main_process()
        tmp = files.partial_path(path, 'run' if multi else None)
        if primary:
            files.remove_stale(path)
            files.remove_partial(tmp)   # what an earlier failed write of this name left
        distributed.barrier(f'jlearngene run checkpoint {path} start')

        def write():
            ckpt = ocp.training.Checkpointer(tmp, context=orbax_context())
            try:
                ckpt.save_checkpointables(step, checkpointables, force=True, metrics=metrics,
                                          custom_metadata=meta)
                ckpt.wait()
            except BaseException:
                with contextlib.suppress(Exception):   # waits for its writers; raises the same error
                    ckpt.close()
                raise
            ckpt.close()
        try:
            call_orbax(write, f'run checkpoint {path!r}', write=True)
            if primary:
                files.replace_dir(os.path.join(tmp, str(step)), path)
        finally:
            if primary:
                files.remove_partial(tmp)
        distributed.barrier(f'jlearngene run checkpoint {path} done')
        self._ckpt.reload()
        return path

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
        """Load the state saved at `step` into the structure, shapes and shardings of
        `target`, which must match the stored state array for array.

        Args:
            target: a train state tree of arrays or `jax.ShapeDtypeStruct`s; leaves without a
              sharding go to the first local device.
            step: the checkpoint's step; None (default): the latest.
            model_config: where given and the checkpoint stores a model config, the two must
              be equal.

        Returns:
            A tuple `(state, metadata)` of the loaded tree, structured as `target`, and the
            checkpoint's `metadata` with 'data_state' decoded (`from_json`).

        Raises:
            CheckpointError: no such checkpoint, another format or model config, or stored
              arrays that differ from `target`'s (paths, shapes or dtypes).
            CorruptCheckpointError: the checkpoint is incomplete, damaged or fails its
              checksums.
            ValueError: two leaves of `target` have the same path.
        """
        return self._load(target, step, model_config, exact=True)

    def restore_subset(self, target: Mapping[str, Any], step: int | None = None, *,
                       model_config: ViTConfig | None = None):
        """Load only the parts of the state that `target` names; nothing else is read.

        Args:
            target: the parts by name, e.g. `{'params': abstract}` or `{'params': ...,
              'step': ...}`, each in the structure, shapes and shardings to load into (arrays
              or `jax.ShapeDtypeStruct`s).
            step: the checkpoint's step; None (default): the latest.
            model_config: where given and the checkpoint stores a model config, the two must
              be equal.

        Returns:
            A tuple `(parts, metadata)` of a dict of the loaded parts and the checkpoint's
            `metadata` with 'data_state' decoded.

        Raises:
            CheckpointError: as `restore` does, where a leaf of `target` is not stored or
              has another shape or dtype (other stored arrays are allowed).
            CorruptCheckpointError: as `restore` does.
        """
        return self._load(dict(target), step, model_config, exact=False)

    def restore_params(self, target=None, step: int | None = None, *,
                       model_config: ViTConfig | None = None, sharding=None):
        """Only the parameters of a checkpoint; the optimiser state is not read.

        Args:
            target: a params tree of arrays or `jax.ShapeDtypeStruct`s giving the structure
              and shardings; None (default): the stored shapes, as nested dicts (a list
              layout's blocks then come back keyed '0', '1', ...).
            step: the checkpoint's step; None (default): the latest.
            model_config: where given and the checkpoint stores a model config, the two must
              be equal.
            sharding: where `target` is None, one sharding (or a tree of them) for the
              arrays; None (default): the first local device.

        Returns:
            A tuple `(params, metadata)` of the parameter tree and the checkpoint's
            `metadata` with 'data_state' decoded.

        Raises:
            CheckpointError: the checkpoint stores no 'params', or as `restore_subset`.
            CorruptCheckpointError: as `restore_subset`.
        """
        if target is None:
            shapes = self.array_shapes(step).get('params')
            if shapes is None:
                raise CheckpointError(f'run checkpoint {self._path(self._resolve(step))!r} '
                                      "stores no 'params'")
            target = abstract_arrays(shapes, sharding)
        parts, meta = self.restore_subset({'params': target}, step, model_config=model_config)
        return parts['params'], meta

    def delete(self, step: int) -> None:
        """Delete the checkpoint of `step`.

        Args:
            step: the checkpoint's step.
        """
        self._ckpt.delete(int(step))

    def set_aside(self, step: int) -> str:
        """Move the checkpoint of `step` out of the run, to `<directory>.unreadable/<step>`
        (numbered `<step>-2`, ... if that exists), where neither retention nor a later save
        of the same step deletes it. For a checkpoint that cannot be read: it stays on disk
        for inspection, and the run goes on from an older one.

        Args:
            step: the checkpoint's step.

        Returns:
            Its new path; where another process of the run moved it first, the newest copy
            of `step` set aside (the highest-numbered).
        """
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
            dest = _newest_aside(aside, step) or dest
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
