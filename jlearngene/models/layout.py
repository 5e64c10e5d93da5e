"""Layouts of the canonical tree: logical axis names per leaf, stacked <-> list blocks.

The logical-axis table is written once here and drives sharding rules, width slicing,
width transformations, head gathering and the timm converter.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.models.config import ViTConfig


class Axes(tuple):
    """Logical axis names of one leaf (a tuple that jax treats as a leaf, not a node)."""

    def __repr__(self):
        return f'Axes{tuple.__repr__(self)}'


# Leaf path (without the 'blocks[/i]/' prefix) -> logical axes. None = broadcast axis.
_BLOCK_AXES = {
    'norm1/scale': ('embed',), 'norm1/bias': ('embed',),
    'norm2/scale': ('embed',), 'norm2/bias': ('embed',),
    'attn/q/kernel': ('embed', 'heads', 'head_dim'), 'attn/q/bias': ('heads', 'head_dim'),
    'attn/k/kernel': ('embed', 'heads', 'head_dim'), 'attn/k/bias': ('heads', 'head_dim'),
    'attn/v/kernel': ('embed', 'heads', 'head_dim'), 'attn/v/bias': ('heads', 'head_dim'),
    'attn/out/kernel': ('heads', 'head_dim', 'embed'), 'attn/out/bias': ('embed',),
    'mlp/fc1/kernel': ('embed', 'mlp'), 'mlp/fc1/bias': ('mlp',),
    'mlp/fc2/kernel': ('mlp', 'embed'), 'mlp/fc2/bias': ('embed',),
    'ls1/scale': ('embed',), 'ls2/scale': ('embed',),
}
_TOP_AXES = {
    'patch_embed/kernel': ('patch_h', 'patch_w', 'channels', 'embed'),
    'patch_embed/bias': ('embed',),
    'cls_token': (None, None, 'embed'),
    'dist_token': (None, None, 'embed'),
    'pos_embed': (None, 'tokens', 'embed'),
    'norm/scale': ('embed',), 'norm/bias': ('embed',),
    'head/kernel': ('embed', 'classes'), 'head/bias': ('classes',),
    'head_dist/kernel': ('embed', 'classes'), 'head_dist/bias': ('classes',),
}
_BLOCK_PATH = re.compile(r'blocks/(?:(\d+)/)?(.*)')


def leaf_axes(path: str, ndim: int | None = None) -> Axes:
    """Logical axes of the leaf at `path` in either layout. Block leaves in the stacked
    layout get a leading 'layers' axis; `ndim` (when given) is checked against the table."""
    m = _BLOCK_PATH.fullmatch(path)
    if m:
        names = _BLOCK_AXES.get(m.group(2))
        if names is not None and m.group(1) is None:
            names = ('layers',) + names
    else:
        names = _TOP_AXES.get(path)
    if names is None:
        raise KeyError(f'no logical axes are known for parameter {path!r}')
    if ndim is not None and len(names) != ndim:
        raise ValueError(f'parameter {path!r} has rank {ndim}, expected axes {names}')
    return Axes(names)


def axes(cfg: ViTConfig | None, params: Any) -> Any:
    """A tree with the structure of `params` whose leaves are `Axes` tuples.

    `params` may be real arrays or `jax.ShapeDtypeStruct`s (e.g. from `jax.eval_shape`).
    `cfg` is accepted for symmetry with `init`; the names depend only on the paths.
    """
    del cfg
    return jax.tree_util.tree_map_with_path(
        lambda p, x: leaf_axes(pytree.path_str(p), len(np.shape(x))), params)


def axis_size(params: Any, path: str, axis: str) -> int:
    """Size of the named logical axis of one leaf, e.g. axis_size(p, 'blocks/attn/q/kernel', 'heads')."""
    leaf = pytree.flatten(params)[path]
    names = leaf_axes(path, np.ndim(leaf))
    return int(np.shape(leaf)[names.index(axis)])


def is_stacked(params: Any) -> bool:
    return isinstance(params['blocks'], dict)


def depth_of(params: Any) -> int:
    blocks = params['blocks']
    return int(jax.tree.leaves(blocks)[0].shape[0]) if isinstance(blocks, dict) else len(blocks)


def unstack_blocks(params: Any) -> Any:
    """Stacked layout -> list layout (a list of per-block trees). Identity on list layout."""
    if not is_stacked(params):
        return params
    blocks = params['blocks']
    out = dict(params)
    out['blocks'] = [jax.tree.map(lambda x, i=i: x[i], blocks) for i in range(depth_of(params))]
    return out


def stack_blocks(params: Any) -> Any:
    """List layout -> stacked layout. Blocks must share structure and shapes; otherwise the
    error names the first differing block and leaf (such models stay in the list layout)."""
    if is_stacked(params):
        return params
    blocks: Sequence[Any] = params['blocks']
    if not blocks:
        raise ValueError('stack_blocks: the model has no blocks')
    for i, b in enumerate(blocks[1:], start=1):
        diff = pytree.structure_diff(blocks[0], b)
        if any(diff.values()):
            raise ValueError(f'stack_blocks: block {i} differs from block 0 '
                             f'({pytree.describe_diff(diff)}); keep this model in the list layout')
    out = dict(params)
    out['blocks'] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
    return out
