"""A gene as one directory: `save_gene` writes it, `load_gene` reads it back bit for bit
(`read_meta` reads only the JSON).

A gene directory holds two files:

* `gene.safetensors`: the gene's arrays, one tensor per leaf, keyed by its '/'-joined pytree
  path ('theta_a/attn/q/kernel', 'blocks/3/mlp/fc1/bias'); readable by any safetensors
  reader (numpy, torch).
* `gene.json`: `format` ('jlearngene.gene') and `format_version`, the jlearngene version
  that wrote it, the `method` (registry name), its `label` and `source`, `configs` (ViT
  configs as dicts: 'source' is the model the gene was made for, the Aux-Net, ancestor or
  small model; 'target' where a gene makes one shape only, e.g. Mango's large model),
  `tree` (the gene's containers: objects, lists, and each leaf's array key, so genes whose
  structure carries metadata, e.g. Cluster-Learngene's per-layer centroid heads, come back
  as they were), `arrays` (shape, dtype and `sha256` of the array's little-endian bytes
  per key; files written before jlearngene stored checksums have none), `params` (stored
  parameters and S-Params), `gene_options` (how it was made) and `descend_options`
  (defaults for `descend`, e.g. Scala's smallest width ratio), and `provenance` ('created',
  'by', and whatever the writer adds: the run, the data, the source checkpoint).

A reader accepts every `format_version` up to its own, whatever jlearngene version wrote
the file; a newer format, a missing or corrupt file, arrays that disagree with the JSON or
are not a gene of the named method are a `GeneFileError` naming the file and the problem
in one line; so is an array whose bytes do not match its `sha256` (a damaged file: the
error names the array).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import secrets
import shutil
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import numpy as np

import jlearngene
from jlearngene import genes
from jlearngene.genes.common import GeneError, Method
from jlearngene.models.config import ConfigError, ViTConfig


FORMAT = 'jlearngene.gene'


FORMAT_VERSION = 1


META_FILE = 'gene.json'


ARRAYS_FILE = 'gene.safetensors'


_DTYPES = ('float64', 'float32', 'float16', 'int64', 'int32', 'int16', 'int8', 'uint8', 'bool')


_FIELDS = ('format', 'format_version', 'method', 'configs', 'tree', 'arrays')


_SHA256 = re.compile(r'[0-9a-f]{64}')


class GeneFileError(ValueError):
    """A gene directory that cannot be written or read; the message names the file."""


# ----------------------------------------------------------------------------------------
# JSON pieces.

def jsonable(obj: Any, where: str) -> Any:
    """A JSON-able copy of options and provenance.

    Args:
        obj: the value: configs, dataclasses, mappings, lists, tuples, numbers, strings,
          `None`, numpy scalars and arrays of at most 4096 elements.
        where: what `obj` is, for the message ('options'); nested values are named from it.

    Returns:
        The copy, with configs and dataclasses as dicts, mapping keys as strings, tuples as
        lists, numpy scalars and small arrays as numbers and lists.

    Raises:
        GeneFileError: a value of another type, or an array of more than 4096 elements.
    """
    if isinstance(obj, ViTConfig):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj), where)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v, f'{where}.{k}') for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, f'{where}[{i}]') for i, v in enumerate(obj)]
    if isinstance(obj, (np.generic, np.ndarray, jax.Array)) and np.size(obj) <= 4096:
        return np.asarray(obj).tolist()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise GeneFileError(f'{where}: a {type(obj).__name__} cannot be stored in {META_FILE} '
                        '(configs, numbers, strings, lists and dicts can)')


def _skeleton(tree: Any, leaves: dict[str, Any], prefix: str = '') -> Any:
    """The tree's containers with each leaf replaced by its array key (its path), which
    `leaves` maps to the leaf."""
    if tree is None:
        return None
    if isinstance(tree, Mapping):
        out = {}
        for k, v in tree.items():
            if not isinstance(k, str) or '/' in k or not k:
                raise GeneFileError(f'gene key {k!r} at {prefix or "the top"!r}: keys must be '
                                    "non-empty strings without '/'")
            out[k] = _skeleton(v, leaves, f'{prefix}{k}/')
        return out
    if isinstance(tree, (list, tuple)):
        return [_skeleton(v, leaves, f'{prefix}{i}/') for i, v in enumerate(tree)]
    leaves[prefix[:-1]] = tree
    return prefix[:-1]


def _rebuild(skeleton: Any, leaves: Mapping[str, Any]) -> Any:
    if isinstance(skeleton, dict):
        return {k: _rebuild(v, leaves) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_rebuild(v, leaves) for v in skeleton]
    return None if skeleton is None else leaves[skeleton]


def checksum(a: np.ndarray) -> str:
    """The sha256 of an array's bytes as a gene file stores them.

    Args:
        a: the array (anything `np.asarray` takes).

    Returns:
        The hex digest of its bytes in C order, little-endian.
    """
    a = np.asarray(a)
    return hashlib.sha256(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder('<')).tobytes()).hexdigest()


def has_checksums(meta: Mapping[str, Any]) -> bool:
    """Whether `gene.json` carries a sha256 of its arrays.

    Args:
        meta: a gene's `gene.json` as a dict.

    Returns:
        True where any array has a 'sha256'; files written before checksums were stored
        carry none, and are read unchecked.
    """
    return any('sha256' in v for v in meta['arrays'].values())


def _make_tmp_dir(parent: str, name: str) -> str:
    """A new empty directory beside `name` in `parent`, made as `os.makedirs` would (its
    mode respects the umask, unlike `tempfile.mkdtemp`'s 0700)."""
    while True:
        tmp = os.path.join(parent, f'.{name}.{secrets.token_hex(4)}.tmp')
        try:
            os.mkdir(tmp)
            return tmp
        except FileExistsError:
            continue


def as_method(method: str | Method) -> Method:
    """The registered `Method` of a name.

    Args:
        method: a registered name, or a `Method` (which stays as it is).

    Returns:
        The `Method`.

    Raises:
        GeneError: no method has that name.
    """
    return genes.get(method) if isinstance(method, str) else method


def _counts(method: Method, gene: Any) -> dict[str, int]:
    method.check_gene(gene)      # the method's parts first: another method's gene is refused
    return {'stored': n_params(gene), 's_params': int(method.gene_param_count(gene, include_head=False)),
            's_params_with_head': int(method.gene_param_count(gene, include_head=True))}


def n_params(tree: Any) -> int:
    """Parameters in a tree.

    Args:
        tree: a pytree of arrays or anything with a shape (`jax.ShapeDtypeStruct`s).

    Returns:
        The total number of elements of its leaves.
    """
    return int(sum(math.prod(np.shape(x)) for x in jax.tree.leaves(tree)))


# ----------------------------------------------------------------------------------------
# Writing.

def is_gene_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a gene directory.

    Args:
        path: the path to look at.

    Returns:
        True where `path` holds a `gene.json` file (its contents are not checked).
    """
    return os.path.isfile(os.path.join(os.fspath(path), META_FILE))


def check_gene_output(path: str | os.PathLike, *, overwrite: bool, inputs: Sequence[str] = (),
                      how: str = 'overwrite=True') -> None:
    """GeneFileError unless a gene may be written at `path` (`train.files.check_replaceable`).

    Args:
        path: where the gene directory would go.
        overwrite: whether an existing gene directory may be replaced.
        inputs: the paths the writer reads; `path` may not be, or contain, any of them.
        how: the switch that sets `overwrite`, in words, for the message.

    Raises:
        GeneFileError: `path` is, or contains, one of `inputs`; it holds something other than
          a gene directory (an empty folder is fine); or it is one and `overwrite` is False.
    """
    from jlearngene.train import files
    files.check_replaceable(path, 'a gene directory', is_gene_dir, overwrite=overwrite, how=how,
                            inputs=inputs, error=GeneFileError)


def save_gene(path: str | os.PathLike, method: str | Method, gene: Any, *,
              configs: Mapping[str, ViTConfig] | None = None,
              gene_options: Mapping[str, Any] | None = None,
              descend_options: Mapping[str, Any] | None = None,
              provenance: Mapping[str, Any] | None = None, overwrite: bool = False,
              inputs: Sequence[str] = ()) -> str:
    """Write `gene` of `method` as the gene directory `path`.

    The gene is checked to be one of `method` first (its `check_gene` and
    `gene_param_count`), of finite floats (`interop.state_dict.check_values`). The new files
    are written beside `path` and swapped in when complete, so a failed write keeps the old.

    Args:
        path: the gene directory to write.
        method: a registered name or a `Method`.
        gene: the gene's pytree of arrays (`None` for a method without a gene); dict keys must
          be non-empty strings without '/'.
        configs: ViT configs by role ('source': what the gene was made for; 'target': the one
          shape it makes, where it makes one).
        gene_options: how it was made (the options of `init_gene` / `gene_from_model`;
          clusters, ranks, ...), kept for the record.
        descend_options: defaults that `descend` needs to reproduce the method's intent (e.g.
          Scala's `smallest`).
        provenance: anything JSON-able about where it came from.
        overwrite: replace an existing gene directory at `path`; anything else there is
          never replaced (`check_gene_output`).
        inputs: what the caller read; `path` may not be, or contain, any of them.

    Returns:
        The gene directory's absolute path.

    Raises:
        GeneFileError: the gene is not one of `method`, is not `None` for a method without a
          gene, or holds a value that is not a finite float; a config is not a `ViTConfig`;
          `path` may not be written (`check_gene_output`); a dict key is not a non-empty
          string without '/'; an array's dtype is not one a gene file stores; or the options
          or provenance are not JSON-able.
        GeneError: `method` is a name that is not registered.
        OSError: a file could not be written (as `files.named_error` gives it, naming `path`).
    """
    from jlearngene.interop.state_dict import StateDictError, check_values, save_safetensors
    from jlearngene.train import files
    m = as_method(method)
    path = os.path.abspath(os.fspath(path))
    try:
        counts = _counts(m, gene)
    except GeneError as e:
        raise GeneFileError(f'{path}: not a {m.label} gene ({e})') from None
    if m.source == 'none' and gene is not None:
        raise GeneFileError(f'{path}: {m.label} has no gene, so it must be None')
    try:
        check_values(gene, path)
    except StateDictError as e:
        raise GeneFileError(str(e)) from None
    cfgs = dict(configs or {})
    for role, cfg in cfgs.items():
        if not isinstance(cfg, ViTConfig):
            raise GeneFileError(f"{path}: configs[{role!r}] is a {type(cfg).__name__}, not a ViTConfig")
    check_gene_output(path, overwrite=overwrite, inputs=inputs)
    leaves: dict[str, Any] = {}
    skeleton = _skeleton(gene, leaves)
    arrays = {k: np.ascontiguousarray(np.asarray(jax.device_get(v))) for k, v in leaves.items()}
    for k, a in arrays.items():
        if a.dtype.name not in _DTYPES:
            raise GeneFileError(f'{path}: array {k!r} has dtype {a.dtype.name}; a gene file stores '
                                f'{", ".join(_DTYPES)}')
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')
    meta = {
        'format': FORMAT, 'format_version': FORMAT_VERSION,
        'jlearngene_version': jlearngene.__version__,
        'method': m.name, 'label': m.label, 'source': m.source,
        'configs': {role: cfg.to_dict() for role, cfg in cfgs.items()},
        'gene_options': jsonable(dict(gene_options or {}), 'gene_options'),
        'descend_options': jsonable(dict(descend_options or {}), 'descend_options'),
        'tree': skeleton,
        'arrays': {k: {'shape': list(a.shape), 'dtype': a.dtype.name, 'sha256': checksum(a)}
                   for k, a in arrays.items()},
        'params': counts,
        'provenance': {'created': created, 'by': f'jlearngene {jlearngene.__version__}',
                       **jsonable(dict(provenance or {}), 'provenance')},
    }
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = _make_tmp_dir(parent, os.path.basename(path))
    try:
        save_safetensors(arrays, os.path.join(tmp, ARRAYS_FILE),
                         metadata={'format': FORMAT, 'method': m.name})
        with open(os.path.join(tmp, META_FILE), 'w') as f:
            json.dump(meta, f, indent=1)
            f.write('\n')
        files.replace_dir(tmp, path)   # the old gene stays whole until the new one is
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise files.named_error(e, path) from None
        raise
    return path


# ----------------------------------------------------------------------------------------
# Reading.

def read_meta(path: str | os.PathLike) -> dict:
    """The checked `gene.json` of a gene directory (no arrays are read).

    Args:
        path: the gene directory, or a shipped gene's name (`jlearngene.zoo`, e.g.
          'letra_digits') where no such file or folder exists.

    Returns:
        The JSON as a dict, with 'gene_options', 'descend_options' and 'provenance' defaulted
        to `{}` and 'path' set to the directory's absolute path.

    Raises:
        GeneFileError: `path` is missing or not a directory; `gene.json` is missing, not valid
          JSON, not an object, lacks a required field, or has another `format`, a
          `format_version` that is not a positive integer or is newer than this reader's, an
          unregistered method, configs that are not ViT configs, a tree whose keys differ from
          its arrays', malformed array entries or checksums, or arrays that do not fit the
          method's gene.
    """
    from jlearngene import zoo   # zoo reads genes with this module: imported when needed
    try:
        path = os.path.abspath(zoo.find(os.fspath(path)))
    except ValueError as e:      # a bare name that is no folder and no shipped gene
        raise GeneFileError(str(e)) from None
    if not os.path.exists(path):
        raise GeneFileError(f'{path}: no such gene directory')
    if not os.path.isdir(path):
        raise GeneFileError(f'{path}: is a file, not a gene directory')
    file = os.path.join(path, META_FILE)
    if not os.path.isfile(file):
        raise GeneFileError(f'{file}: missing; {path} is not a gene directory (it holds '
                            f'{sorted(os.listdir(path))[:5]})')
    try:
        with open(file) as f:
            meta = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise GeneFileError(f'{file}: not valid JSON ({e})') from None
    if not isinstance(meta, dict):
        raise GeneFileError(f'{file}: holds a JSON {type(meta).__name__}, not an object')
    missing = [k for k in _FIELDS if k not in meta]
    if missing:
        raise GeneFileError(f'{file}: missing field(s) {missing}')
    if meta['format'] != FORMAT:
        raise GeneFileError(f"{file}: format {meta['format']!r} is not {FORMAT!r}")
    version = meta['format_version']
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise GeneFileError(f'{file}: format_version {version!r} is not a positive integer')
    if version > FORMAT_VERSION:
        raise GeneFileError(f'{file}: format_version {version} (written by jlearngene '
                            f"{meta.get('jlearngene_version', '?')}) is newer than this jlearngene "
                            f'{jlearngene.__version__} reads (up to {FORMAT_VERSION}); upgrade jlearngene')
    if meta['method'] not in genes.names():
        raise GeneFileError(f"{file}: method {meta['method']!r} is not a registered method "
                            f'(known: {", ".join(genes.names())})')
    if not isinstance(meta['configs'], dict) or not isinstance(meta['arrays'], dict):
        raise GeneFileError(f'{file}: configs and arrays must be JSON objects')
    for role, d in meta['configs'].items():
        try:
            ViTConfig.from_dict(d)
        except (ConfigError, TypeError) as e:
            raise GeneFileError(f'{file}: configs[{role!r}] is not a ViT config ({e})') from None
    keys = set(_keys(meta['tree'], file))
    if keys != set(meta['arrays']):
        odd = sorted(keys ^ set(meta['arrays']))
        raise GeneFileError(f"{file}: its tree and its arrays list different keys (e.g. {odd[0]!r})")
    for k, v in meta['arrays'].items():
        if not isinstance(v, dict):
            raise GeneFileError(f'{file}: arrays[{k!r}] is a JSON {type(v).__name__}, not an object')
    if has_checksums(meta):
        for k, v in meta['arrays'].items():
            if 'sha256' not in v:
                raise GeneFileError(f"{file}: arrays[{k!r}] has no sha256, though other arrays "
                                    'have one; the file was edited')
            if not isinstance(v['sha256'], str) or not _SHA256.fullmatch(v['sha256']):
                raise GeneFileError(f"{file}: arrays[{k!r}].sha256 {v['sha256']!r} is not a "
                                    'sha256 hex digest (64 lowercase hex digits)')
    method = genes.get(meta['method'])
    try:
        _counts(method, gene_shapes(meta))
    except (GeneError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise GeneFileError(f"{file}: method {method.name!r} does not fit the arrays it lists "
                            f'({e})') from None
    for key in ('gene_options', 'descend_options', 'provenance'):
        meta.setdefault(key, {})
    meta['path'] = path
    return meta


def _keys(skeleton: Any, file: str) -> list[str]:
    """The array keys of a tree skeleton (GeneFileError for a leaf that is not a key)."""
    if isinstance(skeleton, dict):
        return [k for v in skeleton.values() for k in _keys(v, file)]
    if isinstance(skeleton, list):
        return [k for v in skeleton for k in _keys(v, file)]
    if skeleton is not None and not isinstance(skeleton, str):
        raise GeneFileError(f'{file}: tree leaf {skeleton!r} is not an array key')
    return [] if skeleton is None else [skeleton]


def gene_shapes(meta: Mapping[str, Any]) -> Any:
    """The gene as `jax.ShapeDtypeStruct` leaves, from `gene.json` alone.

    Args:
        meta: a gene's `gene.json` as a dict (its 'tree' and 'arrays').

    Returns:
        The gene's tree, in its original containers, with a `jax.ShapeDtypeStruct` per leaf.
    """
    leaves = {k: jax.ShapeDtypeStruct(tuple(v['shape']), np.dtype(v['dtype']))
              for k, v in meta['arrays'].items()}
    return _rebuild(meta['tree'], leaves)


def configs(meta: Mapping[str, Any]) -> dict[str, ViTConfig]:
    """The gene's ViT configs by role.

    Args:
        meta: a gene's `gene.json` as a dict.

    Returns:
        A dict of role ('source', 'target') to `ViTConfig`.
    """
    return {role: ViTConfig.from_dict(d) for role, d in meta['configs'].items()}


def _check_method(method: Method, gene: Any, where: str) -> None:
    try:
        _counts(method, gene)
    except GeneError as e:
        raise GeneFileError(f'{where}: the arrays are not a {method.label} gene ({e})') from None
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise GeneFileError(f'{where}: the arrays are not a {method.label} gene '
                            f'({type(e).__name__}: {e})') from None


def check_arrays(meta: Mapping[str, Any]) -> None:
    """GeneFileError unless `gene.safetensors` holds exactly the arrays `gene.json` lists.

    Only the file's header is read.

    Args:
        meta: the gene's checked `gene.json` (`read_meta`; its 'path' names the directory).

    Raises:
        GeneFileError: the file is missing or not a readable safetensors file, lacks an array
          that `gene.json` lists or holds one it does not, or an array's shape differs.
    """
    import safetensors
    file = os.path.join(meta['path'], ARRAYS_FILE)
    if not os.path.isfile(file):
        raise GeneFileError(f'{file}: missing')
    try:
        with safetensors.safe_open(file, 'numpy') as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own kinds for bad files
        raise GeneFileError(f'{file}: not a readable safetensors file ({e}); it is truncated, '
                            'corrupted or of another format') from None
    for k, v in meta['arrays'].items():
        if k not in shapes:
            raise GeneFileError(f"{file}: has no array {k!r}, which {META_FILE} lists")
        if shapes[k] != tuple(v['shape']):
            raise GeneFileError(f"{file}: array {k!r} has shape {shapes[k]} but {META_FILE} says "
                                f"{tuple(v['shape'])}")
    extra = sorted(set(shapes) - set(meta['arrays']))
    if extra:
        raise GeneFileError(f'{file}: holds array(s) {extra[:3]} that {META_FILE} does not list')


def load_gene(path: str | os.PathLike) -> tuple[Method, Any, dict]:
    """Read a gene directory back.

    Args:
        path: the gene directory, or a shipped gene's name (`jlearngene.zoo`, e.g.
          'letra_digits') where no such file or folder exists.

    Returns:
        The triple `(method, gene, meta)`, the registered `Method`, the gene as numpy arrays
        in its original containers (bit for bit as saved), and the checked `gene.json`
        (`read_meta`).

    Raises:
        GeneFileError: as `read_meta` and `check_arrays` raise it; the arrays cannot be read;
          an array's dtype differs from `gene.json`'s; an array's bytes do not match its
          sha256; or the arrays are not a gene of the method.
    """
    import safetensors.numpy
    meta = read_meta(path)
    check_arrays(meta)
    file = os.path.join(meta['path'], ARRAYS_FILE)
    try:
        arrays = safetensors.numpy.load_file(file)
    except Exception as e:  # noqa: BLE001
        raise GeneFileError(f'{file}: not a readable safetensors file ({e})') from None
    for k, v in meta['arrays'].items():
        if arrays[k].dtype.name != v['dtype']:
            raise GeneFileError(f"{file}: array {k!r} is {arrays[k].dtype.name} but {META_FILE} "
                                f"says {v['dtype']}")
        if 'sha256' in v and checksum(arrays[k]) != v['sha256']:
            raise GeneFileError(f"{file}: array {k!r} is damaged: its bytes' sha256 "
                                f"{checksum(arrays[k])[:12]}... is not {v['sha256'][:12]}... that "
                                f'{META_FILE} records; restore the file or write the gene again')
    method = genes.get(meta['method'])
    gene = _rebuild(meta['tree'], arrays)
    _check_method(method, gene, file)
    return method, gene, meta
