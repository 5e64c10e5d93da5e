"""Baseline initialisers in the same API as `tleg.descend` (pure functions, jittable with
the config and choices static).

* `scratch`: random timm/DeiT init.
* `share_init_gene` / `share_init`: Share-Init (Lan et al. 2020, as a TLEG ablation): one
  shared layer θ_B (θ_A ≡ 0), so every descendant layer is identical.
* `he_lg`: He-LG (Wang et al. 2022a): the *last* k layers of an ancestor on top of random
  lower layers (the paper's TLEG comparison uses k = 3).
* `auto_lg`: Auto-LG (Wang et al. 2023): the *first* k ancestor layers, random above.
* `pre_fin`: Pre-Fin(U): a model pretrained at the target shape; when depths differ, the
  first / last / middle layer choices of TLEG Fig. 4 ('#1', '#2', '#3').

`embeddings='inherit'` copies patch/position embeddings, class token and final norm from
the source; 'random' keeps them freshly drawn. Heads follow `tleg.descend`: 'inherit'
(same class count) or 'new'.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jlearngene import pytree
from jlearngene.genes import tleg
from jlearngene.genes.tleg import GeneError
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
CHOICES = ('first', 'last', 'middle')
EMBEDDINGS = ('inherit', 'random')
_EMBED_KEYS = ('patch_embed', 'pos_embed', 'cls_token', 'dist_token', 'norm')


def scratch(cfg: ViTConfig, key: jax.Array) -> Params:
    """A randomly initialised model (the Scratch baseline): `vit.init`."""
    return vit.init(cfg, key)


def share_init_gene(cfg: ViTConfig, key: jax.Array) -> tleg.Gene:
    """A Share-Init gene for an Aux-Net of shape `cfg`: one shared layer θ_B (no θ_A), so
    `tleg.expand` gives identical layers and training it trains one weight-shared ViT."""
    gene = tleg.init_gene(cfg, key)
    return {'theta_b': gene['theta_b'], 'shared': gene['shared']}


def share_init(gene: tleg.Gene, target_cfg: ViTConfig, *, head: str = 'inherit',
               key: jax.Array | None = None) -> Params:
    """Share-Init descendant: every layer is the shared layer θ_B (θ_A ignored if present)."""
    tleg._check_gene(gene)
    return tleg.descend({'theta_b': gene['theta_b'], 'shared': gene['shared']}, target_cfg,
                        head=head, key=key)


def _check_width(source: Params, target: Params, what: str, cfg: ViTConfig) -> None:
    src_block = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), source['blocks'])
    want_block = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), target['blocks'])
    diff = pytree.structure_diff(want_block, src_block)
    if any(diff.values()):
        raise GeneError(f'{what}: source blocks do not fit the target config '
                        f'(width={cfg.width}, num_heads={cfg.num_heads}, mlp_dim={cfg.mlp_dim}): '
                        f'{pytree.describe_diff(diff)}')


def _assemble(source: Params, target_cfg: ViTConfig, key: jax.Array, *, src_layers: np.ndarray,
              dst_layers: np.ndarray, head: str, embeddings: str, what: str) -> Params:
    """Random target params with blocks dst_layers[i] := source blocks src_layers[i]."""
    if head not in tleg.HEADS:
        raise GeneError(f'{what}: head={head!r}; expected one of {tleg.HEADS}')
    if embeddings not in EMBEDDINGS:
        raise GeneError(f'{what}: embeddings={embeddings!r}; expected one of {EMBEDDINGS}')
    if not layout.is_stacked(source):
        source = layout.stack_blocks(source)
    # every check runs on shapes, before anything is drawn
    want = jax.eval_shape(lambda: vit.init(target_cfg, jax.random.key(0)))
    _check_width(source, want, what, target_cfg)
    inherit = [k for k in _EMBED_KEYS if k in want] if embeddings == 'inherit' else []
    for k in inherit:
        if k not in source:
            raise GeneError(f"{what}: the target config needs '{k}' but the source model has none")
    for k in inherit:
        _same_shapes(source[k], want[k], k, what, target_cfg)
    heads = []
    if target_cfg.num_classes and head == 'inherit':
        if 'head' not in source:
            raise GeneError(f"{what}(head='inherit'): the source model has no head; use head='new'")
        _same_shapes(source['head'], want['head'], 'head', what, target_cfg,
                     hint="; use head='new' for a different number of classes")
        heads = [k for k in ('head', 'head_dist') if k in want]

    params = vit.init(target_cfg, key)
    idx_src, idx_dst = np.asarray(src_layers), np.asarray(dst_layers)
    params['blocks'] = jax.tree.map(lambda t, s: t.at[idx_dst].set(s[idx_src].astype(t.dtype)),
                                    params['blocks'], source['blocks'])
    for k in inherit + heads:
        params[k] = source[k]
    return params


def _same_shapes(got, want, name, what, cfg, hint=''):
    for path, leaf in pytree.flatten(got).items():
        w = pytree.flatten(want).get(path)
        if w is None or np.shape(leaf) != np.shape(w):
            full = f'{name}/{path}' if path else name
            raise GeneError(f"{what}: source '{full}' has shape {tuple(np.shape(leaf))} but the "
                            f'target config (width={cfg.width}, image_size={cfg.image_size}, '
                            f'patch_size={cfg.patch_size}, num_classes={cfg.num_classes}) needs '
                            f'{None if w is None else tuple(np.shape(w))}{hint}')


def _check_k(k: int, src_depth: int, dst_depth: int, what: str) -> None:
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= min(src_depth, dst_depth)):
        raise GeneError(f'{what}: k={k!r} layers must be in [1, min(ancestor depth {src_depth}, '
                        f'target depth {dst_depth})]')


def he_lg(ancestor: Params, target_cfg: ViTConfig, k: int, key: jax.Array, *,
          head: str = 'new', embeddings: str = 'random') -> Params:
    """He-LG: the ancestor's last k layers become the target's last k layers; the layers below
    and (by default) the embeddings and head are random, as the learngene is only the layers."""
    n, d = layout.depth_of(ancestor), target_cfg.depth
    _check_k(k, n, d, 'he_lg')
    return _assemble(ancestor, target_cfg, key, src_layers=np.arange(n - k, n),
                     dst_layers=np.arange(d - k, d), head=head, embeddings=embeddings, what='he_lg')


def auto_lg(ancestor: Params, target_cfg: ViTConfig, k: int, key: jax.Array, *,
            head: str = 'new', embeddings: str = 'inherit') -> Params:
    """Auto-LG: the ancestor's first k layers (and by default its patch/position embeddings,
    which those layers were trained on) become the target's first k layers; the rest random."""
    n, d = layout.depth_of(ancestor), target_cfg.depth
    _check_k(k, n, d, 'auto_lg')
    return _assemble(ancestor, target_cfg, key, src_layers=np.arange(k), dst_layers=np.arange(k),
                     head=head, embeddings=embeddings, what='auto_lg')


def layer_window(n_small: int, n_large: int, choice: str) -> np.ndarray:
    """Indices of an n_small-layer window inside n_large layers: 'first', 'last' or 'middle'
    (offset ⌊(n_large − n_small)/2⌋)."""
    if choice not in CHOICES:
        raise GeneError(f'choice={choice!r}; expected one of {CHOICES}')
    start = {'first': 0, 'last': n_large - n_small, 'middle': (n_large - n_small) // 2}[choice]
    return np.arange(start, start + n_small)


def pre_fin(pretrained: Params, target_cfg: ViTConfig, *, choice: str = 'first',
            key: jax.Array | None = None, head: str = 'inherit') -> Params:
    """Pre-Fin(U): initialise from a model pretrained at the target's width.

    Same depth: a copy. Deeper target: the pretrained layers fill the target's first / last /
    middle window (Fig. 4, '#1/#2/#3'), other layers random. Shallower target: the target takes
    the pretrained model's first / last / middle layers. Embeddings are always inherited.
    `key` is needed when layers or the head are drawn fresh.
    """
    n, d = layout.depth_of(pretrained), target_cfg.depth
    if choice not in CHOICES:
        raise GeneError(f'pre_fin: choice={choice!r}; expected one of {CHOICES}')
    if key is None:
        if d > n or head == 'new':
            raise GeneError('pre_fin: a PRNG key is needed for the random layers / new head '
                            f'(pretrained depth {n}, target depth {d}, head={head!r})')
        key = jax.random.key(0)   # every leaf below is overwritten from `pretrained`
    if d >= n:
        src, dst = np.arange(n), layer_window(n, d, choice)
    else:
        src, dst = layer_window(d, n, choice), np.arange(d)
    return _assemble(pretrained, target_cfg, key, src_layers=src, dst_layers=dst, head=head,
                     embeddings='inherit', what='pre_fin')
