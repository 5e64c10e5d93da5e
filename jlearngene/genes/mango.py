"""Mango (Pan et al., NeurIPS 2023): a small pretrained ViT's weights mapped into a large ViT
by one multi-linear operator whose four tensor-ring cores have rank R.

**Weight tensor.** Every block kernel, viewed as a fan-in × fan-out matrix
(`layout.to_matrix`), is cut into D × D slices (D = the model's width): q, k, v and out are
one slice each (attention width = D), fc1 (D × M) gives M/D column blocks and fc2 (M × D)
M/D row blocks. Stacked over layers they form M ∈ R^{L×B×D×D} (the paper's B × I × O × L
tensor with the layers axis first; DeiT: B = 12). Attention widths and MLP sizes must be
multiples of the width.

**Operator.** Cores S_B (R, B1, B2, R), S_I (R, D1, D2, R), S_O (R, D1, D2, R), S_L
(R, L1, L2, R); the full mapping S[b1,i1,o1,l1; b2,i2,o2,l2] = Σ_{r1..r4} S_B[r1,b1,b2,r2]
S_I[r2,i1,i2,r3] S_O[r3,o1,o2,r4] S_L[r4,l1,l2,r1] is never formed. `grow` evaluates
M2 = S·M1 in four stages per target layer l2 (a `lax.map`, checkpointed so its backward
pass keeps nothing per layer; `layer_loop=False` runs all layers at once):

    T1[r4,r1,b1,i1,o1] = Σ_l1     S_L[r4,l1,l2,r1] M1[l1,b1,i1,o1]
    T2[r4,r2,b2,i1,o1] = Σ_r1,b1  S_B[r1,b1,b2,r2] T1
    T3[r4,r3,b2,i2,o1] = Σ_r2,i1  S_I[r2,i1,i2,r3] T2
    M2[l2,b2,i2,o2]    = Σ_r3,r4,o1 S_O[r3,o1,o2,r4] T3

`operator_cost` gives the operator's parameter count and these stages' FLOPs.

**Choices where the paper is silent** (each easy to change):

* Vectors (q/k/v/out biases, fc1 bias as M/D blocks, fc2 bias, LayerNorm γ/β, LayerScale)
  form V ∈ R^{L×V×D}, mapped by a three-core ring that shares S_O and S_L and has its own
  slice core S_V (R, V1, V2, R): V2 = Σ S_V[r1,v1,v2,r3] S_O[r3,o1,o2,r4] S_L[r4,l1,l2,r1] V1.
* Embedding-side tensors (patch embedding, its bias, position embedding, prefix tokens,
  final norm) have their width axis mapped by one learned matrix 'embed' (D1, D2); the
  heads' fan-in by another, 'head_in' (D1, D2).
* Initialisation: the r = 0 ring slot reproduces Net2Net-style growth and every other
  entry is N(0, noise²) (without it the other slots get no gradient): S_O[0,o1,o2,0] =
  [o1 = o2 mod D1] (copy), S_I[0,i1,i2,0] = [i1 = i2 mod D1] / count(i1) (copy, divided by
  the replication count: the fan-in side of Net2Net), S_L[0,l1,l2,0] = [l1 = l2 mod L1]
  (StackBERT), S_B[0,b1,b2,0] = slice b2 of a kernel ← slice (row block mod, column block
  mod) of the same kernel, divided by the row block's replication count (S_V alike,
  without division); 'embed' is the copy matrix, 'head_in' the divided one. With equal
  head_dim and D1 dividing D2 the initial large model then computes the small model's
  function up to the noise, stacked in depth.

**Sharding.** `operator_axes(operator)` names every core axis ('embed' for the large
model's width, 'slices', 'vectors', 'layers', 'ring' and 'source_*' for the small side), so
`parallel.param_shardings(operator, mesh, 'fsdp', axes=mango.operator_axes(operator))`
splits S_I, S_O and the embedding matrices along the large width; under `jax.jit` the
contraction follows that sharding.

**Method contract.** Source 'model': the gene is {'small': the small pretrained model,
'operator': the learned operator} (`gene_from_model`), and its S-Params count both;
`descend(gene, large_cfg)` is `grow`. The operator is trained on the large model's task
loss with the small model frozen (`jlearngene.experiments.mango`).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.genes import common, growth
from jlearngene.genes.common import GeneError
from jlearngene.models import layout
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
Operator = dict[str, jax.Array]
CORES = ('S_B', 'S_I', 'S_O', 'S_L')
HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------------------
# The weight and vector tensors.

class Packing(NamedTuple):
    """How one model's blocks map to the tensors M (L, B, D, D) and V (L, V, D).

    kernels: ((block path, row blocks a, column blocks b), ...): a·b slices each.
    vectors: ((block path, blocks n), ...): n width-sized slices each.
    """
    width: int
    depth: int
    kernels: tuple[tuple[str, int, int], ...]
    vectors: tuple[tuple[str, int], ...]

    @property
    def num_slices(self) -> int:
        """B, the D × D kernel slices per layer (every kernel's row blocks × column blocks)."""
        return sum(a * b for _, a, b in self.kernels)

    @property
    def num_vectors(self) -> int:
        """V, the width-long vectors per layer (biases, LayerNorm γ and β, LayerScale gains)."""
        return sum(n for _, n in self.vectors)


def packing(params: Params, what: str = 'mango') -> Packing:
    """The packing of a stacked canonical tree: how its blocks cut into D × D slices and D-vectors.

    Args:
        params: a stacked canonical tree, of arrays or shapes (`jax.ShapeDtypeStruct`); the width
          D is read from `patch_embed/kernel`.
        what: the start of error messages.

    Returns:
        The `Packing`, which records the width, the depth, and every block kernel and vector in tree order.

    Raises:
        GeneError: a kernel's fan-in or fan-out, or a vector's entries per layer, is not a
          multiple of the width.
    """
    width = layout.axis_size(params, 'patch_embed/kernel', 'embed')
    kernels, vectors = [], []
    for path, x in pytree.flatten(params['blocks']).items():
        full = f'blocks/{path}'
        if path.endswith('kernel'):
            _, fin, fout = layout.matrix_view(full, np.shape(x)).matrix_shape
            if fin % width or fout % width:
                raise GeneError(f"{what}: '{full}' is a {fin} x {fout} matrix, not made of "
                                f'{width} x {width} slices; Mango needs attention widths '
                                f'(num_heads x head_dim) and mlp_dim that are multiples of width={width}')
            kernels.append((path, fin // width, fout // width))
        else:
            n = int(np.prod(np.shape(x)[1:]))
            if n % width:
                raise GeneError(f"{what}: '{full}' has {n} entries per layer, not a multiple of "
                                f'width={width}; Mango needs attention widths (num_heads x '
                                f'head_dim) and mlp_dim that are multiples of width={width}')
            vectors.append((path, n // width))
    return Packing(width, layout.depth_of(params), tuple(kernels), tuple(vectors))


def weight_tensor(params: Params) -> jax.Array:
    """M (L, B, D, D): every block kernel's D × D slices (row block, then column block).

    Args:
        params: a stacked canonical tree of arrays.

    Returns:
        M of shape (depth, B, width, width) with B = `packing(params).num_slices`, holding the
        kernels in tree order, each kernel's slices row block by row block (fan-in), then column block
        (fan-out) within a row block.

    Raises:
        GeneError: a kernel or vector is not made of width-sized slices (`packing`).
    """
    p = packing(params)
    d, flat = p.width, pytree.flatten(params['blocks'])
    parts = []
    for path, a, b in p.kernels:
        m = layout.to_matrix(flat[path], f'blocks/{path}')
        parts.append(m.reshape(p.depth, a, d, b, d).transpose(0, 1, 3, 2, 4)
                     .reshape(p.depth, a * b, d, d))
    return jnp.concatenate(parts, axis=1)


def vector_tensor(params: Params) -> jax.Array:
    """V (L, V, D): every block vector (biases, norms, LayerScale) as width-sized slices.

    Args:
        params: a stacked canonical tree of arrays.

    Returns:
        V of shape (depth, V, width) with V = `packing(params).num_vectors`, holding the vectors
        in tree order, each cut into consecutive width-sized pieces.

    Raises:
        GeneError: a kernel or vector is not made of width-sized slices (`packing`).
    """
    p = packing(params)
    flat = pytree.flatten(params['blocks'])
    return jnp.concatenate([jnp.reshape(flat[path], (p.depth, n, p.width))
                            for path, n in p.vectors], axis=1)


def blocks_from_tensors(m: jax.Array, v: jax.Array, shapes: Params) -> Params:
    """The block tree of `shapes` from its tensors M and V; inverts `weight_tensor` and `vector_tensor`.

    Args:
        m: M (depth, B, width, width) in `shapes`' packing.
        v: V (depth, V, width) in `shapes`' packing.
        shapes: the whole stacked tree (arrays or `jax.ShapeDtypeStruct`s) whose blocks to make.

    Returns:
        The `blocks` subtree (stacked layout, nested dicts) with the shapes of `shapes['blocks']`,
        in `m`'s and `v`'s dtype.

    Raises:
        GeneError: a kernel or vector of `shapes` is not made of width-sized slices (`packing`).
    """
    p = packing(shapes)
    d, flat, out = p.width, pytree.flatten(shapes['blocks']), {}
    start = 0
    for path, a, b in p.kernels:
        block = m[:, start:start + a * b].reshape(p.depth, a, b, d, d).transpose(0, 1, 3, 2, 4)
        view = layout.matrix_view(f'blocks/{path}', np.shape(flat[path]))
        out[path] = layout.from_matrix(block.reshape(p.depth, a * d, b * d), view)
        start += a * b
    start = 0
    for path, n in p.vectors:
        out[path] = jnp.reshape(v[:, start:start + n], np.shape(flat[path]))
        start += n
    return pytree.unflatten(out)


# ----------------------------------------------------------------------------------------
# The operator.

def _copy_matrix(n1: int, n2: int, *, divide: bool) -> np.ndarray:
    """(n1, n2): target unit j copies source unit j mod n1 (divided by that unit's
    replication count with `divide`)."""
    src = np.arange(n2) % n1
    p = np.zeros((n1, n2), np.float32)
    p[src, np.arange(n2)] = 1.0
    if divide:
        p /= np.bincount(src, minlength=n1)[:, None]
    return p


def _slice_map(small: Packing, large: Packing) -> np.ndarray:
    """(B1, B2) initial S_B slot: large slice (kernel, row i, column j) ← small slice
    (kernel, i mod a1, j mod b1), divided by the row block's replication count."""
    p = np.zeros((small.num_slices, large.num_slices), np.float32)
    start1 = dict(zip([k for k, _, _ in small.kernels],
                      np.cumsum([0] + [a * b for _, a, b in small.kernels])))
    col = 0
    for (path, a2, b2), (_, a1, b1) in zip(large.kernels, small.kernels):
        reps = np.bincount(np.arange(a2) % a1, minlength=a1)
        for i in range(a2):
            for j in range(b2):
                p[start1[path] + (i % a1) * b1 + (j % b1), col] = 1.0 / reps[i % a1]
                col += 1
    return p


def _vector_map(small: Packing, large: Packing) -> np.ndarray:
    """(V1, V2) initial S_V slot: large vector block j ← small block j mod n1."""
    p = np.zeros((small.num_vectors, large.num_vectors), np.float32)
    r = c = 0
    for (_, n2), (_, n1) in zip(large.vectors, small.vectors):
        for j in range(n2):
            p[r + j % n1, c + j] = 1.0
        r, c = r + n1, c + n2
    return p


def _check_pair(small: Params, large_cfg: ViTConfig, what: str) -> tuple[Params, Packing, Packing]:
    want = growth.check_growth(small, large_cfg, what)
    return want, packing(small, what), packing(want, what)


def init_operator(small_cfg: ViTConfig, large_cfg: ViTConfig, rank: int, key: jax.Array, *,
                  noise: float = 1e-2) -> Operator:
    """A Mango operator from `small_cfg` to `large_cfg` of ring rank `rank`, initialised with a
    Net2Net/StackBERT r = 0 slot plus N(0, noise²) elsewhere (module docstring).

    Args:
        small_cfg: the small model's config.
        large_cfg: the large model's config (width and depth may both grow).
        rank: the ring rank R.
        key: the PRNG key of the noise.
        noise: the standard deviation of every entry outside the r = 0 slot.

    Returns:
        The operator, a dict of the cores S_B (R, B1, B2, R), S_I and S_O (R, D1, D2, R), S_L
        (R, L1, L2, R) and S_V (R, V1, V2, R), and the matrices 'embed' and 'head_in' (D1, D2).

    Raises:
        GeneError: `rank` is not a positive integer, or the pair shrinks or cannot be grown
          (`check_growth`).
    """
    common.check_no_pre_logits(large_cfg, 'mango.init_operator')
    if not (isinstance(rank, (int, np.integer)) and rank >= 1):
        raise GeneError(f'mango: rank={rank!r} must be a positive integer')
    small = common.target_shapes(small_cfg)
    _, p1, p2 = _check_pair(small, large_cfg, 'mango.init_operator')
    r = int(rank)
    slots = {'S_B': _slice_map(p1, p2),
             'S_I': _copy_matrix(p1.width, p2.width, divide=True),
             'S_O': _copy_matrix(p1.width, p2.width, divide=False),
             'S_L': _copy_matrix(p1.depth, p2.depth, divide=False),
             'S_V': _vector_map(p1, p2)}
    keys = dict(zip(slots, jax.random.split(key, len(slots))))
    op = {}
    for name, slot in slots.items():
        core = noise * jax.random.normal(keys[name], (r,) + slot.shape + (r,), jnp.float32)
        op[name] = core.at[0, :, :, 0].set(jnp.asarray(slot))
    op['embed'] = jnp.asarray(slots['S_O'])
    op['head_in'] = jnp.asarray(slots['S_I'])
    return op


def operator_shapes(small: Params, want: Params, rank: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The operator's shapes for a small tree and large shapes (both stacked).

    Args:
        small: the small model's stacked tree (arrays or shapes).
        want: the large model's stacked tree of shapes.
        rank: the ring rank R.

    Returns:
        A dict from name to `jax.ShapeDtypeStruct`, all float32, for the cores S_B (R, B1, B2, R),
        S_I and S_O (R, D1, D2, R), S_L (R, L1, L2, R), S_V (R, V1, V2, R) and the matrices
        'embed' and 'head_in' (D1, D2), as `init_operator` makes them.

    Raises:
        GeneError: a tree's kernels or vectors are not made of width-sized slices (`packing`).
    """
    p1, p2 = packing(small), packing(want)
    r, f = rank, jnp.float32
    sds = jax.ShapeDtypeStruct
    return {'S_B': sds((r, p1.num_slices, p2.num_slices, r), f),
            'S_I': sds((r, p1.width, p2.width, r), f), 'S_O': sds((r, p1.width, p2.width, r), f),
            'S_L': sds((r, p1.depth, p2.depth, r), f),
            'S_V': sds((r, p1.num_vectors, p2.num_vectors, r), f),
            'embed': sds((p1.width, p2.width), f), 'head_in': sds((p1.width, p2.width), f)}


def rank_of(operator: Mapping[str, Any]) -> int:
    """The ring rank R of an operator.

    Args:
        operator: a Mango operator (`init_operator`).

    Returns:
        The leading size of its core S_B, as an int.

    Raises:
        GeneError: `operator` is not a mapping, or has no core 'S_B'.
    """
    if not isinstance(operator, Mapping) or 'S_B' not in operator:
        got = sorted(operator) if isinstance(operator, Mapping) else type(operator).__name__
        raise GeneError(f'not a Mango operator: expected cores {CORES}, got {got}')
    return int(np.shape(operator['S_B'])[0])


def operator_axes(operator: Mapping[str, Any]) -> dict[str, layout.Axes]:
    """Logical axis names of every operator leaf, for `parallel.param_shardings(..., axes=...)`.

    The large model's sizes are 'embed', 'slices', 'vectors' and 'layers', the small model's
    'source_*', the ring rank 'ring'.

    Args:
        operator: a Mango operator (`init_operator`).

    Returns:
        A dict from name to `layout.Axes` for the cores S_B, S_I, S_O, S_L, S_V and the matrices 'embed' and
        'head_in'.

    Raises:
        GeneError: `operator` is not a Mango operator (`rank_of`).
    """
    rank_of(operator)
    ring = 'ring'
    return {'S_B': layout.Axes((ring, 'source_slices', 'slices', ring)),
            'S_I': layout.Axes((ring, 'source_embed', 'embed', ring)),
            'S_O': layout.Axes((ring, 'source_embed', 'embed', ring)),
            'S_L': layout.Axes((ring, 'source_layers', 'layers', ring)),
            'S_V': layout.Axes((ring, 'source_vectors', 'vectors', ring)),
            'embed': layout.Axes(('source_embed', 'embed')),
            'head_in': layout.Axes(('source_embed', 'embed'))}


# ----------------------------------------------------------------------------------------
# The staged ring contraction.

def _one_layer(s_l, op: Operator, m1, v1):
    """M2 (B2, D2, D2) and V2 (V2, D2) of one target layer; s_l = S_L[:, :, l2, :]."""
    es = functools.partial(jnp.einsum, precision=HIGHEST)
    # ring indices r1..r4 = a b c d; slices x -> y; in i -> j; out o -> p; layers l
    t1 = es('dla,lxio->daxio', s_l, m1)
    t2 = es('axyb,daxio->dbyio', op['S_B'], t1)
    t3 = es('bijc,dbyio->dcyjo', op['S_I'], t2)
    m2 = es('copd,dcyjo->yjp', op['S_O'], t3)
    u1 = es('dla,lso->daso', s_l, v1)
    u2 = es('astc,daso->dcto', op['S_V'], u1)
    v2 = es('copd,dcto->tp', op['S_O'], u2)
    return m2, v2


def _all_layers(op: Operator, m1, v1):
    """The same stages with every target layer m at once."""
    es = functools.partial(jnp.einsum, precision=HIGHEST)
    t1 = es('dlma,lxio->mdaxio', op['S_L'], m1)
    t2 = es('axyb,mdaxio->mdbyio', op['S_B'], t1)
    t3 = es('bijc,mdbyio->mdcyjo', op['S_I'], t2)
    m2 = es('copd,mdcyjo->myjp', op['S_O'], t3)
    u1 = es('dlma,lso->mdaso', op['S_L'], v1)
    u2 = es('astc,mdaso->mdcto', op['S_V'], u1)
    v2 = es('copd,mdcto->mtp', op['S_O'], u2)
    return m2, v2


def contract(operator: Operator, m1: jax.Array, v1: jax.Array, *, layer_loop: bool = True,
             remat: bool = True) -> tuple[jax.Array, jax.Array]:
    """The ring contraction of the operator's cores with M1 and V1, staged (module docstring).

    Args:
        operator: a Mango operator (`init_operator`); its cores S_B, S_I, S_O, S_L and S_V are read.
        m1: M1 (L1, B1, D1, D1), the small model's `weight_tensor`.
        v1: V1 (L1, V1, D1), the small model's `vector_tensor`.
        layer_loop: compute one target layer at a time (`lax.map`); False: all layers at once.
        remat: with `layer_loop`, checkpoint each layer so the backward pass recomputes the
          stages instead of keeping them for every layer; unused without `layer_loop`.

    Returns:
        The pair `(M2, V2)` of the large model's tensors, M2 (L2, B2, D2, D2) and V2 (L2, V2, D2).
    """
    if not layer_loop:
        return _all_layers(operator, m1, v1)
    def body(s_l):
        return _one_layer(s_l, operator, m1, v1)

    if remat:
        body = jax.checkpoint(body)
    return jax.lax.map(body, jnp.moveaxis(operator['S_L'], 2, 0))


def _top_level(operator: Operator, small: Params, want: Params) -> Params:
    """Embeddings, final norm and heads: the width axis through 'embed' (fan-out) or
    'head_in' (the heads' fan-in)."""
    out, flat = {}, pytree.flatten(small)
    for path, w in pytree.flatten(common.top_level(want)).items():
        x = flat[path]
        names = layout.leaf_axes(path, np.ndim(x))
        if 'embed' in names:
            dim = names.index('embed')
            e = operator['head_in' if 'embed' in growth.fan_in_axes(path, np.shape(x)) else 'embed']
            x = jnp.moveaxis(jnp.tensordot(x, e, axes=([dim], [0]), precision=HIGHEST), -1, dim)
        out[path] = jnp.reshape(x, w.shape)
    return pytree.unflatten(out)


def grow(operator: Operator, small_params: Params, large_cfg: ViTConfig, *,
         layer_loop: bool = True, remat: bool = True) -> Params:
    """The large model's params from the small model's, by the operator.

    Blocks by the staged ring contraction (`contract`), embeddings and heads by the operator's
    'embed' / 'head_in' matrices. Jittable with `large_cfg` (and the options) static;
    differentiable in the operator.

    Args:
        operator: the Mango operator (`init_operator`, trained or not).
        small_params: the small model's canonical params.
        large_cfg: the large model's config.
        layer_loop: contract one target layer at a time (a `lax.map`; False: all at once).
        remat: checkpoint each layer's contraction, so its backward pass keeps nothing per
          layer.

    Returns:
        Canonical params of `large_cfg` (`vit.init(large_cfg)`'s structure).
    """
    common.check_no_pre_logits(large_cfg, 'mango.grow')
    small = common.stacked(small_params, 'mango.grow')
    want, _, _ = _check_pair(small, large_cfg, 'mango.grow')
    common.check_fits(operator, operator_shapes(small, want, rank_of(operator)), 'mango.grow',
                      large_cfg, source='operator', complete=True,
                      hint=' (the operator was made for another pair of models)')
    m2, v2 = contract(operator, weight_tensor(small), vector_tensor(small),
                      layer_loop=layer_loop, remat=remat)
    grown = _top_level(operator, small, want)
    grown['blocks'] = blocks_from_tensors(m2, v2, want)
    return grown


# ----------------------------------------------------------------------------------------
# Cost.

def operator_cost(small_cfg: ViTConfig, large_cfg: ViTConfig, rank: int) -> dict[str, Any]:
    """The operator's parameter count and the forward FLOPs of one `grow`, per stage and in total.

    FLOPs count one per multiply-accumulate (the `jlearngene.costs` convention), from shapes
    only. Training the operator costs ≈ 3× these FLOPs per step (forward and backward), on top
    of the large model's own step.

    Args:
        small_cfg: the small model's config.
        large_cfg: the large model's config.
        rank: the ring rank R.

    Returns:
        A dict with 'params', the operator's entry count; 'flops', the total; 'stages',
        `{stage: FLOPs}` for the seven contraction stages and 'embeddings and heads'; 'small' and 'large',
        each {'slices', 'vectors', 'width', 'depth'} of that model's packing.

    Raises:
        GeneError: the pair cannot be grown (`check_growth`: a size shrinks, an axis that may
          not change differs, a pre-logits layer) or is not made of width-sized slices (`packing`).
    """
    small = common.target_shapes(small_cfg)
    want, p1, p2 = _check_pair(small, large_cfg, 'mango.operator_cost')
    r, l1, l2, d1, d2 = rank, p1.depth, p2.depth, p1.width, p2.width
    b1, b2, v1, v2 = p1.num_slices, p2.num_slices, p1.num_vectors, p2.num_vectors
    stages = {
        'T1 = S_L.M1': r * r * b1 * d1 * d1 * l1 * l2,
        'T2 = S_B.T1': r ** 3 * b1 * b2 * d1 * d1 * l2,
        'T3 = S_I.T2': r ** 3 * b2 * d1 * d1 * d2 * l2,
        'M2 = S_O.T3': r * r * b2 * d1 * d2 * d2 * l2,
        'U1 = S_L.V1': r * r * v1 * d1 * l1 * l2,
        'U2 = S_V.U1': r ** 3 * v1 * v2 * d1 * l2,
        'V2 = S_O.U2': r * r * v2 * d1 * d2 * l2,
    }
    top = sum(int(np.prod(w.shape)) * d1 for path, w in pytree.flatten(common.top_level(want)).items()
              if 'embed' in layout.leaf_axes(path, len(w.shape)))
    stages['embeddings and heads'] = top
    params = sum(int(np.prod(s.shape)) for s in operator_shapes(small, want, r).values())
    return {'params': params, 'flops': int(sum(stages.values())), 'stages': stages,
            'small': {'slices': b1, 'vectors': v1, 'width': d1, 'depth': l1},
            'large': {'slices': b2, 'vectors': v2, 'width': d2, 'depth': l2}}


# ----------------------------------------------------------------------------------------
# Method contract.

@common.forwards_options(init_operator)
def gene_from_model(params: Params, cfg: ViTConfig, *, large_cfg: ViTConfig | None = None,
                    operator: Operator | None = None, rank: int = 1,
                    key: jax.Array | None = None, **init_options: Any) -> Params:
    """Mango's gene: {'small': the small pretrained model, 'operator': the (trained) operator}.

    Args:
        params: the small pretrained model's params, in either layout.
        cfg: its config.
        large_cfg: the large model's config, to draw a fresh operator for; unused with `operator`.
        operator: the trained operator, kept as it is (not checked here); None draws a fresh one.
        rank: the fresh operator's ring rank R.
        key: the PRNG key of the fresh operator's noise; None uses `jax.random.key(0)`.
        **init_options: further keyword options of `init_operator` (`noise`).

    Returns:
        A dict with 'small', `params` in the stacked layout, and 'operator', the operator.

    Raises:
        GeneError: `params` is not a whole model of `cfg` (`common.check_model`); neither
          `operator` nor `large_cfg` is given; or `init_operator` refuses the rank or the pair.
    """
    small = common.check_model(params, cfg, 'mango.gene_from_model')
    if operator is None:
        if large_cfg is None:
            raise GeneError('mango.gene_from_model: give the trained operator, or large_cfg '
                            'to draw a fresh one')
        operator = init_operator(cfg, large_cfg, rank, jax.random.key(0) if key is None else key,
                                 **init_options)
    return {'small': small, 'operator': operator}


@common.forwards_options(grow)
def descend(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
            head: str = 'inherit', embeddings: str | None = None, **options: Any) -> Params:
    """The large model grown by the gene's operator (`grow`, whose options pass through).

    Args:
        gene: {'small': the small model, 'operator': the operator} (`gene_from_model`).
        target_cfg: the large model's config.
        key: the PRNG key of whatever is drawn fresh; needed only then.
        head: 'inherit' keeps the grown head (`target_cfg` must have the small model's class
          count); 'new' draws one for `target_cfg`.
        embeddings: 'inherit' (or None) keeps the grown embeddings; 'random' draws them fresh.
        **options: `grow`'s options, `layer_loop` and `remat`.

    Returns:
        Canonical params of `target_cfg`, stacked layout.

    Raises:
        GeneError: `gene` does not have exactly the keys 'small' and 'operator'; `head` or
          `embeddings` is not a valid choice; the operator or the small model does not fit
          `target_cfg`; something is drawn fresh without `key`.
    """
    growth.check_operator_gene(gene, 'Mango')
    return growth.descend_grown(lambda s, c: grow(gene['operator'], s, c, **options),
                                gene['small'], target_cfg, what='mango', key=key, head=head,
                                embeddings=embeddings)


def _init(small_cfg: ViTConfig, large_cfg: ViTConfig, key: jax.Array, *, rank: int = 1,
          **options: Any) -> Operator:
    """`init_operator` on the `Operator` contract (rank as a keyword option)."""
    return init_operator(small_cfg, large_cfg, int(rank), key, **options)


def _grow_flops(small_cfg: ViTConfig, large_cfg: ViTConfig, *, rank: int = 1,
                **init_options: Any) -> float:
    """Forward FLOPs of one `grow` (`operator_cost`); the init options change no shape."""
    del init_options
    return float(operator_cost(small_cfg, large_cfg, int(rank))['flops'])


METHOD = common.register(common.Method(
    name='mango', label='Mango', source='model', gene_from_model=gene_from_model,
    descend=descend, gene_param_count=growth.operator_gene_param_count,
    gene_parts=growth.OPERATOR_PARTS, family='operator',
    operator=common.Operator(init=_init, grow=grow, grow_flops=_grow_flops,
                             grow_options=('layer_loop', 'remat')),
    row_label=lambda options: f"R={options.get('rank', 1)}"))
