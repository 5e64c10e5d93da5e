"""Loss functions that train one slimmable ViT at several widths per step, for the generic
trainer (`trainer.fit(loss_fn, params, ...)`, `loss_fn(params, batch, rng) -> (loss,
metrics)`, as in `tasks`): Scala, US-Net's sandwich rule and MatFormer's nested FFNs.

All of them run every width on the same batch and return the sum of the widths' losses, so
one optimiser step follows the summed gradients (the official codes' accumulated
backward passes). The widths of a step are drawn from the step's key, which the trainer
derives from the run's seed and the step number: a resumed run and every host draw the same
widths. Each width is a real sliced sub-network (`genes.scala.subnet`); a drawn width picks
one branch of a `lax.switch` over the grid's widths, so the step is one compiled program
whose cost is that of the four widths it runs.

* `scala_loss`: the full network (labels, or DeiT hard distillation from an external
  `teacher`), then one width of the upper and one of the lower half of the grid (stable
  sampling) and the smallest: progressive knowledge transfer (each sub-network distils
  from the next larger one of the step, detached; KL at temperature 1 averaged over the
  batch, on the distillation head when the model has one) plus noise calibration (λ × CE
  on the labels, on the class head).
* `full_loss`: the full network alone, Scala's warm-up (the official first 10 epochs, at
  half the learning rate): the experiment runs it as a first stage.
* `usnet_loss`: the sandwich rule: the full width on the labels, the smallest and two
  widths drawn uniformly from the grid's interior distilled in place from the full
  network (soft-target CE, no label term), all left-aligned.
* `matformer_loss`: every FFN granularity each step, equal-weight CE, no distillation.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jlearngene.genes import scala
from jlearngene.models import ViTConfig, apply
from jlearngene.train import losses

TRANSFERS = ('progressive', 'us')
DISTILLS = ('soft', 'hard')
Teacher = tuple[Any, ViTConfig]   # (params, config) of a frozen external teacher


def _choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f'{name}={value!r}; expected one of {tuple(choices)}')


def _targets(batch):
    return batch['label_soft'] if 'label_soft' in batch else batch['label']


def _heads(params, images, cfg: ViTConfig, rng):
    """(class-head logits, distillation-head logits) in training mode; the same logits
    twice without a distillation token."""
    logits, aux = apply(params, images, cfg, train=True, rng=rng)
    if 'logits_dist' in aux:
        return aux['logits_cls'], aux['logits_dist']
    return logits, logits


def width_forward(cfg: ViTConfig, ratio: float, *, rule: str = 'clean', smallest: float = 0.25,
                  side: str | None = None) -> Callable:
    """`(params, images, rng) -> (cls logits, distillation logits)` of the width-`ratio`
    sub-network (`scala.subnet`) in training mode."""
    def run(params, images, rng):
        sub, sub_cfg = scala.subnet(params, cfg, ratio, rule=rule, smallest=smallest, side=side)
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
        t_logits = jax.lax.stop_gradient(apply(t_params, batch['image'], t_cfg)[0])
        return losses.hard_distillation(ce_logits, t_logits, targets, alpha=alpha,
                                        label_smoothing=label_smoothing,
                                        student_dist_logits=kd_logits if distilled else None)
    ce = losses.cross_entropy(ce_logits, targets, label_smoothing=label_smoothing)
    if distilled:
        ce = (ce + losses.cross_entropy(kd_logits, targets, label_smoothing=label_smoothing)) / 2
    return ce


def full_loss(cfg: ViTConfig, *, rule: str = 'clean', teacher: Teacher | None = None,
              alpha: float = 0.5, label_smoothing: float = 0.0) -> Callable:
    """The full network alone (Scala's warm-up): the same loss as `scala_loss`'s full term."""
    _choice('rule', rule, scala.RULES)
    forward = width_forward(cfg, 1.0, rule=rule)

    def loss_fn(params, batch, rng):
        ce_logits, kd_logits = forward(params, batch['image'], rng)
        loss = _full_term(ce_logits, kd_logits, batch, teacher, alpha, label_smoothing,
                          cfg.distill_token)
        return loss, {'accuracy': losses.accuracy(ce_logits, batch['label'])}
    return loss_fn


def scala_loss(cfg: ViTConfig, grid: Sequence[float], *, rule: str = 'clean',
               ce_weight: float = 1.0, transfer: str = 'progressive', distill: str = 'soft',
               isolated: bool = True, teacher: Teacher | None = None, alpha: float = 0.5,
               label_smoothing: float = 0.0) -> Callable:
    """Scala's loss: L_full + Σ_k [KD(teacher_k → k) + ce_weight · CE(k, labels)] over the
    upper, lower and smallest sub-networks of the step (module docstring).

    `grid`: the width grid (`scala.width_grid`), its first entry the smallest ratio s.
    `transfer='us'` distils every sub-network from the full network (the paper's ablation);
    `distill='hard'` uses CE to the teacher's argmax; `isolated=False` slices every width on
    the left (no isolated activation); `ce_weight=0` drops noise calibration. `teacher`:
    (params, cfg) of a frozen external model for the full network's DeiT hard distillation
    (α = `alpha`). Metrics: the four terms, the drawn ratios and the full network's accuracy.
    """
    _choice('rule', rule, scala.RULES)
    _choice('transfer', transfer, TRANSFERS)
    _choice('distill', distill, DISTILLS)
    grid = tuple(float(r) for r in grid)
    upper, lower = scala.stable_halves(grid)
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
        i_up, i_low = scala.sample_widths(k_widths, grid)
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
    return loss_fn


def usnet_loss(cfg: ViTConfig, grid: Sequence[float], *, label_smoothing: float = 0.0) -> Callable:
    """US-Net's sandwich rule with in-place distillation: the full width on the labels; the
    smallest and two widths drawn uniformly from the grid's interior trained only on the
    detached softmax of the full width (soft-target CE); every width left-aligned."""
    grid = tuple(float(r) for r in grid)
    interior, smallest = grid[1:-1], grid[0]

    def make(ratio):
        return width_forward(cfg, ratio, smallest=smallest, side='left')

    def loss_fn(params, batch, rng):
        images = batch['image']
        k_widths, k_full, *k_sub = jax.random.split(rng, 5)
        picks = scala.sample_interior(k_widths, grid, 2)
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
    return loss_fn


def matformer_loss(cfg: ViTConfig, granularities: Sequence[float] = (0.25, 0.5, 0.75, 1.0), *,
                   label_smoothing: float = 0.0) -> Callable:
    """MatFormer: the nested FFN at every granularity (ratio of the MLP width) on the same
    batch, CE on the labels, summed with equal weights."""
    granularities = tuple(float(g) for g in granularities)

    def loss_fn(params, batch, rng):
        targets, total, metrics = _targets(batch), 0.0, {}
        for g, key in zip(granularities, jax.random.split(rng, len(granularities))):
            sub, sub_cfg = scala.ffn_subnet(params, cfg, g)
            ce_logits, _ = _heads(sub, batch['image'], sub_cfg, key)
            term = losses.cross_entropy(ce_logits, targets, label_smoothing=label_smoothing)
            metrics[f'loss_ffn{g:g}'] = term
            total = total + term
            if g == max(granularities):
                metrics['accuracy'] = losses.accuracy(ce_logits, batch['label'])
        return total, metrics
    return loss_fn


def masked_eval(cfg: ViTConfig) -> Callable:
    """`eval_fn((params, masks), batch) -> sums` (as `tasks.classification_eval`) of the
    masked sub-network (`scala.masked_apply`): one compiled program evaluates every width."""
    def eval_fn(params_and_masks, batch):
        params, masks = params_and_masks
        logits, _ = scala.masked_apply(params, batch['image'], cfg, masks)
        labels = batch['label']
        mask = batch.get('mask')
        mask = jnp.ones(labels.shape[:1], jnp.float32) if mask is None else mask.astype(jnp.float32)
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        ce = losses.cross_entropy_per_example(logits, labels)
        return {'accuracy': (correct * mask).sum(), 'loss': (ce * mask).sum(), 'count': mask.sum()}
    return eval_fn
