"""Pytree toolkit shared by every method: paths, regex selection, surgery, counts, comparison.

Paths are '/'-joined keys ('blocks/attn/q/kernel'; list layout: 'blocks/3/attn/q/kernel').
A pattern selects a leaf when it matches (`re.fullmatch`) the whole path or a suffix of it
that starts after a '/': 'attn/q/kernel' selects the q kernels in both layouts,
'blocks/attn/.*' only in the stacked layout, '.*bias' every bias.
Built on `jax.tree_util` path functions, `flax.traverse_util` and `optax.tree_utils` arithmetic.
"""
from __future__ import annotations

import re
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

PyTree = Any

# Arithmetic: re-exported from optax so every method uses one implementation.
tree_add = optax.tree_utils.tree_add
tree_scale = optax.tree_utils.tree_scale


def tree_lerp(a: PyTree, b: PyTree, t: float | jax.Array) -> PyTree:
    """(1 - t)·a + t·b, leafwise.

    Args:
        a: the tree at `t = 0`.
        b: a tree of the same structure as `a`, at `t = 1`.
        t: the interpolation weight, a scalar or an array that broadcasts against every leaf.

    Returns:
        A tree of `a`'s structure whose leaves are `a + t * (b - a)`.
    """
    return jax.tree.map(lambda x, y: x + t * (y - x), a, b)


def key_name(k) -> str:
    """The string of one jax path entry (dict key, list index or attribute).

    Args:
        k: one entry of a `jax.tree_util` key path (`DictKey`, `SequenceKey`, `GetAttrKey`, ...).

    Returns:
        Its `key`, `idx` or `name` attribute as a string, the first it has; else `str(k)`.
    """
    return next((str(getattr(k, a)) for a in ('key', 'idx', 'name') if hasattr(k, a)), str(k))


def path_str(path: Iterable) -> str:
    """A key path as text, its keys joined by '/' ('blocks/attn/q/kernel').

    Args:
        path: the entries of a `jax.tree_util` key path.

    Returns:
        The entries' `key_name`s joined by '/'.
    """
    return '/'.join(key_name(k) for k in path)


def flatten(tree: PyTree) -> dict[str, Any]:
    """{path: leaf} in tree order.

    Args:
        tree: any pytree.

    Returns:
        A dict from each leaf's '/'-joined path (`path_str`) to the leaf, in `jax.tree_util` order.
    """
    return {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def unflatten(flat: Mapping[str, Any]) -> dict:
    """Nested dicts from {path: leaf} (`flax.traverse_util.unflatten_dict`).

    Dict nodes only, so a list layout comes back with '0', '1', ... keys: prefer `map_selected`
    for surgery.

    Args:
        flat: a mapping from '/'-joined paths to leaves, as `flatten` makes it.

    Returns:
        The nested dicts, split at every '/'.
    """
    return traverse_util.unflatten_dict(dict(flat), sep='/')


def path_matches(pattern: str | re.Pattern, path: str) -> bool:
    """Whether `pattern` matches the whole of `path` or of one of its '/'-suffixes.

    So 'attn/q/kernel' matches 'blocks/attn/q/kernel'.

    Args:
        pattern: a regex, as a string or compiled; matched with `re.fullmatch`.
        path: a '/'-joined path.

    Returns:
        True where `pattern` matches `path` or a suffix of it that starts after a '/'.
    """
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    if rx.fullmatch(path):
        return True
    return any(rx.fullmatch(path[i + 1:]) for i, ch in enumerate(path) if ch == '/')


def _any_match(patterns, path):
    if isinstance(patterns, (str, re.Pattern)):
        patterns = (patterns,)
    return any(path_matches(p, path) for p in patterns)


def mask(tree: PyTree, patterns: str | Iterable[str]) -> PyTree:
    """A tree of bools, True where a path matches any pattern (for optax masks).

    Args:
        tree: any pytree.
        patterns: one regex or several (`path_matches`).

    Returns:
        A tree of `tree`'s structure with a Python bool for each leaf.
    """
    return jax.tree_util.tree_map_with_path(lambda p, _: _any_match(patterns, path_str(p)), tree)


def select(tree: PyTree, patterns: str | Iterable[str]) -> dict[str, Any]:
    """{path: leaf} of the leaves whose path matches.

    Args:
        tree: any pytree.
        patterns: one regex or several (`path_matches`).

    Returns:
        A dict from path to leaf of the leaves whose path matches any pattern, in tree order.

    Raises:
        KeyError: no leaf matches.
    """
    hits = {k: v for k, v in flatten(tree).items() if _any_match(patterns, k)}
    if not hits:
        raise KeyError(f'no leaf matches {patterns!r}; paths are e.g. {list(flatten(tree))[:6]}')
    return hits


def map_selected(fn: Callable[[str, Any], Any], tree: PyTree,
                 patterns: str | Iterable[str]) -> PyTree:
    """Apply `fn(path, leaf)` to the matching leaves (`select`'s); others pass through.

    Args:
        fn: called with the '/'-joined path and the leaf of each matching leaf; returns the new leaf.
        tree: any pytree.
        patterns: one regex or several (`path_matches`).

    Returns:
        A tree of `tree`'s structure with the matching leaves replaced by `fn`'s results.

    Raises:
        KeyError: no leaf matches (from `select`).
    """
    chosen = select(tree, patterns)

    def visit(p, leaf):
        path = path_str(p)
        return fn(path, leaf) if path in chosen else leaf
    return jax.tree_util.tree_map_with_path(visit, tree)


def replace(tree: PyTree, patterns: str | Iterable[str], value: Any) -> PyTree:
    """Replace matching leaves by `value`.

    Args:
        tree: any pytree.
        patterns: one regex or several (`path_matches`).
        value: the new leaf, or a callable that takes the old leaf and returns the new one.

    Returns:
        A tree of `tree`'s structure with the matching leaves replaced.

    Raises:
        KeyError: no leaf matches (from `select`).
    """
    fn = value if callable(value) else (lambda _: value)
    return map_selected(lambda _, leaf: fn(leaf), tree, patterns)


def merge(base: PyTree, update: Mapping[str, Any]) -> PyTree:
    """Copy of `base` with the leaves at the given exact paths replaced.

    Args:
        base: any pytree.
        update: {path: new leaf}, each path exact ('/'-joined, as `flatten` gives it).

    Returns:
        A tree of `base`'s structure with the leaves at `update`'s paths replaced.

    Raises:
        KeyError: a path of `update` is not a leaf path of `base`.
    """
    missing = set(update) - set(flatten(base))
    if missing:
        raise KeyError(f'merge: paths not in the tree: {sorted(missing)}')
    return jax.tree_util.tree_map_with_path(
        lambda p, leaf: update.get(path_str(p), leaf), base)


def size(x) -> int:
    """The number of elements of an array-like.

    Args:
        x: an array-like (anything `np.shape` accepts, e.g. a `jax.ShapeDtypeStruct`).

    Returns:
        The product of its shape, as a Python int (1 for a scalar).
    """
    return int(np.prod(np.shape(x), dtype=np.int64))


DEFAULT_GROUPS = (
    ('embeddings', r'(patch_embed/.*|pos_embed|cls_token|dist_token)'),
    ('blocks', r'blocks/.*'),
    ('norm', r'norm/.*'),
    ('head', r'(head|head_dist)/.*'),
)


def count_params(tree: PyTree, groups: Iterable[tuple[str, str]] | None = DEFAULT_GROUPS
                 ) -> dict[str, int]:
    """Parameter counts per group, plus 'other' for unmatched leaves and 'total'.

    Args:
        tree: a parameter tree.
        groups: (name, regex) pairs; a leaf counts in the first group whose regex matches its
          whole path (`re.fullmatch`, anchored at the path start). `None` or empty: no groups.

    Returns:
        A dict from every group's name to its element count (0 where none matched), then
        'other' (only where some leaf matched no group) and 'total'.
    """
    counts: dict[str, int] = {name: 0 for name, _ in (groups or ())}
    counts['other'] = 0
    for path, leaf in flatten(tree).items():
        for name, rx in (groups or ()):
            if re.fullmatch(rx, path):
                counts[name] += size(leaf)
                break
        else:
            counts['other'] += size(leaf)
    counts['total'] = sum(counts.values())
    if not counts['other']:
        del counts['other']
    return counts


def structure_diff(a: PyTree, b: PyTree) -> dict[str, list]:
    """Paths only in `a`, only in `b`, and in both with differing shapes.

    Args:
        a: the reference tree.
        b: the tree compared with it.

    Returns:
        A dict with 'missing', the sorted paths only in `a`; 'unexpected', the sorted paths only in
        `b`; 'shape', a list of `(path, shape_a, shape_b)` for the shared paths whose shapes differ.
    """
    fa, fb = flatten(a), flatten(b)
    return {
        'missing': sorted(set(fa) - set(fb)),
        'unexpected': sorted(set(fb) - set(fa)),
        'shape': [(k, tuple(np.shape(fa[k])), tuple(np.shape(fb[k])))
                  for k in fa if k in fb and np.shape(fa[k]) != np.shape(fb[k])],
    }


def describe_diff(diff: Mapping[str, list]) -> str:
    """`structure_diff`'s result in one line: missing and unexpected paths, then shape mismatches.

    Args:
        diff: a result of `structure_diff`.

    Returns:
        The non-empty parts joined by '; '; an empty string where the trees agree.
    """
    parts = [f'{k}: {diff[k]}' for k in ('missing', 'unexpected') if diff[k]]
    if diff['shape']:
        parts.append('shape mismatch: ' + ', '.join(f'{k} {sa} vs {sb}' for k, sa, sb in diff['shape']))
    return '; '.join(parts)


def assert_same_structure(a: PyTree, b: PyTree, what: str = 'trees') -> None:
    """Check that two trees have the same paths and shapes.

    Args:
        a: a tree.
        b: the tree it should match.
        what: the trees, in words, for the message.

    Raises:
        ValueError: they differ; the message names every difference (`describe_diff`).
    """
    diff = structure_diff(a, b)
    if any(diff.values()):
        raise ValueError(f'{what} differ: {describe_diff(diff)}')


def max_abs_diff(a: PyTree, b: PyTree) -> dict[str, float]:
    """{path: max |a - b|} for trees of the same structure.

    Args:
        a: a tree.
        b: a tree with the same paths and shapes as `a`.

    Returns:
        A dict from path to the largest absolute difference of the leaves, in float32, as a
        Python float; 0.0 for empty leaves.

    Raises:
        ValueError: the trees' paths or shapes differ (`assert_same_structure`).
    """
    assert_same_structure(a, b)
    fb = flatten(b)
    return {k: float(jnp.max(jnp.abs(jnp.asarray(v, jnp.float32) - jnp.asarray(fb[k], jnp.float32))))
            if size(v) else 0.0 for k, v in flatten(a).items()}


def trees_equal(a: PyTree, b: PyTree) -> bool:
    """Exact (bitwise-value) equality of structure, shapes, dtypes and values.

    Args:
        a: a tree.
        b: a tree.

    Returns:
        True where both have the same paths and every leaf has the same shape, dtype and values.
    """
    fa, fb = flatten(a), flatten(b)
    if fa.keys() != fb.keys():
        return False
    return all(np.shape(fa[k]) == np.shape(fb[k]) and np.asarray(fa[k]).dtype == np.asarray(fb[k]).dtype
               and np.array_equal(np.asarray(fa[k]), np.asarray(fb[k])) for k in fa)
