"""Baseline initialisers on the method contract (pure functions, jittable with the config and
choices static).

* `scratch`: random timm/DeiT init; no gene.
* `share_init_gene` / `share_init`: Share-Init (Lan et al. 2020, as a TLEG ablation): one
  shared layer θ_B (θ_A ≡ 0), so every descendant layer is identical.
* `mini_init_gene` / `descend_mini_init`: Mini-Init (a TLEG baseline after MiniViT, Zhang et al.
  2022): n_shared layers, each shared by a run of consecutive layers (weight multiplexing);
  Share-Init is its n_shared = 1 case, kept in TLEG's gene format.
* `he_lg`: He-LG (Wang et al. 2022a): the *last* k layers of an ancestor on top of random
  lower layers (the paper's TLEG comparison uses k = 3), with the ancestor's embeddings by
  default, as the official code copies the patch/position embeddings.
* `auto_lg`: Auto-LG (Wang et al. 2023): the *first* k ancestor layers, random above.
* `pre_fin`: Pre-Fin(U): a model pretrained at the target shape; when depths differ, the
  first / last / middle layer choices of TLEG Fig. 4 ('#1', '#2', '#3').

He-LG, Auto-LG and Pre-Fin take their gene from a trained model (`he_lg_gene`,
`auto_lg_gene`, `pre_fin_gene`): a params-like tree whose `blocks` are the stored layers
(stacked), plus the source's heads and, where chosen, its embeddings (patch/position
embeddings, prefix tokens, final norm). `he_lg` / `auto_lg` / `pre_fin` take the model
itself and are `descend_*(*_gene(model))`. `embeddings='inherit'` copies the embeddings,
'random' draws them fresh; None inherits them exactly when the gene holds them. Heads:
'inherit' (same class count) or 'new'.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Any
from collections.abc import Callable, Mapping

import jax
import numpy as np

from jlearngene.genes import common, tleg
from jlearngene.genes.common import GeneError
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
CHOICES = ('first', 'last', 'middle')
EMBEDDINGS = common.EMBEDDINGS


# ----------------------------------------------------------------------------------------
# Scratch.

def scratch(cfg: ViTConfig, key: jax.Array) -> Params:
    """A randomly initialised model (the Scratch baseline): `vit.init`.

    Args:
        cfg: the model's config.
        key: the PRNG key.

    Returns:
        Canonical params of `cfg` (stacked layout), as `vit.init(cfg, key)` draws them.
    """
    return vit.init(cfg, key)


def descend_scratch(gene: None, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                    head: str = 'new', embeddings: str = 'random') -> Params:
    """Scratch's descend: `vit.init(target_cfg, key)`.

    Args:
        gene: must be None (Scratch has no gene).
        target_cfg: the descendant's config.
        key: the PRNG key; required.
        head: must be 'new' (there is no head to inherit); taken for the common contract.
        embeddings: must be 'random' (there are no embeddings to inherit).

    Returns:
        Canonical params of `target_cfg` (stacked layout), all drawn fresh.

    Raises:
        GeneError: `gene` is not None, `head` is not 'new', `embeddings` is not 'random', or
          `key` is None.
    """
    if gene is not None:
        raise GeneError(f'scratch has no gene; got {type(gene).__name__}')
    common.check_choice('scratch (no gene to inherit from)', 'head', head, ('new',))
    common.check_choice('scratch (no gene to inherit from)', 'embeddings', embeddings, ('random',))
    if key is None:
        raise GeneError('scratch: a random model needs a PRNG key')
    return scratch(target_cfg, key)


# ----------------------------------------------------------------------------------------
# Share-Init.

def share_init_gene(cfg: ViTConfig, key: jax.Array) -> tleg.Gene:
    """A Share-Init gene for an Aux-Net of shape `cfg`: one shared layer θ_B (no θ_A), so
    `tleg.expand` gives identical layers and training it trains one weight-shared ViT.

    Args:
        cfg: the Aux-Net's config.
        key: the PRNG key (θ_B and the embeddings are drawn as `tleg.init_gene` draws them).

    Returns:
        The gene `{'theta_b', 'shared'}`, which is `tleg.init_gene(cfg, key)` without
        'theta_a'.
    """
    gene = tleg.init_gene(cfg, key)
    return {'theta_b': gene['theta_b'], 'shared': gene['shared']}


def _without_theta_a(gene: tleg.Gene) -> tleg.Gene:
    tleg.check_gene(gene)
    return {'theta_b': gene['theta_b'], 'shared': gene['shared']}


@common.forwards_options(tleg.descend)
def share_init(gene: tleg.Gene, target_cfg: ViTConfig, *, head: str = 'inherit',
               key: jax.Array | None = None, **options: Any) -> Params:
    """Share-Init descendant: every layer is the shared layer θ_B (θ_A ignored if present).

    Args:
        gene: a Share-Init or TLEG gene.
        target_cfg: the descendant's config (the Aux-Net's width and heads).
        head: 'inherit' copies the gene's head (same class count); 'new' draws one (needs
          `key`).
        key: the PRNG key, for anything drawn fresh.
        **options: the rest of `tleg.descend`'s options (`others`, `embeddings`).

    Returns:
        Canonical params of `target_cfg` (stacked layout), every layer equal.

    Raises:
        GeneError: `gene` is not a TLEG gene (`tleg.check_gene`), or `tleg.descend` refuses
          it, the config or the options.
    """
    return tleg.descend(_without_theta_a(gene), target_cfg, head=head, key=key, **options)


def share_init_param_count(gene: tleg.Gene, *, include_head: bool = False) -> int:
    """Share-Init's S-Params: θ_B + shared, the part of the gene `share_init` reads.

    Args:
        gene: a Share-Init or TLEG gene (a θ_A in it is not counted).
        include_head: count the head too.

    Returns:
        The number of parameters in θ_B and `shared` (less `shared['blocks']`, as
        `tleg.gene_param_count` counts).

    Raises:
        GeneError: `gene` is not a TLEG gene (`tleg.check_gene`).
    """
    return tleg.gene_param_count(_without_theta_a(gene), include_head=include_head)


# ----------------------------------------------------------------------------------------
# Mini-Init.

def mini_init_gene(cfg: ViTConfig, key: jax.Array, *, n_shared: int | None = None) -> Params:
    """A Mini-Init gene for an Aux-Net of shape `cfg`: `n_shared` blocks (stacked), the
    embeddings and the head, drawn as `vit.init` draws a model of n_shared layers. Default
    n_shared = ⌈depth/2⌉ (the TLEG paper's 6 shared parts of 12 layers).

    MiniViT's weight multiplexing is the sharing itself: Aux-Net layer l runs shared part
    ⌊l·n_shared/L⌋ (`shared_parts`). Left out are MiniViT's per-layer weight
    transformations and its weight distillation: the Des-Nets are initialised from the
    shared parts only, so the baseline keeps what they read.

    Args:
        cfg: the Aux-Net's config.
        key: the PRNG key.
        n_shared: the number of shared parts, in [1, `cfg.depth`]; None is ⌈depth/2⌉.

    Returns:
        Canonical params with `n_shared` stacked blocks, as `vit.init` draws a model of
        `cfg` at depth `n_shared`.

    Raises:
        GeneError: `n_shared` is not an integer in [1, `cfg.depth`].
    """
    n = (cfg.depth + 1) // 2 if n_shared is None else n_shared
    if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 1 <= n <= cfg.depth):
        raise GeneError(f'mini_init: n_shared={n!r} shared parts must be an integer in '
                        f'[1, depth={cfg.depth}]')
    return vit.init(cfg.replace(depth=int(n)), key)


def shared_parts(n_shared: int, depth: int) -> np.ndarray:
    """The shared part ⌊l·n_shared/depth⌋ that each layer l runs.

    Args:
        n_shared: the number of shared parts.
        depth: the number of layers that run them.

    Returns:
        (depth,) integer part indices, non-decreasing (consecutive layers share one part),
        every part used when depth ≥ n_shared.
    """
    return (np.arange(depth) * n_shared) // depth


def mini_init_materialize(trainable: Params, frozen: Mapping[str, Any] | None,
                          cfg: ViTConfig) -> Params:
    """The Aux-Net of config `cfg` from the gene: layer l is shared part ⌊l·n_shared/L⌋,
    so `jax.grad` through it sums each part's layers.

    Args:
        trainable: the trainable part of a Mini-Init gene.
        frozen: the gene's frozen parts, merged with `trainable`; None for none.
        cfg: the Aux-Net's config.

    Returns:
        Canonical params of `cfg` (stacked layout), the gene's embeddings and head
        inherited.

    Raises:
        GeneError: `trainable` and `frozen` overlap, the merged gene has no stacked
          'blocks', it has more shared parts than `cfg.depth` layers, or its shapes do not
          fit `cfg`.
    """
    gene = common.merge_disjoint(trainable, frozen or {}, 'mini_init.materialize',
                                 ('trainable', 'frozen'))
    n = _check_layers_gene(gene, 'mini_init')
    if n > cfg.depth:
        raise GeneError(f'mini_init.materialize: {n} shared parts do not fit in the Aux-Net '
                        f'depth {cfg.depth}')
    return descend_mini_init(gene, cfg, head='inherit', embeddings='inherit')


def descend_mini_init(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                      head: str = 'inherit', embeddings: str | None = None) -> Params:
    """Mini-Init's descend at any depth: target layer l is shared part ⌊l·n_shared/L_d⌋ (a
    target shallower than n_shared skips parts evenly).

    Args:
        gene: a Mini-Init gene (`mini_init_gene`).
        target_cfg: the descendant's config (the gene's width and heads, any depth).
        key: the PRNG key; needed only when the head or the embeddings are drawn.
        head: 'inherit' copies the gene's head (same class count); 'new' draws one.
        embeddings: 'inherit' copies the gene's embeddings, 'random' draws them; None
          inherits them when the gene holds them.

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: the gene has no stacked 'blocks', its shapes do not fit `target_cfg`, an
          option is not one of its choices, or something must be drawn and there is no
          `key`.
    """
    n, d = _check_layers_gene(gene, 'mini_init'), target_cfg.depth
    return _assemble(gene, target_cfg, key, src_layers=shared_parts(n, d), dst_layers=np.arange(d),
                     head=head, embeddings=embeddings, what='mini_init')


# ----------------------------------------------------------------------------------------
# Genes taken from a model.

def _layers_gene(model: Params, layers: np.ndarray, embeddings: str, what: str) -> Params:
    """{'blocks': model layers `layers` (stacked), the model's heads, its embeddings when
    embeddings='inherit'}."""
    common.check_choice(what, 'embeddings', embeddings, EMBEDDINGS)
    model = common.stacked(model, what)
    keep = common.HEAD_KEYS + (common.EMBED_KEYS if embeddings == 'inherit' else ())
    gene = {k: v for k, v in model.items() if k in keep}
    gene['blocks'] = common.gather_layers(model['blocks'], layers)
    return gene


def _check_k(k: int, src_depth: int, dst_depth: int | None, what: str) -> None:
    hi = src_depth if dst_depth is None else min(src_depth, dst_depth)
    where = (f'ancestor depth {src_depth}' if dst_depth is None
             else f'min(ancestor depth {src_depth}, target depth {dst_depth})')
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= hi):
        raise GeneError(f'{what}: k={k!r} layers must be in [1, {where}]')


def he_lg_gene(ancestor: Params, *, k: int = 3, embeddings: str = 'inherit') -> Params:
    """He-LG's learngene: the ancestor's last k layers and its embeddings.

    `embeddings='inherit'` (default) keeps the patch/position embeddings, prefix tokens and
    final norm, as the official He-LG code copies the patch/position embeddings into the
    descendant; 'random' stores only the layers, so descendants draw their embeddings
    fresh (the learngene as the paper describes it: layers only).

    Args:
        ancestor: the ancestor's canonical params (stacked or list layout).
        k: the number of layers stored, in [1, ancestor depth].
        embeddings: 'inherit' or 'random' (see above).

    Returns:
        The gene, with the last `k` layers as stacked 'blocks', the ancestor's heads, and
        its embeddings with embeddings='inherit'.

    Raises:
        GeneError: `k` is out of range, `embeddings` is not one of its choices, or the
          ancestor's list-layout blocks differ in shape.
    """
    n = layout.depth_of(ancestor)
    _check_k(k, n, None, 'he_lg')
    return _layers_gene(ancestor, np.arange(n - k, n), embeddings, 'he_lg')


def auto_lg_gene(ancestor: Params, *, k: int = 3, embeddings: str = 'inherit') -> Params:
    """Auto-LG's learngene: the ancestor's first k layers and (by default) its patch/position
    embeddings, which those layers were trained on.

    Args:
        ancestor: the ancestor's canonical params (stacked or list layout).
        k: the number of layers stored, in [1, ancestor depth].
        embeddings: 'inherit' keeps the embeddings, prefix tokens and final norm; 'random'
          stores the layers (and heads) only.

    Returns:
        The gene, with the first `k` layers as stacked 'blocks', the ancestor's heads, and
        its embeddings with embeddings='inherit'.

    Raises:
        GeneError: `k` is out of range, `embeddings` is not one of its choices, or the
          ancestor's list-layout blocks differ in shape.
    """
    _check_k(k, layout.depth_of(ancestor), None, 'auto_lg')
    return _layers_gene(ancestor, np.arange(k), embeddings, 'auto_lg')


def pre_fin_gene(pretrained: Params) -> Params:
    """Pre-Fin's gene: the whole pretrained model (stacked layout).

    Args:
        pretrained: the pretrained model's canonical params (stacked or list layout).

    Returns:
        Its blocks (stacked), embeddings and heads.

    Raises:
        GeneError: the model's list-layout blocks differ in shape.
    """
    return _layers_gene(pretrained, np.arange(layout.depth_of(pretrained)), 'inherit', 'pre_fin')


def _check_layers_gene(gene: Any, what: str) -> int:
    if not isinstance(gene, dict) or not isinstance(gene.get('blocks'), dict):
        got = sorted(gene) if isinstance(gene, dict) else type(gene).__name__
        raise GeneError(f"{what}: not a layers gene: expected a tree with stacked 'blocks', got {got}")
    return common.num_layers(gene['blocks'])


def _assemble(gene: Params, target_cfg: ViTConfig, key: jax.Array | None, *, src_layers,
              dst_layers, head: str, embeddings: str | None, what: str) -> Params:
    """Target params with blocks dst_layers[i] := gene blocks src_layers[i], every other
    target layer (and what is not inherited) as `vit.init(target_cfg, key)` draws it."""
    want = common.target_shapes(target_cfg)   # every check runs on shapes, before any draw
    common.check_fits(common.block_shapes(gene['blocks']), common.block_shapes(want['blocks']),
                      what, target_cfg, prefix='blocks/', complete=True)
    src, dst = np.asarray(src_layers), np.asarray(dst_layers)
    drawn_layers = sorted(set(range(target_cfg.depth)) - set(dst.tolist()))
    if drawn_layers and key is None:
        raise GeneError(f'{what}: target layers {drawn_layers} are drawn fresh and need a PRNG key')
    base = None if key is None else vit.init(target_cfg, key)
    params = common.embeddings_and_heads(gene, target_cfg, head=head, embeddings=embeddings,
                                         fresh=None if base is None else (lambda: base),
                                         what=what, want=want)
    if base is None:   # every target layer comes from the gene
        order = src[np.argsort(dst)]
        params['blocks'] = jax.tree.map(lambda x, w: x[order].astype(w.dtype),
                                        gene['blocks'], want['blocks'])
    else:
        params['blocks'] = common.place_layers(base['blocks'], dst, gene['blocks'], src)
    return params


def descend_he_lg(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                  head: str = 'inherit', embeddings: str | None = None) -> Params:
    """He-LG's descend: the gene's k layers become the target's last k layers and the gene's
    embeddings the target's (None: where the gene holds them); the layers below and the
    embeddings the gene lacks are random; the head is inherited (head='new' draws one, for
    another task, as the paper's downstream runs do).

    Args:
        gene: a He-LG gene (`he_lg_gene`).
        target_cfg: the descendant's config (the gene's width and heads; at least k layers).
        key: the PRNG key; needed when anything is drawn (layers below the gene's, the head,
          the embeddings).
        head: 'inherit' or 'new'.
        embeddings: 'inherit', 'random', or None (inherit when the gene holds them).

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: the gene has no stacked 'blocks', it has more layers than `target_cfg`,
          its shapes do not fit, an option is not one of its choices, or something must be
          drawn and there is no `key`.
    """
    k, d = _check_layers_gene(gene, 'he_lg'), target_cfg.depth
    if k > d:
        raise GeneError(f"he_lg: the gene's {k} layers do not fit in target depth {d}")
    return _assemble(gene, target_cfg, key, src_layers=np.arange(k), dst_layers=np.arange(d - k, d),
                     head=head, embeddings=embeddings, what='he_lg')


def descend_auto_lg(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                    head: str = 'inherit', embeddings: str | None = None) -> Params:
    """Auto-LG's descend: the gene's k layers become the target's first k layers; the layers
    above are random; the head is inherited (head='new' draws one).

    Args:
        gene: an Auto-LG gene (`auto_lg_gene`).
        target_cfg: the descendant's config (the gene's width and heads; at least k layers).
        key: the PRNG key; needed when anything is drawn (layers above the gene's, the head,
          the embeddings).
        head: 'inherit' or 'new'.
        embeddings: 'inherit', 'random', or None (inherit when the gene holds them).

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: the gene has no stacked 'blocks', it has more layers than `target_cfg`,
          its shapes do not fit, an option is not one of its choices, or something must be
          drawn and there is no `key`.
    """
    k, d = _check_layers_gene(gene, 'auto_lg'), target_cfg.depth
    if k > d:
        raise GeneError(f"auto_lg: the gene's {k} layers do not fit in target depth {d}")
    return _assemble(gene, target_cfg, key, src_layers=np.arange(k), dst_layers=np.arange(k),
                     head=head, embeddings=embeddings, what='auto_lg')


def layer_window(n_small: int, n_large: int, choice: str) -> np.ndarray:
    """Indices of an n_small-layer window inside n_large layers.

    Args:
        n_small: the window's length (at most `n_large`).
        n_large: the number of layers the window lies in.
        choice: 'first', 'last' or 'middle' (offset ⌊(n_large − n_small)/2⌋).

    Returns:
        (n_small,) consecutive layer indices.

    Raises:
        GeneError: `choice` is not one of `CHOICES`, or `n_small` is not in [0, n_large].
    """
    common.check_choice('layer_window', 'choice', choice, CHOICES)
    if not 0 <= n_small <= n_large:
        raise GeneError(f'layer_window: a window of {n_small} layers does not fit in {n_large} layers')
    start = {'first': 0, 'last': n_large - n_small, 'middle': (n_large - n_small) // 2}[choice]
    return np.arange(start, start + n_small)


def descend_pre_fin(gene: Params, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                    head: str = 'inherit', embeddings: str | None = None,
                    choice: str = 'first') -> Params:
    """Pre-Fin's descend from the pretrained model (the gene) at the target's width.

    Same depth: a copy. Deeper target: the pretrained layers fill the target's first / last /
    middle window (Fig. 4, '#1/#2/#3'), other layers random. Shallower target: the target takes
    the pretrained model's first / last / middle layers.

    Args:
        gene: the Pre-Fin gene (`pre_fin_gene`).
        target_cfg: the descendant's config (the gene's width and heads, any depth).
        key: the PRNG key; needed when layers, the head or the embeddings are drawn fresh.
        head: 'inherit' or 'new'.
        embeddings: 'inherit', 'random', or None (inherit when the gene holds them).
        choice: the layer window, 'first', 'last' or 'middle' (`layer_window`).

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: `choice` or another option is not one of its choices, the gene has no
          stacked 'blocks', its shapes do not fit, or something must be drawn and there is
          no `key`.
    """
    common.check_choice('pre_fin', 'choice', choice, CHOICES)
    n, d = _check_layers_gene(gene, 'pre_fin'), target_cfg.depth
    if d >= n:
        src, dst = np.arange(n), layer_window(n, d, choice)
    else:
        src, dst = layer_window(d, n, choice), np.arange(d)
    return _assemble(gene, target_cfg, key, src_layers=src, dst_layers=dst, head=head,
                     embeddings=embeddings, what='pre_fin')


# ----------------------------------------------------------------------------------------
# The model-taking forms.

def he_lg(ancestor: Params, target_cfg: ViTConfig, k: int, key: jax.Array, *,
          head: str = 'inherit', embeddings: str = 'inherit') -> Params:
    """He-LG: the ancestor's last k layers become the target's last k layers and (by default,
    as the official code) its patch/position embeddings the target's; the layers below are
    random, the head inherited (head='new' draws one).

    Args:
        ancestor: the ancestor's canonical params (stacked or list layout).
        target_cfg: the descendant's config (the ancestor's width and heads).
        k: the number of layers inherited, in [1, min(ancestor depth, target depth)].
        key: the PRNG key, for what is drawn fresh.
        head: 'inherit' or 'new'.
        embeddings: 'inherit' (default, as the official code) or 'random' (drawn too).

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: `k` is out of range, an option is not one of its choices, or the
          ancestor's shapes do not fit `target_cfg`.
    """
    _check_k(k, layout.depth_of(ancestor), target_cfg.depth, 'he_lg')
    return descend_he_lg(he_lg_gene(ancestor, k=k, embeddings=embeddings), target_cfg, key=key,
                         head=head, embeddings=embeddings)


def auto_lg(ancestor: Params, target_cfg: ViTConfig, k: int, key: jax.Array, *,
            head: str = 'inherit', embeddings: str = 'inherit') -> Params:
    """Auto-LG: the ancestor's first k layers (and by default its patch/position embeddings,
    which those layers were trained on) become the target's first k layers; the rest random,
    the head inherited (head='new' draws one).

    Args:
        ancestor: the ancestor's canonical params (stacked or list layout).
        target_cfg: the descendant's config (the ancestor's width and heads).
        k: the number of layers inherited, in [1, min(ancestor depth, target depth)].
        key: the PRNG key, for what is drawn fresh.
        head: 'inherit' or 'new'.
        embeddings: 'inherit' (default) or 'random' (drawn too).

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: `k` is out of range, an option is not one of its choices, or the
          ancestor's shapes do not fit `target_cfg`.
    """
    _check_k(k, layout.depth_of(ancestor), target_cfg.depth, 'auto_lg')
    return descend_auto_lg(auto_lg_gene(ancestor, k=k, embeddings=embeddings), target_cfg, key=key,
                           head=head, embeddings=embeddings)


def pre_fin(pretrained: Params, target_cfg: ViTConfig, *, choice: str = 'first',
            key: jax.Array | None = None, head: str = 'inherit') -> Params:
    """Pre-Fin(U): initialise from a model pretrained at the target's width (see
    `descend_pre_fin`); embeddings are always inherited.

    Args:
        pretrained: the pretrained model's canonical params (stacked or list layout).
        target_cfg: the descendant's config (the model's width and heads, any depth).
        choice: the layer window, 'first', 'last' or 'middle' (`layer_window`).
        key: the PRNG key; needed when layers or the head are drawn fresh.
        head: 'inherit' or 'new'.

    Returns:
        Canonical params of `target_cfg` (stacked layout).

    Raises:
        GeneError: as `descend_pre_fin`.
    """
    return descend_pre_fin(pre_fin_gene(pretrained), target_cfg, key=key, head=head,
                           embeddings='inherit', choice=choice)


# ----------------------------------------------------------------------------------------
# Registry entries.

def _from_model_doc(make: Callable[..., Params]) -> str:
    """`make`'s docstring for `gene_from_model(params, cfg, **options)`: its first argument
    (the model) becomes `params` and `cfg`, and the Raises section adds the model check."""
    lines = inspect.cleandoc(make.__doc__).splitlines()
    at = {t: lines.index(t) for t in ('Args:', 'Returns:', 'Raises:')}
    args = lines[at['Args:'] + 1:at['Returns:']]
    first = next((i for i, line in enumerate(args[1:], 1) if not line.startswith(' ' * 6)), len(args))
    options = args[first:]   # the model's entry and its continuation lines dropped
    return '\n'.join([
        *lines[:at['Args:']], 'Args:', '    params: the model\'s params (stacked or list layout).',
        '    cfg: its config; `params` must be a whole model of it.', *options,
        *lines[at['Returns:']:at['Raises:']], 'Raises:',
        '    GeneError: `params` is not a whole model of config `cfg` (`common.check_model`), or',
        f'      as `{make.__name__}`.'])


def _from_model(make: Callable[..., Params], what: str) -> Callable[..., Params]:
    """`make(model, **options)` as a `gene_from_model(params, cfg, **options)` that first
    checks the model against its config."""
    def gene_from_model(params: Params, cfg: ViTConfig, **options: Any) -> Params:
        return make(common.check_model(params, cfg, what), **options)
    gene_from_model.__doc__ = _from_model_doc(make)
    return common.forwards_options(make)(gene_from_model)


def half_depth_k(options: Mapping[str, Any], target_cfg: ViTConfig,
                 source_cfg: ViTConfig) -> dict:
    """He-LG's and Auto-LG's gene options for one descendant, as the papers size the
    learngene.

    Args:
        options: the gene options; 'k' = 0 or unset means ⌈depth / 2⌉ of the descendant.
        target_cfg: the descendant's config.
        source_cfg: the source model's config.

    Returns:
        A copy of `options` with 'k' set, capped at the source's and the descendant's depth.
    """
    k = options.get('k') or math.ceil(target_cfg.depth / 2)
    return {**options, 'k': min(int(k), source_cfg.depth, target_cfg.depth)}


# Share-Init's gene is TLEG's without θ_A; a layers gene holds the stored layers, the heads
# and, where chosen, the embeddings; Pre-Fin's is a whole model.
SHARE_INIT_PARTS = {'theta_b': common.Part(), 'shared': tleg.SHARED_PART}
LAYERS_PARTS = common.model_parts(embeddings=False)

SCRATCH = common.register(common.Method(
    name='scratch', label='Scratch', source='none', descend=descend_scratch,
    gene_param_count=functools.partial(common.count, include_head=False)))
SHARE_INIT = common.register(common.Method(
    name='share_init', label='Share-Init', source='learned', init_gene=share_init_gene,
    materialize=tleg.materialize, descend=share_init, gene_param_count=share_init_param_count,
    gene_parts=SHARE_INIT_PARTS, family='aux'))
MINI_INIT = common.register(common.Method(
    name='mini_init', label='Mini-Init', source='learned', init_gene=mini_init_gene,
    materialize=mini_init_materialize, descend=descend_mini_init,
    gene_param_count=functools.partial(common.count, include_head=False),
    gene_parts=common.model_parts(), family='aux'))
HE_LG = common.register(common.Method(
    name='he_lg', label='He-LG', source='model', gene_from_model=_from_model(he_lg_gene, 'he_lg'),
    descend=descend_he_lg, gene_param_count=functools.partial(common.count, include_head=False),
    gene_parts=LAYERS_PARTS, family='teacher', descend_defaults={'head': 'new'},
    target_options=half_depth_k))
AUTO_LG = common.register(common.Method(
    name='auto_lg', label='Auto-LG', source='model',
    gene_from_model=_from_model(auto_lg_gene, 'auto_lg'), descend=descend_auto_lg,
    gene_param_count=functools.partial(common.count, include_head=False),
    gene_parts=LAYERS_PARTS, family='teacher', descend_defaults={'head': 'new'},
    target_options=half_depth_k))
PRE_FIN = common.register(common.Method(
    name='pre_fin', label='Pre-Fin', source='model',
    gene_from_model=_from_model(pre_fin_gene, 'pre_fin'), descend=descend_pre_fin,
    gene_param_count=functools.partial(common.count, include_head=False), gene_per_target=True,
    gene_parts=common.model_parts(), family='teacher'))
