"""Checkpoints through orbax-checkpoint (V1 API), behind one small wrapper; model artefacts.

Every orbax call goes through `call_orbax`, which turns orbax's many kinds of failure into
one line: a `CheckpointError` for a failed write (a full disk, a file-size limit, a
permission), a `CorruptCheckpointError` for a failed read (`train.integrity` finds most
damage before orbax reads). Orbax writes into a temporary directory and renames it when
complete, so a crash never leaves a half-written checkpoint under the final name.
Metadata is stored as JSON (`to_json` / `from_json`).

**Model artefacts** (`save_model` / `load_model`, format 'jlearngene.model/1'): a parameter
tree (stacked or list layout) plus its `ViTConfig`, JSON metadata and one checksum per
array (`integrity.tree_checksums`). Genes, descendant initialisations and converted timm
models are stored this way. `save_model` writes under a temporary sibling and swaps it into
place when complete (`train.files`), so replacing a model keeps the old one until the new
one is whole. Run checkpoints, the resumable train state, are `train.run_checkpoint`'s.
"""
from __future__ import annotations

import base64
import os
import threading
import time
from typing import Any
from collections.abc import Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from orbax.checkpoint import v1 as ocp

from jlearngene import pytree
from jlearngene.train import files
from jlearngene.models.config import ViTConfig
from jlearngene.train.integrity import (CHECKSUM, CheckpointError, CorruptCheckpointError,
                                        check_array_store, check_exists, short_message,
                                        tree_checksums, verify_checksums)


MODEL_FORMAT = 'jlearngene.model/1'
SETTLE_SECONDS = 5.0   # how long a failed save waits for its other writes before cleaning up


def to_json(obj: Any) -> Any:
    """JSON-able copy of checkpoint metadata.

    Args:
        obj: nested mappings, lists and tuples of None, bools, ints, floats, strings, bytes,
          numpy scalars and 0-d arrays.

    Returns:
        The copy, in which bytes become a dict of the one key `'__bytes__'` that holds their
        base64 text, mapping keys strings, tuples lists, and numpy scalars Python numbers.

    Raises:
        TypeError: a leaf is of another type (an array of one or more dimensions, an object).
    """
    if isinstance(obj, bytes):
        return {'__bytes__': base64.b64encode(obj).decode('ascii')}
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, np.generic) or (isinstance(obj, np.ndarray) and obj.ndim == 0):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f'cannot store {type(obj).__name__} {obj!r} as checkpoint metadata (not JSON-able)')


def from_json(obj: Any) -> Any:
    """The inverse of `to_json`.

    Args:
        obj: what `to_json` made, as read back from JSON.

    Returns:
        The copy, in which each dict whose one key is `'__bytes__'` is decoded to bytes.
        Tuples stay lists and mapping keys strings.
    """
    if isinstance(obj, dict):
        if set(obj) == {'__bytes__'}:
            return base64.b64decode(obj['__bytes__'])
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------
# The orbax wrapper.

def orbax_context(*, partial_load: bool = False):
    """The orbax context of every save and load here.

    Args:
        partial_load: whether a load may read part of the stored tree.

    Returns:
        An `ocp.Context` without replica-parallel saving (one replica writes).
    """
    # Replica-parallel saving slices every replicated array on device first, which costs one
    # small compilation per array shape (seconds on CPU); one replica writes instead.
    ctx = ocp.Context()
    ctx.array.saving.use_replica_parallel = False
    ctx.pytree.loading.partial_load = partial_load
    return ctx


def call_orbax(call: Callable[[], Any], where: str, *, write: bool = False) -> Any:
    """Run an orbax call, whose failure becomes one line naming the innermost cause (orbax
    raises many kinds of exception).

    Args:
        call: the orbax read or write, without arguments.
        where: the checkpoint, in words (`"model checkpoint '<path>'"`), for the message.
        write: whether `call` writes (else it reads).

    Returns:
        What `call()` returns.

    Raises:
        CorruptCheckpointError: a read failed (a `CheckpointError` it raised passes as it is).
        CheckpointError: a write failed (a full disk, a file-size limit, a permission; orbax
          leaves no checkpoint under the final name).
    """
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - orbax raises many kinds
        if isinstance(e, CheckpointError) and not write:
            raise
        cause = _root_cause(e)
        why = f'({type(cause).__name__}: {short_message(str(cause))})'
        if write:
            raise CheckpointError(f'{where} could not be written {why}') from None
        raise CorruptCheckpointError(f'{where} could not be read {why}; it is truncated or corrupted') from None


def _root_cause(e: BaseException) -> BaseException:
    """The innermost exception of `e`'s cause/context chain (orbax wraps the file error)."""
    seen = {id(e)}
    while (inner := e.__cause__ or e.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        e = inner
    return e


def no_metadata(where: str, what: str) -> CorruptCheckpointError:
    """The error for metadata orbax could not read (it logs why and returns None).

    Args:
        where: the checkpoint, in words, for the message.
        what: what could not be read, in words.

    Returns:
        A `CorruptCheckpointError` (not raised) naming both.
    """
    return CorruptCheckpointError(f'{where}: orbax could not read {what}; it is truncated or corrupted')


def abstract_arrays(meta_tree, sharding=None):
    """ShapeDtypeStructs from orbax array metadata, the targets of a load.

    Args:
        meta_tree: a tree of orbax array metadata (each with `shape` and `dtype`).
        sharding: one sharding for every array, or a tree of them matching `meta_tree`;
          `None` (default): the first local device.

    Returns:
        The tree of `jax.ShapeDtypeStruct`s, with their shardings.
    """
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        one = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta_tree)
    return jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), meta_tree, sharding)


def config_mismatch(stored: ViTConfig, expected: ViTConfig, where: str) -> None:
    """Raise CheckpointError naming the fields where two model configs differ.

    Args:
        stored: the checkpoint's config.
        expected: the requested one.
        where: the checkpoint, in words, for the message.

    Raises:
        CheckpointError: the configs differ (`ViTConfig.diff` is not empty).
    """
    diff = stored.diff(expected)
    if diff:
        fields = ', '.join(f'{k}: checkpoint {a!r} vs requested {b!r}' for k, (a, b) in diff.items())
        raise CheckpointError(f'{where} holds a different model config ({fields})')


# ----------------------------------------------------------------------------------------
# Model artefacts.

def is_model(path: str | os.PathLike) -> bool:
    """Whether `path` is a model artefact: a folder whose orbax metadata names the model
    format (only that small JSON file is read; `model_metadata` checks the rest).

    Args:
        path: the path to look at.

    Returns:
        True where `<path>/_CHECKPOINT_METADATA` parses and its custom metadata's format is
        `MODEL_FORMAT`; False otherwise (unreadable or missing included).
    """
    import json
    try:
        with open(os.path.join(os.fspath(path), '_CHECKPOINT_METADATA'), encoding='utf-8') as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get('custom_metadata'), dict) \
        and meta['custom_metadata'].get('format') == MODEL_FORMAT


def check_model_output(path: str | os.PathLike, *, overwrite: bool, inputs=(),
                       how: str = 'overwrite=True') -> None:
    """Check that a model may be written at `path` (`files.check_replaceable`).

    Args:
        path: where the model would go.
        overwrite: whether an existing model artefact may be replaced.
        inputs: paths the caller reads; `path` must neither be nor contain one.
        how: the switch that sets `overwrite`, in words, for the message.

    Raises:
        CheckpointError: `path` is, or contains, one of `inputs`; holds something other than
          a model artefact (an empty folder is fine); or holds one and not `overwrite`.
    """
    files.check_replaceable(path, 'a model checkpoint', is_model, overwrite=overwrite, how=how,
                            inputs=inputs, error=CheckpointError)


def save_model(path: str, params, cfg: ViTConfig | None, *, extra: dict | None = None,
               overwrite: bool = False, inputs=()) -> str:
    """Save a parameter tree with its model config and JSON-able `extra` metadata.

    An existing model is replaced only with `overwrite`, and only once the new one is
    complete (a failed or killed write leaves it as it was). In a multi-process run every
    process calls it; process 0 moves the result into place.

    Args:
        path: the model artefact's folder.
        params: the parameter tree (stacked or list layout, or any other tree).
        cfg: its `ViTConfig`, or None to store none.
        extra: JSON-able metadata (`to_json`) stored beside it; None: `{}`.
        overwrite: whether an existing model artefact at `path` may be replaced.
        inputs: paths the caller read; `path` must neither be nor contain one.

    Returns:
        `path`, made absolute.

    Raises:
        CheckpointError: `path` may not be written (`check_model_output`), or the write
          failed (`call_orbax`).
        TypeError: `extra` is not JSON-able (`to_json`).
    """
    path = os.path.abspath(os.fspath(path))
    check_model_output(path, overwrite=overwrite, inputs=inputs)
    meta = {
        'format': MODEL_FORMAT,
        'config': None if cfg is None else cfg.to_dict(),
        'layout': 'stacked' if isinstance(params, dict) and isinstance(params.get('blocks'), dict)
        else 'list' if isinstance(params, dict) and isinstance(params.get('blocks'), list) else 'other',
        'extra': to_json(extra or {}),
        'checksum': CHECKSUM, 'checksums': tree_checksums(params),
    }
    multi = jax.process_count() > 1
    if not multi:   # host arrays go to the host's device first: orbax's numpy path, when a
        # write fails, leaves callbacks that report 'Event loop is closed' until the process ends
        cpu = jax.local_devices(backend='cpu')[0]
        params = jax.tree.map(lambda x: jax.device_put(x, cpu) if isinstance(x, np.ndarray) else x,
                              params)
    # Written under a temporary sibling and swapped into place when complete, so a full
    # disk or a kill leaves the old model (`files`); the processes of a run share the name.
    primary = jax.process_index() == 0
    tmp = files.partial_path(path, 'run' if multi else None)
    if primary:
        files.remove_stale(path)
    before = set(threading.enumerate())
    try:
        with orbax_context():
            call_orbax(lambda: ocp.save_checkpointables(tmp, {'params': params}, custom_metadata=meta,
                                                        overwrite=True),
                       f'model checkpoint {path!r}', write=True)
        if primary:
            files.replace_dir(tmp, path)
    except BaseException:
        _settle(before)   # the failed save's other writes may still be filling `tmp`
        if primary:
            files.remove_partial(tmp)
        raise
    if multi:
        multihost_utils.sync_global_devices(f'jlearngene save_model {path}')
    return path


def _settle(before: set, seconds: float = SETTLE_SECONDS) -> None:
    """Wait up to `seconds` for the threads started since `before` (orbax's writers of a
    failed save, whose siblings may still be writing) to end."""
    deadline = time.monotonic() + seconds
    for t in set(threading.enumerate()) - before:
        # Thread.join itself: orbax's threads override it to raise their error
        threading.Thread.join(t, max(deadline - time.monotonic(), 0.0))


def model_metadata(path: str) -> dict:
    """The stored metadata of a model artefact, without reading any arrays.

    Args:
        path: the model artefact's folder.

    Returns:
        The custom metadata `save_model` stored ('format', 'config' (a dict or None),
        'layout', 'extra' (as `to_json` made it), 'checksum', 'checksums') and 'arrays', the
        orbax metadata tree of the parameters.

    Raises:
        CheckpointError: `path` does not exist, or is not a model artefact (e.g. a run
          checkpoint).
        CorruptCheckpointError: it is incomplete or its metadata is damaged (`check_exists`,
          `check_array_store`, `call_orbax`, or the error `no_metadata` makes).
    """
    path = os.path.abspath(os.fspath(path))
    check_exists(path, 'model checkpoint')
    where = f'model checkpoint {path!r}'
    check_array_store(os.path.join(path, 'params'), where, arrays=set())

    meta = call_orbax(lambda: ocp.checkpointables_metadata(path), where)
    custom = meta.custom_metadata or {}
    if meta.metadata.get('params', ...) is None:
        raise no_metadata(where, 'the array metadata of params')
    if custom.get('format') != MODEL_FORMAT or 'params' not in meta.metadata:
        raise CheckpointError(f'{path!r} is not a jlearngene model checkpoint '
                              f"(format {custom.get('format')!r}; a run checkpoint? use RunCheckpointer)")
    return {**custom, 'arrays': meta.metadata['params']}


def load_model(path: str, *, expect_cfg: ViTConfig | None = None, sharding=None):
    """Load a model artefact that `save_model` wrote; its arrays are verified by checksum.

    Args:
        path: the model artefact's folder.
        expect_cfg: the config the model must have; None: any.
        sharding: places the arrays (one sharding or a tree of them); None (default): the
          first local device.

    Returns:
        A tuple `(params, cfg, extra)` of the parameter tree, its `ViTConfig` (None where
        none was stored) and the `extra` metadata (`from_json`).

    Raises:
        CheckpointError: `path` is missing or not a model artefact (`model_metadata`), or
          `expect_cfg` is given and the checkpoint stores no config or a different one
          (`config_mismatch`, which names the fields).
        CorruptCheckpointError: the checkpoint is incomplete, damaged or fails its
          checksums.
    """
    path = os.path.abspath(os.fspath(path))
    meta = model_metadata(path)
    cfg = None if meta['config'] is None else ViTConfig.from_dict(meta['config'])
    if expect_cfg is not None:
        if cfg is None:
            raise CheckpointError(f'model checkpoint {path!r} stores no model config')
        config_mismatch(cfg, expect_cfg, f'model checkpoint {path!r}')
    check_array_store(os.path.join(path, 'params'), f'model checkpoint {path!r}')
    params = call_orbax(
        lambda: ocp.load_checkpointables(path, {'params': abstract_arrays(meta['arrays'], sharding)})['params'],
        f'model checkpoint {path!r}')
    verify_checksums(pytree.flatten(params), meta.get('checksums'), f'model checkpoint {path!r}')
    return params, cfg, from_json(meta.get('extra') or {})
