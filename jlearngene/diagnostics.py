"""Diagnostics a learngene study reads off trained models: layer-position linearity, mean
attention distance per head, and linear CKA between two models' layers.

Compute functions take arrays or params and return numpy arrays (or a small dict of them);
`plot_*` functions take those results and return a matplotlib `Figure` (written to `path`
when given). They build figures with `matplotlib.figure.Figure`, never `pyplot`, so they
change no global backend and work the same in scripts, tests and notebooks::

    from jlearngene import diagnostics as dg

    lin = dg.layer_linearity(params, kinds='mlp/fc1/kernel')     # PCA of the layers + score
    dg.plot_layer_linearity(lin, path='linearity.png')

    mad = dg.mean_attention_distance(params, cfg, [images])     # (layers, heads), pixels
    dg.plot_attention_distance(mad, path='mad.png')

    a = dg.block_representations(child, child_cfg, images)      # (layers, tokens, width)
    b = dg.block_representations(ancestor, ancestor_cfg, images)
    dg.plot_cka(dg.cka_matrix(a, b), path='cka.png')

Definitions:

* **Layer-position linearity** (the observation behind TLEG: trained layers lie near a line
  θ_l ≈ θ_B + l·θ_A in parameter space). Each block's chosen parameters, flattened, are one
  row of X (L, P). `layer_pca` centres the rows over layers and returns the layers'
  coordinates on the principal components (the PCA of the L points) with each component's
  share of the across-layer variance. `linearity_score(X)` is the share of that variance
  explained by the best affine function of the layer index, R² = 1 − Σ‖x_l − (b + l·a)‖² /
  Σ‖x_l − x̄‖² (least squares over a and b): 1 when the layers are exactly TLEG's linear
  expansion, about 1/(L−1) for layers drawn independently (one direction of the L−1 that L
  centred points span). `layer_linearity` also reports `pc1_r2`, the R² of the same fit on
  the PC-1 coordinate alone.
* **Mean attention distance** (Dosovitskiy et al. 2021, Fig. 7; Raghu et al. 2021): for
  layer l, head h and image b, with A the post-softmax attention over the N patch tokens
  (prefix tokens' rows and columns dropped), MAD = (1/N) Σ_ij A_ij · δ_ij, δ_ij the pixel
  distance between the centres of patches i and j; then the mean over images. Rows are not
  renormalised after dropping the prefix (the official definition; `renormalise=True` makes
  them distributions again). `mean_attention_distance` streams it over a dataset, and
  Cluster-Learngene clusters heads by it.
* **Linear CKA** (Kornblith et al. 2019): for representations X (n, d1) and Y (n, d2) of the
  same n examples, both centred over examples, CKA = ‖YᵀX‖²_F / (‖XᵀX‖_F · ‖YᵀY‖_F).
  Invariant to isotropic scaling and orthogonal transforms of either side, 1 for identical
  inputs, about d/n for independent ones. Token representations: every patch token of every
  image is one example (`block_representations`).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]

__all__ = ['attention_distance', 'attention_maps', 'block_representations', 'cka', 'cka_matrix',
           'grid_distances', 'layer_linearity', 'layer_matrix', 'layer_pca', 'linearity_score',
           'mean_attention_distance', 'normalise', 'plot_attention_distance', 'plot_cka',
           'plot_layer_linearity']


# ----------------------------------------------------------------------------------------
# Layer-position linearity.

def _block_trees(params: Params) -> list[dict[str, Any]]:
    """Each block's {path: array} (paths relative to the block), in either layout."""
    if not isinstance(params, Mapping) or 'blocks' not in params:
        raise ValueError('layer_matrix: params have no blocks (expected a ViT tree with params["blocks"])')
    blocks = params['blocks']
    if isinstance(blocks, Mapping):
        flat = pytree.flatten(blocks)
        depths = {np.shape(v)[0] for v in flat.values()}
        if len(depths) != 1:
            raise ValueError(f'layer_matrix: stacked blocks disagree on depth: {sorted(depths)}')
        return [{k: v[i] for k, v in flat.items()} for i in range(depths.pop())]
    return [pytree.flatten(b) for b in blocks]


def layer_matrix(params: Params, kinds: str | Sequence[str] = '.*kernel') -> np.ndarray:
    """The layers as rows of one matrix: the X of the layer-position linearity.

    Args:
        params: a ViT parameter tree with `params['blocks']`, stacked or list layout.
        kinds: regexes (or one), each matched with `re.fullmatch` against block-relative paths
          such as 'attn/q/kernel', 'mlp/fc1/kernel', 'norm1/.*'; the default takes every kernel.

    Returns:
        An (L, P) float64 array whose row l is block l's matching parameters, flattened
        and concatenated in tree order.

    Raises:
        ValueError: `params` has no blocks, stacked blocks disagree on depth, there are fewer
          than 2 blocks, no block parameter matches `kinds`, or a block's matching parameters
          differ in presence or shape from block 0's.
    """
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    rx = [re.compile(k) for k in kinds]
    blocks = _block_trees(params)
    if len(blocks) < 2:
        raise ValueError(f'layer_matrix: {len(blocks)} block(s); linearity needs at least 2 layers')
    paths = [p for p in blocks[0] if any(r.fullmatch(p) for r in rx)]
    if not paths:
        raise ValueError(f'layer_matrix: no block parameter matches {list(kinds)}; '
                         f'block paths are {sorted(blocks[0])}')
    rows = []
    for i, b in enumerate(blocks):
        shapes = [np.shape(b.get(p)) for p in paths]
        if any(p not in b for p in paths) or shapes != [np.shape(blocks[0][p]) for p in paths]:
            raise ValueError(f'layer_matrix: block {i} differs in shape from block 0 in {list(kinds)} '
                             '(layers of different shapes have no common parameter space)')
        rows.append(np.concatenate([np.asarray(b[p], np.float64).ravel() for p in paths]))
    return np.stack(rows)


def _as_layers(x, what: str) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f'{what}: expected a (layers >= 2, features) array, got shape {x.shape}')
    if not np.isfinite(x).all():
        raise ValueError(f'{what}: the layer matrix has non-finite entries')
    return x


def layer_pca(x, n_components: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """PCA of the L layers.

    Signs follow the layer order (coordinate of the last layer ≥ that of the first), so plots
    of different models read the same way.

    Args:
        x: the layers as rows, an (L, P) array (`layer_matrix`) with L ≥ 2.
        n_components: k, the number of principal components kept; 1 ≤ k ≤ L.

    Returns:
        The pair `(coords, explained)`, the centred layers' coordinates on the first k
        principal components, (L, k) float64, and each component's share of the across-layer
        variance, (k,). Where P < k, only P components come back.

    Raises:
        ValueError: `x` is not 2-D with at least 2 rows, has non-finite entries, or has
          identical rows; or `n_components` is outside 1..L.
    """
    x = _as_layers(x, 'layer_pca')
    k = int(n_components)
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f'layer_pca: n_components={n_components} must be in 1..{x.shape[0]} (the layers)')
    xc = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(xc, full_matrices=False)
    total = float((s ** 2).sum())
    if total == 0.0:
        raise ValueError('layer_pca: every layer is identical (no across-layer variance)')
    coords = u[:, :k] * s[:k]
    coords *= np.where(coords[-1] < coords[0], -1.0, 1.0)
    return coords, s[:k] ** 2 / total


def linearity_score(x) -> float:
    """R² of the best affine fit x_l ≈ b + l·a to the layers.

    The share of the across-layer variance on a straight line traversed at a constant speed
    in the layer index (TLEG's expansion).

    Args:
        x: the layers as rows, an (L, P) array (`layer_matrix`) with L ≥ 2.

    Returns:
        The R² as a float, 1 for a linear stack and ≈ 1/(L−1) for independent layers.

    Raises:
        ValueError: `x` is not 2-D with at least 2 rows, has non-finite entries, or has
          identical rows.
    """
    x = _as_layers(x, 'linearity_score')
    xc = x - x.mean(axis=0)
    total = float((xc ** 2).sum())
    if total == 0.0:
        raise ValueError('linearity_score: every layer is identical (no across-layer variance)')
    t = np.arange(x.shape[0], dtype=np.float64)
    t -= t.mean()
    proj = t @ xc                                  # least-squares slope · Σt²
    return float((proj ** 2).sum() / (t @ t) / total)


def layer_linearity(params: Params, kinds: str | Sequence[str] = '.*kernel', *,
                    n_components: int = 2) -> dict[str, Any]:
    """Layer-position linearity of a model.

    Args:
        params: a ViT parameter tree, stacked or list layout.
        kinds: the block parameters that make a layer's row, as for `layer_matrix`.
        n_components: the principal components kept (at most L are).

    Returns:
        A dict of 'coords' (L, k) and 'explained' (k,) as `layer_pca` gives them, 'score'
        (`linearity_score` of the layer matrix), 'pc1_r2' (R² of a line through the PC-1
        coordinates against the layer index) and 'kinds' (a tuple).

    Raises:
        ValueError: as `layer_matrix` and `layer_pca` raise it (no matching parameters, fewer
          than 2 blocks, blocks of different shapes, identical layers, `n_components` < 1).
    """
    x = layer_matrix(params, kinds)
    coords, explained = layer_pca(x, min(n_components, x.shape[0]))
    return {'coords': coords, 'explained': explained, 'score': linearity_score(x),
            'pc1_r2': linearity_score(coords[:, :1]),
            'kinds': (kinds,) if isinstance(kinds, str) else tuple(kinds)}


# ----------------------------------------------------------------------------------------
# Mean attention distance.

def grid_distances(grid: int | Sequence[int], patch_size: int) -> np.ndarray:
    """Pixel distances between the centres of a patch grid's patches.

    Args:
        grid: the patch grid, `g` (square) or `(rows, cols)`.
        patch_size: the patch size in pixels.

    Returns:
        An (N, N) float64 array (N = rows·cols, row-major order) of `patch_size` × the
        Euclidean grid distance between each pair of patches.

    Raises:
        ValueError: a grid side is below 1 or `patch_size` is not positive.
    """
    gh, gw = (grid, grid) if isinstance(grid, (int, np.integer)) else tuple(grid)
    if min(gh, gw) < 1 or patch_size <= 0:
        raise ValueError(f'grid_distances: grid {(gh, gw)} and patch_size {patch_size} must be positive')
    rc = np.stack(np.divmod(np.arange(gh * gw), gw), axis=1).astype(np.float64)
    return patch_size * np.sqrt(((rc[:, None] - rc[None]) ** 2).sum(-1))


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def normalise(images, mean=IMAGENET_MEAN, std=IMAGENET_STD, *, official: bool = False):
    """Images in [0, 1] (…, C) as model inputs, (x − mean) / std per channel.

    Args:
        images: an array (…, C) of values in [0, 1].
        mean: the per-channel means, a 1-D sequence of C values or of one, or one number for
          every channel; ImageNet's by default.
        std: the per-channel standard deviations, given as `mean` is.
        official: reproduce Cluster-Learngene's official attention-distance pass: mean·255
          and std·255 applied to images already in [0, 1], which maps every pixel to
          ≈ −mean/std (an almost constant image), so its distances mostly reflect positional
          structure.

    Returns:
        The normalised images, a float32 jax array of the input's shape.

    Raises:
        ValueError: `mean` and `std` are not numbers or 1-D sequences, differ in length, or hold
          neither one value nor one per channel.
    """
    images = jnp.asarray(images, jnp.float32)
    mean, std = np.atleast_1d(np.asarray(mean, np.float32)), np.atleast_1d(np.asarray(std, np.float32))
    if mean.shape != std.shape or mean.ndim != 1 or mean.size not in (1, images.shape[-1]):
        raise ValueError(f'normalise: mean {_values(mean)} and std {_values(std)} need one value '
                         f'per channel ({images.shape[-1]}) or one value')
    if official:
        mean, std = mean * 255.0, std * 255.0
    return (images - mean) / std


def _values(a: np.ndarray) -> str:
    """A 1-D `a` for a message, its values rounded to float32's digits; else its shape."""
    return str(tuple(float(f'{x:.7g}') for x in a)) if a.ndim == 1 else f'of shape {a.shape}'


def _layer_distance(probs, dist, n_prefix: int, renormalise: bool):
    """(B, H) mean attention distance of one layer's probabilities (B, H, T, T): the one
    formula every function here uses."""
    a = probs[:, :, n_prefix:, n_prefix:].astype(jnp.float32)
    if renormalise:
        a = a / jnp.maximum(a.sum(-1, keepdims=True), jnp.finfo(jnp.float32).tiny)
    return jnp.einsum('bhij,ij->bh', a, dist, precision='highest') / a.shape[-1]


def attention_distance(probs, grid: int | Sequence[int], patch_size: int, *, n_prefix: int = 0,
                       renormalise: bool = False) -> np.ndarray:
    """Mean attention distance in pixels from attention probabilities.

    Args:
        probs: (L, B, H, T, T) (what `apply(..., capture=('attn',))` returns in
          `aux['attn']`), (B, H, T, T) for one layer, or a list of per-layer (B, H_l, T, T)
          arrays (list layout with per-layer head counts); T = n_prefix + rows·cols tokens.
        grid: the patch grid, `g` or `(rows, cols)`.
        patch_size: the patch size in pixels.
        n_prefix: the prefix tokens (class, distillation) before the patch tokens; their
          rows and columns are left out.
        renormalise: divide each patch row of the attention by its sum over the patch
          tokens (False: the probabilities as they are, the prefix's share left out).

    Returns:
        The mean over images of (1/N) Σ_ij A_ij δ_ij over the N patch tokens, δ_ij the
        distance between patches i and j in pixels, float64 (L, H); (H,) for one layer; a list
        of (H_l,) arrays for a list input.

    Raises:
        ValueError: `probs` is not (batch, heads, tokens, tokens) per layer, or its token
          count is not `n_prefix` + the grid's.
    """
    gh, gw = (grid, grid) if isinstance(grid, (int, np.integer)) else tuple(grid)
    n = gh * gw
    dist = jnp.asarray(grid_distances((gh, gw), patch_size), jnp.float32)

    def one(p, where):
        p = jnp.asarray(p)
        if p.ndim != 4 or p.shape[-1] != p.shape[-2]:
            raise ValueError(f'attention_distance: {where} has shape {p.shape}; expected '
                             '(batch, heads, tokens, tokens)')
        if p.shape[-1] != n_prefix + n:
            raise ValueError(f'attention_distance: {where} has {p.shape[-1]} tokens but the '
                             f'{gh}x{gw} patch grid and {n_prefix} prefix token(s) give {n_prefix + n}')
        return np.asarray(_layer_distance(p, dist, n_prefix, renormalise).mean(axis=0), np.float64)

    if isinstance(probs, (list, tuple)):
        return [one(p, f'layer {i}') for i, p in enumerate(probs)]
    probs = jnp.asarray(probs)
    if probs.ndim == 4:
        return one(probs, 'the attention')
    if probs.ndim != 5:
        raise ValueError(f'attention_distance: attention of shape {probs.shape}; expected '
                         '(layers, batch, heads, tokens, tokens) or (batch, heads, tokens, tokens)')
    return np.stack([one(probs[i], f'layer {i}') for i in range(probs.shape[0])])


def _n_prefix(params: Params) -> int:
    return sum(k in params for k in ('cls_token', 'dist_token'))


_apply = jax.jit(vit.apply, static_argnames=('cfg', 'capture'))


def attention_maps(params: Params, cfg: ViTConfig, images) -> Any:
    """Attention probabilities of every block on `images`.

    Args:
        params: the model's parameters, stacked or list layout.
        cfg: the model's config.
        images: model inputs (already normalised), NHWC.

    Returns:
        What `vit.apply(..., capture=('attn',))` captures, an (L, B, H, T, T) array, or a list
        of per-layer (B, H_l, T, T) arrays where the layers' head counts differ.
    """
    return _apply(params, jnp.asarray(images, jnp.float32), cfg=cfg, capture=('attn',))[1]['attn']


@functools.partial(jax.jit, static_argnames=('cfg', 'renormalise'))
def _distance_sums(params, images, mask, dist, cfg, renormalise):
    """Σ over the batch's valid images of the per-image distances, (L, H), for stacked
    params; one layer's attention probabilities are alive at a time."""
    n_prefix = _n_prefix(params)
    x = vit.embed(params, images, cfg)

    def body(h, p):
        h, probs = vit.block_apply(p, h, cfg, need_probs=True)
        return h, mask @ _layer_distance(probs, dist, n_prefix, renormalise)

    _, sums = jax.lax.scan(body, x, params['blocks'])
    return sums


def _check_channels(images, mean, what: str) -> None:
    channels, given = images.shape[-1], np.size(mean)
    if given not in (1, channels):
        default = ' (the default is ImageNet\'s 3-channel normalisation)' if tuple(
            np.ravel(mean)) == IMAGENET_MEAN else ''
        raise ValueError(f'{what}: the images have {channels} channel(s) but mean/std give '
                         f'{given}{default}; pass your data\'s mean=..., std=... (one value per '
                         'channel), or mean=None, std=None for images that are model inputs already')


def mean_attention_distance(params: Params, cfg: ViTConfig, batches: Iterable[Any], *,
                            renormalise: bool = False, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                            official_normalisation: bool = False):
    """Mean attention distance of a model, in pixels, over `batches`.

    The definition above, streamed; what Cluster-Learngene clusters heads by. Stacked params
    (or list-layout params that stack) run one compiled pass per batch shape holding one
    layer's attention at a time. Sums in float64.

    Args:
        params: the model's parameters, stacked or list layout.
        cfg: the model's config (its `image_size` and `patch_size` give the patch grid).
        batches: an iterable of image arrays (B, H, W, C) or of mappings with 'image' (and
          optionally a boolean 'mask' marking real examples, as `jlearngene.data.eval_batches`
          gives).
        renormalise: as for `attention_distance`.
        mean: per-channel means (or one number for every channel) that normalise images in
          [0, 1] (ImageNet's by default); `None` (with `std=None`) takes the batches as model
          inputs already.
        std: per-channel standard deviations (or one number), given or `None` together with `mean`.
        official_normalisation: Cluster-Learngene's official bug, see `normalise`.

    Returns:
        A (layers, heads) float64 array, the mean over every real image; for list-layout params
        with per-layer head counts, a list of (H_l,) arrays.

    Raises:
        ValueError: only one of `mean` and `std` is given; `official_normalisation` without
          them; `mean`/`std` fit neither one channel nor the images' channels; or the batches
          hold no (unmasked) images.
    """
    if (mean is None) != (std is None):
        raise ValueError('mean_attention_distance: give both mean and std, or neither')
    if mean is None and official_normalisation:
        raise ValueError('mean_attention_distance: official_normalisation needs mean and std '
                         '(images in [0, 1])')
    try:
        params = params if layout.is_stacked(params) else layout.stack_blocks(params)
        stacked = True
    except ValueError:          # per-layer head counts: the captured attention, layer by layer
        stacked = False
    g = cfg.image_size // cfg.patch_size
    dist = jnp.asarray(grid_distances((g, g), cfg.patch_size), jnp.float32)
    total, count = None, 0.0
    for batch in batches:
        if isinstance(batch, Mapping):
            images, mask = batch['image'], batch.get('mask')
        else:
            images, mask = batch, None
        images = jnp.asarray(images, jnp.float32)
        if mean is not None:
            _check_channels(images, mean, 'mean_attention_distance')
            images = normalise(images, mean, std, official=official_normalisation)
        mask = (jnp.ones(images.shape[:1], jnp.float32) if mask is None
                else jnp.asarray(mask, jnp.float32))
        if stacked:
            sums = np.asarray(_distance_sums(params, images, mask, dist, cfg, renormalise), np.float64)
        else:
            n_prefix = _n_prefix(params)
            sums = [np.asarray(mask @ _layer_distance(p, dist, n_prefix, renormalise), np.float64)
                    for p in attention_maps(params, cfg, images)]
        total = sums if total is None else jax.tree.map(np.add, total, sums)
        count += float(np.asarray(mask).sum())
    if total is None or count == 0:
        raise ValueError('mean_attention_distance: the batches hold no images')
    return jax.tree.map(lambda t: t / count, total)


# ----------------------------------------------------------------------------------------
# Linear CKA.

def _as_examples(x, what: str) -> jax.Array:
    x = jnp.asarray(x, jnp.float32)
    if x.ndim < 2:
        raise ValueError(f'{what}: expected (examples, features) or (batch, tokens, features), got shape {x.shape}')
    return x.reshape(-1, x.shape[-1])


@jax.jit
def _normalised(x):
    """x centred over examples and scaled to unit Frobenius norm (CKA is scale-free, and the
    products below stay far from overflow), with flags: all finite, not constant."""
    x = x - x.mean(axis=0, keepdims=True)
    norm = jnp.linalg.norm(x)
    return x / jnp.where(norm > 0, norm, 1.0), jnp.isfinite(norm), norm > 0


def _centred(x, what: str):
    x, finite, varies = _normalised(x)
    if not bool(finite):
        raise ValueError(f'{what}: the representation has non-finite entries')
    if not bool(varies):
        raise ValueError(f'{what}: the representation is constant over the examples (CKA is undefined)')
    return x


def cka(x, y) -> float:
    """Linear CKA of two representations of the same examples, centred over examples first.

    Args:
        x: an (n, d1) array, or a (batch, tokens, d1) one (every token an example).
        y: an (n, d2) array, or a (batch, tokens, d2) one.

    Returns:
        The CKA as a float in [0, 1].

    Raises:
        ValueError: either is below 2-D, has non-finite entries or is constant over the
          examples, or the two hold different example counts.
    """
    x, y = _as_examples(x, 'cka: x'), _as_examples(y, 'cka: y')
    if x.shape[0] != y.shape[0]:
        raise ValueError(f'cka: x has {x.shape[0]} examples and y {y.shape[0]}; both must '
                         'represent the same examples')
    return float(_cka(_centred(x, 'cka: x'), _centred(y, 'cka: y')))


@jax.jit
def _cka(x, y):
    """Linear CKA of centred x (n, d1), y (n, d2), in the feature form (d×d products)."""
    hp = jax.lax.Precision.HIGHEST
    cross = jnp.sum(jnp.matmul(y.T, x, precision=hp) ** 2)
    nx = jnp.linalg.norm(jnp.matmul(x.T, x, precision=hp))
    ny = jnp.linalg.norm(jnp.matmul(y.T, y, precision=hp))
    return cross / (nx * ny)


def cka_matrix(a, b) -> np.ndarray:
    """Linear CKA between every layer of `a` and every layer of `b`.

    Args:
        a: a stack (La, n, d) or (La, B, T, d), or a list of per-layer arrays (widths may differ
          between and within the models), as `block_representations` gives.
        b: the other model's layers, likewise.

    Returns:
        An (La, Lb) float64 array; entry (i, j) is `cka(a[i], b[j])`.

    Raises:
        ValueError: either has no layer; a layer is below 2-D, has non-finite entries or is
          constant over the examples; or the layers' example counts differ.
    """
    la = [_as_examples(x, f'cka_matrix: a[{i}]') for i, x in enumerate(a)]
    lb = [_as_examples(y, f'cka_matrix: b[{j}]') for j, y in enumerate(b)]
    if not la or not lb:
        raise ValueError('cka_matrix: both models need at least one layer')
    counts = {x.shape[0] for x in la + lb}
    if len(counts) != 1:
        raise ValueError(f'cka_matrix: the layers hold different example counts {sorted(counts)}; '
                         'run both models on the same images')
    la = [_centred(x, f'cka_matrix: a[{i}]') for i, x in enumerate(la)]
    lb = [_centred(y, f'cka_matrix: b[{j}]') for j, y in enumerate(lb)]
    return np.array([[float(_cka(x, y)) for y in lb] for x in la], np.float64)


def block_representations(params: Params, cfg: ViTConfig, images, *,
                          tokens: str = 'patches') -> Any:
    """Every block's output tokens on `images`, as CKA examples.

    Args:
        params: the model's parameters, stacked or list layout.
        cfg: the model's config.
        images: model inputs (already normalised), NHWC.
        tokens: 'patches' drops the prefix tokens, so models with and without a class token
          compare; 'all' keeps every token.

    Returns:
        An (L, B·N, D) array, N the tokens kept; a list of per-layer (B·N, D_l) arrays for
        blocks of different widths.

    Raises:
        ValueError: `tokens` is neither 'patches' nor 'all'.
    """
    if tokens not in ('patches', 'all'):
        raise ValueError(f"block_representations: tokens={tokens!r}; expected 'patches' or 'all'")
    out = _apply(params, jnp.asarray(images, jnp.float32), cfg=cfg, capture=('blocks',))[1]['blocks']
    start = _n_prefix(params) if tokens == 'patches' else 0
    if isinstance(out, (list, tuple)):
        return [h[:, start:].reshape(-1, h.shape[-1]) for h in out]
    return out[:, :, start:].reshape(out.shape[0], -1, out.shape[-1])


# ----------------------------------------------------------------------------------------
# Plots.

def _figure(figsize):
    from matplotlib.figure import Figure
    return Figure(figsize=figsize, layout='constrained')


def _save(fig, path: str | os.PathLike | None):
    if path is not None:
        fig.savefig(os.fspath(path), dpi=100)
    return fig


def plot_layer_linearity(result: Mapping[str, Any], *, path: str | os.PathLike | None = None,
                         title: str | None = None):
    """Two panels from `layer_linearity`'s result.

    Left: the principal-component coordinates against depth with the fitted line of PC-1;
    right: the layers' path in the PC-1/PC-2 plane.

    Args:
        result: `layer_linearity`'s dict ('coords' and 'explained' needed; 'score' and
          'kinds' go into the title when present).
        path: where to save the figure (at 100 dpi); `None`: not saved.
        title: the title's head; `None`: 'layer-position linearity'.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: 'coords' is not 2-D or its column count differs from the length of
          'explained'.
    """
    coords = np.asarray(result['coords'], np.float64)
    explained = np.asarray(result['explained'], np.float64)
    if coords.ndim != 2 or coords.shape[1] != explained.shape[0]:
        raise ValueError(f'plot_layer_linearity: coords {coords.shape} and explained '
                         f'{explained.shape} disagree')
    layers = np.arange(coords.shape[0])
    fig = _figure((10, 4))
    ax_d, ax_p = fig.subplots(1, 2)
    for k in range(coords.shape[1]):
        ax_d.plot(layers, coords[:, k], marker='o', label=f'PC-{k + 1} ({100 * explained[k]:.0f} %)')
    slope, icpt = np.polyfit(layers, coords[:, 0], 1)
    ax_d.plot(layers, icpt + slope * layers, 'k--', lw=1, label='line through PC-1')
    ax_d.set(xlabel='layer', ylabel='coordinate')
    ax_d.legend(fontsize=8)
    ax_d.grid(alpha=0.3)
    y = coords[:, 1] if coords.shape[1] > 1 else np.zeros_like(layers, np.float64)
    sc = ax_p.scatter(coords[:, 0], y, c=layers, cmap='viridis', zorder=3)
    ax_p.plot(coords[:, 0], y, color='0.6', lw=1, zorder=2)
    for i in layers:
        ax_p.annotate(str(i), (coords[i, 0], y[i]), textcoords='offset points', xytext=(4, 4), fontsize=8)
    ax_p.set(xlabel='PC-1', ylabel='PC-2' if coords.shape[1] > 1 else '')
    fig.colorbar(sc, ax=ax_p, label='layer')
    score = result.get('score')
    kinds = ', '.join(result.get('kinds', ()))
    head = title or 'layer-position linearity'
    fig.suptitle(f'{head}: {kinds}' + (f'  (linearity R² = {score:.3f})' if score is not None else ''))
    return _save(fig, path)


def plot_attention_distance(dist, *, path: str | os.PathLike | None = None,
                            title: str = 'mean attention distance (px)'):
    """Heatmap (layer × head) of a mean attention distance.

    Args:
        dist: `attention_distance`'s or `mean_attention_distance`'s (L, H) result, or a list
          of per-layer arrays (different head counts; the missing heads are left blank).
        path: where to save the figure (at 100 dpi); `None`: not saved.
        title: the axes' title.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `dist` is not (layers, heads).
    """
    if isinstance(dist, (list, tuple)):
        rows = [np.asarray(d, np.float64).ravel() for d in dist]
        m = np.full((len(rows), max(len(r) for r in rows)), np.nan)
        for i, r in enumerate(rows):
            m[i, :len(r)] = r
    else:
        m = np.asarray(dist, np.float64)
    if m.ndim != 2:
        raise ValueError(f'plot_attention_distance: expected (layers, heads), got shape {m.shape}')
    fig = _figure((max(4.5, 1.2 + 0.5 * m.shape[1]), max(3.0, 1.2 + 0.4 * m.shape[0])))
    ax = fig.subplots()
    im = ax.imshow(m, cmap='viridis', aspect='auto', origin='lower')
    if m.size <= 256:
        for (i, j), v in np.ndenumerate(m):
            if np.isfinite(v):
                ax.text(j, i, f'{v:.1f}', ha='center', va='center', fontsize=7, color='w')
    ax.set(xlabel='head', ylabel='layer', xticks=range(m.shape[1]), yticks=range(m.shape[0]))
    fig.colorbar(im, ax=ax, label='pixels')
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def plot_cka(matrix, *, path: str | os.PathLike | None = None, xlabel: str = 'ancestor layer',
             ylabel: str = 'descendant layer', title: str = 'linear CKA'):
    """Heatmap of `cka_matrix`'s (La, Lb) result, values in [0, 1].

    Args:
        matrix: the (La, Lb) CKA matrix.
        path: where to save the figure (at 100 dpi); `None`: not saved.
        xlabel: the label of the columns' axis (`b`'s layers).
        ylabel: the label of the rows' axis (`a`'s layers).
        title: the axes' title.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `matrix` is not 2-D.
    """
    m = np.asarray(matrix, np.float64)
    if m.ndim != 2:
        raise ValueError(f'plot_cka: expected a (layers_a, layers_b) matrix, got shape {m.shape}')
    fig = _figure((max(4.5, 1.5 + 0.45 * m.shape[1]), max(3.0, 1.2 + 0.4 * m.shape[0])))
    ax = fig.subplots()
    im = ax.imshow(m, cmap='magma', vmin=0.0, vmax=1.0, origin='lower', aspect='auto')
    if m.size <= 256:
        for (i, j), v in np.ndenumerate(m):
            ax.text(j, i, f'{v:.2f}', ha='center', va='center', fontsize=7,
                    color='k' if v > 0.6 else 'w')
    ax.set(xlabel=xlabel, ylabel=ylabel, xticks=range(m.shape[1]), yticks=range(m.shape[0]),
           title=title)
    fig.colorbar(im, ax=ax)
    return _save(fig, path)
