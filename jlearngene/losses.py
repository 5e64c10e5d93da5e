"""Classification and distillation losses on logits (pure jnp; float32 internally).

A bottom-floor module (like `pytree`): the trainer's tasks and the methods' own losses
(`genes.scala`'s slimmable losses) both build on it.

Targets are integer labels (B,) or probability vectors (B, K) (mixup/cutmix). Every loss
takes an optional `mask` (B,) of valid examples (padded evaluation batches) and averages
over the valid ones. Batches that do not match (labels of another length, teacher logits of
another shape) and empty batches, whose mean would be NaN, are a ValueError; the checks read
shapes only, so they hold under `jax.jit` as well.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _targets(targets, num_classes: int, label_smoothing: float = 0.0) -> jax.Array:
    """Probability targets (B, K); label smoothing applies to integer labels only (mixed
    soft targets from the data pipeline are used as given)."""
    targets = jnp.asarray(targets)
    if jnp.issubdtype(targets.dtype, jnp.integer):
        t = jax.nn.one_hot(targets, num_classes, dtype=jnp.float32)
        if label_smoothing:
            t = t * (1.0 - label_smoothing) + label_smoothing / num_classes
        return t
    if targets.shape[-1] != num_classes:
        raise ValueError(f'soft targets have {targets.shape[-1]} classes, logits have {num_classes}')
    return targets.astype(jnp.float32)


def _check_batch(what: str, logits, targets=None, *, name: str = 'labels',
                 mean: bool = True) -> None:
    """ValueError unless `targets` (labels (...) or probability vectors (..., K); other
    logits with `name`) match the batch axes of `logits` (..., K) and, for a loss that is a
    `mean` over the batch, the batch holds an example."""
    shape = tuple(jnp.shape(logits))
    if mean and len(shape) >= 2 and shape[0] == 0:
        raise ValueError(f'{what}: an empty batch (logits of shape {shape}) has no mean; '
                         'expected logits (batch, classes) with batch >= 1')
    if targets is None:
        return
    t, batch = tuple(jnp.shape(targets)), shape[:-1]
    if name == 'labels':   # the class axis of soft labels is `_targets`' to check
        ok = t[:len(batch)] == batch and len(t) in (len(batch), len(shape))
        soft = '(' + ', '.join([*map(str, batch), 'K']) + ')'
        want = f'{batch} (labels) or {soft} (probabilities)'
    else:
        ok, want = t == shape, 'the same shape'
    if not ok:
        raise ValueError(f'{what}: logits of shape {shape} and {name} of shape {t} do not '
                         f'match (expected {want})')


def _mean(per_example: jax.Array, mask) -> jax.Array:
    if mask is None:
        return per_example.mean()
    mask = jnp.asarray(mask, jnp.float32)
    return (per_example * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def cross_entropy_per_example(logits, targets, *, label_smoothing: float = 0.0) -> jax.Array:
    """Cross-entropy of each example (not averaged).

    Args:
        logits: (batch, classes).
        targets: integer labels (batch,) or target distributions (batch, classes).
        label_smoothing: mass moved uniformly over the classes before the loss.

    Returns:
        (batch,) float32 losses.

    Raises:
        ValueError: `logits` and `targets` do not describe one batch.
    """
    _check_batch('cross_entropy', logits, targets, mean=False)
    logits = jnp.asarray(logits, jnp.float32)
    t = _targets(targets, logits.shape[-1], label_smoothing)
    return -(t * jax.nn.log_softmax(logits, axis=-1)).sum(-1)


def cross_entropy(logits, targets, *, label_smoothing: float = 0.0, mask=None) -> jax.Array:
    """Mean cross-entropy H(targets, softmax(logits)) with optional label smoothing.

    Args:
        logits: (batch, classes).
        targets: integer labels (batch,) or target distributions (batch, classes).
        label_smoothing: mass moved uniformly over the classes (integer labels only).
        mask: optional (batch,) weights of the valid examples (1 valid, 0 padding); `None`
          averages over all.

    Returns:
        The float32 scalar mean over the (valid) examples.

    Raises:
        ValueError: `logits` and `targets` do not describe one batch, or the batch is empty.
    """
    _check_batch('cross_entropy', logits, targets)
    return _mean(cross_entropy_per_example(logits, targets, label_smoothing=label_smoothing), mask)


def kl_per_example(student_logits, teacher_logits, *, tau: float = 1.0) -> jax.Array:
    """KL(p_t || p_s) per example with p = softmax(z / tau) (teacher gets no gradient).

    Args:
        student_logits: (batch, classes).
        teacher_logits: (batch, classes), the same shape.
        tau: softmax temperature of both distributions.

    Returns:
        (batch,) float32 divergences (not averaged, not scaled by τ²).

    Raises:
        ValueError: the two logits differ in shape.
    """
    _check_batch('kl_per_example', student_logits, teacher_logits, name='teacher logits',
                 mean=False)
    s = jax.nn.log_softmax(jnp.asarray(student_logits, jnp.float32) / tau, axis=-1)
    t = jax.nn.log_softmax(jax.lax.stop_gradient(jnp.asarray(teacher_logits, jnp.float32)) / tau, axis=-1)
    return (jnp.exp(t) * (t - s)).sum(-1)


def soft_distillation(student_logits, teacher_logits, labels=None, *, tau: float = 1.0,
                      alpha: float = 0.5, label_smoothing: float = 0.0,
                      legacy_deit_normalisation: bool = False, student_dist_logits=None,
                      mask=None) -> jax.Array:
    """(1 − α)·CE(labels, student) + α·τ²·KL(teacher ‖ student at temperature τ).

    The KL term is averaged over the batch; with `legacy_deit_normalisation` it is instead
    τ²·Σ_{b,c}/(B·C), i.e. divided by the number of classes as well (DeiT's
    `kl_div(reduction='sum') / numel`, used by TLEG's published runs). With a DeiT
    distillation token pass its logits as `student_dist_logits`: the KL term uses them and
    CE uses `student_logits`.

    Args:
        student_logits: (batch, classes).
        teacher_logits: (batch, classes), the shape of the logits the KL term uses.
        labels: integer labels (batch,) or target distributions (batch, classes); may be
          `None` when `alpha` = 1.
        tau: distillation temperature τ.
        alpha: weight α of the KL term; 1 drops the cross-entropy term.
        label_smoothing: label smoothing of the cross-entropy term.
        legacy_deit_normalisation: divide the KL term by the number of classes as well.
        student_dist_logits: logits of a DeiT distillation token (batch, classes), for the KL
          term; `None` uses `student_logits`.
        mask: optional (batch,) weights of the valid examples.

    Returns:
        The float32 scalar loss.

    Raises:
        ValueError: `labels` is `None` and `alpha` < 1; the batches do not match (labels or
          teacher logits of another shape); or the batch is empty.
    """
    _check_batch('soft_distillation', student_logits, labels)
    kd_logits = student_logits if student_dist_logits is None else student_dist_logits
    kl = kl_per_example(kd_logits, teacher_logits, tau=tau)
    kd = tau ** 2 * _mean(kl, mask)
    if legacy_deit_normalisation:
        kd = kd / kd_logits.shape[-1]
    if alpha == 1.0:
        return kd
    if labels is None:
        raise ValueError(f'soft_distillation with alpha={alpha} < 1 needs labels')
    return (1.0 - alpha) * cross_entropy(student_logits, labels, label_smoothing=label_smoothing,
                                         mask=mask) + alpha * kd


def hard_distillation(student_logits, teacher_logits, labels, *, alpha: float = 0.5,
                      label_smoothing: float = 0.0, student_dist_logits=None, mask=None) -> jax.Array:
    """DeiT hard distillation: (1 − α)·CE(labels, student) + α·CE(argmax teacher, student).

    DeiT uses α = 1/2; with a distillation token the second term uses `student_dist_logits`.

    Args:
        student_logits: (batch, classes).
        teacher_logits: (batch, classes); its argmax is the second term's label.
        labels: integer labels (batch,) or target distributions (batch, classes).
        alpha: weight α of the teacher term; 1 drops the cross-entropy on `labels`.
        label_smoothing: label smoothing of the cross-entropy on `labels`.
        student_dist_logits: logits of a DeiT distillation token (batch, classes), for the
          teacher term; `None` uses `student_logits`.
        mask: optional (batch,) weights of the valid examples.

    Returns:
        The float32 scalar loss.

    Raises:
        ValueError: `labels` or `teacher_logits` do not match `student_logits`' batch, or the
          batch is empty.
    """
    _check_batch('hard_distillation', student_logits, labels)
    _check_batch('hard_distillation', student_logits, teacher_logits, name='teacher logits')
    kd_logits = student_logits if student_dist_logits is None else student_dist_logits
    teacher_labels = jnp.argmax(jax.lax.stop_gradient(teacher_logits), axis=-1)
    kd = cross_entropy(kd_logits, teacher_labels, mask=mask)
    if alpha == 1.0:
        return kd
    return (1.0 - alpha) * cross_entropy(student_logits, labels, label_smoothing=label_smoothing,
                                         mask=mask) + alpha * kd


def accuracy(logits, labels, *, mask=None) -> jax.Array:
    """Top-1 accuracy.

    Args:
        logits: (batch, classes).
        labels: integer labels (batch,) or probability vectors (batch, classes), whose argmax
          is the label.
        mask: optional (batch,) weights of the valid examples.

    Returns:
        The float32 scalar fraction of (valid) examples whose argmax is the label.

    Raises:
        ValueError: `labels` do not match the batch of `logits`, or the batch is empty.
    """
    _check_batch('accuracy', logits, labels)
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        labels = jnp.argmax(labels, axis=-1)
    return _mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32), mask)


def eval_sums(logits, batch) -> dict[str, jax.Array]:
    """Sums over a batch's valid examples of correct predictions and cross-entropy.

    An evaluation pass adds these up over its batches and divides by the count.

    Args:
        logits: (batch, classes).
        batch: a dict with integer labels `batch['label']` (batch,) and optionally
          `batch['mask']` (batch,) of valid examples (all valid when absent).

    Returns:
        A dict of float32 scalars, 'accuracy' (number of correct top-1 predictions), 'loss'
        (summed cross-entropy) and 'count' (number of valid examples).

    Raises:
        ValueError: `batch['label']` does not match the batch of `logits`.
    """
    labels = batch['label']
    mask = batch.get('mask')
    mask = jnp.ones(labels.shape[:1], jnp.float32) if mask is None else mask.astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    ce = cross_entropy_per_example(logits, labels)
    return {'accuracy': (correct * mask).sum(), 'loss': (ce * mask).sum(), 'count': mask.sum()}
