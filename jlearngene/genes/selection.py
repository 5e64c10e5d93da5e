"""IMwLM, weight selection (Xu et al., ICLR 2024, "Initializing Models with Larger Ones"):
a smaller model initialised with elements selected from a larger pretrained one.

The gene is the larger model itself (stacked canonical params). A descendant takes, along
every logical axis (`models.layout`), the same evenly spaced indices of the larger model's
axis (uniform element selection): n → m keeps 0, s, 2s, ... with s = n/m when m divides n,
else round(linspace(0, n−1, m)), the published rule. The indices depend only on the two
sizes, so every tensor selects the same neurons (the method's consistency). Layers: the
first m ('first', the paper's default) or the uniform rule ('uniform'); a deeper target
takes every layer and draws the ones above fresh ('first') or repeats layers ('uniform').

Heads: `heads='whole'` selects on the 'heads' and 'head_dim' axes separately (equal head
sizes keep whole heads); `heads='flat'` selects on the flattened heads × head_dim axis, as
the published code does on timm's fused layout.

`METHOD` is the registry's 'imwlm' entry (source 'model').
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.genes import common
from jlearngene.genes.common import GeneError
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
LAYERS = ('first', 'uniform')
HEADS = ('whole', 'flat')
_FIXED_AXES = ('patch_h', 'patch_w', 'channels', 'tokens', 'classes')


def uniform_indices(n: int, m: int) -> np.ndarray:
    """m evenly spaced indices of an axis of size n (the published rule).

    Args:
        n: the size of the larger axis.
        m: how many indices to take, at least 1; m > n repeats indices.

    Returns:
        int64 array of shape `(m,)`, `0, s, 2s, ...` with s = n/m when m divides n, else
        `round(linspace(0, n - 1, m))`.

    Raises:
        GeneError: `n` or `m` is less than 1.
    """
    if n < 1 or m < 1:
        raise GeneError(f'uniform_indices: m={m} indices of an axis of size n={n}; both must be at least 1')
    if m <= n and n % m == 0:
        return np.arange(m) * (n // m)
    return np.round(np.linspace(0, n - 1, m)).astype(np.int64)


def gene_from_model(params: Params, cfg: ViTConfig) -> Params:
    """IMwLM's gene: the whole larger model (stacked layout), checked against `cfg`.

    Args:
        params: the trained larger model's params, in either layout.
        cfg: its config.

    Returns:
        `params` in the stacked layout.

    Raises:
        GeneError: `params` is not a whole model of config `cfg` (`common.check_model`).
    """
    return common.check_model(params, cfg, 'imwlm')


def descend(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
            head: str = 'inherit', embeddings: str | None = None, layers: str = 'first',
            heads: str = 'whole') -> Params:
    """Uniform element selection of `target_cfg`'s shapes from the larger model `gene`.

    Every axis of the target must be at most the model's, except depth; the patch, channel,
    token and class axes must be equal (`head='new'` draws a head for other class counts).

    Args:
        gene: the larger model's params (either layout), as `gene_from_model` makes it.
        target_cfg: the descendant's config.
        key: PRNG key for anything drawn (a new head, random embeddings, layers above the
          model's depth with layers='first'); None where nothing is drawn.
        head: 'inherit' the model's head (selected) or draw a 'new' one.
        embeddings: 'inherit' (selected) or 'random': the patch/position embeddings, prefix
          tokens and final norm drawn fresh; None: inherit.
        layers: 'first', the first `target_cfg.depth` layers (a deeper target draws the rest
          fresh), or 'uniform', `uniform_indices` over the layers (a deeper target repeats them).
        heads: 'whole' selects on the 'heads' and 'head_dim' axes separately; 'flat' on the
          flattened heads × head_dim axis, as the published code does.

    Returns:
        The descendant's params (stacked layout).

    Raises:
        GeneError: the model or the target has a pre-logits layer; `layers`, `heads`, `head` or
          `embeddings` is not a valid choice; the target needs a leaf that the model lacks, or
          one larger than the model's (or different on a fixed axis), naming the first; something
          is drawn and `key` is None.
    """
    common.check_no_pre_logits(gene, 'imwlm.descend')
    common.check_no_pre_logits(target_cfg, 'imwlm.descend')
    common.check_choice('imwlm', 'layers', layers, LAYERS)
    common.check_choice('imwlm', 'heads', heads, HEADS)
    gene = common.stacked(gene, 'imwlm')
    want = common.target_shapes(target_cfg)
    src = pytree.flatten(gene)
    for path, w in pytree.flatten(want).items():
        if path not in src:
            raise GeneError(f"imwlm: the target config ({common.shape_str(target_cfg)}) needs "
                            f"'{path}' but the model has none")
        names = layout.leaf_axes(path, len(w.shape))
        got = np.shape(src[path])
        bad = [a for a, n, m in zip(names, got, w.shape)
               if a != 'layers' and (m > n or (a in _FIXED_AXES and m != n))]
        if bad and not (path.startswith('head') and head == 'new'):
            block = path.startswith('blocks/')     # shapes per layer, as the other methods say
            where, need = (path[len('blocks/'):], w.shape[1:]) if block else (path, w.shape)
            raise GeneError(f"imwlm: the gene's '{where}' has shape {got[1:] if block else got} "
                            f'but the target config ({common.shape_str(target_cfg)}) needs '
                            f"{tuple(need)}; weight selection only shrinks axes ({bad[0]!r})")
    n_layers, depth = layout.depth_of(gene), target_cfg.depth
    if layers == 'first':
        layer_idx = np.arange(min(depth, n_layers))
    else:
        layer_idx = uniform_indices(n_layers, depth)
    drawn = depth > layer_idx.size
    if drawn and key is None:
        raise GeneError(f'imwlm: target layers {list(range(n_layers, depth))} are drawn fresh and '
                        'need a PRNG key')
    k_new, k_blocks = jax.random.split(key) if key is not None else (None, None)

    flat_want = pytree.flatten(want)

    def select(path, x):
        name = pytree.path_str(path)
        names = layout.leaf_axes(name, np.ndim(x))
        shape = tuple(flat_want[name].shape)
        if name.startswith('blocks/'):
            x = jnp.take(x, jnp.asarray(layer_idx), axis=0)
            shape = (layer_idx.size,) + shape[1:]
        sizes = shape
        if heads == 'flat' and 'head_dim' in names:    # one heads × head_dim axis
            at = names.index('head_dim')
            x = x.reshape(x.shape[:at - 1] + (-1,) + x.shape[at + 1:])
            names = names[:at - 1] + ('attn',) + names[at + 1:]
            sizes = shape[:at - 1] + (shape[at - 1] * shape[at],) + shape[at + 1:]
        for dim, axis in enumerate(names):
            if axis != 'layers' and x.shape[dim] != sizes[dim]:
                x = jnp.take(x, jnp.asarray(uniform_indices(x.shape[dim], sizes[dim])), axis=dim)
        return x.reshape(shape)

    selected = jax.tree_util.tree_map_with_path(
        select, {k: v for k, v in gene.items() if k in want and (k != 'head' or head == 'inherit')})

    def fresh() -> Params:
        return vit.init_embeddings(target_cfg, k_new)

    params = common.embeddings_and_heads(selected, target_cfg, head=head, embeddings=embeddings,
                                         fresh=None if key is None else fresh, what='imwlm',
                                         want=want)
    blocks = selected['blocks']
    if drawn:
        base = jax.vmap(lambda k: vit.init_block(target_cfg, k))(jax.random.split(k_blocks, depth))
        blocks = common.place_layers(base, np.arange(layer_idx.size), blocks,
                                     np.arange(layer_idx.size))
    params['blocks'] = blocks
    pytree.assert_same_structure(want, params, 'imwlm: target params and built params')
    return params


def gene_param_count(gene: Params, *, include_head: bool = False) -> int:
    """Parameters of the stored larger model (its head only with `include_head`).

    Args:
        gene: the larger model's params.
        include_head: also count the classifier (`common.HEAD_KEYS`).

    Returns:
        The number of parameters.
    """
    return common.count(gene, include_head=include_head)


METHOD = common.register(common.Method(
    name='imwlm', label='IMwLM', source='model', gene_from_model=gene_from_model,
    descend=descend, gene_param_count=gene_param_count, gene_parts=common.model_parts(),
    family='teacher'))
