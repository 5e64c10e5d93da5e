"""Meshes and sharding rules: batches over the 'data' axis, parameters replicated or
FSDP-sharded over it, and optionally split over a 'model' axis, all by logical axis (the
names from `jlearngene.models.layout`).

The 'data' axis serves both data parallelism and FSDP (as in big_vision's `fsdp` rule):
with `mode='fsdp'` each parameter is split along its largest dimension whose logical name
is in `FSDP_AXES` and whose size the axis divides. A mesh made with `make_mesh(model=m)`
has a second axis, 'model' (tensor parallelism, for targets too large for FSDP alone): each
parameter is split over it along its first dimension named in `MODEL_AXES` order ('heads'
for attention kernels, 'mlp' for the MLP, else 'embed') that `m` divides, and FSDP then
takes the largest of the remaining dimensions. XLA inserts the collectives the layout
needs; the step computes the same function on any mesh. Parameters with no such dimension,
and small ones, stay replicated. Optimiser-state leaves that mirror a parameter (Adam
moments) get that parameter's sharding.

Across processes (`jlearngene.distributed`) the mesh holds every process's devices, the
'model' axis within each process, so each process feeds its own rows of every batch.
"""
from __future__ import annotations

import collections
from typing import Any
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jlearngene import pytree
from jlearngene.models.layout import has_pre_logits, leaf_axes

DATA, MODEL = 'data', 'model'
FSDP_AXES = ('embed', 'mlp', 'heads', 'classes', 'head_dim')
MODEL_AXES = ('heads', 'mlp', 'embed')   # in order of preference
MODES = ('replicate', 'fsdp')


def make_mesh(num_devices: int | None = None, *, model: int = 1) -> Mesh:
    """A mesh over the first `num_devices` devices: 1-D 'data', or 2-D ('data', 'model').

    With `model` > 1 the mesh has shape (n // model, model), the 'model' axis over
    neighbouring devices of one process, so that tensor-parallel groups stay within a host.

    Args:
        num_devices: how many of `jax.devices()` to use, from the first; `None` uses all.
        model: size of the 'model' axis; 1 makes a 1-D mesh with the 'data' axis only.

    Returns:
        The `Mesh`, with axis types `Auto`.

    Raises:
        ValueError: `num_devices` is not in 1..`len(jax.devices())`; `model` is not a positive
          integer; or `model` does not divide the device count or each process's device count.
    """
    devices = jax.devices()
    if num_devices is not None:
        if not 0 < num_devices <= len(devices):
            raise ValueError(f'make_mesh: asked for {num_devices} devices, {len(devices)} available')
        devices = devices[:num_devices]
    if not isinstance(model, int) or isinstance(model, bool) or model < 1:
        raise ValueError(f'make_mesh: model must be a positive integer, got {model!r}')
    if model == 1:
        return jax.make_mesh((len(devices),), (DATA,), axis_types=(AxisType.Auto,), devices=devices)
    if len(devices) % model:
        raise ValueError(f"make_mesh: a 'model' axis of {model} does not divide {len(devices)} devices")
    per_process = collections.Counter(d.process_index for d in devices)
    if any(n % model for n in per_process.values()):
        raise ValueError(f"make_mesh: a 'model' axis of {model} must divide each process's device "
                         f'count ({sorted(per_process.values())}), so model groups stay within a host')
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    return Mesh(np.asarray(devices, dtype=object).reshape(len(devices) // model, model),
                (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto))


def data_size(mesh: Mesh) -> int:
    """The size of the mesh's 'data' axis.

    Args:
        mesh: a mesh with a 'data' axis, as `make_mesh` makes it.

    Returns:
        The number of devices along 'data'.
    """
    return int(mesh.shape[DATA])


def model_size(mesh: Mesh) -> int:
    """The size of the mesh's 'model' axis.

    Args:
        mesh: a mesh, as `make_mesh` makes it.

    Returns:
        The number of devices along 'model'; 1 where the mesh has no such axis.
    """
    return int(dict(mesh.shape).get(MODEL, 1))


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding that keeps an array whole on every device of `mesh`.

    Args:
        mesh: the mesh to replicate over.

    Returns:
        A `NamedSharding` with the empty `PartitionSpec`.
    """
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, *, stacked: bool = False) -> NamedSharding:
    """The sharding of a batch: its batch axis split over 'data'.

    Args:
        mesh: a mesh with a 'data' axis.
        stacked: the arrays hold batches stacked on a new leading axis (one per step of a
          call), so the batch axis split is the second; otherwise it is the leading axis.

    Returns:
        A `NamedSharding` of `P('data')`, or `P(None, 'data')` with `stacked`.
    """
    return NamedSharding(mesh, P(None, DATA) if stacked else P(DATA))


def _logical_axes(params, axes) -> Any:
    if axes is not None:
        return axes
    pre_logits = has_pre_logits(params)

    def one(path, x):
        try:
            return leaf_axes(pytree.path_str(path), np.ndim(x), pre_logits=pre_logits)
        except (KeyError, ValueError):
            return None  # not a ViT leaf: generic rule (largest divisible dimension)
    return jax.tree_util.tree_map_with_path(one, params)


def _divisible(shape, names, n: int, allowed, taken=()) -> list[int]:
    return [i for i, s in enumerate(shape) if i not in taken and s % n == 0 and s >= n
            and (names is None or names[i] in allowed)]


def fsdp_spec(shape: Sequence[int], names: Sequence[str | None] | None, n: int,
              min_size: int = 2 ** 12) -> P:
    """PartitionSpec putting 'data' on the largest dimension that `n` divides.

    Args:
        shape: the leaf's shape.
        names: the leaf's logical axis names, one per dimension; when given, only dimensions
          named in `FSDP_AXES` are split. `None` allows any dimension.
        n: size of the 'data' axis.
        min_size: leaves with fewer elements stay replicated.

    Returns:
        The leaf's `PartitionSpec`; `P()` (replicated) when it is small or no dimension fits.
    """
    return leaf_spec(shape, names, data=n, model=1, fsdp=True, min_size=min_size)


def leaf_spec(shape: Sequence[int], names: Sequence[str | None] | None, *, data: int,
              model: int = 1, fsdp: bool = True, min_size: int = 2 ** 12) -> P:
    """PartitionSpec of one leaf on a ('data', 'model') mesh of those sizes.

    'model' goes on the first dimension named in `MODEL_AXES` order that `model` divides
    (without names: the largest divisible dimension), then, with `fsdp`, 'data' on the
    largest remaining dimension in `FSDP_AXES` (any, without names) that `data` divides.

    Args:
        shape: the leaf's shape.
        names: the leaf's logical axis names, one per dimension, or `None` when unknown.
        data: size of the 'data' axis.
        model: size of the 'model' axis; 1 splits nothing over it.
        fsdp: also split over 'data' (FSDP); otherwise the leaf is replicated over 'data'.
        min_size: leaves with fewer elements stay replicated.

    Returns:
        The leaf's `PartitionSpec`; `P()` (replicated) when it is small or no dimension fits.
    """
    if int(np.prod(shape, dtype=np.int64)) < min_size:
        return P()
    spec: list[str | None] = [None] * len(shape)
    if model > 1:
        if names is None:
            dims = _divisible(shape, None, model, ())
            dims = [max(dims, key=lambda i: (shape[i], -i))] if dims else []
        else:
            dims = [i for axis in MODEL_AXES for i in _divisible(shape, names, model, (axis,))]
        if dims:
            spec[dims[0]] = MODEL
    if fsdp and data > 1:
        taken = [i for i, a in enumerate(spec) if a is not None]
        dims = _divisible(shape, names, data, FSDP_AXES, taken)
        if dims:
            spec[max(dims, key=lambda i: (shape[i], -i))] = DATA
    return P(*spec) if any(a is not None for a in spec) else P()


def param_shardings(params, mesh: Mesh, mode: str = 'replicate', *, axes=None,
                    min_size: int = 2 ** 12) -> Any:
    """A tree of NamedShardings for `params` (arrays, tracers or ShapeDtypeStructs).

    A mesh with a 'model' axis splits parameters over it as well (`leaf_spec`).

    Args:
        params: the parameter tree; only its leaves' shapes are read.
        mesh: the mesh, as `make_mesh` makes it.
        mode: what happens over 'data': 'replicate' (data parallelism) or 'fsdp'.
        axes: a tree of logical-axis tuples matching `params` (e.g.
          `jlearngene.models.axes(cfg, params)`); `None` uses the ViT table for known paths
          and the generic rule (largest divisible dimension) for other leaves.
        min_size: leaves with fewer elements stay replicated.

    Returns:
        A tree of `NamedSharding` with the structure of `params`.

    Raises:
        ValueError: `mode` is not one of `MODES`, or `axes` has another number of leaves than
          `params`.
    """
    if mode not in MODES:
        raise ValueError(f'sharding mode must be one of {MODES}, got {mode!r}')
    m = model_size(mesh)
    if mode == 'replicate' and m == 1:
        return jax.tree.map(lambda _: replicated(mesh), params)
    n = data_size(mesh)
    names = _logical_axes(params, axes)
    flat_names = jax.tree.leaves(names, is_leaf=lambda x: x is None or isinstance(x, tuple))
    leaves, treedef = jax.tree.flatten(params)
    if len(flat_names) != len(leaves):
        raise ValueError(f'axes tree has {len(flat_names)} leaves, params have {len(leaves)}')
    specs = [NamedSharding(mesh, leaf_spec(np.shape(x), nm, data=n, model=m, fsdp=mode == 'fsdp',
                                           min_size=min_size)) for x, nm in zip(leaves, flat_names)]
    return jax.tree.unflatten(treedef, specs)


def constrain(params, mesh: Mesh, mode: str = 'replicate', *, axes=None,
              min_size: int = 2 ** 12) -> Any:
    """`params` inside a jitted function, constrained to `param_shardings`' layout.

    For a model built in the step from what is trained (a Mango or LeTra target expanded
    from its gene), so the large model is laid out over 'model' (and 'data') too.

    Args:
        params: the parameter tree (tracers inside `jax.jit`).
        mesh: the mesh.
        mode: 'replicate' or 'fsdp', as in `param_shardings`.
        axes: logical-axis tree, as in `param_shardings`.
        min_size: leaves with fewer elements stay replicated.

    Returns:
        `params` with sharding constraints applied.

    Raises:
        ValueError: from `param_shardings`: an unknown `mode` or an `axes` tree that does
          not match.
    """
    return jax.lax.with_sharding_constraint(
        params, param_shardings(params, mesh, mode, axes=axes, min_size=min_size))


def state_shardings(state, params_sharding, mesh: Mesh, params_key: str = 'params') -> Any:
    """Shardings for a train state {params, opt_state, ...}.

    Params get `params_sharding`; any other leaf whose path ends with a parameter's path and
    has its shape (optimiser moments) shares that parameter's sharding; everything else is
    replicated.

    Args:
        state: the train state, a dict holding the parameter tree under `params_key`.
        params_sharding: the parameters' shardings, e.g. from `param_shardings`, in the
          structure of `state[params_key]`.
        mesh: the mesh, for the replicated leaves.
        params_key: the key of the parameter tree in `state`.

    Returns:
        A tree of `NamedSharding` with the structure of `state`.
    """
    param_paths = {path: (np.shape(x), s) for (path, x), s in zip(
        pytree.flatten(state[params_key]).items(), jax.tree.leaves(params_sharding))}

    def one(path, x):
        p = pytree.path_str(path)
        if p.startswith(params_key + '/') or p == params_key:
            return param_paths[p[len(params_key) + 1:]][1]
        parts = p.split('/')
        for i in range(len(parts)):
            hit = param_paths.get('/'.join(parts[i:]))
            if hit is not None and hit[0] == np.shape(x):
                return hit[1]
        return replicated(mesh)
    return jax.tree_util.tree_map_with_path(one, state)


def shard_batch(batch: dict, mesh: Mesh, *, stacked: bool = False) -> dict:
    """Host batch (numpy, this process's share) -> global arrays split over 'data'.

    Args:
        batch: a dict of this process's rows; entries that are not boolean or numeric
          (strings, object ids) are left out of the result.
        mesh: the mesh, over every process's devices.
        stacked: the entries hold batches stacked on a leading axis, the batch axis being
          the second (see `batch_sharding`).

    Returns:
        A dict of global `jax.Array`, one per numeric entry of `batch`, sharded by
        `batch_sharding`.

    Raises:
        ValueError: an entry lacks the batch axis, or its global batch size (local rows times
          `jax.process_count()`) is not divisible by the size of the 'data' axis.
    """
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
