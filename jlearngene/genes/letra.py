"""LeTra (Xia et al., NeurIPS 2024; official code "LeTs"): a small learngene, learnable width
matrices and depth coefficients, inside a wider and deeper Aux-Net; descendants of any width
and depth in between by selecting rows of the width matrices.

A **gene** is a plain pytree::

    {'learngene': <canonical params of the small ViT, without pos_embed>,
     'width':     {'embed': E, 'head': C, 'q': Q, 'k': K, 'v': V, 'mlp': M},
     'depth':     {module: {'weight': (n_sets, 2), 'bias': (n_sets, 2)}},
     'pos_embed': (1, T, D_a)}

* `learngene`: D_s wide, L_s layers (even), H_s heads of d_h, MLP M_s; patch embedding,
  final norm (timm's `fc_norm`), head, stacked blocks; a class token only when the config
  has one (the official learngene has none).
* `width`: only the new rows of each [I; F] expansion matrix. E (D_a−D_s, D_s) widens the
  residual stream everywhere (patch embedding, every LayerNorm, the q/k/v/fc1 inputs, the
  out/fc2 outputs, the final norm, the position-embedding channels it selects); C
  (D_a−D_s, D_s) widens the head's input only (not tied to E); Q, K, V (L_s, A_a−A_s, A_s)
  and M (L_s, M_a−M_s, M_s) hold one matrix per *learngene* layer j: Q_j, K_j, V_j widen
  the q/k/v outputs (V_j also the out projection's input), M_j the fc1 output and fc2 input.
  An entry without new rows is absent (the official code keeps None).
* `depth`: one coefficient set per pair of Aux layers (layers 2k and 2k+1 share it and
  their learngene pair, so they are identical), for the modules `MODULES`; `weight`
  multiplies kernels and LayerNorm γ, `bias` biases and β. Learngene layers form L_s/2
  pairs {2g, 2g+1}; coefficient set o (Aux layers 2o, 2o+1) combines pair
  g(o) = ⌊o·(L_s/2)/(L_a/2)⌋ (the official 8→16 table: Aux layers 4g..4g+3 use pair g).
* `pos_embed`: the Aux-Net's own position embedding (D_a channels).

With W an (in, out) kernel, the expansion appends rows and columns: In_F(W) = [W; F W],
Out_F(W) = [W, W Fᵀ]; In first, then Out, no rescaling (the official order). A layer of the
Aux-Net or of a descendant is Σ_t g_t · Ŵ_{2g+t}: the width-expanded layers of one pair,
combined with one coefficient set.

Stage 1: `materialize(gene, None, aux_cfg)` gives the Aux-Net's canonical params; `jax.grad`
through it trains the learngene, width matrices, depth coefficients and position embedding
(weight decay on the matrices only: `DECAY`). Stage 2: `descend(gene, target_cfg, ...)`
selects rows (`SELECTIONS`) and layers for any D_s ≤ D_d ≤ D_a in whole heads and any depth.
`jlearngene.interop.lets` reads and writes the official Aux-Net state dict.

`METHOD` is the registry's 'letra' entry; its S-Params exclude the head (learngene head and
C) by default.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.genes import common
from jlearngene.genes.common import GeneError
from jlearngene.models import vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
Gene = dict[str, Any]

# Modules with depth coefficients (official order), and the block leaves each one covers:
# leaf path -> (module, 'weight' | 'bias').
MODULES = ('norm1', 'q', 'k', 'v', 'out', 'norm2', 'fc1', 'fc2')
LEAF_MODULES = {
    'norm1/scale': ('norm1', 'weight'), 'norm1/bias': ('norm1', 'bias'),
    'attn/q/kernel': ('q', 'weight'), 'attn/q/bias': ('q', 'bias'),
    'attn/k/kernel': ('k', 'weight'), 'attn/k/bias': ('k', 'bias'),
    'attn/v/kernel': ('v', 'weight'), 'attn/v/bias': ('v', 'bias'),
    'attn/out/kernel': ('out', 'weight'), 'attn/out/bias': ('out', 'bias'),
    'norm2/scale': ('norm2', 'weight'), 'norm2/bias': ('norm2', 'bias'),
    'mlp/fc1/kernel': ('fc1', 'weight'), 'mlp/fc1/bias': ('fc1', 'bias'),
    'mlp/fc2/kernel': ('fc2', 'weight'), 'mlp/fc2/bias': ('fc2', 'bias'),
}
WIDTH_KEYS = ('embed', 'head', 'q', 'k', 'v', 'mlp')
SELECTIONS = ('continuous', 'step', 'random', 'random_wo', 'rank')
# A descendant's head: the contract's two, and the official code's for fewer classes.
HEADS = common.HEADS + ('truncate',)
STEP_RULES = ('authors', 'spread')
RANK_NORMS = ('l2', 'l1')
RANK_ORDERS = ('largest', 'smallest')
# Weight decay as the official recipe (timm: every 2-D tensor): the learngene's kernels and
# the width matrices; not biases, LayerNorms, depth coefficients or the position embedding.
DECAY = ('kernel', 'width/.*')
_HI = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------------------
# Sizes.

@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes a gene fixes: learngene (width, heads, head_dim, mlp, depth), Aux-Net
    (aux_width, aux_heads, aux_mlp) and the number of depth-coefficient sets."""
    width: int
    heads: int
    head_dim: int
    mlp: int
    depth: int
    aux_width: int
    aux_heads: int
    aux_mlp: int
    sets: int

    @property
    def pairs(self) -> int:
        """The learngene's layer pairs, L_s / 2."""
        return self.depth // 2

    @property
    def aux_depth(self) -> int:
        """The Aux-Net's depth, two layers per coefficient set."""
        return 2 * self.sets

    def pair_of_set(self) -> np.ndarray:
        """The learngene pair that each coefficient set combines.

        Returns:
            int array of shape `(sets,)`, entry o the pair g(o) = ⌊o·pairs/sets⌋.
        """
        return np.arange(self.sets) * self.pairs // self.sets


def check_gene(gene: Any) -> None:
    """Check that `gene` has the structure of a LeTra gene.

    Args:
        gene: the tree to check (arrays or `jax.ShapeDtypeStruct`s).

    Raises:
        GeneError: its top-level keys, width matrices or learngene blocks are not a LeTra
          gene's.
    """
    want = {'learngene', 'width', 'depth', 'pos_embed'}
    if not isinstance(gene, Mapping) or set(gene) != want:
        got = sorted(gene) if isinstance(gene, Mapping) else type(gene).__name__
        raise GeneError(f'not a LeTra gene: expected keys {sorted(want)}, got {got}')
    extra = sorted(set(gene['width']) - set(WIDTH_KEYS))
    if extra:
        raise GeneError(f'not a LeTra gene: unknown width matrices {extra}; known {WIDTH_KEYS}')
    if not isinstance(gene['learngene'].get('blocks'), Mapping):
        raise GeneError("not a LeTra gene: the learngene has no stacked 'blocks'")


def sizes(gene: Gene) -> Sizes:
    """The `Sizes` a gene fixes, read from its shapes.

    Args:
        gene: a LeTra gene (arrays or `jax.ShapeDtypeStruct`s).

    Returns:
        The learngene's and the Aux-Net's sizes and the number of coefficient sets.

    Raises:
        GeneError: it is no LeTra gene, or its width matrices, coefficients and learngene
          disagree.
    """
    check_gene(gene)
    lg, w = gene['learngene'], gene['width']
    depth, width, heads, head_dim = np.shape(lg['blocks']['attn']['q']['kernel'])
    mlp = np.shape(lg['blocks']['mlp']['fc1']['kernel'])[-1]
    attn = heads * head_dim

    def new_rows(name, cols, per_layer):
        if name not in w:
            return 0
        shape = tuple(np.shape(w[name]))
        want = ((depth,) if per_layer else ()) + (shape[-2], cols)
        if shape != want:
            raise GeneError(f"LeTra gene: width matrix '{name}' has shape {shape}; expected {want} "
                            f'for a learngene of {depth} layers, width {width}, {heads} heads of '
                            f'{head_dim}, MLP {mlp}')
        return shape[-2]

    new_e, new_c = new_rows('embed', width, False), new_rows('head', width, False)
    new_q, new_k, new_v = (new_rows(n, attn, True) for n in 'qkv')
    new_m = new_rows('mlp', mlp, True)
    aux_width = int(np.shape(gene['pos_embed'])[-1])
    if new_e != aux_width - width or (new_c and new_c != new_e):
        raise GeneError(f'LeTra gene: pos_embed has {aux_width} channels, the learngene {width}, '
                        f'but E adds {new_e} rows and C {new_c}')
    if not new_q == new_k == new_v or new_q % head_dim:
        raise GeneError(f'LeTra gene: Q, K, V add {new_q}, {new_k}, {new_v} rows; they must be '
                        f'equal and whole heads of {head_dim}')
    sets = {np.shape(c)[0] for m in gene['depth'].values() for c in m.values()}
    if len(sets) != 1 or depth % 2:
        raise GeneError(f'LeTra gene: {depth} learngene layers (must be even) and coefficient '
                        f'sets {sorted(sets)} (must be one count)')
    n_sets = sets.pop()
    if 2 * n_sets < depth:
        raise GeneError(f'LeTra gene: {n_sets} coefficient sets cannot cover {depth // 2} '
                        'learngene pairs')
    return Sizes(int(width), int(heads), int(head_dim), int(mlp), int(depth), aux_width,
                 int(heads + new_q // head_dim), int(mlp + new_m), int(n_sets))


def learngene_config(cfg: ViTConfig, *, heads: int | None = None, depth: int | None = None,
                     width: int | None = None, mlp_dim: int | None = None) -> ViTConfig:
    """The learngene's config for an Aux-Net of config `cfg`.

    Args:
        cfg: the Aux-Net's config (even depth).
        heads: the learngene's heads, of the Aux-Net's head_dim (default half the Aux-Net's).
        depth: the learngene's layers (default half the Aux-Net's; even).
        width: the learngene's width (default the Aux-Net's scaled by heads / Aux-Net heads).
        mlp_dim: the learngene's MLP size (default scaled the same way).

    Returns:
        The learngene's `ViTConfig`.

    Raises:
        GeneError: the sizes are impossible (more heads or layers than the Aux-Net, an odd
          depth, a width that does not scale to whole units, LayerScale or a distillation
          token, which LeTra cannot transform).
    """
    h = cfg.num_heads // 2 if heads is None else heads
    d = cfg.depth // 2 if depth is None else depth
    if not (isinstance(h, int) and 1 <= h <= cfg.num_heads):
        raise GeneError(f'learngene heads={h!r} must be in [1, Aux-Net num_heads={cfg.num_heads}]')
    if not (isinstance(d, int) and d >= 2 and d % 2 == 0 and d <= cfg.depth):
        raise GeneError(f'learngene depth={d!r} must be even, at least 2 and at most the Aux-Net '
                        f'depth {cfg.depth} (layers combine in pairs)')
    if cfg.depth % 2:
        raise GeneError(f'Aux-Net depth={cfg.depth} must be even: layers 2k and 2k+1 share a '
                        'coefficient set')

    def scaled(n, field):
        if (n * h) % cfg.num_heads:
            raise GeneError(f'learngene {field}: Aux-Net {field}={n} × heads {h}/{cfg.num_heads} '
                            f'is not an integer; give learngene_{field} explicitly')
        return n * h // cfg.num_heads

    w = scaled(cfg.width, 'width') if width is None else width
    m = scaled(cfg.mlp_dim, 'mlp_dim') if mlp_dim is None else mlp_dim
    for name, small, big in (('width', w, cfg.width), ('mlp_dim', m, cfg.mlp_dim)):
        if not (isinstance(small, int) and 1 <= small <= big):
            raise GeneError(f'learngene {name}={small!r} must be in [1, Aux-Net {name}={big}]')
    return cfg.replace(width=w, num_heads=h, head_dim=cfg.head_dim, mlp_dim=m, depth=d)


def _check_supported(cfg: ViTConfig, what: str) -> None:
    common.check_no_pre_logits(cfg, what)
    if cfg.layer_scale or cfg.distill_token:
        raise GeneError(f'{what}: LeTra has no transformation for LayerScale or a distillation '
                        f'token (layer_scale={cfg.layer_scale}, distill_token={cfg.distill_token})')


# ----------------------------------------------------------------------------------------
# Fresh genes.

def _normalised_rows(key, shape):
    u = jax.random.uniform(key, shape, jnp.float32)
    return u / u.sum(-1, keepdims=True)


def _pair_coefficients(key, n_sets):
    u = jax.random.uniform(key, (n_sets, 1), jnp.float32, 0.0, 0.03)
    return jnp.concatenate([jnp.ones_like(u), u], axis=1) / (1.0 + u)


def init_gene(cfg: ViTConfig, key: jax.Array, *, learngene_heads: int | None = None,
              learngene_depth: int | None = None, learngene_width: int | None = None,
              learngene_mlp_dim: int | None = None) -> Gene:
    """A fresh gene for an Aux-Net of config `cfg`, initialised as the official code.

    The learngene as `vit.init` (timm); every width matrix U[0,1) with rows normalised to sum 1
    ('rand'); every coefficient pair (1, u)/(1+u), u ~ U(0, 0.03), drawn independently for
    weights and biases ('stackbert_noisy': each Aux layer starts near the first layer of its
    pair); the Aux-Net's position embedding trunc-normal(0.02). Runs eagerly (the learngene as
    one `vit.init` program); jittable with `cfg` and the learngene sizes static.

    Args:
        cfg: the Aux-Net's config.
        key: the PRNG key.
        learngene_heads: the learngene's heads (`learngene_config`'s `heads`).
        learngene_depth: its layers.
        learngene_width: its width.
        learngene_mlp_dim: its MLP size.

    Returns:
        The gene `{'learngene', 'width', 'depth', 'pos_embed'}` (module docstring).

    Raises:
        GeneError: the learngene sizes do not fit the Aux-Net (`learngene_config`).
    """
    _check_supported(cfg, 'letra.init_gene')
    small = learngene_config(cfg, heads=learngene_heads, depth=learngene_depth,
                             width=learngene_width, mlp_dim=learngene_mlp_dim)
    k_lg, k_pos, k_w, k_d = jax.random.split(key, 4)
    learngene = vit.init(small, k_lg)
    del learngene['pos_embed']
    new = {'embed': (cfg.width - small.width, small.width),
           'head': (cfg.width - small.width, small.width) if cfg.num_classes else (0, 0),
           'q': (small.depth, cfg.attn_width - small.attn_width, small.attn_width),
           'mlp': (small.depth, cfg.mlp_dim - small.mlp_dim, small.mlp_dim)}
    new['k'] = new['v'] = new['q']
    keys = dict(zip(WIDTH_KEYS, jax.random.split(k_w, len(WIDTH_KEYS))))
    width = {n: _normalised_rows(keys[n], new[n]) for n in WIDTH_KEYS if new[n][-2] > 0}
    n_sets = cfg.depth // 2
    leaves = pytree.flatten(learngene['blocks'])
    depth: dict[str, dict[str, jax.Array]] = {}
    for i, (path, (module, kind)) in enumerate(LEAF_MODULES.items()):
        if path in leaves:
            depth.setdefault(module, {})[kind] = _pair_coefficients(jax.random.fold_in(k_d, i), n_sets)
    pos = vit.init_embeddings(cfg, k_pos)['pos_embed']
    return {'learngene': learngene, 'width': width, 'depth': depth, 'pos_embed': pos}


# ----------------------------------------------------------------------------------------
# Width expansion: [I; F] along one axis.

def _grow(x: jax.Array, f: jax.Array | None, axis: int) -> jax.Array:
    """`x` with the rows F·x appended along `axis` (x's other axes untouched)."""
    if f is None or f.shape[0] == 0:
        return x
    new = jnp.tensordot(f.astype(x.dtype), x, axes=((1,), (axis,)), precision=_HI)
    return jnp.concatenate([x, jnp.moveaxis(new, 0, axis)], axis=axis)


def _grow_flat(x: jax.Array, f: jax.Array | None, start: int, stop: int) -> jax.Array:
    """`_grow` along the flattened axes [start, stop) of x (the heads × head_dim of q/k/v);
    the grown axis is split back with the last of those axes kept."""
    shape = x.shape
    flat = x.reshape(shape[:start] + (-1,) + shape[stop:])
    out = _grow(flat, f, start)
    return out.reshape(shape[:start] + (-1,) + shape[stop - 1:stop] + shape[stop:])


def _expand_block(block: Params, e, q, k, v, m) -> Params:
    """One learngene layer at the width the selected rows give (canonical leaves, no layers
    axis): In_E/Out_{Q,K,V}, In_V/Out_E, In_E/Out_M, In_M/Out_E, LayerNorms Out_E."""
    out: Params = {}
    for n in ('norm1', 'norm2'):
        out[n] = {p: _grow(x, e, 0) for p, x in block[n].items()}
    attn = {}
    for name, f in (('q', q), ('k', k), ('v', v)):
        p = block['attn'][name]
        attn[name] = {'kernel': _grow_flat(_grow(p['kernel'], e, 0), f, 1, 3)}
        if 'bias' in p:
            attn[name]['bias'] = _grow_flat(p['bias'], f, 0, 2)
    o = block['attn']['out']
    kernel = _grow_flat(o['kernel'], v, 0, 2)            # (A, D) rows by V: In_V
    attn['out'] = {'kernel': _grow(kernel, e, 2), 'bias': _grow(o['bias'], e, 0)}
    out['attn'] = attn
    fc1, fc2 = block['mlp']['fc1'], block['mlp']['fc2']
    out['mlp'] = {'fc1': {'kernel': _grow(_grow(fc1['kernel'], e, 0), m, 1),
                          'bias': _grow(fc1['bias'], m, 0)},
                  'fc2': {'kernel': _grow(_grow(fc2['kernel'], m, 0), e, 1),
                          'bias': _grow(fc2['bias'], e, 0)}}
    return out


# ----------------------------------------------------------------------------------------
# Depth: layer maps and coefficient combinations.

def depth_map(gene_sizes: Sizes, depth: int, layers: Sequence[int] | None = None,
              coefficient_layers: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (pair, coefficient set) of each of `depth` layers, from Aux-layer indices.

    Layer i combines the learngene pair of Aux layer `layers[i]` (the official
    `--mapping_layer`) with the coefficients of Aux layer `coefficient_layers[i]`
    (`--mapping_layer_coeff`; any Aux layer of a set names that set). Without `layers`, layer
    i takes Aux layer ⌊(i + ½)·L_a/L_d⌋: the Aux-Net's layers spread evenly over the
    descendant's depth (the Aux-Net itself at L_d = L_a; shallower descendants drop layers
    evenly, deeper ones repeat them).

    Args:
        gene_sizes: the gene's `Sizes`.
        depth: the descendant's depth.
        layers: one Aux-layer index per descendant layer (None: spread evenly).
        coefficient_layers: one Aux-layer index per layer for the coefficients (default
          `layers`).

    Returns:
        (pairs, sets), two (depth,) integer arrays.

    Raises:
        GeneError: `depth` is not a positive integer, the lists do not have `depth` entries or
          index layers outside the Aux-Net, `coefficient_layers` comes without `layers`, or a
          coefficient set belongs to another pair than its layer's.
    """
    n_aux = gene_sizes.aux_depth
    if not (isinstance(depth, (int, np.integer)) and depth >= 1):
        raise GeneError(f'letra: depth={depth!r} must be a positive integer')
    if layers is None:
        if coefficient_layers is not None:
            raise GeneError('letra: coefficient_layers needs layers (the official mapping_layer)')
        aux = (2 * np.arange(depth) + 1) * n_aux // (2 * depth)
        coef = aux
    else:
        aux = np.asarray(layers)
        coef = aux if coefficient_layers is None else np.asarray(coefficient_layers)
        for name, idx in (('layers', aux), ('coefficient_layers', coef)):
            if idx.shape != (depth,) or not np.issubdtype(idx.dtype, np.integer):
                raise GeneError(f'letra: {name}={np.asarray(idx).tolist()} must be {depth} integer '
                                'Aux-layer indices, one per descendant layer')
            if idx.min() < 0 or idx.max() >= n_aux:
                raise GeneError(f'letra: {name}={idx.tolist()} index Aux layers outside '
                                f'[0, {n_aux}) of the gene\'s {n_aux}-layer Aux-Net')
    pair_of = gene_sizes.pair_of_set()
    pairs, sets = pair_of[aux // 2], coef // 2
    wrong = np.nonzero(pair_of[sets] != pairs)[0]
    if wrong.size:
        i = int(wrong[0])
        raise GeneError(f'letra: descendant layer {i}: coefficient owner Aux layer {int(coef[i])} '
                        f'(set {int(sets[i])}) combines learngene pair {int(pair_of[sets[i]])} but '
                        f'Aux layer {int(aux[i])} uses pair {int(pairs[i])}; the coefficients must '
                        'come from an Aux layer of the same pair')
    return pairs.astype(np.int32), sets.astype(np.int32)


def _combine(wide: Params, coefficients: Mapping[str, Mapping[str, jax.Array]],
             pairs: np.ndarray, sets: np.ndarray, n_layers: int) -> Params:
    """Stacked layers Σ_t g[set_i, t]·Ŵ[2·pair_i + t] from the width-expanded learngene
    layers `wide` (L_s, ...): one (L_d, L_s) × (L_s, size) product per leaf."""
    columns = 2 * pairs

    def leaf(path, x):
        module, kind = LEAF_MODULES[pytree.path_str(path)]
        g = coefficients[module][kind][sets].astype(x.dtype)            # (L_d, 2)
        mix = (g[:, :1] * jax.nn.one_hot(columns, n_layers, dtype=x.dtype)
               + g[:, 1:] * jax.nn.one_hot(columns + 1, n_layers, dtype=x.dtype))
        out = jnp.matmul(mix, x.reshape(n_layers, -1), precision=_HI)
        return out.reshape((len(pairs),) + x.shape[1:])

    return jax.tree_util.tree_map_with_path(leaf, wide)


# ----------------------------------------------------------------------------------------
# Row selection.

@dataclasses.dataclass(frozen=True)
class Request:
    """New rows a descendant takes: of E (and C), in heads of Q/K/V, of M."""
    embed: int
    heads: int
    mlp: int


def _request(s: Sizes, cfg: ViTConfig, what: str) -> Request:
    """The rows `cfg` needs from a gene of sizes `s`; GeneError naming impossible sizes."""
    _check_supported(cfg, what)
    if cfg.head_dim != s.head_dim:
        raise GeneError(f"{what}: the gene has heads of head_dim={s.head_dim}, so 'attn/q/bias' "
                        f'at num_heads={cfg.num_heads} has shape ({cfg.num_heads}, {s.head_dim}) '
                        f'but the target config ({common.shape_str(cfg)}) needs '
                        f'({cfg.num_heads}, {cfg.head_dim}); the width must be whole heads of '
                        f'{s.head_dim}')
    for name, got, lo, hi in (('width', cfg.width, s.width, s.aux_width),
                              ('num_heads', cfg.num_heads, s.heads, s.aux_heads),
                              ('mlp_dim', cfg.mlp_dim, s.mlp, s.aux_mlp)):
        if got > hi:
            raise GeneError(f'{what}: target {name}={got} exceeds the Aux-Net\'s {hi}; a LeTra '
                            f'gene makes {name} in [{lo}, {hi}]')
        if got < lo:
            raise GeneError(f"{what}: target {name}={got} is below the learngene's {lo}; a LeTra "
                            f'gene makes {name} in [{lo}, {hi}] (selecting learngene rows is not '
                            'supported)')
    return Request(cfg.width - s.width, cfg.num_heads - s.heads, cfg.mlp_dim - s.mlp)


def _head_rows(head_idx, head_dim: int):
    """Row indices of whole heads `head_idx` (..., k) -> (..., k·head_dim); numpy stays numpy
    (static), traced stays traced."""
    xp = np if isinstance(head_idx, np.ndarray) else jnp
    rows = head_idx[..., :, None] * head_dim + xp.arange(head_dim)
    return rows.reshape(head_idx.shape[:-1] + (-1,))


def _take_rows(f, idx):
    """Rows `idx` of f (n, m) or per layer of f (L, n, m) with idx (k,) or (L, k). A static
    `arange(n)` (everything, in order) is f itself."""
    if isinstance(idx, np.ndarray) and idx.ndim == 1 and np.array_equal(idx, np.arange(f.shape[-2])):
        return f
    if np.ndim(idx) == 1:
        return jnp.take(f, jnp.asarray(idx), axis=-2)
    return jnp.take_along_axis(f, jnp.asarray(idx)[..., None], axis=-2)


def _unit_blocks(f, unit: int):
    """Row blocks of `unit` rows: (..., n, m) -> (..., n/unit, unit·m)."""
    return f.reshape(f.shape[:-2] + (f.shape[-2] // unit, unit * f.shape[-1]))


def _scores(f, unit: int, norm: str):
    blocks = _unit_blocks(f, unit)
    return (jnp.abs(blocks) if norm == 'l1' else jnp.square(blocks)).sum(-1)


def _top(scores, k: int, order: str):
    """Indices (ascending) of the k largest (or smallest) scores over the last axis."""
    s = scores if order == 'largest' else -scores
    return jnp.sort(jax.lax.top_k(s, k)[1], axis=-1)


def _draw(key, n: int, k: int, batch: tuple[int, ...] = ()):
    """k distinct indices of n (ascending), a uniformly random subset, independently per
    leading `batch` entry: the k largest of n uniform draws."""
    u = jax.random.uniform(key, batch + (n,))
    return jnp.sort(jax.lax.top_k(u, k)[1], axis=-1)


def select_rows(gene: Gene, request: Request, *, selection: str = 'continuous',
                key: jax.Array | None = None, per_matrix: bool = False,
                step_rule: str = 'authors', rank_norm: str = 'l2',
                rank_order: str = 'largest') -> dict[str, Any]:
    """The row indices of each width matrix that a descendant of `request` takes.

    `selection` (the paper's strategies; only 'continuous' is in the official code):

    * 'continuous': the first k new rows (the official code).
    * 'step': rows 0, Δ, 2Δ, ... With `step_rule='authors'` Δ = ⌊D_aux/D_des⌋ per matrix (in
      heads for Q/K/V), as the authors state; for every width strictly between learngene and
      Aux-Net Δ = 1, so it is then the same as 'continuous'. `step_rule='spread'` takes
      Δ = ⌊new rows / needed rows⌋ instead, spreading the selection over all new rows.
    * 'random': one random index set per kind, shared by every tied use and every learngene
      layer (E and C; all Q_j, K_j, V_j; all M_j); needs `key`.
    * 'random_wo': an independent random set per matrix (E, C, each Q_j/K_j, V_j, M_j);
      needs `key`.
    * 'rank': the rows (heads) of largest `rank_norm` norm per matrix ('smallest' with
      `rank_order`).

    Tied uses of one matrix share its rows: E everywhere, V_j for v-out and out-in, M_j for
    fc1-out and fc2-in. By default (`per_matrix=False`) Q/K/V select whole heads, Q_j and K_j
    one head set (ranked by their summed norms), and C takes E's rows (row r of C reads the
    residual neuron that row r of E makes). `per_matrix=True` is the literal per-matrix
    selection: single rows, Q_j, K_j and C each on their own, which scrambles q·k of the new
    heads and misaligns the head under 'random_wo' and 'rank'.

    Args:
        gene: the LeTra gene.
        request: the new rows the descendant needs (`Request`).
        selection: one of `SELECTIONS`.
        key: the PRNG key of the random selections.
        per_matrix: select each matrix on its own (see above).
        step_rule: 'authors' or 'spread' (`STEP_RULES`), for 'step'.
        rank_norm: 'l1' or 'l2' (`RANK_NORMS`), for 'rank'.
        rank_order: 'largest' or 'smallest' (`RANK_ORDERS`), for 'rank'.

    Returns:
        The row indices of each matrix, a dict with the keys 'embed', 'head', 'q', 'k', 'v' and
        'mlp' (per learngene layer for q/k/v/mlp, so (L_s, k) arrays there).

    Raises:
        GeneError: an option is not one of its choices, or a random selection has no `key`.
    """
    common.check_choice('letra.descend', 'selection', selection, SELECTIONS)
    common.check_choice('letra.descend', 'step_rule', step_rule, STEP_RULES)
    common.check_choice('letra.descend', 'rank_norm', rank_norm, RANK_NORMS)
    common.check_choice('letra.descend', 'rank_order', rank_order, RANK_ORDERS)
    if selection in ('random', 'random_wo') and key is None:
        raise GeneError(f"letra.descend(selection={selection!r}) draws rows and needs a PRNG key")
    s, w = sizes(gene), gene['width']
    unit = 1 if per_matrix else s.head_dim
    need = {'embed': request.embed, 'attn': request.heads * s.head_dim // unit,
            'mlp': request.mlp}
    have = {'embed': s.aux_width - s.width, 'attn': (s.aux_heads - s.heads) * s.head_dim // unit,
            'mlp': s.aux_mlp - s.mlp}
    full = {'embed': s.aux_width, 'attn': s.aux_heads * s.head_dim // unit, 'mlp': s.aux_mlp}
    des = {'embed': s.width + request.embed, 'attn': full['attn'] - have['attn'] + need['attn'],
           'mlp': s.mlp + request.mlp}
    kind_of = {'embed': 'embed', 'head': 'embed', 'q': 'attn', 'k': 'attn', 'v': 'attn',
               'mlp': 'mlp'}
    layers = {n: (s.depth,) if n in 'qkv' or n == 'mlp' else () for n in WIDTH_KEYS}
    keys = {} if key is None else dict(zip(WIDTH_KEYS, jax.random.split(key, len(WIDTH_KEYS))))

    def rows(name):
        kind = kind_of[name]
        k, n, batch = need[kind], have[kind], layers[name]
        size = unit if kind == 'attn' else 1
        if selection == 'continuous':
            idx = np.arange(k)
        elif selection == 'step':
            step = (full[kind] // des[kind]) if step_rule == 'authors' else (n // k if k else 1)
            idx = np.arange(k) * max(step, 1)
        elif selection == 'random':
            shared = {'embed': 'embed', 'attn': 'q', 'mlp': 'mlp'}[kind]
            idx = _draw(keys[shared], n, k) if k else np.arange(0)
        elif selection == 'random_wo':
            idx = _draw(keys[name], n, k, batch) if k else np.zeros(batch + (0,), np.int32)
        else:
            if not k:
                idx = np.zeros(batch + (0,), np.int32)
            elif name in ('q', 'k') and not per_matrix:
                score = _scores(w['q'], size, rank_norm) + _scores(w['k'], size, rank_norm)
                idx = _top(score, k, rank_order)
            else:
                idx = _top(_scores(w[name], size, rank_norm), k, rank_order)
        if selection == 'random_wo' and name == 'k' and not per_matrix:
            return None    # K_j takes Q_j's heads
        return idx

    out = {name: rows(name) for name in WIDTH_KEYS if name in w}
    if not per_matrix:
        if 'head' in out:
            out['head'] = out['embed']
        if 'k' in out:
            out['k'] = out['q']
    if unit > 1:
        out.update({n: _head_rows(out[n], unit) for n in 'qkv' if n in out})
    return out


# ----------------------------------------------------------------------------------------
# Building a network: the Aux-Net (`materialize`) or a descendant (`descend`).

def _channels(pos: jax.Array, width: int, rows) -> jax.Array:
    """The learngene's `width` channels of `pos`, then the new channels `rows` (E's rows)."""
    if rows is None:
        return pos[..., :width]
    if isinstance(rows, np.ndarray) and np.array_equal(rows, np.arange(rows.size)):
        return pos[..., :width + rows.size]
    idx = jnp.concatenate([jnp.arange(width), width + jnp.asarray(rows)])
    return jnp.take(pos, idx, axis=-1)


def _build(gene: Gene, cfg: ViTConfig, rows: Mapping[str, Any], pairs: np.ndarray,
           sets: np.ndarray, *, head: str, embeddings: str | None, key: jax.Array | None,
           what: str) -> Params:
    """Canonical params of config `cfg`: the learngene widened by the selected rows `rows`
    of every width matrix, its layers combined as (`pairs`, `sets`) say."""
    s = sizes(gene)
    lg, w = gene['learngene'], gene['width']
    f = {n: _take_rows(w[n], rows[n]) for n in rows}
    e = f.get('embed')
    wide = jax.vmap(lambda b, q, k, v, m: _expand_block(b, e, q, k, v, m))(
        lg['blocks'], f.get('q'), f.get('k'), f.get('v'), f.get('mlp'))
    blocks = _combine(wide, gene['depth'], pairs, sets, s.depth)

    top: Params = {
        'patch_embed': {'kernel': _grow(lg['patch_embed']['kernel'], e, 3),
                        'bias': _grow(lg['patch_embed']['bias'], e, 0)},
        'norm': {p: _grow(x, e, 0) for p, x in lg['norm'].items()},
        'pos_embed': _channels(gene['pos_embed'], s.width, rows.get('embed')),
    }
    if 'cls_token' in lg:
        top['cls_token'] = _grow(lg['cls_token'], e, 2)
    if 'head' in lg:
        top['head'] = {'kernel': _grow(lg['head']['kernel'], f.get('head'), 0),
                       'bias': lg['head']['bias']}
    if head == 'truncate':
        top, head = _truncated_head(top, cfg, what), 'inherit'
    want = common.target_shapes(cfg)

    def fresh() -> Params:
        return vit.init_embeddings(cfg, key)

    params = common.embeddings_and_heads(top, cfg, head=head, embeddings=embeddings,
                                         fresh=None if key is None else fresh, what=what, want=want)
    common.check_fits(blocks, want['blocks'], what, cfg, source='network built from the gene',
                      prefix='blocks/', complete=True)
    params['blocks'] = blocks
    pytree.assert_same_structure(want, params, f'{what}: target params and built params')
    return params


def _truncated_head(top: Params, cfg: ViTConfig, what: str) -> Params:
    """`top` with its head cut to the first `cfg.num_classes` classes (kernel columns, bias
    entries): the official code's descendant head for non-ImageNet data."""
    if not cfg.num_classes:
        return top
    if 'head' not in top:
        raise GeneError(f"{what}(head='truncate'): the gene has no head; use head='new'")
    have = int(np.shape(top['head']['bias'])[0])
    if have < cfg.num_classes:
        raise GeneError(f"{what}(head='truncate'): the gene's head has {have} classes, fewer than "
                        f"the target's num_classes={cfg.num_classes}; use head='new'")
    n = cfg.num_classes
    return {**top, 'head': {'kernel': top['head']['kernel'][..., :n], 'bias': top['head']['bias'][:n]}}


def _all_rows(gene: Gene) -> dict[str, np.ndarray]:
    return {n: np.arange(np.shape(f)[-2]) for n, f in gene['width'].items()}


def materialize(trainable: Gene, frozen: Mapping[str, Any] | None, cfg: ViTConfig) -> Params:
    """The Aux-Net's canonical params from the trainable gene.

    Every width matrix is applied whole, and Aux layer i is coefficient set ⌊i/2⌋ applied to
    its learngene pair; `jax.grad` through it trains the gene.

    Args:
        trainable: the gene, or its trainable part.
        frozen: the gene's frozen parts (None: none), merged with `trainable`.
        cfg: the Aux-Net's config; it must have the gene's Aux-Net sizes.

    Returns:
        Canonical params of `cfg` (stacked layout).

    Raises:
        GeneError: `trainable` and `frozen` overlap, or `cfg` does not have the gene's Aux-Net
          sizes.
    """
    gene = common.merge_disjoint(trainable, frozen or {}, 'materialize', ('trainable', 'frozen'))
    s = sizes(gene)
    got = (cfg.width, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.depth)
    aux = (s.aux_width, s.aux_heads, s.head_dim, s.aux_mlp, s.aux_depth)
    if got != aux:
        raise GeneError(f'letra.materialize: the gene makes an Aux-Net of (width, num_heads, '
                        f'head_dim, mlp_dim, depth) = {aux} but the config has {got}; use '
                        'descend() for other sizes')
    pairs, sets = depth_map(s, cfg.depth)
    return _build(gene, cfg, _all_rows(gene), pairs, sets, head='inherit', embeddings='inherit',
                  key=None, what='letra.materialize')


def descend(gene: Gene, target_cfg: ViTConfig, *, selection: str = 'continuous',
            layers: Sequence[int] | None = None, coefficient_layers: Sequence[int] | None = None,
            key: jax.Array | None = None, head: str = 'inherit', embeddings: str | None = None,
            per_matrix: bool = False, step_rule: str = 'authors', rank_norm: str = 'l2',
            rank_order: str = 'largest') -> Params:
    """Initialise a descendant of any D_s ≤ width ≤ D_a and any depth.

    Width (whole heads of the gene's head_dim, MLP between the learngene's and the Aux-Net's):
    the rows of every width matrix that `select_rows` picks; the new position-embedding
    channels are those of E's rows (the official first D_d channels under 'continuous').
    Depth: `depth_map(layers, coefficient_layers)`, explicit official lists of Aux-layer
    indices or the Aux-Net's layers spread evenly. With 'continuous' at the Aux-Net's sizes
    and depth the descendant is the Aux-Net, bit for bit. Jittable with `target_cfg` and every
    option but `key` static.

    Args:
        gene: the LeTra gene.
        target_cfg: the descendant's config.
        selection: the row selection (`select_rows`, `SELECTIONS`).
        layers: the official `--mapping_layer` list (`depth_map`).
        coefficient_layers: the official `--mapping_layer_coeff` list.
        key: the PRNG key, for random selections and anything drawn fresh.
        head: 'inherit' widens the learngene head by C's rows (same class count; bias as is);
          'truncate' keeps its first `target_cfg.num_classes` classes (the official code's
          head for non-ImageNet data, e.g. CIFAR-100 takes ImageNet classes 0–99); 'new'
          draws one (needs `key`).
        embeddings: None or 'inherit' widens the learngene's patch embedding and final norm and
          selects position-embedding channels; 'random' draws them (needs `key`).
        per_matrix: `select_rows`' literal per-matrix selection.
        step_rule: `select_rows`' step rule.
        rank_norm: `select_rows`' norm for 'rank'.
        rank_order: `select_rows`' order for 'rank'.

    Returns:
        Canonical params of `target_cfg` (stacked layout), `vit.init(target_cfg)`'s structure.

    Raises:
        GeneError: the target is narrower than the learngene, wider than the Aux-Net or not in
          whole heads; an option is not one of its choices; a head cannot be truncated (the
          gene has none, or fewer classes); something must be drawn and there is no `key`.
    """
    common.check_choice('letra.descend', 'head', head, HEADS)
    s = sizes(gene)
    request = _request(s, target_cfg, 'letra.descend')
    pairs, sets = depth_map(s, target_cfg.depth, layers, coefficient_layers)
    k_rows, k_new = jax.random.split(key) if key is not None else (None, None)
    rows = select_rows(gene, request, selection=selection, key=k_rows, per_matrix=per_matrix,
                       step_rule=step_rule, rank_norm=rank_norm, rank_order=rank_order)
    return _build(gene, target_cfg, rows, pairs, sets, head=head, embeddings=embeddings,
                  key=k_new, what='letra.descend')


def gene_param_count(gene: Gene, *, include_head: bool = False) -> int:
    """The parameters the gene stores (S-Params).

    Args:
        gene: the LeTra gene.
        include_head: count the head (the learngene's head and C), which `descend` reads only
          with head='inherit' or 'truncate'.

    Returns:
        The learngene's, the width matrices', the depth coefficients' and the position
        embedding's parameters (and the head's with `include_head`).
    """
    check_gene(gene)
    total = common.count(gene)
    if not include_head:
        total -= common.count(gene['learngene'].get('head')) + common.count(gene['width'].get('head'))
    return total


# The gene's parts (`common.Part`); a width matrix without new rows is absent.
GENE_PARTS = {
    'learngene': common.Part(parts=common.model_parts(pos_embed=False)),
    'width': common.Part(parts={k: common.Part(('array',), required=False) for k in WIDTH_KEYS}),
    'depth': common.Part(parts={m: common.Part(required=False) for m in MODULES}),
    'pos_embed': common.Part(('array',)),
}

METHOD = common.register(common.Method(
    name='letra', label='LeTra', source='learned', init_gene=init_gene, materialize=materialize,
    descend=descend, gene_param_count=gene_param_count, gene_parts=GENE_PARTS, family='aux',
    trainable_decay=DECAY))
