"""Genes as files: every method's gene as one directory, and the descendants it can make.

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
  per key; files written before jlearngene stored checksums have none), `params` (stored parameters and
  S-Params), `gene_options` (how it was made) and `descend_options` (defaults for
  `descend`, e.g. Scala's smallest width ratio), and `provenance` ('created', 'by', and
  whatever the writer adds: the run, the data, the source checkpoint).

`save_gene` writes one, `load_gene` reads it back bit for bit (`read_meta` reads only the
JSON). A reader accepts every `format_version` up to its own, whatever jlearngene version
wrote the file; a newer format, a missing or corrupt file, arrays that disagree with the
JSON or are not a gene of the named method are a `GeneFileError` naming the file and the
problem in one line; so is an array whose bytes do not match its `sha256` (a damaged file:
the error names the array).

`descendant_config` turns a request (width, depth, heads, MLP size, config overrides) into
the target config the gene's method accepts, or a `NoDescendant` error naming the request's
flags and the widths / depths / heads the gene makes (`capabilities`, what `jlearngene info`
lists); both only trace `descend` on shapes (`jax.eval_shape`), nothing is computed.
"""
from __future__ import annotations

import dataclasses
import datetime
import inspect
import json
import math
import hashlib
import os
import re
import secrets
import shutil
from typing import Any, Mapping, Sequence

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


class NoDescendant(GeneError):
    """No target config fits a request; `reasons` holds each rejected choice's message."""

    def __init__(self, message: str, reasons: Sequence[str]):
        super().__init__(message)
        self.reasons = list(reasons)


# ----------------------------------------------------------------------------------------
# JSON pieces.

def jsonable(obj: Any, where: str) -> Any:
    """A JSON-able copy of options and provenance: configs and dataclasses as dicts, tuples
    as lists, numpy scalars and small arrays as numbers and lists."""
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
    """The sha256 (hex) of an array's bytes as a gene file stores them: C order,
    little-endian."""
    a = np.asarray(a)
    return hashlib.sha256(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder('<')).tobytes()).hexdigest()


def has_checksums(meta: Mapping[str, Any]) -> bool:
    """Whether `gene.json` carries a sha256 of its arrays (files written before
    checksums were stored carry none, and are read unchecked)."""
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


def _method(method: str | Method) -> Method:
    return genes.get(method) if isinstance(method, str) else method


def _counts(method: Method, gene: Any) -> dict[str, int]:
    method.check_gene(gene)      # the method's parts first: another method's gene is refused
    return {'stored': n_params(gene), 's_params': int(method.gene_param_count(gene, include_head=False)),
            's_params_with_head': int(method.gene_param_count(gene, include_head=True))}


# ----------------------------------------------------------------------------------------
# Writing.

def save_gene(path: str | os.PathLike, method: str | Method, gene: Any, *,
              configs: Mapping[str, ViTConfig] | None = None,
              gene_options: Mapping[str, Any] | None = None,
              descend_options: Mapping[str, Any] | None = None,
              provenance: Mapping[str, Any] | None = None, overwrite: bool = False) -> str:
    """Write `gene` of `method` (a name or `Method`) as the gene directory `path`; returns
    its absolute path.

    `configs`: ViT configs by role ('source': what the gene was made for; 'target': the one
    shape it makes, where it makes one). `gene_options`: how it was made (the options of
    `init_gene` / `gene_from_model`; clusters, ranks, ...), kept for the record.
    `descend_options`: defaults that `descend` needs to reproduce the method's intent (e.g.
    Scala's `smallest`). `provenance`: anything JSON-able about where it came from.

    The gene is checked to be one of `method` first (its `gene_param_count`). An existing
    non-empty directory is replaced only with `overwrite=True` and only when it is a gene
    directory; the new files are written beside it and moved in when complete.
    """
    from jlearngene.interop.timm import save_safetensors
    m = _method(method)
    path = os.path.abspath(os.fspath(path))
    try:
        counts = _counts(m, gene)
    except GeneError as e:
        raise GeneFileError(f'{path}: not a {m.label} gene ({e})') from None
    if m.source == 'none' and gene is not None:
        raise GeneFileError(f'{path}: {m.label} has no gene, so it must be None')
    cfgs = dict(configs or {})
    for role, cfg in cfgs.items():
        if not isinstance(cfg, ViTConfig):
            raise GeneFileError(f"{path}: configs[{role!r}] is a {type(cfg).__name__}, not a ViTConfig")
    if os.path.isfile(path):
        raise GeneFileError(f'{path}: is a file; a gene is written as a directory')
    if os.path.isdir(path) and os.listdir(path):
        if not os.path.isfile(os.path.join(path, META_FILE)):
            raise GeneFileError(f'{path}: exists and is not a gene directory (no {META_FILE}); '
                                'choose another path')
        if not overwrite:
            raise GeneFileError(f'{path}: a gene directory already exists; pass overwrite=True '
                                '(--overwrite) to replace it')
    leaves: dict[str, Any] = {}
    skeleton = _skeleton(gene, leaves)
    arrays = {k: np.ascontiguousarray(np.asarray(jax.device_get(v))) for k, v in leaves.items()}
    for k, a in arrays.items():
        if a.dtype.name not in _DTYPES:
            raise GeneFileError(f'{path}: array {k!r} has dtype {a.dtype.name}; a gene file stores '
                                f'{", ".join(_DTYPES)}')
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
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
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


# ----------------------------------------------------------------------------------------
# Reading.

def read_meta(path: str | os.PathLike) -> dict:
    """The checked `gene.json` of gene directory `path` (no arrays are read)."""
    path = os.path.abspath(os.fspath(path))
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
    """The gene as `jax.ShapeDtypeStruct` leaves, from `gene.json` alone."""
    leaves = {k: jax.ShapeDtypeStruct(tuple(v['shape']), np.dtype(v['dtype']))
              for k, v in meta['arrays'].items()}
    return _rebuild(meta['tree'], leaves)


def configs(meta: Mapping[str, Any]) -> dict[str, ViTConfig]:
    """The gene's ViT configs by role."""
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
    """GeneFileError unless `gene.safetensors` opens and holds exactly the arrays `gene.json`
    lists, with their shapes (only the header is read)."""
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
    """(method, gene, meta) of gene directory `path`: the registered `Method`, the gene as
    numpy arrays in its original containers (bit for bit as saved), and the checked
    `gene.json` (see `read_meta`)."""
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


# ----------------------------------------------------------------------------------------
# Descendants: from a request to a target config.

def base_config(meta: Mapping[str, Any]) -> ViTConfig:
    """The config a request is applied to: the gene's 'target' config where it has one, else
    its 'source'. GeneFileError when it has neither."""
    cfgs = configs(meta)
    for role in ('target', 'source'):
        if role in cfgs:
            return cfgs[role]
    raise GeneFileError(f"{meta.get('path', META_FILE)}: {META_FILE} has no 'source' or 'target' "
                        'config, so a descendant needs every shape field (--set)')


def takes_option(method: Method, name: str) -> bool:
    """Whether `method.descend` has a keyword `name` (or takes any keywords)."""
    params = inspect.signature(method.descend).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _fits(method: Method, gene: Any, cfg: ViTConfig, options: Mapping[str, Any]) -> str | None:
    """None when `method.descend` accepts (gene, cfg, options) on shapes, else its message."""
    try:
        jax.eval_shape(lambda g: method.descend(g, cfg, key=jax.random.key(0), **options), gene)
    except (GeneError, ConfigError, ValueError, TypeError) as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def _shape_candidates(base: ViTConfig, width: int | None, heads: int | None,
                      mlp_dim: int | None) -> list[dict[str, int]]:
    """(width, num_heads, head_dim, mlp_dim) choices for a request: the head size kept, or
    the head count kept, as methods differ (Cluster and LeTra keep head_dim, Scala keeps
    the heads)."""
    w = base.width if width is None else width
    if mlp_dim is None:
        mlp = base.mlp_dim * w / base.width
        mlp_dim = int(mlp) if float(mlp).is_integer() else base.mlp_dim
    if width is None and heads is None:
        pairs = [(base.num_heads, base.head_dim)]
    elif heads is None:
        pairs = [(w // base.head_dim, base.head_dim)] if w % base.head_dim == 0 else []
        if w % base.num_heads == 0:
            pairs.append((base.num_heads, w // base.num_heads))
    else:
        pairs = [(heads, base.head_dim)] + ([(heads, w // heads)] if w % heads == 0 else [])
    out = []
    for h, dh in pairs:
        c = {'width': w, 'num_heads': h, 'head_dim': dh, 'mlp_dim': mlp_dim}
        if h >= 1 and dh >= 1 and c not in out:
            out.append(c)
    return out


# The command-line flag of each request field (`jlearngene descend`), for error messages.
FLAGS = {'width': '--width', 'depth': '--depth', 'heads': '--heads', 'mlp_dim': '--mlp-dim',
         'overrides': '--set', 'options': '--option'}
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(ViTConfig))


def _positive_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 1


def _check_request(width, depth, heads, mlp_dim, overrides) -> None:
    """GeneError naming the flag of the first request value that no config can have."""
    for field, v in (('width', width), ('depth', depth), ('mlp_dim', mlp_dim)):
        if v is not None and not _positive_int(v):
            raise GeneError(f'{FLAGS[field]} {v!r}: must be a positive integer')
    if heads is not None:
        per_layer = [heads] if isinstance(heads, (int, np.integer)) else heads
        if isinstance(per_layer, (str, bytes)) or not isinstance(per_layer, (Sequence, np.ndarray)) \
                or not len(per_layer) or not all(_positive_int(h) for h in per_layer):
            raise GeneError(f"{FLAGS['heads']} {heads!r}: must be a positive integer or a "
                            'non-empty list of them (one per layer)')
    unknown = [k for k in overrides if k not in _CONFIG_FIELDS]
    if unknown:
        raise GeneError(f"{FLAGS['overrides']} {unknown[0]}=...: ViTConfig has no field "
                        f'{unknown[0]!r}; its fields: {", ".join(_CONFIG_FIELDS)}')


def _request_text(width, depth, heads, mlp_dim, overrides) -> str:
    """The request as the command line spells it ('--width 50 --set num_classes=3')."""
    parts = [f'{FLAGS[field]} {v if isinstance(v, (int, np.integer)) else ",".join(map(str, v))}'
             for field, v in (('width', width), ('depth', depth), ('heads', heads), ('mlp_dim', mlp_dim))
             if v is not None]
    parts += [f"{FLAGS['overrides']} {k}={v}" for k, v in overrides.items()]
    return ' '.join(parts) or "the gene's own config"


def descendant_config(method: str | Method, gene: Any, base: ViTConfig, *,
                      width: int | None = None, depth: int | None = None,
                      heads: int | Sequence[int] | None = None, mlp_dim: int | None = None,
                      overrides: Mapping[str, Any] | None = None,
                      options: Mapping[str, Any] | None = None) -> tuple[ViTConfig, dict]:
    """(target_cfg, descend options) for a descendant of `width`, `depth`, `heads` and
    `mlp_dim` (None: as `base`) with any other config `overrides`.

    `heads` is a head count, or one per layer for methods whose `descend` takes `heads=`
    (Cluster-Learngene: the config gets the most of them). The MLP size scales with the
    width unless given. Where the request leaves the head size open, the choice that
    `descend` accepts is taken (trying the head size kept, then the head count kept).

    Every value is checked first: sizes must be positive integers, `overrides` fields of
    `ViTConfig`, `options` keywords of the method's `descend` (GeneError naming the flag,
    `FLAGS`). A request that no config fits is a `NoDescendant` naming the request's flags,
    every rejected choice and what the gene makes instead (`capabilities`); the gene's own
    config is never taken in its place.
    """
    m = _method(method)
    overrides = dict(overrides or {})
    _check_request(width, depth, heads, mlp_dim, overrides)
    m.check_options(dict(options or {}), 'descend', FLAGS['options'])
    try:
        return _descendant_config(m, gene, base, width=width, depth=depth, heads=heads,
                                  mlp_dim=mlp_dim, overrides=overrides, options=options)
    except NoDescendant as e:
        asked = [k for k, v in (('width', width), ('depth', depth), ('heads', heads)) if v is not None]
        asked += [k for k, f in (('width', 'width'), ('depth', 'depth'), ('heads', 'num_heads'))
                  if f in overrides and k not in asked]
        kinds = tuple(asked) or ('width', 'depth')
        cap = capabilities(m, gene, base, options, kinds=kinds)
        made = made_summary(cap, base, kinds, prefix=f"{'with these options ' if options else ''}"
                                                     'the gene makes ')
        raise NoDescendant(f'{e}; {made}', e.reasons) from None


def _descendant_config(m: Method, gene: Any, base: ViTConfig, *, width, depth, heads, mlp_dim,
                       overrides, options) -> tuple[ViTConfig, dict]:
    """`descendant_config`'s search on checked values (NoDescendant lists each rejected
    choice)."""
    options = dict(options or {})
    changes = dict(overrides or {})
    if depth is not None:
        changes['depth'] = depth
    n_heads = heads
    if heads is not None and not isinstance(heads, (int, np.integer)):
        per_layer = tuple(int(h) for h in heads)
        if not takes_option(m, 'heads'):
            raise GeneError(f'{m.label} takes one head count, not one per layer ({list(per_layer)})')
        options['heads'] = per_layer
        n_heads = max(per_layer)
        changes.setdefault('depth', len(per_layer))
    shape_fields = ('width', 'num_heads', 'head_dim', 'mlp_dim')
    fixed = {k: changes.pop(k) for k in shape_fields if k in changes}
    w, h = fixed.get('width', width), fixed.get('num_heads', n_heads)
    candidates = _shape_candidates(base, w, h, fixed.get('mlp_dim', mlp_dim))
    candidates = [{**c, **fixed} for c in candidates] or ([fixed] if fixed else [])
    rejected = [] if candidates else [
        f'width {w} is divisible neither by the head size {base.head_dim} nor by the head count '
        f'{base.num_heads}' if h is None else f'width {w} does not split into {h} heads']
    for c in candidates:
        try:
            cfg = base.replace(**c, **changes)
        except (ConfigError, TypeError) as e:
            rejected.append(f'{_shape(c)}: {e}')
            continue
        why = _fits(m, gene, cfg, options)
        if why is None:
            return cfg, options
        rejected.append(f'{_shape(c)}: {why}')
    request = _request_text(width, depth, heads, mlp_dim, overrides or {})
    raise NoDescendant(f'{m.label} cannot make a descendant with {request}: ' + '; '.join(rejected),
                       rejected)


def _shape(c: Mapping[str, int]) -> str:
    return '/'.join(f'{k}={v}' for k, v in c.items())


def capabilities(method: str | Method, gene: Any, base: ViTConfig,
                 options: Mapping[str, Any] | None = None,
                 kinds: Sequence[str] = ('width', 'depth', 'heads')) -> dict[str, Any]:
    """Which descendants the gene makes, by trying `descend` on shapes, one field at a time
    from `base`: widths in steps of the base head size up to twice the base width; depths
    1, half, the base, twice and four times the base; head counts 1, half, the base and
    twice the base (`kinds`: which of 'width', 'depth', 'heads' are tried). Returns
    {'widths', 'depths', 'heads'}: the accepted values, {'tried_widths', ...}: what was
    tried, and {'width_limit', ...}: the first rejected value with the reason `descend`
    gave."""
    m = _method(method)
    step = base.head_dim
    n = max(1, 2 * base.width // step)
    tried_w = sorted({step * k for k in range(1, n + 1)} | {base.width})
    if len(tried_w) > 12:      # evenly thinned, the base width kept
        keep = np.unique(np.linspace(0, len(tried_w) - 1, 12).round().astype(int))
        tried_w = sorted({tried_w[i] for i in keep} | {base.width})
    tried = {'width': tried_w,
             'depth': sorted({1, max(1, base.depth // 2), base.depth, 2 * base.depth, 4 * base.depth}),
             'heads': sorted({1, max(1, base.num_heads // 2), base.num_heads, 2 * base.num_heads})}
    out: dict[str, Any] = {}
    for kind, values in tried.items():
        if kind not in kinds:
            continue
        plural = kind if kind == 'heads' else f'{kind}s'
        out[plural], out[f'tried_{plural}'], out[f'{kind}_limit'] = [], values, None
        for v in values:
            try:
                request = {'width': None, 'depth': None, 'heads': None, 'mlp_dim': None, kind: v}
                _descendant_config(m, gene, base, options=options, overrides=None, **request)
            except NoDescendant as e:
                if out[f'{kind}_limit'] is None:
                    out[f'{kind}_limit'] = f'{kind} {v}: {e.reasons[0]}'
                continue
            out[plural].append(v)
    return out


def describe(meta: Mapping[str, Any], *, probe: bool = True) -> str:
    """A few lines about a gene directory: method, format, configs, stored parameters,
    options, provenance and (`probe`) the descendants it makes."""
    m = genes.get(meta['method'])
    p = meta.get('params', {})
    lines = [f"gene {meta['path']}: {m.label} ('{m.name}', source '{m.source}'), format "
             f"{meta['format']} v{meta['format_version']}, written by jlearngene "
             f"{meta.get('jlearngene_version', '?')}"]
    for role, cfg in configs(meta).items():
        lines.append(f'{role} config: width={cfg.width} depth={cfg.depth} heads={cfg.num_heads} '
                     f'head_dim={cfg.head_dim} mlp={cfg.mlp_dim} patch={cfg.patch_size} '
                     f'image={cfg.image_size} classes={cfg.num_classes} pool={cfg.pool}')
    if p:
        lines.append(f"stored parameters: {p['stored']:,} in {len(meta['arrays'])} arrays; "
                     f"S-Params {p['s_params']:,} ({p['s_params_with_head']:,} with the head)")
    lines.append('checksums: a sha256 of every array, verified at load' if has_checksums(meta) else
                 'checksums: none (an older gene file; its arrays are read unverified)')
    lines += [f'{key.replace("_", " ")}: {json.dumps(meta[key])[:300]}'
              for key in ('gene_options', 'descend_options', 'provenance') if meta.get(key)]
    if probe:
        try:
            base = base_config(meta)
        except GeneFileError as e:
            lines.append(f'descendants: unknown ({e})')
            return '\n'.join(lines)
        cap = capabilities(m, gene_shapes(meta), base, meta.get('descend_options'))
        role = 'target' if 'target' in meta['configs'] else 'source'
        lines.append(f'descendants (descend tried on shapes, other fields as the {role} config): '
                     + made_summary(cap, base, prefix=''))
        lines += [f"  first rejected {cap[f'{kind}_limit'][:400]}"
                  for kind in ('width', 'depth', 'heads') if cap[f'{kind}_limit']]
    return '\n'.join(lines)


def made_summary(cap: Mapping[str, Any], base: ViTConfig,
                 kinds: Sequence[str] = ('width', 'depth', 'heads'),
                 prefix: str = 'the gene makes ') -> str:
    """`capabilities` in words, for `kinds`: 'widths 8, 12, 16 of 4, 8, ... tried at depth
    4; depths ...' (what `jlearngene info GENE` prints)."""
    where = {'width': f' at depth {base.depth}', 'depth': f' at width {base.width}', 'heads': ''}
    parts = []
    for kind in kinds:
        plural = kind if kind == 'heads' else f'{kind}s'
        parts.append(f'{plural} {_ranges(cap[plural])} of {_ranges(cap[f"tried_{plural}"])} '
                     f'tried{where[kind]}')
    return prefix + '; '.join(parts)


def _ranges(values: Sequence[int]) -> str:
    return ', '.join(str(v) for v in values) if values else 'none'


# ----------------------------------------------------------------------------------------
# Descendants as model artefacts.

def write_descendant(out: str | os.PathLike, params: Any, cfg: ViTConfig, *, meta: Mapping[str, Any],
                     options: Mapping[str, Any], seed: int, overwrite: bool = False,
                     to_timm: str | None = None) -> dict[str, Any]:
    """Save a descendant as the model artefact `out` (`jlearngene.train.checkpoint.save_model`,
    what `jlearngene train --config.init=OUT` and every other command load), and with
    `to_timm` also as a timm `.safetensors` state dict (header: the jlearngene config, timm
    class and constructor arguments, as `jlearngene convert --to-timm` writes). The timm
    conversion runs before anything is written. Returns {'out', 'timm', 'timm_kwargs'}."""
    from jlearngene.interop import timm as T
    from jlearngene.train import checkpoint
    result: dict[str, Any] = {'out': os.path.abspath(os.fspath(out)), 'timm': None, 'timm_kwargs': None}
    sd = None
    if to_timm is not None:
        T.check_output(to_timm, '--to-timm', 'the timm state dict', '.safetensors', overwrite)
        sd = T.to_timm(params, cfg)
        result['timm_kwargs'] = T.timm_kwargs(cfg)
    extra = {'source': {'format': FORMAT, 'gene': meta.get('path'), 'method': meta.get('method'),
                        'options': jsonable(dict(options), 'options'), 'seed': int(seed)}}
    checkpoint.save_model(result['out'], params, cfg, extra=extra, overwrite=overwrite)
    if sd is not None:
        result['timm'] = os.path.abspath(T.save_model_safetensors(sd, to_timm, cfg, result['timm_kwargs']))
    return result


def n_params(tree: Any) -> int:
    """Parameters in a tree."""
    return int(sum(math.prod(np.shape(x)) for x in jax.tree.leaves(tree)))


# ----------------------------------------------------------------------------------------
# Genes from runs and models.

def save_run_gene(checkpoint_dir: str | os.PathLike, out: str | os.PathLike, *,
                  overwrite: bool = False) -> str:
    """A gene that an experiment run saved as a model checkpoint (`workdir/genes/NAME/seed_S`:
    the gene tree, its Aux-Net config, `extra['method']` and `extra['options']`) written as
    the gene directory `out`; the checkpoint's extra goes into the provenance."""
    from jlearngene.train import checkpoint
    src = os.path.abspath(os.fspath(checkpoint_dir))
    gene, cfg, extra = checkpoint.load_model(src)
    name = extra.get('method')
    if name is None:
        raise GeneFileError(f"{src}: the checkpoint's metadata names no method (extra['method']); "
                            'use jlearngene gene --method NAME --from-model for a model')
    return save_gene(out, name, gene, configs={} if cfg is None else {'source': cfg},
                     gene_options=extra.get('options') or {},
                     provenance={'from': src, 'checkpoint_extra': extra}, overwrite=overwrite)


def save_model_gene(checkpoint_dir: str | os.PathLike, method: str | Method,
                    out: str | os.PathLike, *, options: Mapping[str, Any] | None = None,
                    target: ViTConfig | None = None, overwrite: bool = False) -> str:
    """The gene of a method of source 'model' taken from a model checkpoint (e.g. one that
    `jlearngene convert --from-timm` wrote): `method.gene_from_model(params, cfg,
    **options)`, with `large_cfg=target` for methods that grow into one target (Mango,
    LiGO), written as the gene directory `out`."""
    from jlearngene.train import checkpoint
    m = _method(method)
    if m.gene_from_model is None:
        raise GeneFileError(f'{m.label} (source {m.source!r}) does not take its gene from a model; '
                            'save a learned gene with artefacts.save_gene')
    opts = dict(options or {})
    m.check_options(opts, 'gene_from_model', '--option')
    src = os.path.abspath(os.fspath(checkpoint_dir))
    params, cfg, extra = checkpoint.load_model(src)
    if extra.get('method') is not None:
        raise GeneFileError(f"{src}: holds a run's saved gene of method {extra['method']!r}, not a "
                            f'model to take a {m.label} gene from; write it with jlearngene gene '
                            f'--from-run {src}')
    if cfg is None:
        raise GeneFileError(f'{src}: the model checkpoint stores no config')
    if target is not None:
        if 'large_cfg' not in inspect.signature(m.gene_from_model).parameters:
            raise GeneFileError(f'{m.label} makes descendants of any target; it takes no target config')
        opts['large_cfg'] = target
    gene = m.gene_from_model(params, cfg, **opts)
    configs_ = {'source': cfg, **({'target': target} if target is not None else {})}
    return save_gene(out, m, jax.device_get(gene), configs=configs_,
                     gene_options={k: v for k, v in opts.items() if k != 'large_cfg'},
                     provenance={'from': src}, overwrite=overwrite)
