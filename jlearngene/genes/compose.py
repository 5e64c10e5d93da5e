"""Chains of methods: a descendant of one method becomes the source of the next.

Every method's `descend` returns canonical params of a target config, and every method that
takes its gene from a model reads canonical params of a config. A chain is therefore plain
function composition over `(params, cfg)` pairs, with no method knowing about another::

    from jlearngene.genes import cluster, compose

    model = compose.descendant('letra', letra_gene,     # width 12 (3 heads of 4), 2 layers
                               aux_cfg.replace(width=12, num_heads=3, mlp_dim=24, depth=2))
    params, cfg = compose.chain(
        model,
        compose.step('tleg', lambda c: c.replace(depth=8),          # TLEG's line, 8 layers
                     gene_from=compose.linear_gene),
        compose.step('cluster', lambda c: cluster.descendant_config(c, [2] * 8),
                     gene_options={'clusters': [(0, 2)] * 8, 'ffn': 'none'},
                     heads=[2] * 8, key=key))                       # heads 0 and 2 shared

* `descendant(method, gene, target_cfg, **options)`: the first link, from a stored gene.
* `step(method, target, *, gene_from=None, gene_options=None, **options)`: a link
  `(params, cfg) -> (params, cfg)`: the model's gene (`gene_from(params, cfg,
  **gene_options)`, by default the method's own `gene_from_model`), then `method.descend`
  to `target` (a config, or a function of the source config).
* `chain(model, *steps)`: the steps applied left to right.

Methods whose gene is learned inside an Aux-Net have no `gene_from_model`; a step into them
names how a gene is read off a model: `linear_gene` (a TLEG gene fitted to any model's
layers, exact for two layers) or `whole_model` (the model is the gene: Scala, US-Net and
MatFormer descend from a full slimmable network).

Everything here is pure and jittable with the configs and options static.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

from jlearngene.genes import common, tleg
from jlearngene.genes.common import GeneError
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
Model = tuple[Params, ViTConfig]
Step = Callable[[Params, ViTConfig], Model]
Target = ViTConfig | Callable[[ViTConfig], ViTConfig]


def _method(method: str | common.Method) -> common.Method:
    return common.get(method) if isinstance(method, str) else method


def descendant(method: str | common.Method, gene: Any, target_cfg: ViTConfig, *,
               key: jax.Array | None = None, **options: Any) -> Model:
    """A chain's first model, from a stored gene.

    Args:
        method: a registered method's name (`jlearngene.genes.get`) or its `Method`.
        gene: the method's gene, as `method.descend` reads it.
        target_cfg: the descendant's config.
        key: PRNG key for whatever the method draws fresh; None where nothing is drawn.
        **options: the rest of `method.descend`'s options (e.g. `head`, `embeddings`).

    Returns:
        `(method.descend(gene, target_cfg, key=key, **options), target_cfg)`.

    Raises:
        GeneError: `method` names no registered method, or `method.descend` refuses the
          gene, the config or the options.
    """
    return _method(method).descend(gene, target_cfg, key=key, **options), target_cfg


def step(method: str | common.Method, target: Target, *,
         gene_from: Callable[..., Any] | None = None, gene_options: Mapping[str, Any] | None = None,
         key: jax.Array | None = None, **options: Any) -> Step:
    """A link of a chain: `(params, cfg)` -> the descendant of `method` of config `target`
    (or `target(cfg)`) whose gene is `gene_from(params, cfg, **gene_options)`.

    Args:
        method: a registered method's name (`jlearngene.genes.get`) or its `Method`.
        target: the descendant's config, or a function of the source model's config that
          returns it.
        gene_from: `gene_from(params, cfg, **gene_options) -> gene`, how the gene is read off
          the source model; None is `method.gene_from_model` (methods of source 'model'). A
          method whose gene is learned needs one (`linear_gene`, `whole_model`, or any
          function of a model).
        gene_options: keyword arguments for `gene_from`; None for none.
        key: PRNG key passed on to `method.descend`.
        **options: the rest of `method.descend`'s options.

    Returns:
        The link, `link(params, cfg) -> (descendant params, target config)`. It raises
        GeneError when `target(cfg)` is not a `ViTConfig`, and whatever `gene_from` and
        `method.descend` raise.

    Raises:
        GeneError: `method` names no registered method, or `gene_from` is None and the
          method has no `gene_from_model`.
    """
    m = _method(method)
    read = gene_from if gene_from is not None else m.gene_from_model
    if read is None:
        raise GeneError(f"compose.step({m.name!r}): {m.label}'s gene is {m.source} "
                        f'(source {m.source!r}), not taken from a model; pass gene_from=, e.g. '
                        'compose.linear_gene or compose.whole_model')

    def link(params: Params, cfg: ViTConfig) -> Model:
        gene = read(params, cfg, **dict(gene_options or {}))
        target_cfg = target(cfg) if callable(target) else target
        if not isinstance(target_cfg, ViTConfig):
            raise GeneError(f'compose.step({m.name!r}): the target is a '
                            f'{type(target_cfg).__name__}, not a ViTConfig')
        return m.descend(gene, target_cfg, key=key, **options), target_cfg

    return link


def chain(model: Model, *steps: Step) -> Model:
    """`steps` applied to `model` from left to right.

    Args:
        model: the first model, `(params, cfg)` (e.g. from `descendant`).
        *steps: links `(params, cfg) -> (params, cfg)`, as `step` makes them.

    Returns:
        The last step's `(params, cfg)`; `model` itself when there are no steps.
    """
    params, cfg = model
    for s in steps:
        params, cfg = s(params, cfg)
    return params, cfg


# ----------------------------------------------------------------------------------------
# Reading a gene off a model, for methods whose gene is learned.

def whole_model(params: Params, cfg: ViTConfig) -> Params:
    """The model itself as the gene: what Scala, US-Net and MatFormer descend from (their
    gene is the full slimmable network).

    Args:
        params: the model's canonical params (stacked or list layout).
        cfg: the model's config.

    Returns:
        `params` in the stacked layout.

    Raises:
        GeneError: `params` is not a whole model of config `cfg` (`common.check_model`).
    """
    return common.check_model(params, cfg, 'compose.whole_model')


def linear_gene(params: Params, cfg: ViTConfig) -> tleg.Gene:
    """A TLEG gene fitted to a model: per block tensor, θ_B and θ_A of the least-squares line
    w_l ≈ θ_B + (l/L)·θ_A through the model's L layers (`tleg.coefficients(L)`); the
    embeddings and head are kept in `shared`.

    Every block module is expanded (LayerScale too when the config has it), so
    `tleg.descend` gives any depth without drawing anything. The fit is exact for two
    layers (θ_B = w_0, θ_A = 2·(w_1 − w_0)) and for a model that TLEG expanded; a one-layer
    model gives θ_A = 0 (Share-Init). Deeper models keep their best linear approximation
    in depth: the layer-position linearity TLEG builds on.

    Args:
        params: the model's canonical params (stacked or list layout).
        cfg: the model's config.

    Returns:
        A TLEG gene, a dict with keys 'theta_b' and 'theta_a' (block trees, each leaf of one
        layer's shape and the model's dtype, fitted in float32) and 'shared' (the embeddings
        and heads).

    Raises:
        GeneError: `params` is not a whole model of config `cfg` (`common.check_model`), or
          it has block modules outside TLEG's expansion groups.
    """
    params = common.check_model(params, cfg, 'compose.linear_gene')
    groups = [g for g in tleg.MODULES if g != 'ls' or cfg.layer_scale]
    keys = tleg.expanded_keys(groups, cfg)
    blocks = params['blocks']
    free = sorted(k for k in blocks if k not in keys)
    if free:
        raise GeneError(f'compose.linear_gene: block modules {free} have no TLEG expansion group '
                        f'(groups {tuple(tleg.MODULES)})')
    c = tleg.coefficients(cfg.depth)
    dc = c - c.mean()
    var = jnp.sum(dc * dc)

    def fit(w):
        flat = w.reshape(cfg.depth, -1).astype(jnp.float32)
        mean = flat.mean(0)
        if cfg.depth == 1:
            slope = jnp.zeros_like(mean)
        else:
            slope = jnp.matmul(dc, flat - mean, precision=jax.lax.Precision.HIGHEST) / var
        base = mean - c.mean() * slope
        shape = w.shape[1:]
        return base.reshape(shape).astype(w.dtype), slope.reshape(shape).astype(w.dtype)

    fitted = jax.tree.map(fit, blocks)
    is_pair = lambda x: isinstance(x, tuple)   # noqa: E731
    return {'theta_b': jax.tree.map(lambda p: p[0], fitted, is_leaf=is_pair),
            'theta_a': jax.tree.map(lambda p: p[1], fitted, is_leaf=is_pair),
            'shared': common.top_level(params)}
