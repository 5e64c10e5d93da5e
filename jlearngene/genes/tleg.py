"""TLEG (Xia et al., AAAI 2024): a learngene of two layer-shaped tensors, linearly expanded.

Layer l of an L-layer network gets θ_l = θ_B + (l/L)·θ_A, l = 0..L−1 (0-based; the paper's
(l−1)/L with 1-based l; the divisor is L, so the last layer's coefficient is (L−1)/L).

A **gene** is a plain pytree::

    {'theta_a': <block tree>, 'theta_b': <block tree>, 'shared': {...}}

* `theta_a`, `theta_b`: the canonical block structure of `jlearngene.models.vit` *without*
  the layers axis, holding only the expanded modules. A gene without `theta_a` means θ_A ≡ 0
  (Share-Init: every layer identical).
* `shared`: what is not expanded. The top-level ViT params (patch/position embeddings, class
  token, final norm, head), plus

  - `shared['blocks']`: block modules that are *not* expanded, stacked per Aux-Net layer
    (L, ...): in the Aux-Net they are free per-layer parameters (paper Table 4 variants);
  - `shared['prefix']`: the expanded modules of layers 0..from_layer−1, stacked
    (from_layer, ...): with partial expansion (paper Table 6, "from the 3rd layer") these
    first layers are free per-layer parameters too.

Expandable module groups (`MODULES`): 'msa' = blocks/attn/* (q, k, v, out; weights and
biases), 'mlp' = blocks/mlp/*, 'ln' = norm1 and norm2 (γ and β), 'ls' = LayerScale ls1/ls2
(not in the official model; only for `cfg.layer_scale`, off by default so LayerScale gains
stay free per layer).

Stage 1 (Aux-Net): `materialize(gene, None, aux_cfg)` = `expand(gene, aux_cfg.depth)`
gives canonical params; the loss runs `apply` on them, so `jax.grad` reaches θ_A and θ_B
through the broadcast (∂/∂θ_B = Σ_l g_l, ∂/∂θ_A = Σ_l (l/L)·g_l). Stage 2: `descend`
initialises a descendant of any depth with its own L_d.

`METHOD` is the registry's 'tleg' entry (`jlearngene.genes.get('tleg')`): source 'learned',
with these functions as its verbs; its S-Params exclude the head by default.
"""
from __future__ import annotations

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

MODULES: dict[str, tuple[str, ...]] = {
    'msa': ('attn',),
    'mlp': ('mlp',),
    'ln': ('norm1', 'norm2'),
    'ls': ('ls1', 'ls2'),
}
DEFAULT_EXPAND = ('msa', 'mlp', 'ln')   # the paper's main setting (Table 4, #5)
HEADS = common.HEADS
OTHERS = ('random', 'inherit')


# ----------------------------------------------------------------------------------------
# Gene construction.

def _block_keys(cfg: ViTConfig) -> tuple[str, ...]:
    return tuple(jax.eval_shape(lambda: vit.init_block(cfg, jax.random.key(0))))


def expanded_keys(expand: Sequence[str], cfg: ViTConfig) -> tuple[str, ...]:
    """The block-level keys ('attn', 'norm1', ...) that the module groups `expand` cover.

    Args:
        expand: module groups, a subset of `MODULES`.
        cfg: the Aux-Net's config (it decides whether 'ls' exists).

    Returns:
        The keys, in block order.

    Raises:
        GeneError: `expand` is empty, names an unknown group, or has 'ls' without LayerScale.
    """
    if isinstance(expand, str):
        expand = (expand,)
    if not expand:
        raise GeneError(f'expand is empty; choose a subset of {tuple(MODULES)}')
    unknown = [m for m in expand if m not in MODULES]
    if unknown:
        raise GeneError(f'unknown expanded module(s) {unknown}; known: {tuple(MODULES)}')
    if 'ls' in expand and not cfg.layer_scale:
        raise GeneError("expand includes 'ls' but the config has layer_scale=False")
    return tuple(k for m in expand for k in MODULES[m])


def _split_block(block: Params, keys: Sequence[str]) -> tuple[Params, Params]:
    return ({k: v for k, v in block.items() if k in keys},
            {k: v for k, v in block.items() if k not in keys})


def _zero_non_kernels(tree: Params) -> Params:
    """θ_A init: linear kernels trunc-normal (as drawn), every bias / LN / LayerScale 0."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x if pytree.path_str(p).endswith('kernel') else jnp.zeros_like(x), tree)


def init_gene(cfg: ViTConfig, key: jax.Array, expand: Sequence[str] = DEFAULT_EXPAND,
              from_layer: int = 0) -> Gene:
    """A fresh gene for an Aux-Net of shape `cfg` (cfg.depth = L), initialised as the official
    code: θ_A and θ_B linear weights independent trunc-normal(0.02), all biases 0, LayerNorm
    γ_B = 1, β_B = 0, γ_A = β_A = 0; embeddings and head as `vit.init_embeddings`.

    Args:
        cfg: the Aux-Net's config.
        key: the PRNG key.
        expand: the module groups to expand (`MODULES`); the others are free per-layer
          parameters in `shared['blocks']`.
        from_layer: the layers before it are free per-layer parameters in `shared['prefix']`
          (partial expansion, paper Table 6: from_layer=2).

    Returns:
        The gene `{'theta_a', 'theta_b', 'shared'}` (module docstring).

    Raises:
        GeneError: `expand` is not a valid choice (`expanded_keys`), or `from_layer` is not in
          [0, depth).
    """
    keys = expanded_keys(expand, cfg)
    if not (isinstance(from_layer, int) and 0 <= from_layer < cfg.depth):
        raise GeneError(f'from_layer={from_layer!r} must be an integer in [0, depth={cfg.depth}) '
                        'so that at least one layer is expanded')
    ka, kb, ke, kf, kp = jax.random.split(key, 5)
    theta_b, _ = _split_block(vit.init_block(cfg, kb), keys)
    theta_a, _ = _split_block(vit.init_block(cfg, ka), keys)
    gene: Gene = {'theta_a': _zero_non_kernels(theta_a), 'theta_b': theta_b,
                  'shared': vit.init_embeddings(cfg, ke)}
    free = [k for k in _block_keys(cfg) if k not in keys]
    if free:
        stacked = jax.vmap(lambda k: vit.init_block(cfg, k))(jax.random.split(kf, cfg.depth))
        gene['shared']['blocks'] = _split_block(stacked, keys)[1]
    if from_layer:
        stacked = jax.vmap(lambda k: vit.init_block(cfg, k))(jax.random.split(kp, from_layer))
        gene['shared']['prefix'] = _split_block(stacked, keys)[0]
    return gene


# ----------------------------------------------------------------------------------------
# Introspection.

def check_gene(gene: Any) -> None:
    """Check that `gene` has the structure of a TLEG gene (θ_A optional).

    Args:
        gene: the tree to check.

    Raises:
        GeneError: it is not a dict, lacks 'theta_b' or 'shared', or has other keys; or
          'theta_a' and 'theta_b' differ in structure or shapes.
    """
    if not isinstance(gene, Mapping) or 'theta_b' not in gene or 'shared' not in gene:
        got = list(gene) if isinstance(gene, Mapping) else type(gene).__name__
        raise GeneError(f"not a TLEG gene: expected keys 'theta_b', 'shared' (and 'theta_a'), got {got}")
    extra = set(gene) - {'theta_a', 'theta_b', 'shared'}
    if extra:
        raise GeneError(f'not a TLEG gene: unexpected keys {sorted(extra)}')
    if 'theta_a' in gene:
        try:
            pytree.assert_same_structure(gene['theta_b'], gene['theta_a'], 'theta_b and theta_a')
        except ValueError as e:
            raise GeneError(f'not a TLEG gene: {e}') from None


def aux_depth(gene: Gene) -> int | None:
    """Depth of the Aux-Net the gene was built for.

    Args:
        gene: a TLEG gene.

    Returns:
        The layers of its free per-layer block params (`shared['blocks']`); None when every
        block param is expanded (then any depth works).
    """
    return common.num_layers(gene['shared'].get('blocks', {})) or None


def from_layer_of(gene: Gene) -> int:
    """Number of leading free (non-expanded) layers.

    Args:
        gene: a TLEG gene.

    Returns:
        The layers in `shared['prefix']`; 0 unless the gene was partially expanded.
    """
    return common.num_layers(gene['shared'].get('prefix', {}))


def expanded_modules(gene: Gene) -> tuple[str, ...]:
    """The module groups of `MODULES` that the gene expands.

    Args:
        gene: a TLEG gene.

    Returns:
        The names of the groups all of whose modules are in `gene['theta_b']`, in `MODULES` order.
    """
    keys = set(gene['theta_b'])
    return tuple(m for m, ks in MODULES.items() if set(ks) <= keys)


def coefficients(depth: int) -> jax.Array:
    """The expansion coefficients of a network of `depth` layers.

    Args:
        depth: L.

    Returns:
        (L,) float32 coefficients l/L, l = 0..L−1.

    Raises:
        GeneError: `depth` is not a positive integer.
    """
    if not (isinstance(depth, (int, np.integer)) and depth >= 1):
        raise GeneError(f'depth={depth!r} must be a positive integer')
    return jnp.arange(depth, dtype=jnp.float32) / depth


# ----------------------------------------------------------------------------------------
# Expansion.

def _expand_core(gene: Gene, depth: int) -> Params:
    """θ_B + (l/L)·θ_A stacked on a leading (depth,) axis, then the free prefix layers."""
    c = coefficients(depth)

    def lin(b, a=None):
        # One (depth, n) x (n, size) product instead of a broadcast-multiply-add: its
        # derivative, the gene's gradient, is again a product, where XLA:CPU reduces the
        # (depth, ...) per-layer gradients over the leading axis 20-40x slower. HIGHEST
        # keeps it exact float32 on GPUs (no TF32).
        terms = [b] if a is None else [b, a.astype(b.dtype)]
        coef = jnp.stack([jnp.ones_like(c), c], axis=1)[:, :len(terms)].astype(b.dtype)
        flat = jnp.stack([t.reshape(-1) for t in terms])
        out = jnp.matmul(coef, flat, precision=jax.lax.Precision.HIGHEST)
        return out.reshape((depth,) + b.shape)

    if 'theta_a' in gene:
        blocks = jax.tree.map(lin, gene['theta_b'], gene['theta_a'])
    else:
        blocks = jax.tree.map(lin, gene['theta_b'])
    prefix = gene['shared'].get('prefix')
    if prefix:
        n = from_layer_of(gene)
        if depth <= n:
            raise GeneError(f'the gene keeps its first {n} layers free (partial expansion); '
                            f'depth={depth} must exceed {n}')
        pytree.assert_same_structure(jax.tree.map(lambda x: x[0], prefix),
                                     gene['theta_b'], "shared['prefix'] layers and theta_b")
        blocks = jax.tree.map(lambda p, x: jnp.concatenate([p.astype(x.dtype), x[n:]]), prefix, blocks)
    return blocks


def expand(gene: Gene, depth: int) -> Params:
    """Canonical stacked ViT params of the Aux-Net of `depth` layers.

    Every expanded tensor is θ_B + (l/depth)·θ_A; free per-layer params come from `shared`.
    Jittable with `depth` static. Use `descend` for a descendant of another depth.

    Args:
        gene: the TLEG gene.
        depth: the Aux-Net's depth.

    Returns:
        Canonical params (stacked layout).

    Raises:
        GeneError: `gene` is not a TLEG gene (`check_gene`), the gene has free per-layer params
          (`shared['blocks']`, or a partial expansion's first layers) for another depth, or
          `depth` is not a positive integer.
    """
    check_gene(gene)
    blocks = _expand_core(gene, depth)
    free = gene['shared'].get('blocks')
    if free:
        n = aux_depth(gene)
        if n != depth:
            raise GeneError(f"the gene has free per-layer params for {n} layers "
                            f"(non-expanded modules {sorted(free)}); expand needs depth={n}, "
                            f'got {depth}; use descend() for other depths')
        blocks = {**blocks, **free}
    params = common.top_level(gene['shared'])
    params['blocks'] = blocks
    return params


def materialize(trainable: Gene, frozen: Mapping[str, Any] | None, cfg: ViTConfig) -> Params:
    """The Aux-Net's params from the trainable gene: `expand(gene, cfg.depth)`.

    Gradients of a loss over `vit.apply(materialize(...), ...)` with respect to `trainable`
    reach only the gene.

    Args:
        trainable: the gene, or its trained part.
        frozen: gene parts that are not trained (None: none), e.g. `{'shared': {'pos_embed':
          ...}}` or `{'theta_a': zeros}`, merged into `trainable`.
        cfg: the Aux-Net's config.

    Returns:
        Canonical params of `cfg`.

    Raises:
        GeneError: `trainable` and `frozen` overlap, or `expand` refuses the depth.
    """
    gene = common.merge_disjoint(trainable, frozen or {}, 'materialize', ('trainable', 'frozen'))
    return expand(gene, cfg.depth)


# ----------------------------------------------------------------------------------------
# Descendants.

def descendant_config(cfg: ViTConfig, depth: int, *, num_classes: int | None = None,
                      official_pool_order: bool = False, **overrides: Any) -> ViTConfig:
    """The Des-Net config: the Aux-Net's shape with its own depth (and class count).

    Args:
        cfg: the Aux-Net's config.
        depth: the descendant's depth.
        num_classes: its class count (None: the Aux-Net's).
        official_pool_order: reproduce the official TLEG Des-Net (timm `global_pool='avg'`
          with `fc_norm`): LN applied *after* average pooling (`pool_norm='after'`) and
          LayerNorm eps 1e-6, while the official Aux-Net pools mean(LN(x)) with eps 1e-5. The
          published numbers used this; the default keeps the Aux-Net's pooling, so that a
          Des-Net at the Aux-Net's depth computes exactly the Aux-Net's function.
        **overrides: any other field of the config.

    Returns:
        The descendant's `ViTConfig`.
    """
    changes: dict[str, Any] = dict(depth=depth)
    if num_classes is not None:
        changes['num_classes'] = num_classes
    if official_pool_order:
        changes.update(pool_norm='after', ln_eps=1e-6)
    changes.update(overrides)
    return cfg.replace(**changes)


def descend(gene: Gene, target_cfg: ViTConfig, *, head: str = 'inherit',
            key: jax.Array | None = None, others: str = 'random',
            embeddings: str | None = None) -> Params:
    """Initialise a descendant of any depth ≥ 1 (also deeper than the Aux-Net).

    Every expanded tensor of layer i is θ_B + (i/L_d)·θ_A with the descendant's own L_d =
    `target_cfg.depth`. With partial expansion the gene's free first layers are inherited as
    the descendant's first layers; layer i ≥ from_layer keeps coefficient i/L_d. The pooling
    order is a config property (`descendant_config(..., official_pool_order=True)` for the
    official Des-Net). Jittable with `target_cfg`, `head`, `others`, `embeddings` static.

    Args:
        gene: the TLEG gene.
        target_cfg: the descendant's config (the Aux-Net's width and heads).
        head: 'inherit' copies the gene's head (same class count); 'new' draws one (needs
          `key`; for another class count).
        key: the PRNG key, for anything drawn fresh.
        others: block modules the gene does not expand: drawn fresh ('random', needs `key`;
          paper Table 4) or copied from the Aux-Net's free per-layer params ('inherit', only
          at the Aux-Net's depth).
        embeddings: None or 'inherit' copies the patch/position embeddings, class token and
          final norm; 'random' draws them (needs `key`).

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: `gene` is not a TLEG gene (`check_gene`), the gene's shapes do not fit
          `target_cfg`, an option is not one of its choices, `target_cfg.depth` does not exceed
          a partial expansion's free first layers, `others='inherit'` at another depth than the
          Aux-Net's, or something must be drawn and there is no `key`.
    """
    check_gene(gene)
    common.check_choice('descend', 'others', others, OTHERS)
    shared = gene['shared']
    want = common.target_shapes(target_cfg)
    common.check_fits(gene['theta_b'], common.block_shapes(want['blocks']), 'descend', target_cfg,
                      prefix='theta_b/')
    kh, kb = jax.random.split(key) if key is not None else (None, None)

    def fresh() -> Params:   # only the drawn entries are used
        top = vit.init_embeddings(target_cfg, jax.random.fold_in(key, 2))
        if target_cfg.num_classes:
            top['head'] = vit.init_head(target_cfg, kh)
            if target_cfg.distill_token:
                top['head_dist'] = vit.init_head(target_cfg, jax.random.fold_in(kh, 1))
        return top

    params = common.embeddings_and_heads(shared, target_cfg, head=head, embeddings=embeddings,
                                         fresh=None if key is None else fresh, what='descend',
                                         want=want)
    depth = target_cfg.depth
    blocks = _expand_core(gene, depth)
    free_keys = [k for k in want['blocks'] if k not in blocks]
    if free_keys:
        if others == 'inherit':
            free = shared.get('blocks', {})
            if aux_depth(gene) != depth or set(free) != set(free_keys):
                raise GeneError(f"descend(others='inherit'): the gene has free per-layer params "
                                f'{sorted(free)} for {aux_depth(gene)} layers; the target needs '
                                f'{free_keys} for {depth} layers')
            common.check_fits(free, want['blocks'], 'descend', target_cfg, prefix="shared/blocks/")
            blocks.update(free)
        else:
            if key is None:
                raise GeneError(f'descend: the gene does not expand {free_keys}; these are drawn '
                                "fresh and need a PRNG key (or others='inherit' at the Aux-Net depth)")
            fresh_blocks = jax.vmap(lambda k: vit.init_block(target_cfg, k))(jax.random.split(kb, depth))
            blocks.update({k: fresh_blocks[k] for k in free_keys})
    params['blocks'] = blocks
    pytree.assert_same_structure(want, params, 'descend: target params and built params')
    return params


def gene_param_count(gene: Gene, *, include_head: bool = False) -> int:
    """The parameters stored in the gene (its S-Params), as `descend` reads them by default.

    Free per-layer params of non-expanded modules (`shared['blocks']`) are Aux-Net parameters,
    not part of the learngene: descendants draw those modules fresh.

    Args:
        gene: the TLEG gene.
        include_head: count the head too.

    Returns:
        θ_A + θ_B + shared (the head only with `include_head`).

    Raises:
        GeneError: `gene` is not a TLEG gene (`check_gene`).
    """
    check_gene(gene)
    shared = {k: v for k, v in gene['shared'].items() if k != 'blocks'}
    return (common.count(gene['theta_b']) + common.count(gene.get('theta_a'))
            + common.count(shared, include_head=include_head))


# The gene's parts (`common.Part`): θ_B and the shared params, θ_A where it is not ≡ 0.
SHARED_PART = common.Part(parts={**common.top_parts(), 'blocks': common.Part(required=False),
                                 'prefix': common.Part(required=False)})
GENE_PARTS = {'theta_a': common.Part(required=False), 'theta_b': common.Part(),
              'shared': SHARED_PART}

METHOD = common.register(common.Method(
    name='tleg', label='TLEG', source='learned', init_gene=init_gene, materialize=materialize,
    descend=descend, gene_param_count=gene_param_count, gene_parts=GENE_PARTS, family='aux'))
