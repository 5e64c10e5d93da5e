"""Checkpoints through orbax-checkpoint (V1 API), behind one small module.

Two kinds of artefact:

* **Model artefacts** (`save_model` / `load_model`): a parameter tree (stacked or list
  layout) plus its `ViTConfig` and JSON metadata. Genes, descendant initialisations and
  converted timm models are stored this way.
* **Run checkpoints** (`RunCheckpointer`): the whole train state (params, optimiser state,
  step, RNG), the data-iterator state and the resolved experiment config, under
  `workdir/checkpoints/<step>`, with keep-last-N plus best-by-metric retention.

Orbax writes into a temporary directory and renames it when complete, so a crash never
leaves a half-written checkpoint under the final name. Every artefact also stores a CRC32
digest of its arrays; loading recomputes it, so a truncated or corrupted file is reported
as a `CheckpointError`, never loaded silently.
"""
from __future__ import annotations

import base64
import os
import zlib
from typing import Any, Mapping

import jax
import numpy as np
from orbax.checkpoint import v1 as ocp

from jlearngene import pytree
from jlearngene.models.config import ViTConfig

MODEL_FORMAT = 'jlearngene.model/1'
RUN_FORMAT = 'jlearngene.run/1'


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupted or does not fit the requested target."""


# ----------------------------------------------------------------------------------------
# Helpers.

def _fully_addressable(tree) -> bool:
    return all(getattr(x, 'is_fully_addressable', True) for x in jax.tree.leaves(tree))


def tree_digest(tree) -> str | None:
    """CRC32 over paths, shapes, dtypes and bytes of every leaf (None for multi-host arrays)."""
    if not _fully_addressable(tree):
        return None
    crc = 0
    for path, leaf in pytree.flatten(tree).items():
        a = np.asarray(jax.device_get(leaf))
        crc = zlib.crc32(f'{path}|{a.shape}|{a.dtype}|'.encode(), crc)
        crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data, crc)
    return f'{crc:08x}'


def to_json(obj: Any) -> Any:
    """JSON-able copy: bytes become {'__bytes__': base64}, tuples lists, numpy scalars numbers."""
    if isinstance(obj, bytes):
        return {'__bytes__': base64.b64encode(obj).decode('ascii')}
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray) and obj.ndim == 0:
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f'cannot store {type(obj).__name__} {obj!r} as checkpoint metadata (not JSON-able)')


def from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {'__bytes__'}:
            return base64.b64decode(obj['__bytes__'])
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    return obj


def _context():
    # Replica-parallel saving slices every replicated array on device first, which costs one
    # small compilation per array shape (seconds on CPU); one replica writes instead.
    ctx = ocp.Context()
    ctx.array.saving.use_replica_parallel = False
    return ctx


def _check_exists(path: str, what: str) -> None:
    if not os.path.isdir(path):
        raise CheckpointError(f'{what} {path!r} does not exist')
    if not os.path.exists(os.path.join(path, 'commit_success.txt')) or not ocp.is_orbax_checkpoint(path):
        raise CheckpointError(f'{what} {path!r} is not a complete orbax checkpoint '
                              '(interrupted write or wrong directory)')


def _abstract(meta_tree, sharding=None):
    """ShapeDtypeStructs from orbax array metadata, placed on `sharding` (a tree or one sharding)."""
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if isinstance(sharding, jax.sharding.Sharding):
        return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), meta_tree)
    return jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), meta_tree, sharding)


def _verify(tree, digest: str | None, where: str) -> None:
    if digest is None:
        return
    got = tree_digest(tree)
    if got is not None and got != digest:
        raise CheckpointError(f'{where}: array contents do not match the stored checksum '
                              f'({got} != {digest}); the checkpoint is corrupted')


def _load_error(where: str, e: Exception) -> CheckpointError:
    msg = str(e).split('[tensorstore_spec')[0].strip()
    return CheckpointError(f'{where} could not be read ({type(e).__name__}: {msg[:400]}); '
                           'it is truncated or corrupted')


def config_mismatch(stored: ViTConfig, expected: ViTConfig, where: str) -> None:
    """Raise CheckpointError naming the fields where two model configs differ."""
    diff = stored.diff(expected)
    if diff:
        fields = ', '.join(f'{k}: checkpoint {a!r} vs requested {b!r}' for k, (a, b) in diff.items())
        raise CheckpointError(f'{where} holds a different model config ({fields})')


def _flat_state(state) -> tuple[dict[str, Any], list[str]]:
    """{'00000': leaf, ...} in tree order plus the leaf paths: stored flat so that restoring
    never depends on how orbax treats containers (optax NamedTuples, empty states)."""
    flat = pytree.flatten(state)
    if len(flat) != len(jax.tree.leaves(state)):
        raise ValueError('train state has two leaves with the same path; cannot checkpoint it')
    return {f'{i:05d}': v for i, v in enumerate(flat.values())}, list(flat)


def _check_fits(stored_paths, stored_meta, target, where: str) -> None:
    """Stored arrays must match the target leaf for leaf; errors name the paths."""
    flat = pytree.flatten(target)
    if list(stored_paths) != list(flat):
        only_ckpt = [p for p in stored_paths if p not in flat]
        only_state = [p for p in flat if p not in set(stored_paths)]
        raise CheckpointError(
            f'{where} does not fit the train state: only in the checkpoint {only_ckpt[:6]}, '
            f'only in the state {only_state[:6]} ({len(stored_paths)} vs {len(flat)} arrays); '
            'it was written for a different model, optimiser or trainable set')
    bad = [f'{k} {tuple(m.shape)}/{np.dtype(m.dtype)} vs {tuple(np.shape(t))}/{np.dtype(t.dtype)}'
           for (k, t), m in zip(flat.items(), (stored_meta[f'{i:05d}'] for i in range(len(flat))))
           if tuple(m.shape) != tuple(np.shape(t)) or np.dtype(m.dtype) != np.dtype(t.dtype)]
    if bad:
        raise CheckpointError(f'{where} does not fit the train state (checkpoint vs state): '
                              + '; '.join(bad[:6]) + (f' ... and {len(bad) - 6} more' if len(bad) > 6 else ''))


# ----------------------------------------------------------------------------------------
# Model artefacts.

def save_model(path: str, params, cfg: ViTConfig | None, *, extra: dict | None = None,
               overwrite: bool = False) -> str:
    """Save a parameter tree with its model config and JSON-able `extra` metadata."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not overwrite:
        raise CheckpointError(f'{path!r} already exists; pass overwrite=True to replace it')
    meta = {
        'format': MODEL_FORMAT,
        'config': None if cfg is None else cfg.to_dict(),
        'layout': 'stacked' if isinstance(params, dict) and isinstance(params.get('blocks'), dict)
        else 'list' if isinstance(params, dict) and isinstance(params.get('blocks'), list) else 'other',
        'extra': to_json(extra or {}),
        'digest': tree_digest(params),
    }
    with _context():
        ocp.save_checkpointables(path, {'params': params}, custom_metadata=meta, overwrite=overwrite)
    return path


def model_metadata(path: str) -> dict:
    """The stored metadata of a model artefact ({'config', 'layout', 'extra', 'shapes', ...})
    without reading any arrays."""
    path = os.path.abspath(os.fspath(path))
    _check_exists(path, 'model checkpoint')
    try:
        meta = ocp.checkpointables_metadata(path)
    except Exception as e:  # noqa: BLE001 - orbax raises many kinds
        raise _load_error(f'model checkpoint {path!r}', e) from e
    custom = meta.custom_metadata or {}
    if custom.get('format') != MODEL_FORMAT or 'params' not in meta.metadata:
        raise CheckpointError(f'{path!r} is not a jlearngene model checkpoint '
                              f"(format {custom.get('format')!r}; a run checkpoint? use RunCheckpointer)")
    if meta.metadata['params'] is None:  # orbax logs the reason and returns None
        raise CheckpointError(f'model checkpoint {path!r}: array metadata could not be read; '
                              'it is truncated or corrupted')
    out = dict(custom)
    out['arrays'] = meta.metadata['params']
    return out


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
    try:
        params = ocp.load_checkpointables(path, {'params': _abstract(meta['arrays'], sharding)})['params']
    except Exception as e:  # noqa: BLE001
        raise _load_error(f'model checkpoint {path!r}', e) from e
    _verify(params, meta.get('digest'), f'model checkpoint {path!r}')
    return params, cfg, from_json(meta.get('extra') or {})


# ----------------------------------------------------------------------------------------
# Run checkpoints.

class RunCheckpointer:
    """Train-state checkpoints of one run: `directory/<step>/`.

    Keeps the latest `keep` checkpoints plus the `keep_best` best by `best_metric`
    (mode 'max' or 'min'; checkpoints saved with that metric only). Saving is synchronous
    so a checkpoint is complete when `save` returns (needed before exiting on SIGTERM).
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
        self._ckpt = ocp.training.Checkpointer(
            self.directory, preservation_policy=pp.AnyPreservationPolicy(policies),
            context=_context())

    # -- queries ----------------------------------------------------------------------
    def steps(self) -> list[int]:
        return sorted(c.step for c in self._ckpt.checkpoints)

    def latest_step(self) -> int | None:
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
        path = os.path.join(self.directory, str(step))
        _check_exists(path, 'run checkpoint')
        try:
            custom = self._ckpt.metadata(step).custom_metadata or {}
        except Exception as e:  # noqa: BLE001
            raise _load_error(f'run checkpoint {path!r}', e) from e
        if custom.get('format') != RUN_FORMAT:
            raise CheckpointError(f'{path!r} is not a jlearngene run checkpoint (format {custom.get("format")!r})')
        return custom

    def _resolve(self, step):
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f'no checkpoint in {self.directory!r}')
        return int(step)

    # -- save / restore ---------------------------------------------------------------
    def save(self, step: int, state, *, data_state: Any = None, config: Mapping | None = None,
             model_config: ViTConfig | None = None, metrics: Mapping[str, float] | None = None) -> str:
        """Write a checkpoint for `step` and wait until it is complete."""
        step = int(step)
        meta = {'format': RUN_FORMAT, 'step': step, 'data_state': to_json(data_state),
                'config': to_json(config) if config is not None else None,
                'model_config': None if model_config is None else model_config.to_dict(),
                'digest': tree_digest(state)}
        arrays, meta['paths'] = _flat_state(state)
        use_metrics = None
        if metrics and self.best_metric and self.best_metric in metrics:
            use_metrics = {k: float(v) for k, v in metrics.items()}
        if step in self.steps():
            self._ckpt.delete(step)
        self._ckpt.save_checkpointables(step, {'state': arrays}, force=True, metrics=use_metrics,
                                        custom_metadata=meta)
        self._ckpt.wait()
        return os.path.join(self.directory, str(step))

    def restore(self, target, step: int | None = None, *, model_config: ViTConfig | None = None):
        """Load the state saved at `step` (default latest) into the structure, shapes and
        shardings of `target` (arrays or ShapeDtypeStructs). Returns (state, metadata)."""
        step = self._resolve(step)
        path = os.path.join(self.directory, str(step))
        meta = self.metadata(step)
        if model_config is not None and meta.get('model_config') is not None:
            config_mismatch(ViTConfig.from_dict(meta['model_config']), model_config, f'run checkpoint {path!r}')
        try:
            arrays = self._ckpt.checkpointables_metadata(step).metadata['state']
        except Exception as e:  # noqa: BLE001
            raise _load_error(f'run checkpoint {path!r}', e) from e
        if arrays is None:  # orbax logs the reason and returns None
            raise CheckpointError(f'run checkpoint {path!r}: array metadata could not be read; '
                                  'it is truncated or corrupted')
        _check_fits(meta.get('paths', []), arrays, target, f'run checkpoint {path!r}')
        leaves = jax.tree.leaves(target)
        default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = {f'{i:05d}': jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                                                     sharding=getattr(x, 'sharding', None) or default)
                    for i, x in enumerate(leaves)}
        try:
            loaded = self._ckpt.load_checkpointables(step, {'state': abstract})['state']
        except Exception as e:  # noqa: BLE001
            raise _load_error(f'run checkpoint {path!r}', e) from e
        state = jax.tree.unflatten(jax.tree.structure(target), [loaded[f'{i:05d}'] for i in range(len(leaves))])
        _verify(state, meta.get('digest'), f'run checkpoint {path!r}')
        meta = dict(meta)
        meta['data_state'] = from_json(meta.get('data_state'))
        return state, meta

    def delete(self, step: int) -> None:
        self._ckpt.delete(int(step))

    def close(self):
        self._ckpt.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
