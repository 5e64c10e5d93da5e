"""Class subsets, a held-out validation part and a labelled fraction of a training split.

A transfer study trains upstream on some classes and descendants on others, often with few
labels, and picks its hyperparameters on images that no labelled subset holds
(specs/fair_studies.md, "Transfer setting"). The choice is a pure function of the labels:

* `classes`: the original class ids kept, relabelled 0..k-1 in the order given.
* per kept class c, its examples (ascending index) are ordered by one seeded permutation,
  drawn from `(seed, c)` alone: the first `validation_per_class` are the 'validation'
  part, the next `per_class` the 'labelled' part, where `per_class` = round(
  label_fraction * examples of the kept classes / k), the same for every class.

So the validation part is the same for every label fraction, a smaller fraction's labelled
part is a prefix of a larger one's (1 % lies inside 10 %), neither depends on which other
classes are kept, and the two never overlap. `label_fraction=1` takes every example left
after the validation part. The permutation comes from numpy's PCG64 bit stream, which
numpy keeps stable across releases, so a library upgrade does not change a study's data.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jlearngene.data.sources import ArraySource, DataError

PARTS = ('labelled', 'validation', 'all')


def check_options(*, classes=None, label_fraction=1.0, validation_per_class=0, seed=0,
                  num_classes: int | None = None) -> tuple[int, ...] | None:
    """The selection options checked; reads no data.

    Args:
        classes: any ordered sequence of distinct integer class ids (a list, a tuple, a
          range, a 1-D array); `None` or empty: every class.
        label_fraction: any real number (Python's or numpy's) in (0, 1].
        validation_per_class: a non-negative integer.
        seed: the subset seed, a non-negative integer.
        num_classes: the bound of the class ids; `None`: only non-negativity is checked.

    Returns:
        `classes` as a tuple of ints, or `None` for every class.

    Raises:
        DataError: (naming the field) `classes` is not a 1-D ordered sequence, holds a
          non-integer, a repeat or an id outside [0, `num_classes`); `label_fraction` is not a
          number in (0, 1]; or `validation_per_class` or `seed` is not a non-negative integer.
    """
    if classes is not None and (isinstance(classes, (str, bytes))
                                or not isinstance(classes, (Sequence, np.ndarray))
                                or np.ndim(classes) != 1):
        got = f'an array of shape {np.shape(classes)}' if isinstance(classes, np.ndarray) else repr(classes)
        raise DataError(f'classes must be an ordered sequence of class ids (a list, tuple, '
                        f'range or 1-D array), got {got}')
    if classes is not None and len(classes) == 0:
        classes = None
    if classes is not None:
        if not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in classes):
            raise DataError(f'classes must be integers, got {tuple(classes)!r}')
        classes = tuple(int(c) for c in classes)
        if len(set(classes)) != len(classes):
            raise DataError(f'classes {classes} repeat a class')
        bad = [c for c in classes if c < 0 or (num_classes is not None and c >= num_classes)]
        if bad:
            raise DataError(f'classes {bad} are not class ids' + (
                f' (0..{num_classes - 1})' if num_classes is not None else ''))
    if (isinstance(label_fraction, (bool, np.bool_))
            or not isinstance(label_fraction, (int, float, np.integer, np.floating))
            or not 0 < label_fraction <= 1):
        raise DataError(f'label_fraction must be a number in (0, 1], got {label_fraction!r}')
    for name, value in (('validation_per_class', validation_per_class), ('subset_seed', seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise DataError(f'{name} must be a non-negative integer, got {value!r}')
    return classes


def class_order(labels: np.ndarray, c: int, seed: int) -> np.ndarray:
    """The indices of class `c` in `labels`, in the seeded order of `(seed, c)`.

    Args:
        labels: the integer labels, (N,).
        c: the class id.
        seed: the subset seed.

    Returns:
        The indices of `c`'s examples, permuted by a PCG64 stream seeded with `(seed, c)`
        alone.
    """
    idx = np.flatnonzero(labels == c)
    keys = np.random.PCG64(np.random.SeedSequence([int(seed), int(c)])).random_raw(len(idx))
    return idx[np.argsort(keys, kind='stable')]


def subset_indices(labels, part: str, *, classes: Sequence[int] | None = None,
                   label_fraction: float = 1.0, validation_per_class: int = 0, seed: int = 0,
                   num_classes: int | None = None) -> np.ndarray:
    """Ascending indices into `labels` of `part` (see the module docstring).

    Args:
        labels: the integer labels, (N,).
        part: 'labelled' (the training examples a run learns from), 'validation' (held out
          of every labelled part) or 'all' (every example of `classes`: a test split).
        classes: the class ids kept; `None` or empty: every class.
        label_fraction: the labelled fraction, in (0, 1].
        validation_per_class: examples per class held out as 'validation'.
        seed: the subset seed.
        num_classes: the bound of the class ids; `None`: max label + 1.

    Returns:
        The indices, an int array sorted ascending.

    Raises:
        DataError: `part` is unknown; the options fail `check_options`; 'validation' is asked
          with `validation_per_class` 0; `label_fraction` leaves no example per class; or a
          class has fewer examples than its validation and labelled parts need.
    """
    labels = np.asarray(labels)
    if part not in PARTS:
        raise DataError(f'part must be one of {PARTS}, got {part!r}')
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if len(labels) else 0
    classes = check_options(classes=classes, label_fraction=label_fraction,
                            validation_per_class=validation_per_class, seed=seed,
                            num_classes=num_classes)
    classes = tuple(range(num_classes)) if classes is None else classes
    if part == 'all':
        return np.flatnonzero(np.isin(labels, classes))
    if part == 'validation' and validation_per_class == 0:
        raise DataError("no validation part: set validation_per_class (data.validation_per_class) "
                        "to hold out that many training images per class")
    counts = {c: int(np.sum(labels == c)) for c in classes}
    per_class = None
    if label_fraction < 1:
        per_class = round(label_fraction * sum(counts.values()) / len(classes))
        if per_class < 1:
            raise DataError(f'label_fraction {label_fraction} of the {sum(counts.values())} '
                            f'examples of {len(classes)} classes leaves no example per class')
    need = validation_per_class + (per_class or 1)
    short = [c for c in classes if counts[c] < need]
    if short:
        raise DataError(f'class {short[0]} has {counts[short[0]]} examples, fewer than the '
                        f'{validation_per_class} validation + {per_class or 1} labelled it needs')
    picked = []
    for c in classes:
        order = class_order(labels, c, seed)
        if part == 'validation':
            picked.append(order[:validation_per_class])
        else:
            end = None if per_class is None else validation_per_class + per_class
            picked.append(order[validation_per_class:end])
    return np.sort(np.concatenate(picked))


def relabel(labels, classes: Sequence[int] | None) -> np.ndarray:
    """Labels mapped to their position in `classes`.

    Args:
        labels: non-negative integer labels.
        classes: the class ids kept, in their new order, at least one; `None`: labels unchanged.

    Returns:
        An int64 array of `labels`' shape holding each label's index in `classes`, -1 outside
        them.

    Raises:
        DataError: `classes` is empty.
    """
    labels = np.asarray(labels, np.int64)
    if classes is None:
        return labels
    if len(classes) == 0:
        raise DataError('relabel: classes is empty; give the class ids to keep, or None to keep '
                        'the labels unchanged')
    table = np.full(max(int(labels.max(initial=0)), *classes) + 1, -1, np.int64)
    table[list(classes)] = np.arange(len(classes))
    return table[labels]


def subset(source, part: str, *, classes: Sequence[int] | None = None,
           label_fraction: float = 1.0, validation_per_class: int = 0, seed: int = 0,
           split: str | None = None, name: str | None = None) -> ArraySource:
    """`part` of any source (`subset_indices`) as an in-memory source.

    Array sources are sliced; others are read once, whole.

    Args:
        source: the source to select from.
        part: 'labelled', 'validation' or 'all' (see `subset_indices`).
        classes: the class ids kept, relabelled 0..k-1 in this order; `None` or empty: all.
        label_fraction: the labelled fraction, in (0, 1].
        validation_per_class: examples per class held out as 'validation'.
        seed: the subset seed.
        split: the new `DataInfo.split`; `None`: the source's.
        name: the new `DataInfo.name`; `None`: the source's.

    Returns:
        An `ArraySource` of the selected examples (read-only arrays) whose `info` has the
        kept classes' count and names.

    Raises:
        DataError: as `check_options` and `subset_indices` raise it.
    """
    info = source.info
    if isinstance(source, ArraySource):
        images, labels = source.images, source.labels
    else:
        rows = [source[i] for i in range(len(source))]
        images = np.stack([r['image'] for r in rows])
        labels = np.array([r['label'] for r in rows], np.int64)
    classes = check_options(classes=classes, label_fraction=label_fraction,
                            validation_per_class=validation_per_class, seed=seed,
                            num_classes=info.num_classes)
    idx = subset_indices(labels, part, classes=classes, label_fraction=label_fraction,
                         validation_per_class=validation_per_class, seed=seed,
                         num_classes=info.num_classes)
    names = info.class_names
    if classes is not None and names is not None:
        names = tuple(names[c] for c in classes)
    out = dataclasses.replace(info, name=name or info.name, split=split or info.split,
                              num_classes=info.num_classes if classes is None else len(classes),
                              num_examples=len(idx), class_names=names)
    images, labels = images[idx], relabel(labels[idx], classes)
    for a in (images, labels):
        a.setflags(write=False)
    return ArraySource(images, labels, out)


__all__ = ['PARTS', 'check_options', 'class_order', 'relabel', 'subset', 'subset_indices']
