"""Scala (Zhang et al., NeurIPS 2024): one slimmable ViT whose sub-networks of width ratio r
on a grid are slices of its parameters; with US-Net's and MatFormer's slicing for the
baselines.

A width-r sub-network has embedding width d = r·D, MLP width r·M, every one of the H heads
(head size r·Dh) and all layers; the position/class axes and the classifier's outputs are
never sliced. Which channels it takes is **isolated activation**: the first (left) block
for the smallest ratio s and for r = 1, the last (right) block for every ratio in between,
so the intermediate sub-networks nest right-aligned and the smallest shares weights only
with the full network and the widest intermediates.

Two slicing rules (`subnet(..., rule=)`), side by side:

| | `'clean'` (default, for training from scratch) | `'official'` (BeSpontaneous/Scala-pytorch) |
|---|---|---|
| q, k, v | each projection sliced on its own: head h keeps its own first/last r·Dh units, so the sub-network's q/k/v are the full model's | the fused (D → 3D) qkv output is cut as one contiguous block of 3d rows, then read as (3, H, d/H): at r = 1/4 (left) q, k and v all come from the full q; at r = 1/2 (right) q is the second half of full k, k and v are full v |
| out projection | per head, the same units | its (H·Dh) input flattened, first/last d |
| attention scale | the sub-network's (r·Dh)^-1/2 (`cfg.attn_scale`, None) | the full model's Dh^-1/2 at every r |
| LayerNorm eps | the config's | 1e-5 at every r, r = 1 included (the functional LN call without eps) |
| side of the outer parameters | the side of the blocks | the same, except in a distilled model (dist token), whose tokens, position embedding, final norm and heads use the left block exactly at r ∈ {0.25, 1} whatever s is (the distilled class hard-codes them); the patch embedding follows s |

Both keep the head count and need d to split into H whole heads (a GeneError otherwise).
Because the clean rule keeps every unit in its own head, a sub-network is also the full
network with the other units zeroed: `masked_apply` runs it at full shapes (masked
LayerNorm statistics), e.g. to train several widths in one compiled program where that
is faster; the official rule moves units between projections and heads, so it has no
masked form.

Width grid and **stable sampling**: `width_grid(s, g)` is {s, s+g, ..., 1}; per step the
full network, one width of the upper half [m, 1) and one of the lower half (s, m), m =
(s + 1)/2, and s are trained (`stable_halves`, `sample_widths`, pure functions of a PRNG
key). Every granularity whose grid has a width in each half works, g = 1/4 included (upper
{0.75}, lower {0.5}), where the official sampler's randint(m//g, 1//g − 1) and
randint(s//g + 1, m//g − 1) raise; for dyadic grids with g < 1/4 the halves are the
official ones.

Baselines' slicing: US-Net takes the left block at every width (`subnet(..., side='left')`)
and samples its two middle widths uniformly from the grid's interior (`sample_interior`);
MatFormer nests only the FFN (`ffn_subnet`: the first units of the MLP, per layer), with
Mix'n'Match (`mix_n_match`) for FFN ratios between the trained granularities.

Registered methods (gene = the full slimmable network's canonical params, source
'learned'; `init_gene` is `vit.init`, `materialize(gene, None, cfg)` the sub-network of
`cfg`'s width, so a loss on it trains the shared weights):

* 'scala': `descend(gene, target_cfg, rule='clean'|'official', smallest=0.25)` = the
  sub-network of the target's width (target width / gene width is the ratio; heads, depth
  and the MLP ratio must match the gene's);
* 'us_net': the same with the left block at every width;
* 'matformer': the target keeps the gene's width and heads; its `mlp_dim` picks the
  nested FFN (one size for all layers).

The methods' training losses live here too (last section): `scala_loss`, `full_loss`
(the warm-up), `usnet_loss` and `matformer_loss`, each a `loss_fn(params, batch, rng) ->
(loss, metrics)` for the generic trainer, built on `jlearngene.losses`; each declares a
hashable `key` naming it by its arguments (None with an external teacher), which callers
put into the trainer's compile key so runs of one loss and shape compile once.
"""
from __future__ import annotations

import fractions
import math
from typing import Any
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import losses, pytree
from jlearngene.genes import common
from jlearngene.genes.common import GeneError
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]

RULES = ('clean', 'official')
SIDES = layout.SIDES
OFFICIAL_LN_EPS = 1e-5
# The distilled official model slices its tokens, position embedding, final norm and heads
# on the left exactly at these ratios (hard-coded, independent of the smallest ratio).
OFFICIAL_DISTILLED_LEFT = (0.25, 1.0)
OUTER_KEYS = ('cls_token', 'dist_token', 'pos_embed', 'norm', 'head', 'head_dist')


# ----------------------------------------------------------------------------------------
# Ratios and the width grid.

def _fraction(ratio: float, what: str = 'ratio') -> fractions.Fraction:
    try:
        f = fractions.Fraction(ratio).limit_denominator(1 << 16)
    except (TypeError, ValueError):
        raise GeneError(f'{what}={ratio!r} is not a number') from None
    if not 0 < f <= 1:
        raise GeneError(f'{what}={ratio!r} must lie in (0, 1]')
    return f


def _count(ratio: float, n: int, what: str) -> int:
    """r·n as a whole number (GeneError when it is not one)."""
    x = _fraction(ratio) * n
    if x.denominator != 1:
        raise GeneError(f'width ratio {ratio}: {ratio}·{what}={n} = {float(x):g} is not a '
                        f'whole number of units')
    return int(x)


def width_grid(smallest: float = 0.25, granularity: float = 1 / 16) -> tuple[float, ...]:
    """The ratios s, s + g, ..., 1 (X = (1 − s)/g + 1 of them; s = 1/4, g = 1/16: X = 13).

    Args:
        smallest: the smallest ratio s, in (0, 1].
        granularity: the step g between ratios, in (0, 1]; it must divide 1 − s.

    Returns:
        The X ratios as floats, increasing, the last 1.0.

    Raises:
        GeneError: `smallest` or `granularity` is not a number in (0, 1], or g does not divide 1 − s.
    """
    s, g = _fraction(smallest, 'smallest'), _fraction(granularity, 'granularity')
    steps = (1 - s) / g
    if steps.denominator != 1:
        raise GeneError(f'granularity={granularity} does not divide 1 − smallest = {float(1 - s)}')
    return tuple(float(s + i * g) for i in range(int(steps) + 1))


def _check_grid(grid: Sequence[float]) -> tuple[float, ...]:
    grid = tuple(float(r) for r in grid)
    if len(grid) < 2 or list(grid) != sorted(set(grid)) or grid[-1] != 1.0:
        raise GeneError(f'a width grid is increasing, without repeats, and ends at 1; got {grid}')
    for r in grid:
        _fraction(r)
    return grid


def stable_halves(grid: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The two halves of a width grid that stable sampling draws one width of each per step.

    Args:
        grid: the width grid (`width_grid`): increasing, without repeats, ending at 1.

    Returns:
        `(upper, lower)`, the grid's ratios in [m, 1) and in (s, m), m = (s + 1)/2, s = `grid[0]`.

    Raises:
        GeneError: `grid` has fewer than 2 ratios, is not increasing, does not end at 1 or has a ratio
          outside (0, 1]; or a half is empty.
    """
    grid = _check_grid(grid)
    s = grid[0]
    m = (s + 1.0) / 2
    upper = tuple(r for r in grid if m <= r < 1.0)
    lower = tuple(r for r in grid if s < r < m)
    if not upper or not lower:
        raise GeneError(f'stable sampling needs grid widths in [{m:g}, 1) and in ({s:g}, {m:g}); '
                        f'the grid {grid} has {len(upper)} and {len(lower)}')
    return upper, lower


def sample_widths(key: jax.Array, grid: Sequence[float]) -> tuple[jax.Array, jax.Array]:
    """Stable sampling: one width of each half of the grid.

    Drawn from `key` alone, so a resumed run and every host agree.

    Args:
        key: a PRNG key.
        grid: the width grid (`width_grid`).

    Returns:
        `(i_upper, i_lower)`, int32 scalar indices into the two halves of `stable_halves(grid)`,
        uniform and independent.

    Raises:
        GeneError: as `stable_halves` (an invalid grid, or an empty half).
    """
    upper, lower = stable_halves(grid)
    ku, kl = jax.random.split(key)
    return (jax.random.randint(ku, (), 0, len(upper)), jax.random.randint(kl, (), 0, len(lower)))


def sample_interior(key: jax.Array, grid: Sequence[float], n: int = 2) -> jax.Array:
    """US-Net's middle widths: indices into the grid's interior (s, 1), drawn from `key` alone.

    Args:
        key: a PRNG key.
        grid: the width grid (`width_grid`).
        n: how many widths to draw.

    Returns:
        int32 array of shape `(n,)`, uniform with replacement, of indices into the interior
        `grid[1:-1]`.

    Raises:
        GeneError: `grid` is not a valid width grid (at least 2 ratios in (0, 1], increasing,
          ending at 1), or has no ratio strictly between its ends.
    """
    return jax.random.randint(key, (n,), 0, len(_interior(grid)))


def _interior(grid: Sequence[float]) -> tuple[float, ...]:
    """The checked grid's widths strictly between its ends (US-Net's middle widths)."""
    interior = _check_grid(grid)[1:-1]
    if not interior:
        raise GeneError(f'the grid {tuple(grid)} has no width strictly between its ends')
    return interior


def is_left(ratio: float, smallest: float) -> bool:
    """Isolated activation: the left block for the smallest ratio and for 1, else the right.

    Args:
        ratio: a width ratio.
        smallest: the grid's smallest ratio s.

    Returns:
        Whether the width-`ratio` sub-network takes the left block (`ratio` is close to s or to 1).
    """
    return math.isclose(ratio, smallest) or math.isclose(ratio, 1.0)


# ----------------------------------------------------------------------------------------
# Sub-network sizes and slicing.

def sizes(cfg: ViTConfig, ratio: float) -> dict[str, int]:
    """The sizes of the width-`ratio` sub-network (all H heads kept).

    Args:
        cfg: the full network's config.
        ratio: the width ratio r, in (0, 1].

    Returns:
        A dict of the sizes r·width, r·mlp_dim and r·head_dim, under 'embed', 'mlp' and
        'head_dim'.

    Raises:
        GeneError: r is not a number in (0, 1], a size is not whole, or r·width does not split
          into `cfg.num_heads` whole heads.
    """
    d = _count(ratio, cfg.width, 'width')
    if d % cfg.num_heads:
        raise GeneError(f'width ratio {ratio}: width {d} does not split into num_heads='
                        f'{cfg.num_heads} whole heads')
    return {'embed': d, 'mlp': _count(ratio, cfg.mlp_dim, 'mlp_dim'),
            'head_dim': _count(ratio, cfg.head_dim, 'head_dim')}


def _side(side: str | None, ratio: float, smallest: float) -> str:
    if side is None:
        return 'left' if is_left(ratio, smallest) else 'right'
    common.check_choice('subnet', 'side', side, SIDES)
    return side


def subnet(params: Params, cfg: ViTConfig, ratio: float, *, rule: str = 'clean',
           smallest: float = 0.25, side: str | None = None) -> tuple[Params, ViTConfig]:
    """The width-`ratio` sub-network as a real smaller canonical tree (module docstring: the two
    rules). Jittable with `cfg`, `ratio` and the options static.

    Args:
        params: the slimmable network's params.
        cfg: its config.
        ratio: the width ratio r; r·width must split into the same heads.
        rule: 'clean' or 'official' (`RULES`).
        smallest: the grid's smallest ratio s (isolated activation: the left block at s and 1,
          the right block otherwise).
        side: 'left' or 'right' for every parameter, overriding isolated activation (US-Net:
          'left').

    Returns:
        (sub_params, sub_cfg), which `vit.apply(sub_params, x, sub_cfg)` runs.

    Raises:
        GeneError: `cfg` has a pre-logits layer; `rule` is not one of `RULES` or `side` not one of
          `SIDES`; list-layout blocks differ in shape; r is not in (0, 1], a size is not whole or
          r·width does not split into the heads (`sizes`); rule='official' with num_heads ×
          head_dim != width.
    """
    common.check_no_pre_logits(cfg, 'scala.subnet')
    common.check_choice('subnet', 'rule', rule, RULES)
    params = common.stacked(params, 'scala.subnet')
    n = sizes(cfg, ratio)
    block_side = _side(side, ratio, smallest)
    if rule == 'clean':
        return layout.slice_tree(params, n, side=block_side), subnet_config(cfg, ratio)
    return _official(params, cfg, ratio, n, block_side, smallest, side)


def subnet_config(cfg: ViTConfig, ratio: float, *, rule: str = 'clean') -> ViTConfig:
    """The config that `subnet(params, cfg, ratio, rule=rule)` returns (no params needed).

    Args:
        cfg: the full network's config.
        ratio: the width ratio r.
        rule: 'clean' or 'official' (`RULES`); 'official' also sets the full network's attention
          scale and LayerNorm eps 1e-5.

    Returns:
        The sub-network's config.

    Raises:
        GeneError: `rule` is not one of `RULES`, or r gives no whole sub-network (`sizes`).
    """
    common.check_choice('subnet_config', 'rule', rule, RULES)
    n = sizes(cfg, ratio)
    if rule == 'clean':
        return layout.slice_config(cfg, n)
    sub_cfg = layout.slice_config(cfg, {'embed': n['embed'], 'mlp': n['mlp'],
                                        'head_dim': n['embed'] // cfg.num_heads})
    scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim ** -0.5
    return sub_cfg.replace(attn_scale=scale, ln_eps=OFFICIAL_LN_EPS)


def subnet_configs(cfg: ViTConfig, grid: Sequence[float], *,
                   rule: str = 'clean') -> tuple[tuple[float, ViTConfig], ...]:
    """The sub-networks one slimmable network of `cfg` holds on `grid`.

    These are the models a trained Scala network stands in for, so its cost is shared by
    `len(grid)` of them (X = 13 on the 1/16 grid from 1/4).

    Args:
        cfg: the full network's config.
        grid: the width grid (`width_grid`).
        rule: the slicing rule (`subnet_config`).

    Returns:
        `((ratio, sub-network config), ...)`, smallest first.

    Raises:
        GeneError: `grid` is not a valid width grid, `rule` is not one of `RULES`, or a ratio gives
          no whole sub-network (the first such one is named).
    """
    return tuple((r, subnet_config(cfg, r, rule=rule)) for r in _check_grid(grid))


def _official(params, cfg, ratio, n, block_side, smallest, side):
    """The official rule (module docstring)."""
    if cfg.attn_width != cfg.width:
        raise GeneError(f"rule='official' slices timm's fused qkv (D → 3D) and needs num_heads × "
                        f'head_dim = width; got {cfg.num_heads} × {cfg.head_dim} != {cfg.width}')
    d, heads = n['embed'], cfg.num_heads
    if side is None and cfg.distill_token:
        outer_side = 'left' if any(math.isclose(ratio, r) for r in OFFICIAL_DISTILLED_LEFT) else 'right'
    else:
        outer_side = block_side
    embed = {'embed': d}
    outer = {k: v for k, v in params.items() if k in OUTER_KEYS}
    blocks = {k: v for k, v in params['blocks'].items() if k != 'attn'}
    sub = {**layout.slice_tree(outer, embed, side=outer_side),
           **layout.slice_tree({'patch_embed': params['patch_embed']}, embed, side=block_side),
           'blocks': {**layout.slice_tree({'blocks': blocks}, {'embed': d, 'mlp': n['mlp']},
                                          side=block_side)['blocks'],
                      'attn': _official_attention(params['blocks']['attn'], d, heads, block_side)}}
    return sub, subnet_config(cfg, ratio, rule='official')


def _cut(x, axis: int, n: int, side: str):
    start = 0 if side == 'left' else x.shape[axis] - n
    return jax.lax.slice_in_dim(x, start, start + n, axis=axis)


def _official_attention(attn: Params, d: int, heads: int, side: str) -> Params:
    """Stacked q/k/v/out of the official slice: the fused (D, 3·H·Dh) qkv output cut to one
    block of 3d, read as (3, H, d/H); the out kernel's flattened input cut to d."""
    layers, width = attn['q']['kernel'].shape[:2]
    fused = jnp.stack([attn[p]['kernel'] for p in 'qkv'], axis=2).reshape(layers, width, -1)
    fused = _cut(_cut(fused, 1, d, side), 2, 3 * d, side).reshape(layers, d, 3, heads, d // heads)
    out = {p: {'kernel': fused[:, :, i]} for i, p in enumerate('qkv')}
    if 'bias' in attn['q']:
        bias = jnp.stack([attn[p]['bias'] for p in 'qkv'], axis=1).reshape(layers, -1)
        bias = _cut(bias, 1, 3 * d, side).reshape(layers, 3, heads, d // heads)
        for i, p in enumerate('qkv'):
            out[p]['bias'] = bias[:, i]
    o = attn['out']['kernel'].reshape(layers, -1, width)
    out['out'] = {'kernel': _cut(_cut(o, 1, d, side), 2, d, side).reshape(layers, heads, d // heads, d),
                  'bias': _cut(attn['out']['bias'], 1, d, side)}
    return out


# ----------------------------------------------------------------------------------------
# The masked variant of the clean rule.

def unit_masks(cfg: ViTConfig, ratio, *, smallest: float = 0.25,
               side: str | None = None) -> dict[str, jax.Array]:
    """The units of the clean rule's width-`ratio` sub-network, as masks for `masked_apply`.

    Args:
        cfg: the full network's config.
        ratio: the width ratio r, a Python number or a traced scalar (one program for every
          width); a traced ratio's counts are rounded and unchecked.
        smallest: the grid's smallest ratio s (isolated activation, `is_left`).
        side: 'left' or 'right' for every axis, overriding isolated activation.

    Returns:
        float32 0/1 masks by axis, 'embed' (D,), 'mlp' (M,) and 'head_dim' (Dh,).

    Raises:
        GeneError: `side` not one of `SIDES` (for any ratio); for a Python-number `ratio`, as
          `sizes`.
    """
    if side is not None:
        common.check_choice('unit_masks', 'side', side, SIDES)
    if isinstance(ratio, (int, float)):
        counts = sizes(cfg, ratio)
        left = _side(side, ratio, smallest) == 'left'
    else:
        counts = {a: jnp.round(ratio * n).astype(jnp.int32)
                  for a, n in (('embed', cfg.width), ('mlp', cfg.mlp_dim), ('head_dim', cfg.head_dim))}
        left = ((jnp.isclose(ratio, smallest) | jnp.isclose(ratio, 1.0)) if side is None
                else side == 'left')
    full = {'embed': cfg.width, 'mlp': cfg.mlp_dim, 'head_dim': cfg.head_dim}
    masks = {}
    for axis, size in full.items():
        i = jnp.arange(size)
        masks[axis] = jnp.where(left, i < counts[axis], i >= size - counts[axis]).astype(jnp.float32)
    return masks


def ffn_masks(cfg: ViTConfig, mlp_ratios: float | Sequence[float]) -> dict[str, jax.Array]:
    """Masks of MatFormer's sub-network (`ffn_subnet`): the first r·M MLP units of each layer.

    Args:
        cfg: the full network's config.
        mlp_ratios: one FFN ratio for all layers, or one per layer (`cfg.depth` of them).

    Returns:
        float32 0/1 masks by axis, 'embed' (D,) and 'head_dim' (Dh,) all ones, 'mlp' (L, M) per
        layer (a single ratio repeated over the layers).

    Raises:
        GeneError: a per-layer sequence not of length `cfg.depth`, or a ratio outside (0, 1] or
          whose r·M is not whole.
    """
    ratios = [mlp_ratios] * cfg.depth if isinstance(mlp_ratios, (int, float)) else list(mlp_ratios)
    if len(ratios) != cfg.depth:
        raise GeneError(f'ffn_masks: {len(ratios)} per-layer ratios for depth {cfg.depth}')
    counts = jnp.asarray([_count(r, cfg.mlp_dim, 'mlp_dim') for r in ratios])
    return {'embed': jnp.ones((cfg.width,), jnp.float32),
            'head_dim': jnp.ones((cfg.head_dim,), jnp.float32),
            'mlp': (jnp.arange(cfg.mlp_dim)[None, :] < counts[:, None]).astype(jnp.float32)}


def mask_params(params: Params, masks: dict[str, jax.Array]) -> Params:
    """Full-shape stacked params with every unit outside `masks` zeroed, by logical axis.

    Args:
        params: stacked params.
        masks: 0/1 masks by logical axis (`unit_masks`, `ffn_masks`); a 1-D mask applies to every
          leaf with that axis, a 2-D mask `(L, n)` is per layer, its first axis on 'layers'.

    Returns:
        `params` with each leaf multiplied by its axes' masks (in the leaf's dtype).
    """
    def zero(path, x):
        names = layout.leaf_axes(pytree.path_str(path), np.ndim(x))
        for dim, axis in enumerate(names):
            if axis in masks:
                m = masks[axis]
                shape = [1] * np.ndim(x)
                shape[dim] = x.shape[dim]
                if np.ndim(m) == 2:
                    shape[names.index('layers')] = m.shape[0]
                x = x * m.reshape(shape).astype(x.dtype)
        return x
    return jax.tree_util.tree_map_with_path(zero, params)


def _masked_norm(x, p, mask, eps):
    """LayerNorm over the active channels only (inactive ones stay zero)."""
    x32 = x.astype(jnp.float32)
    n = mask.sum()
    mean = (x32 * mask).sum(-1, keepdims=True) / n
    centred = (x32 - mean) * mask
    var = jnp.square(centred).sum(-1, keepdims=True) / n
    return (centred * jax.lax.rsqrt(var + eps) * p['scale'] + p['bias'] * mask).astype(x.dtype)


def masked_apply(params: Params, images: jax.Array, cfg: ViTConfig,
                 masks: dict[str, jax.Array]) -> tuple[jax.Array, dict]:
    """The clean-rule sub-network of `masks`, run at full shapes.

    Equal to `vit.apply(*subnet(params, cfg, r), ...)` (or `ffn_subnet`'s) up to float
    rounding, in one program for every width when the masks are traced. Evaluation mode (no
    dropout or stochastic depth); LayerNorm statistics over the active channels only.

    Args:
        params: the full network's params (list-layout blocks are stacked).
        images: a batch of images, as `vit.apply` takes them.
        cfg: the full network's config; its `attn_scale` (None: (active head_dim)^-1/2) and
          `ln_eps` are used.
        masks: `unit_masks`, or MatFormer's `ffn_masks`.

    Returns:
        `(logits, aux)` like `vit.apply`, float32 logits `(batch, num_classes)` (the two heads'
        mean with a distillation token); aux 'pre_logits', and with a distillation token
        'logits_cls' / 'logits_dist'. Without a head, `(pre-logits features, aux)`.

    Raises:
        GeneError: list-layout blocks that differ in shape.
    """
    params = mask_params(common.stacked(params, 'scala.masked_apply'), masks)
    emask = masks['embed']
    scale = (cfg.attn_scale if cfg.attn_scale is not None
             else jax.lax.rsqrt(masks['head_dim'].sum()))
    x = vit.embed(params, images, cfg)

    def block(h, p):
        y, _ = vit.attention(p['attn'], _masked_norm(h, p['norm1'], emask, cfg.ln_eps),
                             precision=cfg.dense_precision, scale=scale)
        h = h + y * (p['ls1']['scale'] if 'ls1' in p else 1.0)
        y = vit.mlp(p['mlp'], _masked_norm(h, p['norm2'], emask, cfg.ln_eps), cfg.gelu,
                    cfg.dense_precision)
        return h + y * (p['ls2']['scale'] if 'ls2' in p else 1.0), None

    x, _ = jax.lax.scan(block, x, params['blocks'])
    n_prefix = cfg.num_prefix_tokens
    if cfg.pool == 'cls':
        feats = _masked_norm(x[:, 0], params['norm'], emask, cfg.ln_eps)
    elif cfg.pool_norm == 'after':
        feats = _masked_norm(x[:, n_prefix:].mean(1), params['norm'], emask, cfg.ln_eps)
    else:
        feats = _masked_norm(x[:, n_prefix:], params['norm'], emask, cfg.ln_eps).mean(1)
    aux = {'pre_logits': feats}
    if 'head' not in params:
        return feats, aux
    head = lambda f, h: f @ h['kernel'] + h['bias']   # noqa: E731
    logits = head(feats, params['head'])
    if 'head_dist' in params:
        dist = head(_masked_norm(x[:, int('cls_token' in params)], params['norm'], emask, cfg.ln_eps),
                    params['head_dist'])
        aux['logits_cls'], aux['logits_dist'] = logits, dist
        logits = (logits + dist) / 2
    return logits.astype(jnp.float32), aux


# ----------------------------------------------------------------------------------------
# MatFormer: nested FFN widths.

def ffn_subnet(params: Params, cfg: ViTConfig,
               mlp_ratios: float | Sequence[float]) -> tuple[Params, ViTConfig]:
    """MatFormer's sub-network: the first r·M MLP units of every layer or of each layer.

    Attention, embeddings and heads are kept whole.

    Args:
        params: the full network's params (either layout).
        cfg: its config.
        mlp_ratios: one FFN ratio r for all layers, or one per layer (Mix'n'Match).

    Returns:
        `(sub_params, sub_cfg)`. With per-layer ratios the blocks come in the list layout and
        `sub_cfg.mlp_dim` is the largest layer's (`vit.apply` reads every block's shape from the
        params).

    Raises:
        GeneError: list-layout blocks that differ in shape; a per-layer sequence not of length
          `cfg.depth`; a ratio outside (0, 1] or whose r·M is not whole.
    """
    params = common.stacked(params, 'scala.ffn_subnet')
    if isinstance(mlp_ratios, (int, float)):
        m = _count(mlp_ratios, cfg.mlp_dim, 'mlp_dim')
        return layout.slice_tree(params, {'mlp': m}), cfg.replace(mlp_dim=m)
    if len(mlp_ratios) != cfg.depth:
        raise GeneError(f'ffn_subnet: {len(mlp_ratios)} per-layer ratios for depth {cfg.depth}')
    ms = [_count(r, cfg.mlp_dim, 'mlp_dim') for r in mlp_ratios]
    blocks = layout.unstack_blocks(params)['blocks']
    sub = dict(params, blocks=[layout.slice_tree({'blocks': [b]}, {'mlp': m})['blocks'][0]
                               for b, m in zip(blocks, ms)])
    return sub, cfg.replace(mlp_dim=max(ms))


def mix_n_match(ratio: float, granularities: Sequence[float], depth: int) -> tuple[float, ...]:
    """Per-layer FFN ratios from the trained `granularities` whose mean is closest to `ratio`.

    MatFormer's heuristic: the two granularities around it, the smaller in the first layers
    and the larger in the last (non-decreasing with depth).

    Args:
        ratio: the wanted mean FFN ratio.
        granularities: the FFN ratios the network was trained at.
        depth: the number of layers.

    Returns:
        `depth` ratios; all equal to `ratio` where it is a trained granularity.

    Raises:
        GeneError: `granularities` is empty, or `ratio` lies outside their range.
    """
    gs = sorted(float(g) for g in granularities)
    if not gs:
        raise GeneError(f'mix_n_match: no trained granularities to mix for ratio {ratio}')
    if not gs[0] <= ratio <= gs[-1]:
        raise GeneError(f'mix_n_match: ratio {ratio} lies outside the trained granularities {gs}')
    if ratio in gs:
        return (float(ratio),) * depth
    lo = max(g for g in gs if g < ratio)
    hi = min(g for g in gs if g > ratio)
    n_hi = int(round((ratio - lo) / (hi - lo) * depth))
    return (lo,) * (depth - n_hi) + (hi,) * n_hi


# ----------------------------------------------------------------------------------------
# The methods on the contract.

def _source_config(gene: Params, target_cfg: ViTConfig, what: str) -> ViTConfig:
    """The full (gene) network's config: the target's numerics with the gene's shapes."""
    gene = common.stacked(gene, what)
    q = gene['blocks']['attn']['q']['kernel']
    width, heads, head_dim = q.shape[1:]
    mlp = gene['blocks']['mlp']['fc1']['kernel'].shape[-1]
    if layout.depth_of(gene) != target_cfg.depth:
        raise GeneError(f'{what}: the gene has {layout.depth_of(gene)} layers; depth is never '
                        f'sliced, so the target needs depth={layout.depth_of(gene)} '
                        f'(got {target_cfg.depth})')
    return target_cfg.replace(width=int(width), num_heads=int(heads), head_dim=int(head_dim),
                              mlp_dim=int(mlp), attn_scale=None)


def _ratio(target: int, full: int, what: str) -> float:
    if not 0 < target <= full:
        raise GeneError(f'{what}: a target width {target} is not a slice of the gene width {full}')
    return target / full


def _check_sub(sub_cfg: ViTConfig, target_cfg: ViTConfig, what: str) -> None:
    for f in ('width', 'num_heads', 'head_dim', 'mlp_dim'):
        if getattr(sub_cfg, f) != getattr(target_cfg, f):
            raise GeneError(f'{what}: the sub-network of width {sub_cfg.width} has {f}='
                            f'{getattr(sub_cfg, f)} but the target config has {getattr(target_cfg, f)}')


def _check_classes(gene: Params, target_cfg: ViTConfig, what: str) -> None:
    """The gene's head (which the sub-network keeps) has `target_cfg.num_classes` classes."""
    k = int(np.shape(gene['head']['bias'])[0]) if 'head' in gene else 0
    if k != target_cfg.num_classes:
        got = f"the gene's head has {k} classes" if k else 'the gene has no head'
        raise GeneError(f'{what}: {got} but the target config has num_classes='
                        f"{target_cfg.num_classes}; the sub-network keeps the gene's head")


def descend(gene: Params, target_cfg: ViTConfig, *, key=None, rule: str = 'clean',
            smallest: float = 0.25, side: str | None = None) -> Params:
    """The slimmable `gene`'s sub-network of `target_cfg`'s width, by `subnet`.

    Run it with `subnet`'s config for rule='official' (full attention scale, eps 1e-5).

    Args:
        gene: the full slimmable network's params (either layout).
        target_cfg: the descendant's config; its width / the gene's width is the ratio r; its
          depth and heads must be the gene's, its head size and MLP width r times the gene's.
        key: unused (nothing is drawn).
        rule: the slicing rule (`subnet`).
        smallest: the grid's smallest ratio s (isolated activation).
        side: 'left' or 'right' for every parameter, overriding isolated activation.

    Returns:
        The sub-network's params (stacked layout).

    Raises:
        GeneError: the depths differ; the target width is not in (0, gene width]; as `subnet`;
          the sub-network's width, heads, head size or MLP width is not the target's; or the
          gene's head has another class count than `target_cfg.num_classes` (none: 0).
    """
    del key
    return _sub_network(gene, target_cfg, rule=rule, smallest=smallest, side=side, where='scala.descend')


def _sub_network(gene: Params, target_cfg: ViTConfig, *, rule: str, smallest: float, side: str | None,
                 where: str) -> Params:
    """`descend`'s work, its errors naming the method `where` ('us_net.descend')."""
    full = _source_config(gene, target_cfg, where)
    _check_classes(gene, target_cfg, where)
    ratio = _ratio(target_cfg.width, full.width, where)
    sub, sub_cfg = subnet(gene, full, ratio, rule=rule, smallest=smallest, side=side)
    _check_sub(sub_cfg, target_cfg, where)
    return sub


def descend_us_net(gene: Params, target_cfg: ViTConfig, *, key=None) -> Params:
    """US-Net's sub-network of the target's width: the left block at every width.

    Args:
        gene: the full slimmable network's params (either layout).
        target_cfg: the descendant's config (as `descend`).
        key: unused (nothing is drawn).

    Returns:
        The sub-network's params (stacked layout).

    Raises:
        GeneError: as `descend`.
    """
    del key
    return _sub_network(gene, target_cfg, rule='clean', smallest=0.25, side='left', where='us_net.descend')


def descend_matformer(gene: Params, target_cfg: ViTConfig, *, key=None) -> Params:
    """MatFormer's nested FFN of `target_cfg.mlp_dim` (width and heads as the gene's).

    Args:
        gene: the full network's params (either layout).
        target_cfg: the descendant's config; all but `mlp_dim` as the gene's.
        key: unused (nothing is drawn).

    Returns:
        The sub-network's params (stacked layout), the first `target_cfg.mlp_dim` MLP units of
        every layer.

    Raises:
        GeneError: the depth, width, heads, head size or class count (of the gene's head; none:
          0) differs from the gene's, or `target_cfg.mlp_dim` is not in (0, gene mlp_dim].
    """
    del key
    full = _source_config(gene, target_cfg, 'matformer.descend')
    _check_classes(gene, target_cfg, 'matformer.descend')
    if target_cfg.width != full.width or target_cfg.num_heads != full.num_heads:
        raise GeneError(f'matformer.descend: only the FFN is nested; the target needs the gene '
                        f'width {full.width} and {full.num_heads} heads (got {target_cfg.width}, '
                        f'{target_cfg.num_heads})')
    sub, sub_cfg = ffn_subnet(gene, full, _ratio(target_cfg.mlp_dim, full.mlp_dim, 'matformer.descend'))
    _check_sub(sub_cfg, target_cfg, 'matformer.descend')
    return sub


def init_gene(cfg: ViTConfig, key: jax.Array) -> Params:
    """The full slimmable network, freshly initialised (`vit.init`).

    Args:
        cfg: the full network's config.
        key: a PRNG key.

    Returns:
        Its params (stacked layout).
    """
    return vit.init(cfg, key)


def _materializer(descend_fn):
    def materialize(trainable: Params, frozen: Any, cfg: ViTConfig) -> Params:
        """The sub-network of `cfg` run while the slimmable network learns (identity at the
        full width)."""
        del frozen
        return descend_fn(trainable, cfg)
    return materialize


def gene_param_count(gene: Params, *, include_head: bool = False) -> int:
    """Every parameter of the slimmable network (all sub-networks live in it).

    Args:
        gene: the full network's params.
        include_head: also count the classifier (`common.HEAD_KEYS`).

    Returns:
        The number of parameters.
    """
    return common.count(gene, include_head=include_head)


# The gene is the whole slimmable network (every sub-network lives in it).
GENE_PARTS = common.model_parts(blocks=('tree', 'layers'))

# ----------------------------------------------------------------------------------------
# Loss functions that train one slimmable ViT at several widths per step, for the generic
# trainer (`trainer.fit(loss_fn, params, ...)`, `loss_fn(params, batch, rng) -> (loss,
# metrics)`, as in `tasks`): Scala, US-Net's sandwich rule and MatFormer's nested FFNs.
#
# All of them run every width on the same batch and return the sum of the widths' losses, so
# one optimiser step follows the summed gradients (the official codes' accumulated
# backward passes). The widths of a step are drawn from the step's key, which the trainer
# derives from the run's seed and the step number: a resumed run and every host draw the same
# widths. Each width is a real sliced sub-network (`genes.scala.subnet`); a drawn width picks
# one branch of a `lax.switch` over the grid's widths, so the step is one compiled program
# whose cost is that of the four widths it runs.
#
# * `scala_loss`: the full network (labels, or DeiT hard distillation from an external
#   `teacher`), then one width of the upper and one of the lower half of the grid (stable
#   sampling) and the smallest: progressive knowledge transfer (each sub-network distils
#   from the next larger one of the step, detached; KL at temperature 1 averaged over the
#   batch, on the distillation head when the model has one) plus noise calibration (λ × CE
#   on the labels, on the class head).
# * `full_loss`: the full network alone, Scala's warm-up (the official first 10 epochs, at
#   half the learning rate): the experiment runs it as a first stage.
# * `usnet_loss`: the sandwich rule: the full width on the labels, the smallest and two
#   widths drawn uniformly from the grid's interior distilled in place from the full
#   network (soft-target CE, no label term), all left-aligned.
# * `matformer_loss`: every FFN granularity each step, equal-weight CE, no distillation.

TRANSFERS = ('progressive', 'us')
DISTILLS = ('soft', 'hard')
Teacher = tuple[Any, ViTConfig]   # (params, config) of a frozen external teacher


def _choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise GeneError(f'{name}={value!r}; expected one of {tuple(choices)}')


def _targets(batch):
    return batch['label_soft'] if 'label_soft' in batch else batch['label']


def _heads(params, images, cfg: ViTConfig, rng):
    """(class-head logits, distillation-head logits) in training mode; the same logits
    twice without a distillation token."""
    logits, aux = vit.apply(params, images, cfg, train=True, rng=rng)
    if 'logits_dist' in aux:
        return aux['logits_cls'], aux['logits_dist']
    return logits, logits


def width_forward(cfg: ViTConfig, ratio: float, *, rule: str = 'clean', smallest: float = 0.25,
                  side: str | None = None) -> Callable:
    """The forward of the width-`ratio` sub-network (`subnet`) in training mode.

    Args:
        cfg: the full network's config.
        ratio: the width ratio r.
        rule: the slicing rule (`subnet`).
        smallest: the grid's smallest ratio s (isolated activation).
        side: 'left' or 'right' for every parameter, overriding isolated activation.

    Returns:
        `run(params, images, rng) -> (cls logits, distillation logits)`, the same logits twice
        without a distillation token; it raises `subnet`'s errors when called.
    """
    def run(params, images, rng):
        sub, sub_cfg = subnet(params, cfg, ratio, rule=rule, smallest=smallest, side=side)
        return _heads(sub, images, sub_cfg, rng)
    return run


def _switch(index, ratios, make, params, images, rng):
    """The forward of ratios[index] (`make(ratio)`), one `lax.switch` branch per ratio."""
    if len(ratios) == 1:
        return make(ratios[0])(params, images, rng)
    return jax.lax.switch(index, [make(r) for r in ratios], params, images, rng)


def _full_term(ce_logits, kd_logits, batch, teacher: Teacher | None, alpha: float,
               label_smoothing: float, distilled: bool):
    """The full network's loss: DeiT hard distillation from `teacher`, else CE (on both
    heads, averaged, with a distillation token)."""
    targets = _targets(batch)
    if teacher is not None:
        t_params, t_cfg = teacher
        t_logits = jax.lax.stop_gradient(vit.apply(t_params, batch['image'], t_cfg)[0])
        return losses.hard_distillation(ce_logits, t_logits, targets, alpha=alpha,
                                        label_smoothing=label_smoothing,
                                        student_dist_logits=kd_logits if distilled else None)
    ce = losses.cross_entropy(ce_logits, targets, label_smoothing=label_smoothing)
    if distilled:
        ce = (ce + losses.cross_entropy(kd_logits, targets, label_smoothing=label_smoothing)) / 2
    return ce


def full_loss(cfg: ViTConfig, *, rule: str = 'clean', teacher: Teacher | None = None,
              alpha: float = 0.5, label_smoothing: float = 0.0) -> Callable:
    """The full network alone (Scala's warm-up): the same loss as `scala_loss`'s full term.

    Args:
        cfg: the slimmable network's config.
        rule: the slicing rule (`subnet`).
        teacher: (params, cfg) of a frozen external model for DeiT hard distillation; None:
          cross-entropy on the labels (both heads averaged with a distillation token).
        alpha: the DeiT distillation weight, with `teacher`.
        label_smoothing: of the cross-entropy terms.

    Returns:
        `loss_fn(params, batch, rng) -> (loss, metrics)` for the trainer, with a hashable `key`
        naming it (None with an external teacher); metrics hold the accuracy.

    Raises:
        GeneError: `rule` is not one of `RULES`.
    """
    _choice('rule', rule, RULES)
    forward = width_forward(cfg, 1.0, rule=rule)

    def loss_fn(params, batch, rng):
        ce_logits, kd_logits = forward(params, batch['image'], rng)
        loss = _full_term(ce_logits, kd_logits, batch, teacher, alpha, label_smoothing,
                          cfg.distill_token)
        return loss, {'accuracy': losses.accuracy(ce_logits, batch['label'])}
    loss_fn.key = None if teacher is not None else (
        'scala.full_loss', cfg, rule, float(alpha), float(label_smoothing))
    return loss_fn


def scala_loss(cfg: ViTConfig, grid: Sequence[float], *, rule: str = 'clean',
               ce_weight: float = 1.0, transfer: str = 'progressive', distill: str = 'soft',
               isolated: bool = True, teacher: Teacher | None = None, alpha: float = 0.5,
               label_smoothing: float = 0.0) -> Callable:
    """Scala's loss: L_full + Σ_k [KD(teacher_k → k) + ce_weight · CE(k, labels)] over the
    upper, lower and smallest sub-networks of the step (module docstring).

    Args:
        cfg: the slimmable network's config.
        grid: the width grid (`width_grid`), its first entry the smallest ratio s.
        rule: the slicing rule (`subnet`).
        ce_weight: the weight of the sub-networks' cross-entropy (0 drops noise calibration).
        transfer: 'progressive' (each width distils from the next larger) or 'us' (every
          width from the full network, the paper's ablation).
        distill: 'soft' (KL) or 'hard' (cross-entropy to the teacher's argmax).
        isolated: slice by isolated activation (False: every width on the left).
        teacher: (params, cfg) of a frozen external model for the full network's DeiT hard
          distillation.
        alpha: the DeiT distillation weight of the full network's loss, with `teacher`.
        label_smoothing: of the cross-entropy terms.

    Returns:
        `loss_fn(params, batch, rng) -> (loss, metrics)` for the trainer, with a hashable
        `key` naming it (None with an external teacher); metrics: the four terms, the drawn
        ratios and the full network's accuracy.

    Raises:
        GeneError: `rule`, `transfer` or `distill` is not one of its choices, or `grid` is not
          a valid width grid or a stable half is empty (`stable_halves`).
    """
    _choice('rule', rule, RULES)
    _choice('transfer', transfer, TRANSFERS)
    _choice('distill', distill, DISTILLS)
    grid = tuple(float(r) for r in grid)
    upper, lower = stable_halves(grid)
    smallest = grid[0]
    side = None if isolated else 'left'

    def make(ratio):
        return width_forward(cfg, ratio, rule=rule, smallest=smallest, side=side)

    def kd(student, teacher_logits):
        if distill == 'hard':
            return losses.cross_entropy(student, jnp.argmax(jax.lax.stop_gradient(teacher_logits), -1))
        return losses.kl_per_example(student, teacher_logits).mean()

    def loss_fn(params, batch, rng):
        images, targets = batch['image'], _targets(batch)
        k_widths, k_full, k_up, k_low, k_small = jax.random.split(rng, 5)
        i_up, i_low = sample_widths(k_widths, grid)
        ce_full, kd_full = make(1.0)(params, images, k_full)
        total = _full_term(ce_full, kd_full, batch, teacher, alpha, label_smoothing,
                           cfg.distill_token)
        metrics = {'loss_full': total, 'accuracy': losses.accuracy(ce_full, batch['label']),
                   'ratio_upper': jnp.asarray(upper)[i_up], 'ratio_lower': jnp.asarray(lower)[i_low]}
        teacher_logits = kd_full
        runs = (('upper', i_up, upper, k_up), ('lower', i_low, lower, k_low),
                ('smallest', 0, (smallest,), k_small))
        for name, index, ratios, key in runs:
            ce_logits, kd_logits = _switch(index, ratios, make, params, images, key)
            term = kd(kd_logits, teacher_logits) + ce_weight * losses.cross_entropy(
                ce_logits, targets, label_smoothing=label_smoothing)
            metrics[f'loss_{name}'] = term
            total = total + term
            if transfer == 'progressive':
                teacher_logits = kd_logits
        return total, metrics
    loss_fn.key = None if teacher is not None else (
        'scala.scala_loss', cfg, grid, rule, float(ce_weight), transfer, distill, bool(isolated),
        float(alpha), float(label_smoothing))
    return loss_fn


def usnet_loss(cfg: ViTConfig, grid: Sequence[float], *, label_smoothing: float = 0.0) -> Callable:
    """US-Net's sandwich rule with in-place distillation.

    The full width trains on the labels; the smallest and two widths drawn uniformly from the
    grid's interior train only on the detached softmax of the full width (soft-target CE);
    every width is left-aligned.

    Args:
        cfg: the slimmable network's config.
        grid: the width grid (`width_grid`), its first entry the smallest ratio; it needs a
          ratio strictly between its ends (checked when `loss_fn` is traced).
        label_smoothing: of the full width's cross-entropy.

    Returns:
        `loss_fn(params, batch, rng) -> (loss, metrics)` for the trainer, with a hashable `key`
        naming it; metrics: 'loss_full', 'accuracy', 'loss_width0' to 'loss_width2' (the two
        drawn widths, then the smallest) and the drawn ratios 'ratio_a', 'ratio_b'.
    """
    grid = tuple(float(r) for r in grid)
    interior, smallest = grid[1:-1], grid[0]

    def make(ratio):
        return width_forward(cfg, ratio, smallest=smallest, side='left')

    def loss_fn(params, batch, rng):
        images = batch['image']
        k_widths, k_full, *k_sub = jax.random.split(rng, 5)
        picks = sample_interior(k_widths, grid, 2)
        logits_full, _ = make(1.0)(params, images, k_full)
        total = losses.cross_entropy(logits_full, _targets(batch), label_smoothing=label_smoothing)
        soft = jax.nn.softmax(jax.lax.stop_gradient(logits_full.astype(jnp.float32)), -1)
        metrics = {'loss_full': total, 'accuracy': losses.accuracy(logits_full, batch['label'])}
        for i, (index, ratios) in enumerate(((picks[0], interior), (picks[1], interior),
                                             (0, (smallest,)))):
            logits, _ = _switch(index, ratios, make, params, images, k_sub[i])
            term = losses.cross_entropy(logits, soft)
            metrics[f'loss_width{i}'] = term
            total = total + term
        metrics['ratio_a'], metrics['ratio_b'] = jnp.asarray(interior)[picks[0]], jnp.asarray(interior)[picks[1]]
        return total, metrics
    loss_fn.key = ('scala.usnet_loss', cfg, grid, float(label_smoothing))
    return loss_fn


def matformer_loss(cfg: ViTConfig, granularities: Sequence[float] = (0.25, 0.5, 0.75, 1.0), *,
                   label_smoothing: float = 0.0) -> Callable:
    """MatFormer: the nested FFN at every granularity on the same batch, CE on the labels, summed.

    Args:
        cfg: the full network's config.
        granularities: the FFN ratios (of the MLP width) trained at every step.
        label_smoothing: of the cross-entropy terms.

    Returns:
        `loss_fn(params, batch, rng) -> (loss, metrics)` for the trainer, with a hashable `key`
        naming it; metrics: 'loss_ffn{g}' per granularity and the largest one's 'accuracy'.
    """
    granularities = tuple(float(g) for g in granularities)

    def loss_fn(params, batch, rng):
        targets, total, metrics = _targets(batch), 0.0, {}
        for g, key in zip(granularities, jax.random.split(rng, len(granularities))):
            sub, sub_cfg = ffn_subnet(params, cfg, g)
            ce_logits, _ = _heads(sub, batch['image'], sub_cfg, key)
            term = losses.cross_entropy(ce_logits, targets, label_smoothing=label_smoothing)
            metrics[f'loss_ffn{g:g}'] = term
            total = total + term
            if g == max(granularities):
                metrics['accuracy'] = losses.accuracy(ce_logits, batch['label'])
        return total, metrics
    loss_fn.key = ('scala.matformer_loss', cfg, granularities, float(label_smoothing))
    return loss_fn


# ----------------------------------------------------------------------------------------
# How each slimmable network trains (`common.Slimmable`), and the registered methods.

def scala_plan(grid: Sequence[float], warmup: int, steps: int) -> tuple[tuple[float, float], ...]:
    """The forward-backward passes per width of a Scala run, for its training FLOPs.

    Args:
        grid: the width grid (`width_grid`).
        warmup: steps of the full-width warm-up.
        steps: steps of the main run.

    Returns:
        `((ratio, passes), ...)`, the full width `warmup + steps`, the smallest `steps`, each
        width of a stable half `steps / len(half)` (one per step, spread evenly).

    Raises:
        GeneError: as `stable_halves`.
    """
    upper, lower = stable_halves(grid)
    return ((1.0, warmup + steps), (grid[0], steps), *((r, steps / len(upper)) for r in upper),
            *((r, steps / len(lower)) for r in lower))


def usnet_plan(grid: Sequence[float], warmup: int, steps: int) -> tuple[tuple[float, float], ...]:
    """The forward-backward passes per width of a US-Net run, for its training FLOPs.

    Args:
        grid: the width grid (`width_grid`).
        warmup: steps of the full-width warm-up.
        steps: steps of the main run.

    Returns:
        `((ratio, passes), ...)`, the full width `warmup + steps`, the smallest `steps`, each
        interior width `2 * steps / len(interior)` (two drawn uniformly per step).

    Raises:
        GeneError: as `sample_interior` (an invalid grid, or no width strictly between its
          ends), which `usnet_loss` runs.
    """
    interior = _interior(grid)
    return ((1.0, warmup + steps), (grid[0], steps), *((r, 2 * steps / len(interior)) for r in interior))


def matformer_plan(grid: Sequence[float], warmup: int, steps: int) -> tuple[tuple[float, float], ...]:
    """The forward-backward passes per FFN ratio of a MatFormer run, for its training FLOPs.

    Args:
        grid: the FFN ratios trained.
        warmup: steps of the full-width warm-up.
        steps: steps of the main run.

    Returns:
        `((ratio, passes), ...)`, every ratio `steps`, plus `warmup` for the ratio 1.0.
    """
    return tuple((r, steps + (warmup if r == 1.0 else 0)) for r in grid)


def _clean_only(rule: str, what: str) -> None:
    if rule != 'clean':
        raise GeneError(f"{what} slices by one rule, 'clean'; got rule={rule!r}")


def _usnet_loss(cfg: ViTConfig, grid: Sequence[float], *, rule: str = 'clean') -> Callable:
    _clean_only(rule, 'US-Net')
    return usnet_loss(cfg, grid)


def _matformer_loss(cfg: ViTConfig, grid: Sequence[float], *, rule: str = 'clean') -> Callable:
    _clean_only(rule, 'MatFormer')
    return matformer_loss(cfg, grid)


def matformer_subnet_config(cfg: ViTConfig, ratio: float, *, rule: str = 'clean') -> ViTConfig:
    """MatFormer's sub-network config at FFN ratio `ratio`: the width and heads kept, the
    first ratio·M MLP units.

    Args:
        cfg: the full network's config.
        ratio: the FFN ratio r.
        rule: must be 'clean' (MatFormer slices by that rule only).

    Returns:
        `cfg` with `mlp_dim` = r·M.

    Raises:
        GeneError: `rule` is not 'clean', or r is not in (0, 1] or r·M is not whole.
    """
    _clean_only(rule, 'MatFormer')
    return cfg.replace(mlp_dim=_count(ratio, cfg.mlp_dim, 'mlp_dim'))


def _usnet_subnet_config(cfg: ViTConfig, ratio: float, *, rule: str = 'clean') -> ViTConfig:
    _clean_only(rule, 'US-Net')
    return subnet_config(cfg, ratio)


METHOD = common.register(common.Method(
    name='scala', label='Scala', source='learned', descend=descend,
    gene_param_count=gene_param_count, init_gene=init_gene, materialize=_materializer(descend),
    gene_parts=GENE_PARTS, family='slimmable',
    slimmable=common.Slimmable(grid=width_grid, loss=scala_loss, warmup_loss=full_loss,
                               subnet_config=subnet_config, plan=scala_plan,
                               loss_options=('ce_weight', 'transfer', 'isolated'))))
US_NET = common.register(common.Method(
    name='us_net', label='US-Net', source='learned', descend=descend_us_net,
    gene_param_count=gene_param_count, init_gene=init_gene,
    materialize=_materializer(descend_us_net), gene_parts=GENE_PARTS, family='slimmable',
    slimmable=common.Slimmable(grid=width_grid, loss=_usnet_loss, warmup_loss=full_loss,
                               subnet_config=_usnet_subnet_config, plan=usnet_plan)))
MATFORMER = common.register(common.Method(
    name='matformer', label='MatFormer', source='learned', descend=descend_matformer,
    gene_param_count=gene_param_count, init_gene=init_gene,
    materialize=_materializer(descend_matformer), gene_parts=GENE_PARTS, family='slimmable',
    slimmable=common.Slimmable(grid=width_grid, loss=_matformer_loss, warmup_loss=full_loss,
                               subnet_config=matformer_subnet_config, plan=matformer_plan)))
