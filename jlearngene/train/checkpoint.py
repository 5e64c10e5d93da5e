"""Checkpoints through orbax-checkpoint (V1 API), behind one small module.

Two kinds of artefact:

* **Model artefacts** (`save_model` / `load_model`, format 'jlearngene.model/1'): a
  parameter tree (stacked or list layout) plus its `ViTConfig` and JSON metadata. Genes,
  descendant initialisations and converted timm models are stored this way.
* **Run checkpoints** (`RunCheckpointer`, format 'jlearngene.run/2'): the train state, the
  data-iterator state and the resolved experiment config, under `workdir/checkpoints/<step>`,
  with keep-last-N plus best-by-metric retention. The state is stored as one nested tree of
  plain dicts, the checkpointable 'state': {'params': ..., 'opt_state': ..., 'step', 'rng'},
  each node keyed by its path in the train state (optax NamedTuples and list entries become
  dicts keyed by field name or index; empty states have no arrays and are not stored).
  Plain orbax reads it (`ocp.load_checkpointables(path)['state']`), and a part of it can be
  restored alone (`restore_params`, `restore_subset`).

Orbax writes into a temporary directory and renames it when complete, so a crash never
leaves a half-written checkpoint under the final name. Damage is found by orbax and
tensorstore's own validation: a missing commit marker, JSON metadata that does not parse,
an OCDBT manifest or b-tree node that does not decode, a zarr shard index that fails its
CRC32C, a data file shorter than the byte ranges the index names, or a chunk that does not
decompress. The JSON metadata, the OCDBT index and the arrays a load asks for are read
here first, synchronously through tensorstore (so a load reads its arrays twice, on every
host), and damage is refused before orbax's asynchronous readers start, whose abandoned
tasks would otherwise report it again from other threads. Each of these is a
`CorruptCheckpointError` (a `CheckpointError`) naming the file-level cause in one short
sentence. The array bytes themselves carry no checksum in orbax's format (its zstd frames
are written without one), so both kinds of artefact store one 32-bit checksum per array in
their metadata (`tree_checksums`): a position-weighted sum of the array's bits modulo 2**32,
computed on the arrays' devices in one jitted call (exact for any sharding, across hosts),
so a save moves only one uint32 per array to the host. Loading recomputes it for the arrays
it reads and refuses a mismatch as a `CorruptCheckpointError` naming the arrays. Any change
of a single byte of an array always changes its checksum (the weights are odd); other
changes go unnoticed with probability about 2**-32. A checkpoint stored without checksums
loads unverified. A failed write is a `CheckpointError` in one line as well.
"""
from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import re
import shutil
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from orbax.checkpoint import v1 as ocp

from jlearngene import pytree
from jlearngene.models.config import ViTConfig

MODEL_FORMAT = 'jlearngene.model/1'
RUN_FORMAT = 'jlearngene.run/2'
CHECKSUM = 'jlearngene.u32-weighted-sum/1'


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupted or does not fit the requested target."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint exists but cannot be read back as written: an incomplete write, a
    truncated or damaged file, or arrays that fail their checksums. (A checkpoint that
    reads fine but fits another model is a plain `CheckpointError`.)"""


# ----------------------------------------------------------------------------------------
# Helpers.

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
    if isinstance(obj, dict):
        if set(obj) == {'__bytes__'}:
            return base64.b64decode(obj['__bytes__'])
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    return obj


def _context(*, partial_load: bool = False):
    # Replica-parallel saving slices every replicated array on device first, which costs one
    # small compilation per array shape (seconds on CPU); one replica writes instead.
    ctx = ocp.Context()
    ctx.array.saving.use_replica_parallel = False
    ctx.pytree.loading.partial_load = partial_load
    return ctx


def _check_exists(path: str, what: str) -> None:
    """`path` is a complete orbax checkpoint whose `_CHECKPOINT_METADATA` parses (orbax
    logs an error for a damaged one and reads it as empty)."""
    if not os.path.isdir(path):
        raise CheckpointError(f'{what} {path!r} does not exist')
    if not os.path.exists(os.path.join(path, 'commit_success.txt')) or not ocp.is_orbax_checkpoint(path):
        raise CorruptCheckpointError(f'{what} {path!r} is not a complete orbax checkpoint '
                              '(interrupted write or wrong directory)')
    _check_json([os.path.join(path, '_CHECKPOINT_METADATA')], path, f'{what} {path!r}')


def _check_json(files: list[str], root: str, where: str) -> None:
    """Each existing file of `files` parses as JSON, else CorruptCheckpointError naming it
    (relative to `root`)."""
    for f in files:
        if not os.path.isfile(f):
            continue
        try:
            with open(f, 'rb') as fh:
                json.loads(fh.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(f'{where}: {os.path.relpath(f, root)} is not valid JSON '
                                         f'({_short(str(e))}); it is truncated or corrupted') from None


def _abstract(meta_tree, sharding=None):
    """ShapeDtypeStructs from orbax array metadata, placed on `sharding` (a tree or one sharding)."""
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        one = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta_tree)
    return jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), meta_tree, sharding)


def _short(text: str, limit: int = 200) -> str:
    """The first line of `text` without orbax's object reprs and tensorstore specs, at most
    `limit` characters. tensorstore nests its causes as 'outer: inner: root cause', so a
    long text keeps its last ': '-separated parts (the cause), never a word cut in two."""
    text = text.strip().splitlines()[0] if text.strip() else ''
    text = text.split('[tensorstore_spec')[0]
    text = re.sub(r'<[^<>]*(object at 0x|class )[^<>]*>', '...', text).strip(' "\'')
    if len(text) <= limit:
        return text
    kept: list[str] = []
    for part in reversed(text.split(': ')):
        if len(': '.join([part] + kept)) > limit - 4:
            break
        kept.insert(0, part)
    if kept:
        return '... ' + ': '.join(kept)
    return text[:limit].rsplit(' ', 1)[0].rstrip(',;:') + ' ...'


def _root_cause(e: BaseException) -> BaseException:
    """The innermost exception of `e`'s cause/context chain (orbax wraps the file error)."""
    seen = {id(e)}
    while (inner := e.__cause__ or e.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        e = inner
    return e


def _check_array_store(item_dir: str, where: str, arrays: set[str] | None = None) -> None:
    """Read what orbax reads of one checkpointable (`<checkpoint>/state`, `<model>/params`),
    synchronously, through tensorstore: its JSON metadata (`_METADATA`, `_sharding`,
    `array_metadatas/*`), its OCDBT index and the arrays named in `arrays` (stored names:
    the tree path joined by '.'; default every array). Raise CorruptCheckpointError naming
    the first damaged file or array. Damage found here never reaches orbax's asynchronous
    readers, whose abandoned tasks would raise again on their closed event loop, from other
    threads, after the error."""
    if not os.path.isdir(item_dir):
        return
    metadata_files = [os.path.join(item_dir, n) for n in ('_METADATA', '_sharding')]
    metadata_files += sorted(glob.glob(os.path.join(item_dir, 'array_metadatas', '*')))
    _check_json(metadata_files, os.path.dirname(item_dir), where)
    if not os.path.exists(os.path.join(item_dir, 'manifest.ocdbt')):
        return
    kvstore = {'driver': 'ocdbt', 'base': 'file://' + os.path.abspath(item_dir) + '/'}
    try:
        keys = ts.KvStore.open(kvstore).result().list().result()
    except ValueError as e:
        raise CorruptCheckpointError(f'{where}: its array index could not be read '
                                     f'({_short(str(e))}); it is truncated or corrupted') from None
    names = [k.decode()[:-len('/zarr.json')] for k in keys if k.endswith(b'/zarr.json')]
    for name in names if arrays is None else [n for n in names if n in arrays]:
        try:
            ts.open({'driver': 'zarr3', 'kvstore': dict(kvstore, path=name + '/')},
                    open=True, read=True).result().read().result()
        except ValueError as e:
            raise CorruptCheckpointError(f'{where}: array {name!r} could not be read '
                                         f'({_short(str(e))}); it is truncated or corrupted') from None


def _orbax(call: Callable[[], Any], where: str, *, write: bool = False) -> Any:
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
        why = f'({type(cause).__name__}: {_short(str(cause))})'
        if write:
            raise CheckpointError(f'{where} could not be written {why}') from None
        raise CorruptCheckpointError(f'{where} could not be read {why}; it is truncated or corrupted') from None


def _no_metadata(where: str, what: str) -> CorruptCheckpointError:
    """orbax could not read `what` (it logs why and returns None)."""
    return CorruptCheckpointError(f'{where}: orbax could not read {what}; it is truncated or corrupted')


def config_mismatch(stored: ViTConfig, expected: ViTConfig, where: str) -> None:
    """Raise CheckpointError naming the fields where two model configs differ."""
    diff = stored.diff(expected)
    if diff:
        fields = ', '.join(f'{k}: checkpoint {a!r} vs requested {b!r}' for k, (a, b) in diff.items())
        raise CheckpointError(f'{where} holds a different model config ({fields})')


# Odd multiplier of the position weights: weight(i) = (i * _GOLDEN) | 1, an odd number, so a
# change d * 2**(8k) of one word (one byte changed, k < 4) changes the sum by a non-zero
# amount modulo 2**32.
_GOLDEN = 0x9E3779B1


def _words(x) -> jax.Array:
    """The bits of `x` as a flat uint32 vector (1- and 2-byte elements zero-extended,
    8-byte elements as two words)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    dt = np.dtype(x.dtype)
    if dt == np.bool_:
        return x.astype(jnp.uint32).reshape(-1)
    if jnp.issubdtype(dt, jnp.complexfloating) or dt.itemsize not in (1, 2, 4, 8):
        raise ValueError(f'cannot checksum arrays of dtype {dt} (1-, 2-, 4- or 8-byte '
                         'real or integer elements only)')
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[dt.itemsize]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)


def _leaf_checksum(x) -> jax.Array:
    words = _words(x)
    weights = (jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(_GOLDEN)) | jnp.uint32(1)
    return jnp.sum(words * weights, dtype=jnp.uint32)


@jax.jit
def _checksums(leaves: list) -> jax.Array:
    if not leaves:
        return jnp.zeros((0,), jnp.uint32)
    return jnp.stack([_leaf_checksum(x) for x in leaves])


def tree_checksums(tree) -> dict[str, int]:
    """{path: checksum} of every array leaf (see the module docstring): one jitted call on
    the arrays' devices (one per set of devices the leaves live on), exact for any sharding
    (integer sums modulo 2**32); one uint32 per leaf moves to the host."""
    groups: dict[tuple, dict[str, jax.Array]] = {}   # one call per set of devices
    for p, x in pytree.flatten(tree).items():
        x = x if isinstance(x, jax.Array) else jnp.asarray(x)
        groups.setdefault(tuple(sorted(d.id for d in x.sharding.device_set)), {})[p] = x
    out = {}
    for group in groups.values():
        sums = _checksums(list(group.values()))
        host = np.asarray(jax.device_get(sums) if sums.is_fully_addressable else sums.addressable_data(0))
        out.update((p, int(v)) for p, v in zip(group, host))
    return out


def _verify_checksums(flat: Mapping[str, Any], stored: Mapping[str, int] | None, where: str) -> None:
    """The loaded arrays ({path: array}) match their stored checksums, else
    CorruptCheckpointError naming them; `stored` None (a checkpoint saved without
    checksums) verifies nothing."""
    if stored is None:
        return
    got = tree_checksums(dict(flat))
    missing = [p for p in got if p not in stored]
    if missing:
        raise CorruptCheckpointError(f'{where} stores no checksum for {missing[:6]}; '
                                     'its metadata is truncated or corrupted')
    bad = [p for p, v in got.items() if int(stored[p]) != v]
    if bad:
        raise CorruptCheckpointError(f'{where}: array contents do not match the stored checksums '
                                     f"({', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}); "
                                     'the checkpoint is corrupted')


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
        'checksum': CHECKSUM, 'checksums': tree_checksums(params),
    }
    with _context():
        _orbax(lambda: ocp.save_checkpointables(path, {'params': params}, custom_metadata=meta,
                                                overwrite=overwrite), f'model checkpoint {path!r}', write=True)
    return path


def model_metadata(path: str) -> dict:
    """The stored metadata of a model artefact ({'config', 'layout', 'extra', 'shapes', ...})
    without reading any arrays."""
    path = os.path.abspath(os.fspath(path))
    _check_exists(path, 'model checkpoint')
    where = f'model checkpoint {path!r}'
    _check_array_store(os.path.join(path, 'params'), where, arrays=set())

    meta = _orbax(lambda: ocp.checkpointables_metadata(path), where)
    custom = meta.custom_metadata or {}
    if meta.metadata.get('params', ...) is None:
        raise _no_metadata(where, 'the array metadata of params')
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
    _check_array_store(os.path.join(path, 'params'), f'model checkpoint {path!r}')
    params = _orbax(
        lambda: ocp.load_checkpointables(path, {'params': _abstract(meta['arrays'], sharding)})['params'],
        f'model checkpoint {path!r}')
    _verify_checksums(pytree.flatten(params), meta.get('checksums'), f'model checkpoint {path!r}')
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
        self._save_failed = False
        self._ckpt = ocp.training.Checkpointer(self.directory, context=_context(),
                                               preservation_policy=pp.AnyPreservationPolicy(policies))

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
        path = self._path(step)
        _check_exists(path, 'run checkpoint')
        _check_array_store(os.path.join(path, 'state'), f'run checkpoint {path!r}', arrays=set())

        custom = _orbax(lambda: self._ckpt.metadata(step).custom_metadata,
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

        arrays = _orbax(lambda: self._ckpt.checkpointables_metadata(step).metadata['state'],
                        f'run checkpoint {path!r}')
        if arrays is None:
            raise _no_metadata(f'run checkpoint {path!r}', 'the array metadata of the state')
        return pytree.flatten(arrays)

    # -- save / restore ---------------------------------------------------------------
    def save(self, step: int, state, *, data_state: Any = None, config: Mapping | None = None,
             model_config: ViTConfig | None = None, metrics: Mapping[str, float] | None = None) -> str:
        """Write a checkpoint for `step` and wait until it is complete. The state's arrays
        stay where they are; only their checksums (one uint32 each) come to the host."""
        step = int(step)
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
            _orbax(write, f'run checkpoint {self._path(step)!r}', write=True)
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
        _check_array_store(os.path.join(path, 'state'), where, arrays={p.replace('/', '.') for p in target})
        default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = pytree.unflatten({
            p: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, 'sharding', None) or default)
            for p, x in target.items()})

        def read():
            with _context(partial_load=True):
                return ocp.load_checkpointables(path, {'state': abstract})['state']
        flat = pytree.flatten(_orbax(read, where))
        _verify_checksums(flat, meta.get('checksums'), where)
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
            target = _abstract(shapes, sharding)
        parts, meta = self.restore_subset({'params': target}, step, model_config=model_config)
        return parts['params'], meta

    def delete(self, step: int) -> None:
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
        raised twice when `save` raised it."""
        if not self._save_failed:
            _orbax(self._ckpt.close, f'run checkpoints {self.directory!r}', write=True)
            return
        with contextlib.suppress(Exception):   # the failure `save` raised
            self._ckpt.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
