"""Meshes and sharding rules: batches over the 'data' axis, parameters replicated or
FSDP-sharded by logical axis (the names from `jlearngene.models.layout`).

One mesh axis, 'data', serves both data parallelism and FSDP (as in big_vision's `fsdp`
rule): with `mode='fsdp'` each parameter is split along its largest dimension whose logical
name is in `FSDP_AXES` and whose size the device count divides; parameters with no such
dimension, and small ones, stay replicated. Optimiser-state leaves that mirror a parameter
(Adam moments) get that parameter's sharding.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jlearngene import pytree

DATA = 'data'
FSDP_AXES = ('embed', 'mlp', 'heads', 'classes', 'head_dim')
MODES = ('replicate', 'fsdp')


def make_mesh(num_devices: int | None = None, *, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh with axis 'data' over `devices` (default: the first `num_devices`, or all)."""
    if devices is None:
        devices = jax.devices()
        if num_devices is not None:
            if not 0 < num_devices <= len(devices):
                raise ValueError(f'make_mesh: asked for {num_devices} devices, {len(devices)} available')
            devices = devices[:num_devices]
    return jax.make_mesh((len(devices),), (DATA,), axis_types=(AxisType.Auto,), devices=list(devices))


def data_size(mesh: Mesh) -> int:
    return int(mesh.shape[DATA])


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, *, stacked: bool = False) -> NamedSharding:
    """Leading (batch) axis split over 'data'; with `stacked`, batches stacked on a new
    leading axis (one per step of a call), their batch axis (the second) split."""
    return NamedSharding(mesh, P(None, DATA) if stacked else P(DATA))


def _logical_axes(params, axes) -> Any:
    if axes is not None:
        return axes
    from jlearngene.models.layout import leaf_axes  # models never import parallel

    def one(path, x):
        try:
            return leaf_axes(pytree.path_str(path), np.ndim(x))
        except (KeyError, ValueError):
            return None  # not a ViT leaf: generic rule (largest divisible dimension)
    return jax.tree_util.tree_map_with_path(one, params)


def fsdp_spec(shape: Sequence[int], names: Sequence[str | None] | None, n: int,
              min_size: int = 2 ** 12) -> P:
    """PartitionSpec putting 'data' on the largest dimension that `n` divides, restricted to
    FSDP_AXES when logical names are known. Small leaves (< min_size elements) stay replicated."""
    if n == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
        return P()
    dims = [i for i, s in enumerate(shape) if s % n == 0 and s >= n
            and (names is None or names[i] in FSDP_AXES)]
    if not dims:
        return P()
    best = max(dims, key=lambda i: (shape[i], -i))
    spec = [None] * len(shape)
    spec[best] = DATA
    return P(*spec)


def param_shardings(params, mesh: Mesh, mode: str = 'replicate', *, axes=None,
                    min_size: int = 2 ** 12) -> Any:
    """A tree of NamedShardings for `params` (arrays or ShapeDtypeStructs).

    `axes` (a tree of logical-axis tuples, e.g. `jlearngene.models.axes(cfg, params)`)
    defaults to the ViT table for known paths and a generic rule for other leaves.
    """
    if mode not in MODES:
        raise ValueError(f'sharding mode must be one of {MODES}, got {mode!r}')
    if mode == 'replicate':
        return jax.tree.map(lambda _: replicated(mesh), params)
    n = data_size(mesh)
    names = _logical_axes(params, axes)
    flat_names = jax.tree.leaves(names, is_leaf=lambda x: x is None or isinstance(x, tuple))
    leaves, treedef = jax.tree.flatten(params)
    if len(flat_names) != len(leaves):
        raise ValueError(f'axes tree has {len(flat_names)} leaves, params have {len(leaves)}')
    specs = [NamedSharding(mesh, fsdp_spec(np.shape(x), nm, n, min_size)) for x, nm in zip(leaves, flat_names)]
    return jax.tree.unflatten(treedef, specs)


def state_shardings(state, params_sharding, mesh: Mesh, params_key: str = 'params') -> Any:
    """Shardings for a train state {params, opt_state, ...}: params as given; any other leaf
    whose path ends with a parameter's path and has its shape (optimiser moments) shares
    that parameter's sharding; everything else is replicated."""
    param_paths = {path: (np.shape(x), s) for (path, x), s in zip(
        pytree.flatten(state[params_key]).items(), jax.tree.leaves(params_sharding))}

    def one(path, x):
        p = pytree.path_str(path)
        if p.startswith(params_key + '/') or p == params_key:
            sub = p[len(params_key) + 1:]
            return param_paths[sub][1]
        parts = p.split('/')
        for i in range(len(parts)):
            hit = param_paths.get('/'.join(parts[i:]))
            if hit is not None and hit[0] == np.shape(x):
                return hit[1]
        return replicated(mesh)
    return jax.tree_util.tree_map_with_path(one, state)


def shard_batch(batch: dict, mesh: Mesh, *, stacked: bool = False) -> dict:
    """Host batch (numpy, this process's share) -> global arrays split over 'data'
    (`stacked`: batches stacked on a leading axis, see `batch_sharding`)."""
    n = data_size(mesh)
    sharding = batch_sharding(mesh, stacked=stacked)
    axis = int(stacked)
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        if v.dtype.kind not in 'biuf':
            continue  # strings, object ids: not device data
        if v.ndim <= axis or (v.shape[axis] * jax.process_count()) % n:
            raise ValueError(f"batch entry {k!r} has batch size {v.shape[axis:axis + 1]}, which does "
                             f"not split over {n} devices of the 'data' axis; use a batch size "
                             f"divisible by {n}")
        out[k] = jax.make_array_from_process_local_data(sharding, v)
    return out
