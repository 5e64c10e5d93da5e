"""Growth baselines: a small pretrained ViT's parameters mapped into a larger ViT (wider
and/or deeper), as pure functions on canonical stacked trees.

* `net2net(small, large_cfg, key)`: Net2Net (Chen et al., ICLR 2016). Net2WiderNet gives
  every new unit of a growing axis (residual width 'embed', attention 'heads', MLP hidden
  'mlp') a source unit to copy: the weights that *read* a unit (fan-in side) are divided by
  its replication count, the weights that *write* it (fan-out side, biases, LayerNorm) are
  copied, so the function is preserved. Net2DeeperNet inserts identity layers: target layer
  l copies source layer ⌊l·L1/L2⌋; the extra copies have zeroed output projections
  (attention out and fc2, kernels and biases), which makes a pre-norm block the identity.
  The logits equal the small model's exactly (to float rounding).
* `stackbert(small, large_cfg)`: StackBERT (Gong et al., ICML 2019) as a one-shot
  initialisation: target layer l is source layer l mod L1. It grows depth only; with
  `width='net2net'` a width change is filled by Net2WiderNet first.
* `bert2bert(small, large_cfg, key, aki=True)`: bert2BERT (Chen et al., ACL 2022): width by
  function-preserving initialisation (FPI, the Net2WiderNet rule applied to MHA, FFN,
  embeddings and LayerNorm), optionally with advanced knowledge initialisation (AKI: the new
  heads and FFN neurons of layer l take their fan-out weights from layer l+1, the top layer
  from itself), then depth by stacking. With aki=False and equal depths the logits equal the
  small model's.
* `ligo_init_operator(small_cfg, large_cfg, key)` / `ligo_grow(operator, small, large_cfg)`:
  LiGO (Wang et al., ICLR 2023) with the official code's tying (VITA-Group/LiGO
  `ligo.py`): every block leaf is first mixed over source layers with its own (L2, L1)
  coefficients (weights and biases separately, every module separately), then expanded in
  width by matrices A = [I; C] (the old units kept, new units learned combinations of old
  ones), applied to every growing axis (W2 = A_in·W·A_outᵀ in x·W layout). One residual
  expansion is shared by the patch/position embeddings, class/distillation tokens, all
  LayerNorms, the fan-in of q/k/v/fc1 and the fan-out of out/fc2; the head's input has its
  own expansion (LiGO learns the classifier's width expansion apart from the residual one),
  initialised equal to the residual one; per target layer q, k, v have their own expansions
  of the attention width (v's also expands out's fan-in) and the MLP hidden its own (fc1
  fan-out = fc2 fan-in). The operator is trained (~100 steps, the small model frozen) on the
  large model's loss; see experiments/mango.

Function preservation with LayerNorm: the residual stream is normalised over all D2 units,
so its mean and variance are kept only when every source unit is replicated equally often.
`embed_mapping='balanced'` (default) draws the residual mapping as a random balanced
assignment (each of the D1 source units ⌊D2/D1⌋ or ⌈D2/D1⌉ times; exact when D1 divides
D2); 'random' is Net2Net's original uniform draw, which breaks the LayerNorm statistics.
Heads and MLP units use Net2Net's uniform draw (no normalisation over them). One mapping per
axis serves every layer. Heads are copied whole, so Net2Net and bert2BERT need the same
head_dim in both models.

AKI's choice here: new units of the per-layer hidden axes ('heads', 'mlp') come from layer
l+1; the residual axis keeps FPI in every layer (the residual stream is shared by all
layers, so its new units cannot come from another layer's outputs consistently).

Each baseline is registered as a Method with source 'model' (the gene is the small model,
plus the learned operator for LiGO); `descend(gene, target_cfg, key=..., head=...,
embeddings=...)` grows it. `descend_grown` and `check_growth` are shared with
`jlearngene.genes.mango`.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.genes import common
from jlearngene.genes.common import GeneError
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]

WIDTH_AXES = ('embed', 'heads', 'mlp')          # the axes Net2Net / bert2BERT grow
ALL_GROWABLE = ('embed', 'heads', 'head_dim', 'mlp', 'layers')
EMBED_MAPPINGS = ('balanced', 'random')
STACKBERT_WIDTHS = ('none', 'net2net')
LIGO_WIDTH_INITS = ('rand', 'sel')
LIGO_DEPTH_INITS = ('stackbert_noisy', 'stackbert')
_FIXED_HINTS = {
    'classes': "use descend(head='new') for another number of classes",
    'tokens': 'image_size, patch_size and the prefix tokens must match',
    'patch_h': 'patch_size must match', 'patch_w': 'patch_size must match',
    'channels': 'the image channels must match',
}
# Output projections of a block: zero them and a pre-norm block is the identity.
_BLOCK_OUTPUTS = ('attn/out/kernel', 'attn/out/bias', 'mlp/fc2/kernel', 'mlp/fc2/bias')


# ----------------------------------------------------------------------------------------
# Checks and shapes shared by every growth method.

def _shape_of(x) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(x))


def check_growth(small: Params, large_cfg: ViTConfig, what: str, *,
                 grows: tuple[str, ...] = ALL_GROWABLE, hint: str = '') -> Params:
    """The shapes of `vit.init(large_cfg)`, after checking that the stacked `small` tree grows
    into them: the same leaves, each logical axis in `grows` at least as large, every other
    axis equal.

    Args:
        small: the small model's canonical params (stacked layout), or their shapes.
        large_cfg: the large model's config.
        what: the caller's name, for error messages.
        grows: the logical axes that may grow (`ALL_GROWABLE` by default).
        hint: added to errors about an axis that may not change (unless the axis has its own
          hint: classes, tokens, patch and channels).

    Returns:
        The large model's params as `jax.ShapeDtypeStruct`s (`common.target_shapes`).

    Raises:
        GeneError: either model has a pre-logits layer, the leaves differ, a leaf's rank
          differs, an axis in `grows` would shrink, or an axis not in `grows` differs (the
          message names the first such leaf and axis).
    """
    common.check_no_pre_logits(small, what)
    common.check_no_pre_logits(large_cfg, what)
    want = common.target_shapes(large_cfg)
    fs, fw = pytree.flatten(small), pytree.flatten(want)
    for path in fw:
        if path not in fs:
            raise GeneError(f"{what}: the large config ({common.shape_str(large_cfg)}) needs "
                            f"'{path}' but the small model has none")
    for path in fs:
        if path not in fw:
            raise GeneError(f"{what}: the small model has '{path}', which the large config "
                            f'({common.shape_str(large_cfg)}) does not have')
    for path, w in fw.items():
        s = _shape_of(fs[path])
        names = layout.leaf_axes(path, len(w.shape))
        if len(s) != len(names):
            raise GeneError(f"{what}: the small model's '{path}' has rank {len(s)}, expected {len(names)}")
        for name, n1, n2 in zip(names, s, w.shape):
            if n1 == n2:
                continue
            if name in grows and n2 < n1:
                raise GeneError(f"{what}: '{path}' axis '{name}' would shrink from {n1} to {n2}; "
                                'growth needs every size of the large model at least the small one')
            if name not in grows:
                why = _FIXED_HINTS.get(name) or hint
                raise GeneError(f"{what}: '{path}' axis '{name}' is {n1} in the small model but "
                                f'{n2} in the large config ({common.shape_str(large_cfg)}); '
                                f"{what} cannot change it" + (f'; {why}' if why else ''))
    return want


def axis_sizes(tree: Params) -> dict[str, int]:
    """The size of every logical axis of a canonical tree.

    Args:
        tree: canonical params (either layout), or their shapes.

    Returns:
        A dict from each logical axis of any leaf ('layers' included for stacked blocks) to
        its size, taken from the first leaf that has it.

    Raises:
        KeyError: a leaf's path is not in the canonical tree (`layout.leaf_axes`).
    """
    sizes: dict[str, int] = {}
    for path, x in pytree.flatten(tree).items():
        for name, n in zip(layout.leaf_axes(path, np.ndim(x)), np.shape(x)):
            if name is not None:
                sizes.setdefault(name, int(n))
    return sizes


def fan_in_axes(path: str, shape) -> tuple[str, ...]:
    """The logical axes a kernel reads (its fan-in).

    Args:
        path: the leaf's '/'-joined path in a canonical tree.
        shape: the leaf's shape.

    Returns:
        The kernel's fan-in axis names; () for any leaf whose path does not end in 'kernel'
        (biases, norms, embeddings).

    Raises:
        KeyError: `path` ends in 'kernel' but is not a kernel of the canonical tree
          (`layout.matrix_view`).
    """
    if not path.endswith('kernel'):
        return ()
    return tuple(layout.matrix_view(path, tuple(shape)).fan_in)


def num_classes_of(params: Params) -> int:
    """The class count of a model's head.

    Args:
        params: canonical params.

    Returns:
        The length of `params['head']['bias']`; 0 without a head.
    """
    return int(np.shape(params['head']['bias'])[0]) if 'head' in params else 0


def descend_grown(grow: Callable[[Params, ViTConfig], Params], small: Params,
                  target_cfg: ViTConfig, *, what: str, key: jax.Array | None,
                  head: str, embeddings: str | None) -> Params:
    """A grown descendant with the contract's `head` / `embeddings` options.

    Args:
        grow: `grow(small, cfg) -> params`, grows `small` into `cfg`; called with the small
          model's class count when `head` is 'new' or `target_cfg` has no classes, else
          with `target_cfg` (so an inherited head needs the same class count).
        small: the small model's canonical params (either layout).
        target_cfg: the descendant's config.
        what: the caller's name, for error messages.
        key: the PRNG key for what is drawn fresh (a new head, random embeddings); it is not
          passed to `grow`.
        head: 'inherit' keeps the grown head; 'new' draws a fresh one for `target_cfg`
          (needs `key`).
        embeddings: 'inherit' (or None) keeps the grown embeddings; 'random' draws them
          fresh (needs `key`).

    Returns:
        Canonical params of `target_cfg`, with the grown blocks (stacked layout).

    Raises:
        GeneError: `small`'s list-layout blocks differ in shape, `head` or `embeddings` is
          not one of its choices, an inherited part does not fit `target_cfg`, or something
          must be drawn and there is no `key`; and whatever `grow` raises.
    """
    small = common.stacked(small, what)
    common.check_choice(what, 'head', head, common.HEADS)
    grow_cfg = target_cfg
    if head == 'new' or not target_cfg.num_classes:
        grow_cfg = target_cfg.replace(num_classes=num_classes_of(small))
    grown = grow(small, grow_cfg)

    def fresh() -> Params:
        return vit.init_embeddings(target_cfg, jax.random.fold_in(key, 11))

    top = common.embeddings_and_heads(
        grown, target_cfg, head=head, embeddings='inherit' if embeddings is None else embeddings,
        fresh=None if key is None else fresh, what=what, src='grown model')
    return {**top, 'blocks': grown['blocks']}


# ----------------------------------------------------------------------------------------
# Net2WiderNet / FPI.

def unit_mapping(n1: int, n2: int, key: jax.Array | None, *, balanced: bool) -> jax.Array:
    """The source unit of every target unit when an axis grows from n1 to n2 units.

    Args:
        n1: the axis's size in the small model (at least 1).
        n2: its size in the large model (at least `n1`).
        key: the PRNG key for the new units; may be None when `n2 == n1`.
        balanced: draw the new units as a random permutation of the source units repeated,
          so no source unit is used more than once more than another; else uniform draws
          (Net2Net).

    Returns:
        (n2,) int source-unit indices; the first n1 are the units themselves, the n2 − n1
        new ones random source units.

    Raises:
        GeneError: `n1` is less than 1 or `n2` less than `n1`, or `n2 != n1` and `key` is None.
    """
    if not 1 <= n1 <= n2:
        raise GeneError(f'unit_mapping: an axis grows from {n1} to {n2} units; growth needs '
                        'n2 >= n1 >= 1')
    if n2 == n1:
        return jnp.arange(n1)
    if key is None:
        raise GeneError(f'growing an axis from {n1} to {n2} units draws a random unit mapping '
                        'and needs a PRNG key (key=...)')
    new = n2 - n1
    if balanced:
        reps = -(-new // n1)
        perms = jax.vmap(lambda k: jax.random.permutation(k, n1))(jax.random.split(key, reps))
        extra = perms.reshape(-1)[:new]
    else:
        extra = jax.random.randint(key, (new,), 0, n1)
    return jnp.concatenate([jnp.arange(n1), extra])


def net2net_mappings(small: Params, want: Params, key: jax.Array | None, *,
                     embed_mapping: str = 'balanced') -> dict[str, jax.Array]:
    """The Net2WiderNet unit mappings of the width axes that grow.

    Args:
        small: the small model's canonical params (stacked layout).
        want: the large model's params or shapes (`check_growth`'s output).
        key: the PRNG key, split over `WIDTH_AXES`; needed when any width axis grows.
        embed_mapping: the residual axis's draw, 'balanced' or 'random' (`unit_mapping`);
          'heads' and 'mlp' always draw uniformly.

    Returns:
        A dict from each axis of `WIDTH_AXES` whose size differs to its (n2,) source units.

    Raises:
        GeneError: `embed_mapping` is not one of `EMBED_MAPPINGS`, or an axis grows and
          `key` is None.
    """
    common.check_choice('net2net', 'embed_mapping', embed_mapping, EMBED_MAPPINGS)
    s, t = axis_sizes(small), axis_sizes(want)
    keys = dict(zip(WIDTH_AXES, jax.random.split(key, len(WIDTH_AXES)))) if key is not None else {}
    return {name: unit_mapping(s[name], t[name], keys.get(name),
                               balanced=(name == 'embed' and embed_mapping == 'balanced'))
            for name in WIDTH_AXES if name in s and s[name] != t[name]}


def _widen_leaf(x, path: str, mappings: Mapping[str, jax.Array]):
    """One leaf widened by Net2WiderNet: gather every mapped axis; divide fan-in axes by the
    source unit's replication count."""
    names, fan_in = layout.leaf_axes(path, np.ndim(x)), fan_in_axes(path, np.shape(x))
    for dim, name in enumerate(names):
        if name not in mappings:
            continue
        g, n1 = mappings[name], x.shape[dim]
        x = jnp.take(x, g, axis=dim)
        if name in fan_in:
            count = jnp.bincount(g, length=n1)[g].astype(x.dtype)
            x = x / count.reshape((-1,) + (1,) * (x.ndim - dim - 1))
    return x


def _aki_mask(path: str, shape, mappings: Mapping[str, jax.Array], small_sizes: Mapping[str, int]):
    """Boolean mask over a widened block leaf: True on the new units of its fan-out 'heads'
    or 'mlp' axes (those AKI takes from the next layer); None when it has none."""
    names, fan_in = layout.leaf_axes(path, len(shape)), fan_in_axes(path, shape)
    mask = None
    for dim, name in enumerate(names):
        if name in ('heads', 'mlp') and name in mappings and name not in fan_in:
            new = (jnp.arange(shape[dim]) >= small_sizes[name]).reshape(
                (-1,) + (1,) * (len(shape) - dim - 1))
            mask = new if mask is None else (mask | new)
    return mask


def widen(small: Params, mappings: Mapping[str, jax.Array], *, aki: bool = False) -> Params:
    """`small` with its width axes grown by `mappings` (FPI / Net2WiderNet). The depth is
    unchanged.

    Args:
        small: the small model's canonical params (stacked layout).
        mappings: {axis: (n2,) source units} (`net2net_mappings`); unmapped axes are kept.
        aki: bert2BERT's AKI, so the new fan-out heads / MLP units of layer l come from layer
          l+1 (the top layer from itself).

    Returns:
        The widened params, in the stacked layout.
    """
    sizes = axis_sizes(small)

    def one(p, x):
        path = pytree.path_str(p)
        y = _widen_leaf(x, path, mappings)
        if aki and path.startswith('blocks/'):
            mask = _aki_mask(path, y.shape, mappings, sizes)
            if mask is not None:
                nxt = jnp.concatenate([x[1:], x[-1:]], axis=0)
                y = jnp.where(mask, _widen_leaf(nxt, path, mappings), y)
        return y
    return jax.tree_util.tree_map_with_path(one, small)


# ----------------------------------------------------------------------------------------
# Depth.

def stack_depth(blocks: Params, depth: int) -> Params:
    """StackBERT's depth growth: layer l is source layer l mod L1.

    Args:
        blocks: a stacked blocks tree of L1 layers.
        depth: the number of layers wanted.

    Returns:
        A stacked blocks tree of `depth` layers.
    """
    return common.gather_layers(blocks, np.arange(depth) % common.num_layers(blocks))


def identity_depth(blocks: Params, depth: int) -> Params:
    """Net2DeeperNet: layer l copies source layer ⌊l·L1/depth⌋; every copy after the first
    of a source layer has its output projections zeroed (an identity block).

    Args:
        blocks: a stacked blocks tree of L1 layers.
        depth: the number of layers wanted, at least L1.

    Returns:
        A stacked blocks tree of `depth` layers.
    """
    n = common.num_layers(blocks)
    src = (np.arange(depth) * n) // depth
    first = np.concatenate([[True], src[1:] != src[:-1]])
    out = common.gather_layers(blocks, src)
    keep = jnp.asarray(first, jnp.float32)

    def zero_extra(p, x):
        if pytree.path_str(p) in _BLOCK_OUTPUTS:
            return x * keep.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
        return x
    return jax.tree_util.tree_map_with_path(zero_extra, out)


def _with_blocks(params: Params, blocks: Params) -> Params:
    return {**params, 'blocks': blocks}


# ----------------------------------------------------------------------------------------
# The baselines.

def net2net(small: Params, large_cfg: ViTConfig, key: jax.Array | None = None, *,
            embed_mapping: str = 'balanced') -> Params:
    """Net2WiderNet then Net2DeeperNet: the large model computes the small model's function
    (exactly with a balanced residual mapping when D1 divides D2). `key` draws the unit
    mappings (needed when the width grows). Needs equal head_dim; classes, patches and
    image size unchanged.

    Args:
        small: the small model's canonical params (either layout).
        large_cfg: the large model's config.
        key: the PRNG key for the unit mappings.
        embed_mapping: 'balanced' or 'random' residual mapping (`unit_mapping`).

    Returns:
        Canonical params of `large_cfg` (stacked layout).

    Raises:
        GeneError: `small` does not grow into `large_cfg` by width and depth
          (`check_growth`), `embed_mapping` is not one of its choices, or the width grows
          and `key` is None.
    """
    small = common.stacked(small, 'net2net')
    want = check_growth(small, large_cfg, 'net2net', grows=WIDTH_AXES + ('layers',),
                        hint='Net2Net copies whole heads, so head_dim must match')
    wide = widen(small, net2net_mappings(small, want, key, embed_mapping=embed_mapping))
    return _with_blocks(wide, identity_depth(wide['blocks'], large_cfg.depth))


def stackbert(small: Params, large_cfg: ViTConfig, key: jax.Array | None = None, *,
              width: str = 'none', embed_mapping: str = 'balanced') -> Params:
    """StackBERT: target layer l = source layer l mod L1.

    Args:
        small: the small model's canonical params (either layout).
        large_cfg: the large model's config.
        key: the PRNG key for Net2WiderNet's unit mappings (width='net2net' with a width
          change only).
        width: 'none' needs equal widths; 'net2net' first widens by Net2WiderNet.
        embed_mapping: with width='net2net', the residual mapping (`unit_mapping`).

    Returns:
        Canonical params of `large_cfg` (stacked layout).

    Raises:
        GeneError: `width` or `embed_mapping` is not one of its choices, `small` does not
          grow into `large_cfg` (`check_growth`), or the width grows and `key` is None.
    """
    common.check_choice('stackbert', 'width', width, STACKBERT_WIDTHS)
    small = common.stacked(small, 'stackbert')
    if width == 'none':
        check_growth(small, large_cfg, 'stackbert', grows=('layers',),
                     hint="StackBERT grows depth only; width='net2net' widens by Net2Net first")
    else:
        want = check_growth(small, large_cfg, 'stackbert', grows=WIDTH_AXES + ('layers',),
                            hint='Net2Net copies whole heads, so head_dim must match')
        small = widen(small, net2net_mappings(small, want, key, embed_mapping=embed_mapping))
    return _with_blocks(small, stack_depth(small['blocks'], large_cfg.depth))


def bert2bert(small: Params, large_cfg: ViTConfig, key: jax.Array | None = None, *,
              aki: bool = True, embed_mapping: str = 'balanced') -> Params:
    """bert2BERT: FPI width growth (with AKI by default), then stacking to the target
    depth.

    Args:
        small: the small model's canonical params (either layout).
        large_cfg: the large model's config (the small model's head_dim).
        key: the PRNG key for the unit mappings; needed when the width grows.
        aki: take the new heads' and MLP units' fan-out weights from the next layer (AKI).
        embed_mapping: the residual mapping, 'balanced' or 'random' (`unit_mapping`).

    Returns:
        Canonical params of `large_cfg` (stacked layout).

    Raises:
        GeneError: `small` does not grow into `large_cfg` by width and depth
          (`check_growth`), `embed_mapping` is not one of its choices, or the width grows
          and `key` is None.
    """
    small = common.stacked(small, 'bert2bert')
    want = check_growth(small, large_cfg, 'bert2bert', grows=WIDTH_AXES + ('layers',),
                        hint='bert2BERT copies whole heads, so head_dim must match')
    wide = widen(small, net2net_mappings(small, want, key, embed_mapping=embed_mapping), aki=aki)
    return _with_blocks(wide, stack_depth(wide['blocks'], large_cfg.depth))


# ----------------------------------------------------------------------------------------
# LiGO.

_LIGO_ATTN = {'attn/q/kernel': 'q', 'attn/q/bias': 'q', 'attn/k/kernel': 'k', 'attn/k/bias': 'k',
              'attn/v/kernel': 'v', 'attn/v/bias': 'v', 'attn/out/kernel': 'v'}


def _ligo_sizes(small: Params, want: Params) -> dict[str, tuple[int, int]]:
    """{expansion: (n1, n2)}: residual width, attention width H·Dh and MLP hidden size."""
    s, t = axis_sizes(small), axis_sizes(want)
    return {'embed': (s['embed'], t['embed']),
            'attn': (s['heads'] * s['head_dim'], t['heads'] * t['head_dim']),
            'mlp': (s['mlp'], t['mlp']), 'layers': (s['layers'], t['layers'])}


def _ligo_operator_shapes(small: Params, want: Params) -> Params:
    """The operator's shapes; 'head' (the head input's expansion) only for a model with a
    head."""
    n = _ligo_sizes(small, want)
    (l1, l2), sds = n['layers'], jax.ShapeDtypeStruct
    width = {'embed': sds((n['embed'][1] - n['embed'][0], n['embed'][0]), jnp.float32)}
    for name in ('q', 'k', 'v'):
        width[name] = sds((l2, n['attn'][1] - n['attn'][0], n['attn'][0]), jnp.float32)
    width['mlp'] = sds((l2, n['mlp'][1] - n['mlp'][0], n['mlp'][0]), jnp.float32)
    if 'head' in small:
        width['head'] = width['embed']
    depth = jax.tree.map(lambda _: sds((l2, l1), jnp.float32), small['blocks'])
    return {'width': width, 'depth': depth}


def ligo_init_operator(small_cfg: ViTConfig, large_cfg: ViTConfig, key: jax.Array, *,
                       width_init: str = 'rand', depth_init: str = 'stackbert_noisy',
                       depth_noise: float = 0.03) -> Params:
    """A LiGO operator from `small_cfg` to `large_cfg`, initialised as the official code::

        {'width': {'embed': C (D2−D1, D1), 'head': (D2−D1, D1), 'q'|'k'|'v': (L2, A2−A1, A1),
                   'mlp': (L2, M2−M1, M1)},
         'depth': <block tree of (L2, L1) coefficients>}

    width_init 'rand' (official default): each row of C is U(0, 1) normalised to sum 1 (not
    function-preserving); 'sel': a random one-hot row (copy a source unit, no division).
    'head' (the head input's own expansion; absent without a head) starts equal to 'embed',
    so at init the head reads the residual stream's new units as they are made, and the
    other matrices are drawn as without it.
    depth_init 'stackbert_noisy' (official): row l2 = normalise(onehot(l2 mod L1) +
    U(0, depth_noise)); 'stackbert': the one-hot rows.

    Args:
        small_cfg: the small model's config.
        large_cfg: the large model's config.
        key: the PRNG key.
        width_init: 'rand' or 'sel' (above).
        depth_init: 'stackbert_noisy' or 'stackbert' (above).
        depth_noise: the upper bound of the uniform noise of 'stackbert_noisy'.

    Returns:
        The operator (above), float32.

    Raises:
        GeneError: `width_init` or `depth_init` is not one of its choices, or `small_cfg`
          does not grow into `large_cfg` (`check_growth`).
    """
    common.check_choice('ligo_init_operator', 'width_init', width_init, LIGO_WIDTH_INITS)
    common.check_choice('ligo_init_operator', 'depth_init', depth_init, LIGO_DEPTH_INITS)
    small = common.target_shapes(small_cfg)
    want = check_growth(small, large_cfg, 'ligo')
    shapes = _ligo_operator_shapes(small, want)
    head = shapes['width'].pop('head', None)    # drawn as 'embed' is, below
    l2, l1 = large_cfg.depth, small_cfg.depth
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    stack = jax.nn.one_hot(np.arange(l2) % l1, l1, dtype=jnp.float32)

    def width(k, shape):
        if width_init == 'rand':
            c = jax.random.uniform(k, shape, jnp.float32)
            return c / jnp.maximum(c.sum(-1, keepdims=True), 1e-12)
        return jax.nn.one_hot(jax.random.randint(k, shape[:-1], 0, shape[-1]), shape[-1],
                              dtype=jnp.float32)

    def depth(k):
        if depth_init == 'stackbert':
            return stack
        w = stack + jax.random.uniform(k, (l2, l1), jnp.float32, 0.0, depth_noise)
        return w / w.sum(-1, keepdims=True)

    out = jax.tree.unflatten(treedef, list(keys))
    widths = {k: width(out['width'][k], shapes['width'][k].shape) for k in shapes['width']}
    if head is not None:     # its own buffer: a trained leaf apart from 'embed'
        widths['head'] = jnp.array(widths['embed'], copy=True)
    return {'width': widths, 'depth': jax.tree.map(depth, out['depth'])}


def _expansion(c: jax.Array) -> jax.Array:
    """A = [I; C]: (n2, n1) from C (n2 − n1, n1), or (L, n2, n1) from per-layer C (L, ., n1)."""
    n1 = c.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n1, dtype=c.dtype), c.shape[:-2] + (n1, n1))
    return jnp.concatenate([eye, c], axis=-2)


def _expand_axis(x, dim: int, a: jax.Array):
    """x with axis `dim` (size n1) mapped to n2 by A: (n2, n1), or per layer (L, n2, n1)
    with x's leading axis the layers."""
    x = jnp.moveaxis(x, dim, -1)
    if a.ndim == 2:
        y = jnp.einsum('...n,mn->...m', x, a, precision=jax.lax.Precision.HIGHEST)
    else:
        y = jnp.einsum('l...n,lmn->l...m', x, a, precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(y, -1, dim)


def _ligo_leaf(x, path: str, target_shape, expansions: Mapping[str, jax.Array]):
    """One (depth-mixed) leaf expanded in width with the official tying."""
    names = list(layout.leaf_axes(path, np.ndim(x)))
    if 'heads' in names:          # the attention width H·Dh is one expanded axis
        h = names.index('heads')
        x = x.reshape(x.shape[:h] + (-1,) + x.shape[h + 2:])
        names[h:h + 2] = ['attn']
    key = path[len('blocks/'):] if path.startswith('blocks/') else path
    embed = expansions['head'] if key.startswith(('head/', 'head_dist/')) else expansions['embed']
    for dim, name in enumerate(names):
        if name == 'embed':
            x = _expand_axis(x, dim, embed)
        elif name == 'attn':
            x = _expand_axis(x, dim, expansions[_LIGO_ATTN[key]])
        elif name == 'mlp':
            x = _expand_axis(x, dim, expansions['mlp'])
    return x.reshape(target_shape)


def ligo_grow(operator: Params, small: Params, large_cfg: ViTConfig) -> Params:
    """The large model's params from the small model's by the LiGO operator: each block leaf
    mixed over source layers by its own coefficients, then every growing axis expanded by
    its tied [I; C] matrix (see the module docstring; the head's input by the operator's
    'head' matrix). Jittable with `large_cfg` static.

    Args:
        operator: the LiGO operator (`ligo_init_operator`, trained or not).
        small: the small model's canonical params (either layout).
        large_cfg: the large model's config.

    Returns:
        Canonical params of `large_cfg` (stacked layout).

    Raises:
        GeneError: `small` does not grow into `large_cfg` (`check_growth`), or the
          operator's shapes are not those for this pair of models.
    """
    small = common.stacked(small, 'ligo_grow')
    want = check_growth(small, large_cfg, 'ligo_grow')
    common.check_fits(operator, _ligo_operator_shapes(small, want), 'ligo_grow', large_cfg,
                      source='operator', complete=True,
                      hint=' (the operator was made for another pair of models)')
    expansions = {k: _expansion(c) for k, c in operator['width'].items()}
    flat_want = pytree.flatten(want)

    def block_leaf(p, x, w):
        path = 'blocks/' + pytree.path_str(p)
        mixed = jnp.tensordot(w, x, axes=1, precision=jax.lax.Precision.HIGHEST)
        return _ligo_leaf(mixed, path, flat_want[path].shape, expansions)

    top = {path: _ligo_leaf(x, path, flat_want[path].shape, expansions)
           for path, x in pytree.flatten(common.top_level(small)).items()}
    grown = pytree.unflatten(top)
    grown['blocks'] = jax.tree_util.tree_map_with_path(block_leaf, small['blocks'],
                                                       operator['depth'])
    return grown


# ----------------------------------------------------------------------------------------
# Method contract.

def _small_gene(params: Params, cfg: ViTConfig) -> Params:
    """The gene of Net2Net / StackBERT / bert2BERT: the small model itself."""
    return common.check_model(params, cfg, 'growth gene')


def _split_key(key):
    return (None, None) if key is None else tuple(jax.random.split(key))


def _descend_with(fn: Callable[..., Params], name: str):
    def descend(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                head: str = 'inherit', embeddings: str | None = None, **options: Any) -> Params:
        k_grow, k_fresh = _split_key(key)
        return descend_grown(lambda s, c: fn(s, c, k_grow, **options), gene, target_cfg,
                             what=name, key=k_fresh, head=head, embeddings=embeddings)
    descend.__doc__ = (f'Grow the small model `gene` into `target_cfg` by `{fn.__name__}` '
                       "(options passed on); head='inherit'|'new', embeddings='inherit'|'random'.")
    return common.forwards_options(fn)(descend)


@common.forwards_options(ligo_init_operator)
def ligo_gene(params: Params, cfg: ViTConfig, *, large_cfg: ViTConfig | None = None,
              operator: Params | None = None, key: jax.Array | None = None,
              **init_options: Any) -> Params:
    """LiGO's gene: the small model and its (trained) operator.

    Args:
        params: the small model's canonical params (either layout).
        cfg: the small model's config.
        large_cfg: the large model's config, to draw a fresh operator; not used with
          `operator`.
        operator: the trained operator; None draws a fresh one for `large_cfg`.
        key: the PRNG key for a fresh operator; None is `jax.random.key(0)`.
        **init_options: `ligo_init_operator`'s options for a fresh operator.

    Returns:
        A dict with the small model (stacked layout) under 'small' and the operator under
        'operator'.

    Raises:
        GeneError: `params` is not a whole model of config `cfg` (`common.check_model`),
          neither `operator` nor `large_cfg` is given, or `ligo_init_operator` refuses the
          configs or options.
    """
    small = common.check_model(params, cfg, 'ligo_gene')
    if operator is None:
        if large_cfg is None:
            raise GeneError('ligo_gene: give the trained operator, or large_cfg to draw a fresh one')
        operator = ligo_init_operator(cfg, large_cfg, jax.random.key(0) if key is None else key,
                                      **init_options)
    return {'small': small, 'operator': operator}


def check_operator_gene(gene: Any, what: str) -> None:
    """Check that `gene` is a learned growth's gene, `{'small': model, 'operator': operator}`.

    Args:
        gene: the tree to check.
        what: the method's label, for the error message.

    Raises:
        GeneError: `gene` is not a mapping with exactly the keys 'small' and 'operator'.
    """
    if not isinstance(gene, Mapping) or set(gene) != {'small', 'operator'}:
        got = sorted(gene) if isinstance(gene, Mapping) else type(gene).__name__
        raise GeneError(f"not a {what} gene: expected keys ['operator', 'small'], got {got}")


def descend_ligo(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                 head: str = 'inherit', embeddings: str | None = None) -> Params:
    """The large model grown by the gene's LiGO operator.

    Args:
        gene: the LiGO gene (`ligo_gene`).
        target_cfg: the large model's config (the one the operator was made for, up to the
          class count with head='new').
        key: the PRNG key for what is drawn fresh (a new head, random embeddings).
        head: 'inherit' or 'new' (`descend_grown`).
        embeddings: 'inherit', None (inherit) or 'random'.

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: `gene` is no operator gene (`check_operator_gene`), the operator does not
          fit the models, an option is not one of its choices, or something must be drawn
          and there is no `key`.
    """
    check_operator_gene(gene, 'LiGO')
    return descend_grown(lambda s, c: ligo_grow(gene['operator'], s, c), gene['small'],
                         target_cfg, what='ligo', key=key, head=head, embeddings=embeddings)


def operator_gene_param_count(gene: Params, *, include_head: bool = False) -> int:
    """The parameters a learned growth stores: the small model plus the operator.

    Args:
        gene: an operator gene, `{'small', 'operator'}`.
        include_head: count the small model's head too.

    Returns:
        The small model's parameter count (its head only with `include_head`) plus the
        whole operator's.
    """
    return common.count(gene['small'], include_head=include_head) + common.count(gene['operator'])


def ligo_gene_param_count(gene: Params, *, include_head: bool = False) -> int:
    """LiGO's S-Params: `operator_gene_param_count`, less the head input's own expansion
    without `include_head` (descend reads it only with head='inherit').

    Args:
        gene: the LiGO gene.
        include_head: count the small model's head and the operator's 'head' expansion.

    Returns:
        The parameter count.
    """
    total = operator_gene_param_count(gene, include_head=include_head)
    if not include_head:
        total -= common.count(gene['operator']['width'].get('head'))
    return total


_SMALL_COUNT = functools.partial(common.count, include_head=False)
# The gene of Net2Net, StackBERT and bert2BERT is the small model; LiGO's and Mango's add the
# learned operator.
SMALL_PARTS = common.model_parts()
OPERATOR_PARTS = {'small': common.Part(parts=common.model_parts()), 'operator': common.Part()}
NET2NET, STACKBERT, BERT2BERT = (common.register(common.Method(
    name=name, label=label, source='model', gene_from_model=_small_gene,
    descend=_descend_with(grow, name), gene_param_count=_SMALL_COUNT, gene_parts=SMALL_PARTS,
    family='grown'))
    for name, label, grow in (('net2net', 'Net2Net', net2net), ('stackbert', 'StackBERT', stackbert),
                              ('bert2bert', 'bert2BERT', bert2bert)))
LIGO = common.register(common.Method(
    name='ligo', label='LiGO', source='model', gene_from_model=ligo_gene,
    descend=descend_ligo, gene_param_count=ligo_gene_param_count,
    gene_parts=OPERATOR_PARTS, family='operator',
    operator=common.Operator(init=ligo_init_operator, grow=ligo_grow)))
