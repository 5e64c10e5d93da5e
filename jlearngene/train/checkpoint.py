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
    """JSON-able copy: bytes become {'__bytes__': base64}, tuples lists, numpy scalars numbers."""
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
    """The inverse of `to_json`."""
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
    """The orbax context of every save and load here (`partial_load`: read part of a tree)."""
    # Replica-parallel saving slices every replicated array on device first, which costs one
    # small compilation per array shape (seconds on CPU); one replica writes instead.
    ctx = ocp.Context()
    ctx.array.saving.use_replica_parallel = False
    ctx.pytree.loading.partial_load = partial_load
    return ctx


def call_orbax(call: Callable[[], Any], where: str, *, write: bool = False) -> Any:
    """`call()`, an orbax read (or `write`) of the checkpoint `where` names, whose failure
    becomes one line naming the innermost cause (orbax raises many kinds of exception): a
    CorruptCheckpointError for a read (a CheckpointError passes as it is), a CheckpointError
    for a write (a full disk, a file-size limit, a permission; orbax leaves no checkpoint
    under the final name)."""
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
    """orbax could not read `what` (it logs why and returns None)."""
    return CorruptCheckpointError(f'{where}: orbax could not read {what}; it is truncated or corrupted')


def abstract_arrays(meta_tree, sharding=None):
    """ShapeDtypeStructs from orbax array metadata, placed on `sharding` (a tree or one sharding)."""
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        one = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta_tree)
    return jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), meta_tree, sharding)


def config_mismatch(stored: ViTConfig, expected: ViTConfig, where: str) -> None:
    """Raise CheckpointError naming the fields where two model configs differ."""
    diff = stored.diff(expected)
    if diff:
        fields = ', '.join(f'{k}: checkpoint {a!r} vs requested {b!r}' for k, (a, b) in diff.items())
        raise CheckpointError(f'{where} holds a different model config ({fields})')


# ----------------------------------------------------------------------------------------
# Model artefacts.

def is_model(path: str | os.PathLike) -> bool:
    """Whether `path` is a model artefact: a folder whose orbax metadata names the model
    format (only that small JSON file is read; `model_metadata` checks the rest)."""
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
    """CheckpointError unless a model may be written at `path` (`files.check_replaceable`:
    nothing there, or a model artefact and `overwrite`; never one of `inputs`)."""
    files.check_replaceable(path, 'a model checkpoint', is_model, overwrite=overwrite, how=how,
                            inputs=inputs, error=CheckpointError)


def save_model(path: str, params, cfg: ViTConfig | None, *, extra: dict | None = None,
               overwrite: bool = False, inputs=()) -> str:
    """Save a parameter tree with its model config and JSON-able `extra` metadata. An
    existing model is replaced only with `overwrite`, and only once the new one is
    complete (a failed or killed write leaves it as it was); anything else at `path`, or
    a path that is or contains one of `inputs` (what the caller read), is refused
    (`check_model_output`)."""
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
    """The stored metadata of a model artefact ({'config', 'layout', 'extra', 'shapes', ...})
    without reading any arrays."""
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
    """Load a model artefact -> (params, cfg, extra).

    `expect_cfg` refuses a checkpoint whose config differs (the error names the fields).
    `sharding` places the arrays (one sharding or a tree of them; default: first local device).
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
