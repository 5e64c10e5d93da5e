"""Numpy augmentation: random crop / random-resized crop / flip per example, mixup / cutmix
and label smoothing per batch. Every function takes an explicit `np.random.Generator`, which
the pipeline derives from (seed, epoch, position), so results are reproducible and resumable.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from jlearngene.data import sources
from jlearngene.data.sources import DataError


@dataclasses.dataclass(frozen=True)
class Augment:
    """Augmentation options; the defaults do nothing.

    Any of mixup, cutmix or label smoothing makes the pipeline emit 'label_soft'.

    Attributes:
      crop_padding: pad each side with zeros by this many pixels, then crop back at random;
        below the image's height and width (checked when an image is augmented).
      rrc_scale: (lo, hi) area fraction for an Inception-style random-resized crop instead
        (with aspect ratios in `rrc_ratio`), resized back to the image size.
      flip: random horizontal flip. Off by default: it is wrong for digits and text.
      mixup_alpha: Beta(alpha, alpha) mixup with the reversed batch; when both alphas are
        > 0, cutmix is chosen with probability `switch_prob`. `mix_prob` is the chance a
        batch is mixed at all.
      cutmix_alpha: Beta(alpha, alpha) cutmix with the reversed batch (see `mixup_alpha`).
      label_smoothing: applied to the one-hot targets before mixing.
    """
    crop_padding: int = 0
    rrc_scale: tuple | None = None
    rrc_ratio: tuple = (3 / 4, 4 / 3)
    flip: bool = False
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.0

    def __post_init__(self):
        def bad(msg):
            raise DataError(f'Augment: {msg}')
        if int(self.crop_padding) != self.crop_padding or self.crop_padding < 0:
            bad(f'crop_padding must be an int >= 0, got {self.crop_padding!r}')
        if self.rrc_scale is not None:
            if len(self.rrc_scale) != 2 or not 0 < self.rrc_scale[0] <= self.rrc_scale[1] <= 1:
                bad(f'rrc_scale must be (lo, hi) with 0 < lo <= hi <= 1, got {self.rrc_scale!r}')
            if self.crop_padding:
                bad('use either crop_padding or rrc_scale, not both')
        if len(self.rrc_ratio) != 2 or not 0 < self.rrc_ratio[0] <= self.rrc_ratio[1]:
            bad(f'rrc_ratio must be (lo, hi) with 0 < lo <= hi, got {self.rrc_ratio!r}')
        for name in ('mixup_alpha', 'cutmix_alpha'):
            if getattr(self, name) < 0:
                bad(f'{name} must be >= 0, got {getattr(self, name)}')
        for name in ('mix_prob', 'switch_prob'):
            if not 0 <= getattr(self, name) <= 1:
                bad(f'{name} must be in [0, 1], got {getattr(self, name)}')
        if not 0 <= self.label_smoothing < 1:
            bad(f'label_smoothing must be in [0, 1), got {self.label_smoothing}')

    @classmethod
    def create(cls, value) -> Augment:
        """An `Augment` from a config value.

        Args:
            value: `None` (no augmentation), an `Augment` (returned as it is), or a dict /
              ConfigDict of its fields (lists become tuples).

        Returns:
            The `Augment`.

        Raises:
            DataError: `value` is neither a mapping nor an `Augment`, has keys that are not
              fields, or has a value the fields' checks refuse.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if hasattr(value, 'to_dict'):
            value = value.to_dict()
        if not isinstance(value, Mapping):
            raise DataError(f'augment must be a dict or Augment, got {type(value).__name__}')
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(value) - fields
        if unknown:
            raise DataError(f'Augment: unknown options {sorted(unknown)}; known: {sorted(fields)}')
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})

    @property
    def per_example(self) -> bool:
        """Whether each example is augmented, by a crop or a flip (`augment_image`)."""
        return bool(self.crop_padding or self.rrc_scale or self.flip)

    @property
    def soft_labels(self) -> bool:
        """Whether batches carry soft targets, 'label_soft', from mixup, cutmix or label
        smoothing (`mix_batch`)."""
        return bool(self.mixup_alpha > 0 or self.cutmix_alpha > 0 or self.label_smoothing > 0)


def random_resized_crop(image, scale, ratio, rng, method='bilinear'):
    """Crops a random box of area fraction in `scale` and aspect in `ratio`, resizes back.

    Up to 10 boxes are drawn; where none fits inside the image, the image is kept whole.

    Args:
        image: a uint8 (H, W, C) image.
        scale: `(lo, hi)`, the range of the box's area as a fraction of the image's.
        ratio: `(lo, hi)`, the range of the box's aspect ratio (width / height), drawn
          log-uniformly.
        rng: the generator that draws the box.
        method: the resize method (`sources.RESIZE_METHODS`).

    Returns:
        The (H, W, C) uint8 crop, resized to the image's size.
    """
    h, w = image.shape[:2]
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        area = h * w * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            return sources.resize(image[y:y + ch, x:x + cw], (h, w), method)
    return image  # no box fitted: keep the whole image


def _check_pad(pad: int, h: int, w: int, what: str) -> None:
    if pad >= min(h, w):
        raise DataError(f'{what} {pad} must be below the image side; the image is {h}x{w} '
                        f'(pad at most {min(h, w) - 1})')


def shift_crop(image: np.ndarray, pad: int, rng: np.random.Generator) -> np.ndarray:
    """Same as zero-padding by `pad` on each side and cropping a random (H, W) window.

    Args:
        image: an (H, W, ...) image.
        pad: the padding in pixels on each side; the window's offset is drawn from
          [-pad, pad] on each axis.
        rng: the generator that draws the offset.

    Returns:
        The shifted image, of `image`'s shape and dtype, zeros where the window leaves it.

    Raises:
        DataError: `pad` is not below the image's height and width.
    """
    h, w = image.shape[:2]
    _check_pad(pad, h, w, 'shift_crop: pad')
    dy, dx = rng.integers(-pad, pad + 1, size=2)   # window offset relative to the original
    out = np.zeros_like(image)
    ys, xs = slice(max(dy, 0), h + min(dy, 0)), slice(max(dx, 0), w + min(dx, 0))
    yd, xd = slice(max(-dy, 0), h + min(-dy, 0)), slice(max(-dx, 0), w + min(-dx, 0))
    out[yd, xd] = image[ys, xs]
    return out


def augment_image(image: np.ndarray, a: Augment, rng: np.random.Generator,
                  method: str = 'bilinear') -> np.ndarray:
    """Applies the per-example options of `a` to a uint8 (H, W, C) image.

    Args:
        image: a uint8 (H, W, C) image.
        a: the options: a random-resized crop (`rrc_scale`) or else a shift crop
          (`crop_padding`), then a horizontal flip with probability 0.5 (`flip`).
        rng: the generator that draws every random choice.
        method: the resize method of the random-resized crop.

    Returns:
        The augmented (H, W, C) image, C-contiguous.

    Raises:
        DataError: `a.crop_padding` is not below the image's height and width.
    """
    if a.rrc_scale is not None:
        image = random_resized_crop(image, a.rrc_scale, a.rrc_ratio, rng, method)
    elif a.crop_padding:
        _check_pad(int(a.crop_padding), *image.shape[:2], 'Augment: crop_padding')
        image = shift_crop(image, int(a.crop_padding), rng)
    if a.flip and rng.random() < 0.5:
        image = image[:, ::-1]
    return np.ascontiguousarray(image)


def mix_batch(image: np.ndarray, label: np.ndarray, num_classes: int, a: Augment,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Mixup / cutmix of a float (B, H, W, C) batch with its reverse.

    Args:
        image: the float (B, H, W, C) batch.
        label: its integer labels, (B,).
        num_classes: K, the width of the soft labels.
        a: the options (`mixup_alpha`, `cutmix_alpha`, `mix_prob`, `switch_prob`,
          `label_smoothing`).
        rng: the generator that draws whether and how the batch is mixed.

    Returns:
        The pair `(image, soft)`, the (possibly mixed) batch and float32 (B, K) soft labels,
        label-smoothed one-hots mixed with the same weight as the pixels (for cutmix, the
        exact pasted area fraction).
    """
    b, h, w = image.shape[:3]
    soft = np.full((b, num_classes), a.label_smoothing / num_classes, np.float32)
    soft[np.arange(b), label] += 1.0 - a.label_smoothing
    if not (a.mixup_alpha > 0 or a.cutmix_alpha > 0) or rng.random() >= a.mix_prob:
        return image, soft
    if a.cutmix_alpha > 0 and (a.mixup_alpha <= 0 or rng.random() < a.switch_prob):   # cutmix
        lam = rng.beta(a.cutmix_alpha, a.cutmix_alpha)
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy, cx = rng.integers(0, h), rng.integers(0, w)
        y0, y1 = np.clip([cy - ch // 2, cy + ch // 2], 0, h)
        x0, x1 = np.clip([cx - cw // 2, cx + cw // 2], 0, w)
        image, partner = image.copy(), image[::-1]
        image[:, y0:y1, x0:x1] = partner[:, y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        lam = rng.beta(a.mixup_alpha, a.mixup_alpha)
        image = (lam * image + (1.0 - lam) * image[::-1]).astype(np.float32)
    soft = (lam * soft + (1.0 - lam) * soft[::-1]).astype(np.float32)
    return image, soft
