"""Whether a checkpoint reads back as written: the checkpoint errors, synchronous checks of
its files, and one checksum per array.

Damage is found by orbax and tensorstore's own validation: a missing commit marker, JSON
metadata that does not parse, an OCDBT manifest or b-tree node that does not decode, a
zarr shard index that fails its CRC32C, a data file shorter than the byte ranges the index
names, or a chunk that does not decompress. The JSON metadata, the OCDBT index and the
arrays a load asks for are read first (`check_exists`, `check_array_store`), synchronously
through tensorstore (so a load reads its arrays twice, on every host), and damage is
refused before orbax's asynchronous readers start, whose abandoned tasks would otherwise
report it again from other threads. Each of these is a `CorruptCheckpointError` (a
`CheckpointError`) naming the file-level cause in one short sentence.

The array bytes themselves carry no checksum in orbax's format (its zstd frames are
written without one), so both kinds of artefact (`checkpoint.save_model`,
`run_checkpoint.RunCheckpointer`) store one 32-bit checksum per array in their metadata
(`tree_checksums`): a position-weighted sum of the array's bits modulo 2**32, computed on
the arrays' devices in one jitted call (exact for any sharding, across hosts), so a save
moves only one uint32 per array to the host. Loading recomputes it for the arrays it reads
(`verify_checksums`) and refuses a mismatch as a `CorruptCheckpointError` naming the
arrays. Any change of a single byte of an array always changes its checksum (the weights
are odd); other changes go unnoticed with probability about 2**-32. A checkpoint stored
without checksums loads unverified.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from orbax.checkpoint import v1 as ocp

from jlearngene import pytree


CHECKSUM = 'jlearngene.u32-weighted-sum/1'


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupted or does not fit the requested target."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint exists but cannot be read back as written: an incomplete write, a
    truncated or damaged file, or arrays that fail their checksums. (A checkpoint that
    reads fine but fits another model is a plain `CheckpointError`.)"""


# ----------------------------------------------------------------------------------------
# The files, read before orbax reads them.

def check_exists(path: str, what: str) -> None:
    """Check that `path` is a complete orbax checkpoint whose `_CHECKPOINT_METADATA` parses.

    Orbax itself logs an error for a damaged `_CHECKPOINT_METADATA` and reads it as empty.

    Args:
        path: the checkpoint's directory.
        what: what the checkpoint is, for the messages (e.g. 'run checkpoint').

    Raises:
        CheckpointError: `path` is not a directory.
        CorruptCheckpointError: it lacks `commit_success.txt` or is not an orbax checkpoint
          (an interrupted write or the wrong directory), or its `_CHECKPOINT_METADATA` is not
          valid JSON.
    """
    if not os.path.isdir(path):
        raise CheckpointError(f'{what} {path!r} does not exist')
    if not os.path.exists(os.path.join(path, 'commit_success.txt')) or not ocp.is_orbax_checkpoint(path):
        if os.path.isfile(os.path.join(path, 'metrics.jsonl')):     # a training workdir, not its model
            model = os.path.join(path, 'model')
            raise CorruptCheckpointError(
                f'{what} {path!r} is a training workdir, not a checkpoint: '
                + (f'its saved model is {model!r}' if os.path.isdir(model) else
                   f'its run checkpoints are in {os.path.join(path, "checkpoints")!r}'))
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
                                         f'({short_message(str(e))}); it is truncated or corrupted') from None


def check_array_store(item_dir: str, where: str, arrays: set[str] | None = None) -> None:
    """Read what orbax reads of one checkpointable, synchronously, through tensorstore.

    That is its JSON metadata (`_METADATA`, `_sharding`, `array_metadatas/*`), its OCDBT
    index and the arrays asked for. Damage found here never reaches orbax's asynchronous
    readers, whose abandoned tasks would raise again on their closed event loop, from other
    threads, after the error. A missing `item_dir`, or one without an OCDBT manifest after
    its metadata, is not checked further.

    Args:
        item_dir: the checkpointable's directory (`<checkpoint>/state`, `<model>/params`).
        where: what is read, for the messages.
        arrays: stored names of the arrays to read (the tree path joined by '.'); `None`
          reads every array.

    Raises:
        CorruptCheckpointError: a metadata file is not valid JSON, the array index cannot be
          read, or an array cannot be read (the message names the first such file or array).
    """
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
                                     f'({short_message(str(e))}); it is truncated or corrupted') from None
    names = [k.decode()[:-len('/zarr.json')] for k in keys if k.endswith(b'/zarr.json')]
    for name in names if arrays is None else [n for n in names if n in arrays]:
        try:
            ts.open({'driver': 'zarr3', 'kvstore': dict(kvstore, path=name + '/')},
                    open=True, read=True).result().read().result()
        except ValueError as e:
            raise CorruptCheckpointError(f'{where}: array {name!r} could not be read '
                                         f'({short_message(str(e))}); it is truncated or corrupted') from None


def short_message(text: str, limit: int = 200) -> str:
    """The first line of `text` without orbax's object reprs and tensorstore specs, shortened.

    tensorstore nests its causes as 'outer: inner: root cause', so a long text keeps its last
    ': '-separated parts (the cause), never a word cut in two.

    Args:
        text: an error message.
        limit: the longest result, in characters.

    Returns:
        The short message; '' for a blank `text`. A shortened one starts with '... ' (kept
        causes) or ends with ' ...' (cut at a word).
    """
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


# ----------------------------------------------------------------------------------------
# Checksums.

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
    """Checksums of every array leaf (see the module docstring).

    One jitted call on the arrays' devices (one per set of devices the leaves live on),
    exact for any sharding (integer sums modulo 2**32); one uint32 per leaf moves to the
    host.

    Args:
        tree: a pytree of arrays (jax, numpy or scalars); typed PRNG keys are checksummed by
          their key data.

    Returns:
        A dict from every leaf's '/'-joined path to its checksum, a Python int in [0, 2**32).

    Raises:
        ValueError: a leaf has a complex dtype or elements of other than 1, 2, 4 or 8 bytes.
    """
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


def verify_checksums(flat: Mapping[str, Any], stored: Mapping[str, int] | None, where: str) -> None:
    """Check that the loaded arrays match their stored checksums.

    Args:
        flat: {path: array} of the loaded arrays.
        stored: {path: checksum} from the checkpoint's metadata; `None` (a checkpoint saved
          without checksums) verifies nothing. Extra entries are ignored.
        where: what was loaded, for the messages.

    Raises:
        CorruptCheckpointError: `stored` lacks the checksum of a loaded array, or an array's
          checksum differs from the stored one (the message names up to 6 arrays).
    """
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
