"""Task functions for the generic trainer, built on `jlearngene.models.apply`.

`*_loss(...)` return `loss_fn(params, batch, rng) -> (loss, metrics)` and `*_eval(...)`
return `eval_fn(params, batch) -> sums`: per-batch **sums** over the valid examples plus a
'count' entry, so `evaluate.evaluate` (used by the trainer and `jlearngene eval`) can
average over a whole split exactly even when the last batch is padded (batch['mask'] marks
real examples).
"""
from __future__ import annotations

from collections.abc import Callable

from jlearngene import losses
from jlearngene.models import ViTConfig, apply


def classification_loss(cfg: ViTConfig, *, label_smoothing: float = 0.0) -> Callable:
    """Cross-entropy on `batch['label_soft']` when present (mixup/cutmix), else `batch['label']`.

    Args:
        cfg: the ViT's config.
        label_smoothing: label smoothing of integer labels.

    Returns:
        The function `loss_fn(params, batch, rng) -> (loss, metrics)`, which applies the
        model in training mode to `batch['image']`; its metrics hold 'accuracy', the top-1
        accuracy on `batch['label']`. Its attribute `key`, ('classification_loss', `cfg`,
        `label_smoothing`), names it for a `FitConfig.compile_key`.
    """
    def loss_fn(params, batch, rng):
        logits, _ = apply(params, batch['image'], cfg, train=True, rng=rng)
        targets = batch['label_soft'] if 'label_soft' in batch else batch['label']
        loss = losses.cross_entropy(logits, targets, label_smoothing=label_smoothing)
        return loss, {'accuracy': losses.accuracy(logits, batch['label'])}
    loss_fn.key = ('classification_loss', cfg, float(label_smoothing))
    return loss_fn


def classification_eval(cfg: ViTConfig) -> Callable:
    """Sums of correct predictions and cross-entropy over the valid examples, and 'count'.

    Args:
        cfg: the ViT's config.

    Returns:
        The function `eval_fn(params, batch) -> sums`, the sums 'accuracy', 'loss' and
        'count' as `losses.eval_sums` gives them, applying the model in inference mode to
        `batch['image']` (honouring `batch['mask']`). Its attribute `key`,
        ('classification_eval', `cfg`), names it (the `Evaluation` hook's compile key).
    """
    def eval_fn(params, batch):
        logits, _ = apply(params, batch['image'], cfg)
        return losses.eval_sums(logits, batch)
    eval_fn.key = ('classification_eval', cfg)
    return eval_fn
