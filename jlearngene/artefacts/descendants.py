"""The descendants a gene makes: from a request to a target config.

`descendant_config` turns a request (width, depth, heads, MLP size, config overrides) into
the target config the gene's method accepts, or a `NoDescendant` error naming the request's
flags and the widths / depths / heads the gene makes (`capabilities`, what `jlearngene info`
lists); both only trace `descend` on shapes (`jax.eval_shape`), nothing is computed.
`describe` tells a gene directory's method, configs, parameters and descendants in a few
lines.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from jlearngene import genes
from jlearngene.artefacts.gene_file import (META_FILE, GeneFileError, as_method, configs,
                                            gene_shapes, has_checksums)
from jlearngene.genes.common import GeneError, Method
from jlearngene.models.config import ConfigError, ViTConfig, no_field


class NoDescendant(GeneError):
    """No target config fits a request; `reasons` holds each rejected choice's message."""

    def __init__(self, message: str, reasons: Sequence[str]):
        super().__init__(message)
        self.reasons = list(reasons)


def base_config(meta: Mapping[str, Any]) -> ViTConfig:
    """The config a request is applied to.

    Args:
        meta: a gene's checked `gene.json` (`read_meta`).

    Returns:
        The gene's 'target' config where it has one, else its 'source'.

    Raises:
        GeneFileError: the gene has neither config.
    """
    cfgs = configs(meta)
    for role in ('target', 'source'):
        if role in cfgs:
            return cfgs[role]
    raise GeneFileError(f"{meta.get('path', META_FILE)}: {META_FILE} has no 'source' or 'target' "
                        'config, so a descendant needs every shape field (--set)')


def takes_option(method: Method, name: str) -> bool:
    """Whether `method.descend` takes an option.

    Args:
        method: the method.
        name: the keyword's name.

    Returns:
        True where `method.descend` has a parameter `name` or takes any keywords.
    """
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
        raise GeneError(f"{FLAGS['overrides']} {unknown[0]}=...: {no_field(unknown[0])}; its "
                        f'fields: {", ".join(_CONFIG_FIELDS)}')


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
    """The target config and descend options for a requested descendant.

    Where the request leaves the head size open, the choice that `descend` accepts is taken
    (trying the head size kept, then the head count kept); the gene's own config is never
    taken in place of a request that no config fits. Every value is checked before the search.

    Args:
        method: a registered name or a `Method`.
        gene: the gene, arrays or `jax.ShapeDtypeStruct`s (only shapes are traced).
        base: the config the request is applied to (`base_config`).
        width: the descendant's width; `None`: as `base`.
        depth: its depth; `None`: as `base`.
        heads: a head count, or one per layer for methods whose `descend` takes `heads=`
          (Cluster-Learngene: the config gets the most of them, the depth their count);
          `None`: as `base`.
        mlp_dim: its MLP size; `None`: scaled with the width where that gives an integer, else
          as `base`.
        overrides: any other `ViTConfig` fields to set.
        options: keyword options of the method's `descend`.

    Returns:
        The pair `(target_cfg, options)`, the `ViTConfig` that `descend` accepts and the
        descend options to pass with it (with `heads` added for a per-layer head list).

    Raises:
        GeneError: a size is not a positive integer, an `overrides` key is not a `ViTConfig`
          field, an option is not one `descend` takes (each naming its flag, `FLAGS`), per-layer
          heads are given to a method that takes one head count, or `method` is not registered.
        NoDescendant: no config fits the request; the message names the request's flags, every
          rejected choice and what the gene makes instead (`capabilities`).
    """
    m = as_method(method)
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
    """Which descendants the gene makes, by trying `descend` on shapes, one field at a time.

    From `base`, it tries widths in steps of the base head size up to twice the base width
    (thinned evenly to about 12, the base width kept); depths 1, half, the base, twice and four
    times the base; head counts 1, half, the base and twice the base.

    Args:
        method: a registered name or a `Method`.
        gene: the gene, arrays or `jax.ShapeDtypeStruct`s (only shapes are traced).
        base: the config each field is varied from (`base_config`).
        options: keyword options of the method's `descend`; `None`: none.
        kinds: which of 'width', 'depth', 'heads' are tried.

    Returns:
        A dict with, for each kind tried, 'widths' / 'depths' / 'heads', the accepted values;
        'tried_widths' / 'tried_depths' / 'tried_heads', the values tried; and 'width_limit' /
        'depth_limit' / 'heads_limit', the first rejected value with the reason `descend` gave
        (`None` where every value was accepted).
    """
    m = as_method(method)
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


# ----------------------------------------------------------------------------------------
# In words.

def describe(meta: Mapping[str, Any], *, probe: bool = True) -> str:
    """A few lines about a gene directory.

    Args:
        meta: the gene's checked `gene.json` (`read_meta`).
        probe: also try `descend` on shapes and tell the descendants the gene makes
          (`capabilities`).

    Returns:
        The text, its lines joined by newlines; they tell the method, format, configs, stored
        parameters, checksums, options, provenance and (with `probe`) the descendants.
    """
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
    """`capabilities` in words (what `jlearngene info GENE` prints).

    Args:
        cap: `capabilities`' result, with every kind of `kinds` tried.
        base: the config the values were varied from (its depth and width are named).
        kinds: which of 'width', 'depth', 'heads' to tell, in this order.
        prefix: the text put before the summary.

    Returns:
        `prefix` followed by e.g. 'widths 8, 12, 16 of 4, 8, ... tried at depth 4; depths ...'.
    """
    where = {'width': f' at depth {base.depth}', 'depth': f' at width {base.width}', 'heads': ''}
    parts = []
    for kind in kinds:
        plural = kind if kind == 'heads' else f'{kind}s'
        parts.append(f'{plural} {_ranges(cap[plural])} of {_ranges(cap[f"tried_{plural}"])} '
                     f'tried{where[kind]}')
    return prefix + '; '.join(parts)


def _ranges(values: Sequence[int]) -> str:
    return ', '.join(str(v) for v in values) if values else 'none'
