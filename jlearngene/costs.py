"""Cost accounting as in the TLEG tables: Params, S-Params, FLOPs per image, training cost.

* `param_count(cfg_or_params)`: parameters of one model (from `jax.eval_shape`, nothing
  allocated, or from a params tree of arrays or shapes).
* `s_params(method, targets, ...)`: parameters that must be *stored* to initialise a set of
  descendants: the registered method's gene (`jlearngene.genes`), counted by its own
  `gene_param_count` (one gene for TLEG; one pretrained model per size for Pre-Fin; ...).
* `flops_per_image(cfg, params=None)`: forward cost, counted the way fvcore counts a timm ViT
  (the convention of the DeiT/TLEG papers' "FLOPs (G)"): one per multiply-accumulate of
  every matmul (patch embedding, q/k/v/out projections D×(H·Dh) each, QKᵀ and attention·V
  n²·H·Dh each, MLP, the pre-logits layer D×R when there is one, heads) plus 5 per
  LayerNorm element; softmax, GELU, tanh, adds and pooling are not counted. Every size is
  read from the parameters' shapes, per block, so blocks may differ in head count or head
  size (list layout). With this convention the TLEG
  Table 1 FLOPs of all 24 Des-Ti/S/B models (no class token, 196 tokens) round to the
  published value.
* `training_cost(plan)`: epochs, image passes and FLOPs of a plan of training runs
  (backward ≈ 2× forward, so a training step costs ≈ 3× forward FLOPs per image, plus one
  teacher forward when distilling; a teacher that is not a ViT, such as the LeViT-384 that
  TLEG and LeTra distil from, is given by its forward FLOPs per image).
* `cost_ratio(baseline, plan)` and `plan_table(plan, baseline)`: a plan against another in
  epochs and in FLOPs. The papers state their savings in epochs, which count an Aux-Net
  epoch like a small descendant's: LeTra's "3.6×" (12 Des-Nets × 100 epochs against 320 +
  12 × 1) is 3.61× in epochs and 1.7× in FLOPs (1.75× without the teacher's forward).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any
from collections.abc import Iterable, Sequence

import jax
import numpy as np

from jlearngene import genes, pytree
from jlearngene.genes import common
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

LN_FLOPS_PER_ELEMENT = 5   # fvcore's count for an affine LayerNorm


def __getattr__(name: str) -> Any:
    if name == 'METHODS':   # the registry's names, at the time of asking
        return genes.names()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _shapes(cfg_or_params: ViTConfig | Any) -> Any:
    if isinstance(cfg_or_params, ViTConfig):
        return jax.eval_shape(lambda: vit.init(cfg_or_params, jax.random.key(0)))
    return cfg_or_params


def param_count(cfg_or_params: ViTConfig | Any, *, include_head: bool = True) -> int:
    """The parameters of a ViT (the tables' Params).

    Args:
        cfg_or_params: a `ViTConfig`, or a params tree (arrays or `jax.ShapeDtypeStruct`s,
          either layout).
        include_head: count the classifier heads too.

    Returns:
        The number of parameters.
    """
    return common.count(_shapes(cfg_or_params), include_head=include_head)


def block_param_count(cfg: ViTConfig) -> int:
    """Parameters of one encoder block.

    Args:
        cfg: the model's config; the block is shaped as `vit.init_block(cfg)` makes it.

    Returns:
        The number of parameters of one block (counted from shapes; nothing is allocated).
    """
    return common.count(jax.eval_shape(lambda: vit.init_block(cfg, jax.random.key(0))))


def embedding_param_count(cfg: ViTConfig) -> int:
    """Patch/position embeddings, prefix tokens and final norm (no blocks, no head).

    Args:
        cfg: the model's config.

    Returns:
        The number of parameters under `common.EMBED_KEYS` of `vit.init(cfg)` (counted from
        shapes; nothing is allocated).
    """
    shapes = _shapes(cfg)
    return common.count({k: v for k, v in shapes.items() if k in common.EMBED_KEYS})


def _signature(tree: Any, include_head: bool) -> tuple:
    if isinstance(tree, dict) and not include_head:
        tree = {k: v for k, v in tree.items() if k not in common.HEAD_KEYS}
    return tuple((p, tuple(np.shape(x))) for p, x in pytree.flatten(tree).items())


def s_params(method: str | genes.Method, targets: Sequence[ViTConfig] = (), *,
             source: ViTConfig | None = None, include_head: bool = False,
             **gene_options: Any) -> int:
    """The parameters stored to initialise the descendants `targets` with `method` (S-Params).

    One gene serves every target; a method with `gene_per_target` and no `source` stores one
    gene per distinct target shape (Pre-Fin: the sum of the pretrained models' sizes). A
    method without a gene stores 0.

    Args:
        method: a registered name or a `genes.Method`.
        targets: the descendants' configs.
        source: the config of the gene's source (Aux-Net, ancestor or pretrained model).
        include_head: count the heads too (downstream descendants get a new head, so they
          are left out by default).
        **gene_options: options of the method's gene (e.g. TLEG's `expand`, `from_layer`;
          He-LG's `k`).

    Returns:
        The parameters, counted by the method's `gene_param_count` on the gene's shapes
        (nothing is allocated).

    Raises:
        ValueError: `source` is missing where the method needs it, or neither `source` nor
          targets are given for a method with one gene per target.
        GeneError: the method cannot make a gene for `source` with these options.
    """
    m = method if isinstance(method, genes.Method) else genes.get(method)
    if source is not None or m.source == 'none':
        sources = [source]
    elif not m.gene_per_target:
        raise ValueError(f's_params({m.name!r}) needs the `source` config (Aux-Net or ancestor)')
    elif not targets:
        raise ValueError(f's_params({m.name!r}) needs target configs (or one `source`)')
    else:
        sources = list(targets)
    stored: dict[tuple, int] = {}
    for cfg in sources:
        gene = m.gene_shapes(cfg, **gene_options)
        stored[_signature(gene, include_head)] = m.gene_param_count(gene, include_head=include_head)
    return sum(stored.values())


def _axis_sizes(path: str, leaf: Any) -> dict[str, int]:
    return dict(zip(layout.leaf_axes(path, np.ndim(leaf)), np.shape(leaf)))


def _block_flops(q: dict[str, int], fc1: dict[str, int], n: int) -> int:
    """Forward FLOPs of the blocks described by the q kernel's and fc1 kernel's axis sizes
    (times their 'layers' axis when stacked)."""
    d, a, m = q['embed'], q['heads'] * q['head_dim'], fc1['mlp']
    attn = 4 * n * d * a + 2 * n * n * a          # q, k, v, out projections + QKᵀ + A·V
    mlp = 2 * n * d * m
    ln = 2 * LN_FLOPS_PER_ELEMENT * n * d
    return q.get('layers', 1) * (attn + mlp + ln)


def flops_per_image(cfg: ViTConfig, params: Any = None) -> int:
    """The forward FLOPs of one image (fvcore convention, see the module docstring).

    Args:
        cfg: the model's config (it supplies the pooling: `pool`, `pool_norm`).
        params: the parameters whose sizes count (arrays or `jax.ShapeDtypeStruct`s, stacked
          or list layout; blocks may differ in shape); None: the shapes of `vit.init(cfg)`.

    Returns:
        The FLOPs.
    """
    shapes = _shapes(cfg if params is None else params)
    flat = pytree.flatten(shapes)
    n = _axis_sizes('pos_embed', flat['pos_embed'])['tokens']
    pk = _axis_sizes('patch_embed/kernel', flat['patch_embed/kernel'])
    d = pk['embed']
    patches = n - sum(k in shapes for k in ('cls_token', 'dist_token'))
    total = patches * pk['patch_h'] * pk['patch_w'] * pk['channels'] * d
    prefixes = [p[:-len('attn/q/kernel')] for p in flat if p.endswith('attn/q/kernel')]
    for pre in prefixes:
        q = _axis_sizes(f'{pre}attn/q/kernel', flat[f'{pre}attn/q/kernel'])
        fc1 = _axis_sizes(f'{pre}mlp/fc1/kernel', flat[f'{pre}mlp/fc1/kernel'])
        total += _block_flops(q, fc1, n)
    normed = n if (cfg.pool == 'cls' or cfg.pool_norm == 'before') else 1
    total += LN_FLOPS_PER_ELEMENT * d * normed
    for h in common.HEAD_KEYS:   # the pre-logits layer and the heads: one MAC per kernel entry
        if f'{h}/kernel' in flat:
            total += int(np.prod(np.shape(flat[f'{h}/kernel'])))
    return int(total)


# LeViT-384's forward FLOPs for one 224 px image (Graham et al. 2021, 2,353 M): the teacher
# of TLEG's and LeTra's Aux-Nets, which is not a ViT. A `Run` takes it as its `teacher`.
LEVIT_384_FLOPS = 2_353_000_000


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a plan: `epochs` over `images` training images (fractional epochs
    are fine: steps × batch / images), `count` identical runs, an optional distillation
    `teacher` whose forward pass is paid every step: a ViT's config, or the forward FLOPs per
    image of a teacher that is not a ViT (`LEVIT_384_FLOPS`)."""
    name: str
    cfg: ViTConfig
    epochs: float
    images: int
    teacher: ViTConfig | float | None = None
    count: int = 1

    def __post_init__(self):
        t = self.teacher
        if t is None or isinstance(t, ViTConfig):
            return
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise ValueError(f'Run {self.name!r}: teacher={t!r}; expected a ViTConfig or the '
                             "teacher's forward FLOPs per image, a positive number (e.g. "
                             'costs.LEVIT_384_FLOPS)')


TRAIN_FACTOR = 3   # forward + backward ≈ 3 forward passes


def teacher_flops(run: Run) -> float:
    """Forward FLOPs per image of the run's teacher.

    Args:
        run: the run whose `teacher` is counted.

    Returns:
        0 without a teacher; `flops_per_image` of a `ViTConfig` teacher; otherwise the
        teacher's FLOPs per image as given.
    """
    if run.teacher is None:
        return 0
    if isinstance(run.teacher, ViTConfig):
        return flops_per_image(run.teacher)
    return run.teacher


def run_cost(run: Run) -> dict[str, Any]:
    """The cost of one `Run` of a plan.

    Args:
        run: the run (its config, epochs, images per epoch, count and optional teacher).

    Returns:
        A dict with the run's 'name', 'epochs' (epochs × count), 'image_passes' and 'flops' (the
        forward and backward passes of training, `TRAIN_FACTOR` × `flops_per_image`, plus the
        teacher's forward passes, for every image pass).
    """
    passes = run.epochs * run.images * run.count
    per_image = TRAIN_FACTOR * flops_per_image(run.cfg) + teacher_flops(run)
    return {'name': run.name, 'epochs': run.epochs * run.count, 'image_passes': passes,
            'flops': passes * per_image}


def _runs(plan: Iterable[Run | dict]) -> list[Run]:
    return [r if isinstance(r, Run) else Run(**r) for r in plan]


def training_cost(plan: Iterable[Run | dict]) -> dict[str, Any]:
    """Cost of a plan of training runs.

    Args:
        plan: the runs: `Run`s or dicts of `Run`'s fields.

    Returns:
        A dict of 'runs', the list of every run's `run_cost`, and the totals 'epochs',
        'image_passes' and 'flops'.

    Raises:
        ValueError: a dict run's `teacher` is neither a `ViTConfig` nor a positive number
          (`Run`'s check).
    """
    rows = [run_cost(r) for r in _runs(plan)]
    return {'runs': rows, 'epochs': sum(r['epochs'] for r in rows),
            'image_passes': sum(r['image_passes'] for r in rows),
            'flops': sum(r['flops'] for r in rows)}


def _cost(plan_or_cost: Iterable[Run | dict] | dict) -> dict[str, Any]:
    if isinstance(plan_or_cost, dict) and 'runs' in plan_or_cost:
        return plan_or_cost
    return training_cost(plan_or_cost)


def cost_ratio(baseline: Iterable[Run | dict] | dict, plan: Iterable[Run | dict] | dict
               ) -> dict[str, float]:
    """How many times `plan` is cheaper than `baseline`.

    Papers state the epochs ratio; the FLOPs ratio also weighs each epoch by its model's and
    teacher's size.

    Args:
        baseline: a plan (as for `training_cost`) or a `training_cost` result.
        plan: a plan or a `training_cost` result.

    Returns:
        A dict of 'epochs', 'image_passes' and 'flops', each baseline / plan (`math.inf` where
        the plan's total is 0).

    Raises:
        ValueError: a dict run's `teacher` is invalid (`Run`'s check).
    """
    b, p = _cost(baseline), _cost(plan)
    return {k: b[k] / p[k] if p[k] else math.inf for k in ('epochs', 'image_passes', 'flops')}


def _si(flops: float, unit: str = 'FLOPs') -> str:
    """1.23 GFLOPs, 4.56 EFLOPs, ...: three significant digits."""
    for scale, prefix in ((1e18, 'E'), (1e15, 'P'), (1e12, 'T'), (1e9, 'G'), (1e6, 'M')):
        if flops >= scale:
            return f'{flops / scale:.3g} {prefix}{unit}'
    return f'{flops:.3g} {unit}'


def plan_table(plan: Iterable[Run | dict], baseline: Iterable[Run | dict] | None = None) -> str:
    """Markdown table of a plan.

    One row per run: its full shape (width, depth, heads, MLP size), runs, epochs (all runs
    together), teacher, forward FLOPs per image and training FLOPs; then the totals.

    Args:
        plan: the runs: `Run`s or dicts of `Run`'s fields.
        baseline: a plan or `training_cost` result to compare with; `None`: no comparison.

    Returns:
        The table as a Markdown string; with a `baseline`, followed by a blank line and a line
        with the ratios baseline / plan in epochs and in FLOPs.

    Raises:
        ValueError: a dict run's `teacher` is invalid (`Run`'s check).
    """
    runs = _runs(plan)
    rows = ['| run | width | depth | heads | mlp | runs | epochs | teacher | forward / image '
            '| training |', '|---|---|---|---|---|---|---|---|---|---|']
    for run in runs:
        c, cost = run.cfg, run_cost(run)
        teacher = '' if run.teacher is None else _si(teacher_flops(run))
        if isinstance(run.teacher, ViTConfig):
            t = run.teacher
            teacher = f'ViT {t.width}/{t.depth}/{t.num_heads}/{t.mlp_dim}, {teacher}'
        rows.append(f'| {run.name} | {c.width} | {c.depth} | {c.num_heads} | {c.mlp_dim} | '
                    f"{run.count} | {cost['epochs']:g} | {teacher} | {_si(flops_per_image(c))} | "
                    f"{_si(cost['flops'])} |")
    total = training_cost(runs)
    rows.append(f"| total | | | | | {sum(r.count for r in runs)} | {total['epochs']:g} | | | "
                f"{_si(total['flops'])} |")
    if baseline is not None:
        ratio = cost_ratio(baseline, total)
        rows += ['', f"baseline / plan: {ratio['epochs']:.2f}× in epochs, {ratio['flops']:.2f}× "
                     'in FLOPs (training FLOPs: 3 forward passes per image, plus the teacher\'s '
                     'forward)']
    return '\n'.join(rows)
