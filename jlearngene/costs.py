"""Cost accounting as in the TLEG tables: Params, S-Params, FLOPs per image, training cost.

* `param_count(cfg)`: parameters of one model (from `jax.eval_shape`, nothing allocated).
* `s_params(method, targets, ...)`: parameters that must be *stored* to initialise a set of
  descendants (one gene for TLEG; one pretrained model per size for Pre-Fin; ...).
* `flops_per_image(cfg)`: forward cost, counted the way fvcore counts a timm ViT (the
  convention of the DeiT/TLEG papers' "FLOPs (G)"): one per multiply-accumulate of every
  matmul (patch embedding, q/k/v/out projections, QKᵀ and attention·V, MLP, heads) plus
  5 per LayerNorm element; softmax, GELU, adds and pooling are not counted. With this
  convention the TLEG Table 1 FLOPs of all 24 Des-Ti/S/B models (no class token, 196
  tokens) round to the published value.
* `training_cost(plan)`: epochs, image passes and FLOPs of a plan of training runs
  (backward ≈ 2× forward, so a training step costs ≈ 3× forward FLOPs per image, plus one
  teacher forward when distilling).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import jax

from jlearngene import pytree
from jlearngene.models import vit
from jlearngene.models.config import ViTConfig

METHODS = ('scratch', 'tleg', 'share_init', 'pre_fin', 'he_lg', 'auto_lg')
_HEADS = ('head', 'head_dist')
LN_FLOPS_PER_ELEMENT = 5   # fvcore's count for an affine LayerNorm


def _shapes(cfg: ViTConfig):
    return jax.eval_shape(lambda: vit.init(cfg, jax.random.key(0)))


def _count(tree, include_head: bool = True) -> int:
    if not include_head and isinstance(tree, dict):
        tree = {k: v for k, v in tree.items() if k not in _HEADS}
    return pytree.count_params(tree, groups=None)['total']


def param_count(cfg: ViTConfig, *, include_head: bool = True) -> int:
    """Parameters of the ViT `cfg` (the tables' Params)."""
    return _count(_shapes(cfg), include_head)


def block_param_count(cfg: ViTConfig) -> int:
    """Parameters of one encoder block."""
    return _count(jax.eval_shape(lambda: vit.init_block(cfg, jax.random.key(0))))


def embedding_param_count(cfg: ViTConfig) -> int:
    """Patch/position embeddings, prefix tokens and final norm (no blocks, no head)."""
    shapes = _shapes(cfg)
    return _count({k: v for k, v in shapes.items() if k not in ('blocks',) + _HEADS})


def s_params(method: str, targets: Sequence[ViTConfig] = (), *, source: ViTConfig | None = None,
             k: int = 3, expand: Sequence[str] | None = None, from_layer: int = 0,
             include_head: bool = False) -> int:
    """Parameters stored to initialise the descendants `targets` with `method`.

    * 'scratch': 0.
    * 'tleg': the gene of the Aux-Net `source` as `tleg.descend` reads it: θ_A + θ_B (+ the
      free first layers of a partial expansion) + embeddings and final norm; one gene serves
      every target. (Free per-layer params of non-expanded modules are not counted: the
      descendants draw them fresh.)
    * 'share_init': one shared layer θ_B + embeddings.
    * 'pre_fin': one pretrained model per distinct target shape (the sum of their sizes), or,
      with `source`, the one pretrained model of shape `source` (TLEG Fig. 4).
    * 'he_lg': k layers of the ancestor `source`; 'auto_lg': k layers + its embeddings.

    Heads are excluded unless `include_head` (downstream descendants get a new head).
    """
    from jlearngene.genes import tleg   # local: keep `import jlearngene.costs` light

    if method not in METHODS:
        raise ValueError(f's_params: unknown method {method!r}; known: {METHODS}')
    if method == 'scratch':
        return 0
    if method == 'pre_fin':
        if source is not None:
            return param_count(source, include_head=include_head)
        if not targets:
            raise ValueError("s_params('pre_fin') needs target configs (or one pretrained `source`)")
        distinct = {dataclasses.replace(t, drop_path=0.0, dropout=0.0, remat=False,
                                        num_classes=t.num_classes if include_head else 0)
                    for t in targets}
        return sum(param_count(t, include_head=include_head) for t in distinct)
    if source is None:
        raise ValueError(f"s_params({method!r}) needs the `source` config (Aux-Net or ancestor)")
    if method in ('he_lg', 'auto_lg'):
        if not 1 <= k <= source.depth:
            raise ValueError(f's_params({method!r}): k={k} must be in [1, {source.depth}]')
        extra = embedding_param_count(source) if method == 'auto_lg' else 0
        return k * block_param_count(source) + extra
    gene = jax.eval_shape(lambda: tleg.init_gene(source, jax.random.key(0),
                                                 expand or tleg.DEFAULT_EXPAND, from_layer))
    gene['shared'] = {kk: v for kk, v in gene['shared'].items() if kk != 'blocks'}
    if method == 'share_init':
        gene.pop('theta_a')
        gene['shared'].pop('prefix', None)
    return tleg.gene_param_count(gene, include_head=include_head)


def flops_per_image(cfg: ViTConfig) -> int:
    """Forward FLOPs of one image (fvcore convention, see the module docstring)."""
    n, d, m, h = cfg.num_tokens, cfg.width, cfg.mlp_dim, cfg.num_heads
    patch = cfg.num_patches * cfg.patch_size ** 2 * cfg.channels * d
    attn = 4 * n * d * d + 2 * n * n * d          # q, k, v, out projections + QKᵀ + A·V
    del h                                         # head count does not change the count
    mlp = 2 * n * d * m
    ln = 2 * LN_FLOPS_PER_ELEMENT * n * d
    final_ln = LN_FLOPS_PER_ELEMENT * d * (n if (cfg.pool == 'cls' or cfg.pool_norm == 'before') else 1)
    heads = d * cfg.num_classes * (2 if cfg.distill_token else 1)
    return patch + cfg.depth * (attn + mlp + ln) + final_ln + heads


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a plan: `epochs` over `images` training images (fractional epochs
    are fine: steps × batch / images), `count` identical runs, an optional distillation
    `teacher` whose forward pass is paid every step."""
    name: str
    cfg: ViTConfig
    epochs: float
    images: int
    teacher: ViTConfig | None = None
    count: int = 1


TRAIN_FACTOR = 3   # forward + backward ≈ 3 forward passes


def run_cost(run: Run) -> dict[str, Any]:
    passes = run.epochs * run.images * run.count
    per_image = TRAIN_FACTOR * flops_per_image(run.cfg)
    if run.teacher is not None:
        per_image += flops_per_image(run.teacher)
    return {'name': run.name, 'epochs': run.epochs * run.count, 'image_passes': passes,
            'flops': passes * per_image}


def training_cost(plan: Iterable[Run | dict]) -> dict[str, Any]:
    """Cost of a plan: {'runs': [per-run epochs, image passes, FLOPs], 'epochs', 'image_passes',
    'flops'} (totals). Runs may be `Run`s or dicts with its fields."""
    runs = [r if isinstance(r, Run) else Run(**r) for r in plan]
    rows = [run_cost(r) for r in runs]
    return {'runs': rows, 'epochs': sum(r['epochs'] for r in rows),
            'image_passes': sum(r['image_passes'] for r in rows),
            'flops': sum(r['flops'] for r in rows)}
