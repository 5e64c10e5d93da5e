"""Layouts of the canonical tree: logical axis names per leaf, stacked <-> list blocks,
slicing by logical axis and fan-in × fan-out matrix views of kernels.

The logical-axis table is written once here and drives sharding rules, width slicing
(`slice_tree`, Scala's sub-networks), width transformations and growth operators
(`to_matrix` / `from_matrix`, LeTra and Mango), head gathering (`slice_tree` with index
lists, Cluster-Learngene) and the timm converter.
"""
from __future__ import annotations

import re
import dataclasses
import math
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.models import vit
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
    'pre_logits/kernel': ('embed', 'repr'), 'pre_logits/bias': ('repr',),
    'head/kernel': ('embed', 'classes'), 'head/bias': ('classes',),
    'head_dist/kernel': ('embed', 'classes'), 'head_dist/bias': ('classes',),
}
# Heads read the pre-logits layer's outputs ('repr') in a tree that has one.
_HEAD_AXES_AFTER_PRE_LOGITS = {'head/kernel': ('repr', 'classes'),
                               'head_dist/kernel': ('repr', 'classes')}
_BLOCK_PATH = re.compile(r'blocks/(?:(\d+)/)?(.*)')
LOGICAL_AXES = tuple(sorted({a for t in (_BLOCK_AXES, _TOP_AXES) for names in t.values()
                             for a in names if a is not None} | {'layers'}))


def leaf_axes(path: str, ndim: int | None = None, *, pre_logits: bool = False) -> Axes:
    """Logical axes of the leaf at `path` in either layout.

    Block leaves in the stacked layout ('blocks/attn/q/kernel', not 'blocks/3/attn/q/kernel')
    get a leading 'layers' axis. The tree-level functions here (`axes`, `axis_size`,
    `slice_tree`) tell `pre_logits` from the tree.

    Args:
        path: the leaf's '/'-joined path in a canonical tree.
        ndim: the leaf's rank, checked against the table; None skips the check.
        pre_logits: the leaf belongs to a tree with a `pre_logits` layer (`has_pre_logits`),
          whose head kernels read its outputs: their input axis is then 'repr', not 'embed'.

    Returns:
        The leaf's axis names; None for a broadcast axis (the leading axes of `pos_embed` and
        the prefix tokens).

    Raises:
        KeyError: `path` is not a leaf of the canonical tree.
        ValueError: `ndim` differs from the number of axes of `path`.
    """
    m = _BLOCK_PATH.fullmatch(path)
    if m:
        names = _BLOCK_AXES.get(m.group(2))
        if names is not None and m.group(1) is None:
            names = ('layers',) + names
    elif pre_logits and path in _HEAD_AXES_AFTER_PRE_LOGITS:
        names = _HEAD_AXES_AFTER_PRE_LOGITS[path]
    else:
        names = _TOP_AXES.get(path)
    if names is None:
        raise KeyError(f'no logical axes are known for parameter {path!r}')
    if ndim is not None and len(names) != ndim:
        raise ValueError(f'parameter {path!r} has rank {ndim}, expected axes {names}')
    return Axes(names)


def has_pre_logits(params: Any) -> bool:
    """Whether a canonical tree has a pre-logits layer (`ViTConfig.representation_size`).

    Args:
        params: a canonical tree (arrays or shapes), either layout.

    Returns:
        True where `params` is a mapping with a 'pre_logits' entry.
    """
    return isinstance(params, Mapping) and 'pre_logits' in params


def axes(cfg: ViTConfig | None, params: Any) -> Any:
    """The logical axis names of every leaf of `params`.

    The names depend only on the paths (and on whether the tree has a pre-logits layer, see
    `leaf_axes`).

    Args:
        cfg: the model's config, checked against the parameters' shapes (None skips the check).
        params: the parameters: arrays or `jax.ShapeDtypeStruct`s (e.g. from
          `jax.eval_shape`), either layout.

    Returns:
        A tree with the structure of `params` whose leaves are `Axes` tuples.

    Raises:
        ConfigError: `cfg` does not match the parameters' shapes (`vit.check_params`, the
          first differing leaf named).
    """
    if cfg is not None:
        vit.check_params(params, cfg, 'axes')
    pre = has_pre_logits(params)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: leaf_axes(pytree.path_str(p), len(np.shape(x)), pre_logits=pre), params)


def axis_size(params: Any, path: str, axis: str) -> int:
    """Size of the named logical axis of one leaf, e.g. `axis_size(p, 'blocks/attn/q/kernel', 'heads')`.

    Args:
        params: a canonical tree (arrays or shapes), either layout.
        path: the leaf's exact path in `params` ('blocks/3/attn/q/kernel' in the list layout).
        axis: a logical axis name of that leaf (`leaf_axes`).

    Returns:
        The size of that axis, as an int.

    Raises:
        KeyError: `path` is not a leaf of `params`, or not a leaf of the canonical tree.
        ValueError: the leaf has no axis named `axis`, or its rank is not the table's.
    """
    leaf = pytree.flatten(params)[path]
    names = leaf_axes(path, np.ndim(leaf), pre_logits=has_pre_logits(params))
    return int(np.shape(leaf)[names.index(axis)])


def is_stacked(params: Any) -> bool:
    """Whether `params` holds its blocks stacked on a leading layers axis (else the list layout).

    Args:
        params: a canonical tree with a 'blocks' entry.

    Returns:
        True where `params['blocks']` is a dict (stacked layout); False for a list of blocks.
    """
    return isinstance(params['blocks'], dict)


def depth_of(params: Any) -> int:
    """The number of blocks of `params`, in either layout.

    Args:
        params: a canonical tree with a 'blocks' entry (arrays or shapes).

    Returns:
        The leading size of the stacked blocks' leaves, or the length of the list of blocks.
    """
    blocks = params['blocks']
    return int(jax.tree.leaves(blocks)[0].shape[0]) if isinstance(blocks, dict) else len(blocks)


def unstack_blocks(params: Any) -> Any:
    """Stacked layout to list layout (one tree per block); the list layout is returned as it is.

    Args:
        params: canonical parameters.

    Returns:
        The same parameters with `blocks` a list of per-block trees.
    """
    if not is_stacked(params):
        return params
    blocks = params['blocks']
    return {**params,
            'blocks': [jax.tree.map(lambda x, i=i: x[i], blocks) for i in range(depth_of(params))]}


def stack_blocks(params: Any) -> Any:
    """List layout to stacked layout; the stacked layout is returned as it is.

    Args:
        params: canonical parameters.

    Returns:
        The same parameters with the blocks stacked on a leading layers axis.

    Raises:
        ValueError: there are no blocks, or they differ in structure or shapes (the first
          differing block and leaf named; such models stay in the list layout).
    """
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
    return {**params, 'blocks': jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)}


# ----------------------------------------------------------------------------------------
# Slicing by logical axis.

SIDES = ('left', 'right')
# A size request per logical axis: a count n (the first or last n entries, by `side`) or
# explicit indices (any order, repeats allowed: a gather).
Selection = int | Sequence[int] | np.ndarray | jax.Array


def _side_of(side: str | Mapping[str, str], axis: str) -> str:
    s = side.get(axis, 'left') if isinstance(side, Mapping) else side
    if s not in SIDES:
        raise ValueError(f'side={s!r} for axis {axis!r}; expected one of {SIDES}')
    return s


def _check_selection_axes(sizes: Mapping[str, Selection]) -> None:
    unknown = sorted(a for a in sizes if a not in LOGICAL_AXES)
    if unknown:
        raise ValueError(f'slice: unknown logical axis name(s) {unknown}; known: {LOGICAL_AXES}')


def _take(x, dim: int, sel: Selection, side: str, what: str):
    n = x.shape[dim]
    if isinstance(sel, (int, np.integer)) and not isinstance(sel, bool):
        sel = int(sel)
        if not 1 <= sel <= n:
            raise ValueError(f'slice: {what} has size {n}; cannot keep {sel} entries')
        start = 0 if side == 'left' else n - sel
        return jax.lax.slice_in_dim(x, start, start + sel, axis=dim)
    if isinstance(sel, jax.Array) and not isinstance(sel, jax.core.Tracer):
        sel = np.asarray(sel)
    if isinstance(sel, jax.core.Tracer):   # traced indices: a gather, no range check
        return jnp.take(x, sel, axis=dim)
    idx = np.asarray(sel)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f'slice: {what}: expected a count or a non-empty 1-D list of integer '
                         f'indices, got {sel!r}')
    if idx.min() < 0 or idx.max() >= n:
        raise ValueError(f'slice: {what} has size {n}; indices {idx.tolist()} are out of range')
    return jnp.take(x, idx, axis=dim)


def slice_leaf(x, names: Sequence[str | None], sizes: Mapping[str, Selection], *,
               side: str | Mapping[str, str] = 'left', what: str = 'leaf'):
    """`x` with each logical axis named in `sizes` cut to that selection.

    Args:
        x: the leaf, an array.
        names: the leaf's logical axes (`leaf_axes(path)`), one per dimension of `x`.
        sizes: {logical axis: selection}; axes not in `sizes` are kept whole. A count n keeps
          the first or last n entries (by `side`); an index list (or array) gathers those entries
          in order, repeats allowed. Traced index arrays are gathered without range checks.
        side: 'left' (the first entries) or 'right' (the last), for every axis or as {axis: side}
          (an axis not in the mapping is 'left'); used for counts only.
        what: the leaf, in words, for error messages.

    Returns:
        `x` cut along every named axis in `sizes`.

    Raises:
        ValueError: `sizes` names an unknown logical axis; `names` does not have one entry per
          dimension of `x`; a `side` is not 'left' or 'right'; a count is not in 1..size; an
          index list is empty, not 1-D, not integer or out of range.
    """
    _check_selection_axes(sizes)
    if len(names) != np.ndim(x):
        raise ValueError(f'slice: {what} has rank {np.ndim(x)} but axes {tuple(names)}')
    for dim, axis in enumerate(names):
        if axis is not None and axis in sizes:
            x = _take(x, dim, sizes[axis], _side_of(side, axis), f"{what} axis '{axis}'")
    return x


def slice_tree(params: Any, sizes: Mapping[str, Selection], *,
               side: str | Mapping[str, str] = 'left') -> Any:
    """A smaller canonical tree: every leaf cut along the logical axes named in `sizes`.

    E.g. `slice_tree(params, {'embed': 96, 'mlp': 384, 'heads': 3})` is the left sub-network
    of a width-192 model (a real tree that `apply` runs with `slice_config`'s config);
    `{'heads': [0, 2]}` keeps heads 0 and 2 of every layer; `{'layers': [0, 0, 1]}` repeats
    layer 0. A pre-logits layer is cut along 'embed' (its input) and 'repr'; the heads after
    it along 'repr' and 'classes'. Works in both layouts ('layers' only in the stacked one)
    and under `jax.jit` with `sizes` static (index arrays may also be traced, without range
    checks).

    Args:
        params: a canonical tree, either layout.
        sizes: {logical axis: selection}, a count or an index list per axis (`slice_leaf`).
        side: 'left' or 'right', for every axis or as {axis: side} (`slice_leaf`).

    Returns:
        A tree of `params`' structure with every leaf cut.

    Raises:
        ValueError: `sizes` names an unknown logical axis, or 'layers' for a list-layout tree;
          or a selection or side does not fit a leaf (`slice_leaf`).
        KeyError: a leaf of `params` is not a leaf of the canonical tree (`leaf_axes`).
    """
    _check_selection_axes(sizes)
    if 'layers' in sizes and not is_stacked(params):
        raise ValueError("slice_tree: 'layers' needs the stacked layout (blocks on axis 0); "
                         'select list-layout blocks by indexing the list')

    pre = has_pre_logits(params)

    def cut(path, x):
        name = pytree.path_str(path)
        return slice_leaf(x, leaf_axes(name, np.ndim(x), pre_logits=pre), sizes, side=side,
                          what=f"'{name}'")
    return jax.tree_util.tree_map_with_path(cut, params)


_CONFIG_FIELD_OF_AXIS = {'embed': 'width', 'mlp': 'mlp_dim', 'heads': 'num_heads',
                         'head_dim': 'head_dim', 'layers': 'depth', 'classes': 'num_classes',
                         'repr': 'representation_size'}


def slice_config(cfg: ViTConfig, sizes: Mapping[str, Selection]) -> ViTConfig:
    """The config of `slice_tree(params, sizes)`: the sliced axes' new sizes, the rest kept.

    Args:
        cfg: the config of the tree that is sliced.
        sizes: what `slice_tree` gets: {logical axis: a count, or an index list whose length is
          the new size}.

    Returns:
        `cfg` with `width`, `mlp_dim`, `num_heads`, `head_dim`, `depth`, `num_classes` or
        `representation_size` changed for the sliced axes; `head_dim` is kept unless sliced.

    Raises:
        ValueError: `sizes` names an unknown logical axis, or one that the input geometry
          fixes ('patch_h', 'patch_w', 'channels', 'tokens').
        ConfigError: the new sizes make an invalid config (`ViTConfig.replace`).
    """
    _check_selection_axes(sizes)
    fixed = sorted(a for a in sizes if a not in _CONFIG_FIELD_OF_AXIS)
    if fixed:
        raise ValueError(f'slice_config: axes {fixed} are fixed by the input geometry; '
                         f'sliceable: {sorted(_CONFIG_FIELD_OF_AXIS)}')
    changes = {_CONFIG_FIELD_OF_AXIS[axis]: int(sel) if isinstance(sel, (int, np.integer))
               else int(np.size(sel)) for axis, sel in sizes.items()}
    changes.setdefault('head_dim', cfg.head_dim)   # the head size is kept unless sliced itself
    return cfg.replace(**changes)


# ----------------------------------------------------------------------------------------
# Fan-in × fan-out matrix views of kernels.

# Kernel leaf path (no 'blocks/' prefix, no layers axis) -> number of leading input axes.
_KERNEL_FAN_IN = {
    'attn/q/kernel': 1, 'attn/k/kernel': 1, 'attn/v/kernel': 1, 'attn/out/kernel': 2,
    'mlp/fc1/kernel': 1, 'mlp/fc2/kernel': 1,
    'patch_embed/kernel': 3, 'pre_logits/kernel': 1, 'head/kernel': 1, 'head_dist/kernel': 1,
}


@dataclasses.dataclass(frozen=True)
class MatrixView:
    """How a kernel leaf maps to a (…, fan_in, fan_out) matrix: the leading axes kept
    (e.g. 'layers'), then the input axes flattened, then the output axes flattened."""
    path: str
    shape: tuple[int, ...]
    lead: Axes
    fan_in: Axes
    fan_out: Axes

    @property
    def matrix_shape(self) -> tuple[int, ...]:
        """The shape as a matrix view (the leading axes, then fan-in and fan-out each flattened to one axis)."""
        n_lead, n_in = len(self.lead), len(self.fan_in)
        return (self.shape[:n_lead] + (math.prod(self.shape[n_lead:n_lead + n_in]),
                                       math.prod(self.shape[n_lead + n_in:])))


def matrix_view(path: str, shape: Sequence[int], *, pre_logits: bool = False) -> MatrixView:
    """The fan-in × fan-out view of the kernel at `path` with `shape` (either layout).

    Args:
        path: the kernel's '/'-joined path in a canonical tree.
        shape: the kernel's shape (the target shape, for `from_matrix` after a resize).
        pre_logits: as in `leaf_axes`: it names the heads' input axis ('repr', not 'embed').

    Returns:
        The `MatrixView`, holding the leading axes kept ('layers' in the stacked layout), the
        input axes and the output axes.

    Raises:
        KeyError: `path` is not a leaf of the canonical tree (`leaf_axes`).
        ValueError: the leaf at `path` is not a kernel, or `shape`'s rank is not the table's.
    """
    names = leaf_axes(path, len(shape), pre_logits=pre_logits)
    m = _BLOCK_PATH.fullmatch(path)
    key = m.group(2) if m else path
    if key not in _KERNEL_FAN_IN:
        raise ValueError(f'{path!r} is not a kernel; matrix views exist for '
                         f'{sorted(_KERNEL_FAN_IN)} (in blocks/ for block kernels)')
    n_lead = len(names) - len(_BLOCK_AXES.get(key, _TOP_AXES.get(key, ())))
    n_in = _KERNEL_FAN_IN[key]
    return MatrixView(path, tuple(int(d) for d in shape), Axes(names[:n_lead]),
                      Axes(names[n_lead:n_lead + n_in]), Axes(names[n_lead + n_in:]))


def to_matrix(x, path: str):
    """The kernel `x` at `path` as a (…, fan_in, fan_out) matrix; `from_matrix` inverts it.

    E.g. a stacked q kernel (L, D, H, Dh) -> (L, D, H·Dh) and an out kernel (L, H, Dh, D) ->
    (L, H·Dh, D); a reshape (no copy under jit).

    Args:
        x: the kernel, an array.
        path: its '/'-joined path in a canonical tree, either layout.

    Returns:
        `x` reshaped to `matrix_view(path, x.shape).matrix_shape`.

    Raises:
        KeyError: `path` is not a leaf of the canonical tree (`matrix_view`).
        ValueError: `path` is not a kernel, or `x`'s rank is not the table's (`matrix_view`).
    """
    return jnp.reshape(x, matrix_view(path, np.shape(x)).matrix_shape)


def from_matrix(m, view: MatrixView):
    """Back from `to_matrix`: a matrix of `view.matrix_shape` to the kernel's own shape.

    Args:
        m: the matrix, an array of shape `view.matrix_shape`.
        view: the kernel's `MatrixView`. For a matrix whose fan-in / fan-out sizes differ (a
          width transformation or a growth operator changed them), give the view of the target
          shape: `matrix_view(path, shape)`.

    Returns:
        `m` reshaped to `view.shape`.

    Raises:
        ValueError: `m`'s shape is not `view.matrix_shape`.
    """
    if tuple(np.shape(m)) != view.matrix_shape:
        raise ValueError(f"from_matrix: '{view.path}' needs a matrix of shape "
                         f'{view.matrix_shape} for kernel shape {view.shape}, got {tuple(np.shape(m))}')
    return jnp.reshape(m, view.shape)


def kernel_matrices(params: Any) -> dict[str, Any]:
    """{path: (…, fan_in, fan_out) matrix} for every kernel leaf of a canonical tree.

    Args:
        params: a canonical tree of arrays, either layout.

    Returns:
        A dict from path to `to_matrix` of the leaf, for every leaf whose path ends in 'kernel', in tree
        order.
    """
    return {path: to_matrix(x, path) for path, x in pytree.flatten(params).items()
            if path.endswith('kernel')}
