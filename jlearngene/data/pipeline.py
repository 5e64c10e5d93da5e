"""grain pipelines: an infinite, resumable training iterator and a finite, masked eval pass.

Training order (all on record indices, before any read): the whole source is shuffled with a
new permutation each epoch, epochs are concatenated into one endless stream of positions
k = 0, 1, 2, ..., global batch j is positions [j*B, (j+1)*B) (B = global batch), and
process p of P reads only its block of it, positions [j*B + p*b, j*B + (p+1)*b) (b = B/P).
Laid out over the mesh in process order (`parallel.shard_batch`), the processes' batches
form exactly the batch a single process would see, whatever P is, and the iterator state
(the local batch count) means the same global step for any P. Batches may straddle an
epoch boundary. Per-example augmentation draws from a generator seeded by (seed, epoch,
position in epoch); batch-level mixing by (seed, step, process), so `get_state()` /
`set_state()` (grain's `{'next_index': step}`) resume exactly.

Images come out as float32 `(x / 255 - mean) / std` (default mean = std = 0.5: values in
[-1, 1]; per-channel tuples are accepted).
"""
from __future__ import annotations

import math
from typing import Any
from collections.abc import Mapping

import grain
import numpy as np

from jlearngene.data import augment as aug
from jlearngene.data.augment import Augment
from jlearngene.data import fashion
from jlearngene.data import sources
from jlearngene.data import subsets
from jlearngene.data.sources import DataError, DataInfo

_STREAM_EXAMPLE, _STREAM_BATCH, _STREAM_SHUFFLE = 1, 2, 3
DEFAULT_READ = dict(num_threads=2, prefetch_buffer_size=8)


def _process(process_index, process_count) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax
        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise DataError(f'process_index {process_index} outside [0, {process_count})')
    return int(process_index), int(process_count)


def _local_batch(batch_size: int, process_count: int) -> int:
    if batch_size < 1 or batch_size % process_count:
        raise DataError(f'batch_size {batch_size} must be a positive multiple of the process '
                        f'count {process_count} (each process gets batch_size // process_count)')
    return batch_size // process_count


def _target_shape(info: DataInfo, image_size) -> tuple[int, int, int]:
    if image_size is not None:
        h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        return int(h), int(w), info.image_shape[-1]
    if any(d is None for d in info.image_shape):
        raise DataError(f'{info.name}: images vary in size {info.image_shape}; pass image_size')
    return tuple(info.image_shape)


def _channel_stats(value, default, channels: int, what: str) -> np.ndarray:
    value = default if value is None else value
    arr = np.asarray(value, np.float32).reshape(-1)
    if arr.size == 1:
        arr = np.repeat(arr, channels)
    if arr.size != channels:
        raise DataError(f'{what} has {arr.size} values for {channels}-channel images')
    if what == 'std' and np.any(arr <= 0):
        raise DataError(f'std must be positive, got {value}')
    return arr


class _Reader:
    """Reads one example, checks its label and shape, resizes when asked."""

    def __init__(self, source, shape, num_classes: int, resize_method: str):
        self.source, self.shape, self.num_classes = source, shape, num_classes
        self.resize_method = resize_method

    def __call__(self, index: int) -> tuple[np.ndarray, int]:
        ex = self.source[index]
        image, label = np.asarray(ex['image']), int(ex['label'])
        if image.ndim == 2:
            image = image[..., None]
        if image.shape[:2] != self.shape[:2]:
            image = sources.resize(image, self.shape[:2], self.resize_method)
        if image.shape != self.shape or image.dtype != np.uint8:
            raise DataError(f'{self.source.info.name} example {index}: image {image.shape} '
                            f'{image.dtype}, expected uint8 {self.shape}')
        if not 0 <= label < self.num_classes:
            raise DataError(f'{self.source.info.name} example {index}: label {label} outside '
                            f'[0, {self.num_classes})')
        return image, label


def _shuffle_seed(seed: int) -> int:
    # Decorrelate seeds: grain folds the epoch into the shuffle seed as seed + epoch.
    return int(np.random.SeedSequence([seed, _STREAM_SHUFFLE]).generate_state(1)[0])


def _prepare(source, batch_size, image_size, mean, std, num_classes, process_index,
             process_count, resize_method):
    """What both pipelines resolve first: process slot, local batch, target shape, classes,
    normalisation, source size and a checking reader."""
    info = source.info
    p, count = _process(process_index, process_count)
    local = _local_batch(batch_size, count)
    shape = _target_shape(info, image_size)
    k = int(num_classes or info.num_classes)
    mean = _channel_stats(mean, info.mean, shape[-1], 'mean')
    std = _channel_stats(std, info.std, shape[-1], 'std')
    return p, count, local, shape, k, mean, std, len(source), _Reader(source, shape, k, resize_method)


def train_iterator(source, *, batch_size: int, seed: int, image_size=None,
                   augment: Augment | Mapping | None = None, mean=None, std=None,
                   num_classes: int | None = None, process_index: int | None = None,
                   process_count: int | None = None, resize_method: str = 'bilinear',
                   read_options: grain.ReadOptions | None = None):
    """Endless shuffled, augmented, per-process batches from `source`, as a grain iterator.

    Deterministic for `seed`; `it.get_state()` / `it.set_state(state)` resume exactly (the
    state is only valid for the same source, batch size, seed and options).

    Args:
        source: a random-access source (`len`, `source[i]`, `source.info`).
        batch_size: B, the global batch; a positive multiple of the process count.
        seed: the seed of the order, augmentation and mixing, in `[0, 2**32)`.
        image_size: `s` or `(h, w)` to resize the images to; `None`: the source's shape.
        augment: an `Augment`, a dict of its fields, or `None` (none).
        mean: per-channel mean (or one value) of images scaled to [0, 1]; `None`:
          `source.info`'s.
        std: per-channel standard deviation (or one value), positive; `None`: `source.info`'s.
        num_classes: K, the label range; `None`: `source.info`'s.
        process_index: this process's index; `None`: jax's.
        process_count: the process count; `None`: jax's.
        resize_method: the resize method (`sources.RESIZE_METHODS`).
        read_options: grain's read options; `None`: `DEFAULT_READ`.

    Returns:
        A grain iterator of batches, each
        `{'image': float32 (b, H, W, C), 'label': int32 (b,)}` with
        b = batch_size // process_count, plus `'label_soft': float32 (b, K)` when the
        augmentation mixes or smooths labels. An example whose image or label is invalid
        raises `DataError` when it is read.

    Raises:
        DataError: `augment` is invalid; the process index is outside [0, process_count);
          `batch_size` is not a positive multiple of the process count; the images vary in
          size and no `image_size` is given; `mean`/`std` fit neither one channel nor the
          images' channels, or `std` is not positive; the source has no examples; or `seed`
          is outside `[0, 2**32)`.
    """
    augment = Augment.create(augment)
    p, count, local, shape, k, mean, std, n, read = _prepare(
        source, batch_size, image_size, mean, std, num_classes, process_index, process_count,
        resize_method)
    if n == 0:
        raise DataError(f'{source.info.name}[{source.info.split}] has no examples')
    if not 0 <= seed < 2**32:
        raise DataError(f'seed must be in [0, 2**32), got {seed}')

    order = grain.MapDataset.range(n).shuffle(seed=_shuffle_seed(seed)).repeat()

    def position(i: int) -> int:   # local element i -> its position in the endless stream
        return (i // local) * batch_size + p * local + i % local

    def example(i: int, _):
        epoch, pos = divmod(position(i), n)
        image, label = read(order[position(i)])
        if augment.per_example:
            rng = np.random.default_rng([seed, _STREAM_EXAMPLE, epoch, pos])
            image = aug.augment_image(image, augment, rng, resize_method)
        return {'image': image, 'label': label}

    def finish(step: int, batch: dict[str, np.ndarray]):
        image = (batch['image'].astype(np.float32) / 255.0 - mean) / std
        label = batch['label'].astype(np.int32)
        out = {'image': image, 'label': label}
        if augment.soft_labels:
            rng = np.random.default_rng([seed, _STREAM_BATCH, step, p])
            out['image'], out['label_soft'] = aug.mix_batch(image, label, k, augment, rng)
        return out

    ds = grain.MapDataset.range(len(order) // count).map_with_index(example)
    ds = ds.batch(local, drop_remainder=True)
    ds = ds.map_with_index(finish)
    return iter(ds.to_iter_dataset(read_options or grain.ReadOptions(**DEFAULT_READ)))


def eval_batches(source, *, batch_size: int, image_size=None, mean=None, std=None,
                 num_classes: int | None = None, process_index: int | None = None,
                 process_count: int | None = None, resize_method: str = 'bilinear',
                 read_options: grain.ReadOptions | None = None):
    """Every example once, in order, as a finite grain iterator of padded batches.

    Process p gets its block of each global batch (positions [j·B + p·b, j·B + (p+1)·b)),
    like training.

    Args:
        source: a random-access source (`len`, `source[i]`, `source.info`).
        batch_size: B, the global batch; a positive multiple of the process count.
        image_size: `s` or `(h, w)` to resize the images to; `None`: the source's shape.
        mean: per-channel mean (or one value); `None`: `source.info`'s.
        std: per-channel standard deviation (or one value), positive; `None`: `source.info`'s.
        num_classes: the label range; `None`: `source.info`'s.
        process_index: this process's index; `None`: jax's.
        process_count: the process count; `None`: jax's.
        resize_method: the resize method (`sources.RESIZE_METHODS`).
        read_options: grain's read options; `None`: `DEFAULT_READ`.

    Returns:
        A grain iterator of ceil(len(source) / batch_size) batches (at least 1) on every
        process, each `{'image': float32 (b, H, W, C), 'label': int32 (b,), 'mask': bool (b,)}`
        with b = batch_size // process_count; `mask` is False on padding (zero images,
        label 0).

    Raises:
        DataError: the process index is outside [0, process_count); `batch_size` is not a
          positive multiple of the process count; the images vary in size and no
          `image_size` is given; or `mean`/`std` do not fit the channels, or `std` is not
          positive.
    """
    p, count, local, shape, k, mean, std, n, read = _prepare(
        source, batch_size, image_size, mean, std, num_classes, process_index, process_count,
        resize_method)
    padded = max(1, math.ceil(n / batch_size)) * batch_size

    def example(position: int):
        if position >= n:
            return {'image': np.zeros(shape, np.uint8), 'label': 0, 'mask': False}
        image, label = read(position)
        return {'image': image, 'label': label, 'mask': True}

    def finish(batch):
        return {'image': (batch['image'].astype(np.float32) / 255.0 - mean) / std,
                'label': batch['label'].astype(np.int32), 'mask': batch['mask'].astype(bool)}

    ds = grain.MapDataset.range(padded // count).map(
        lambda i: example((i // local) * batch_size + p * local + i % local))
    ds = ds.batch(local).map(finish)
    return iter(ds.to_iter_dataset(read_options or grain.ReadOptions(**DEFAULT_READ)))


def check_split(source, *, what: str, batch_size: int, image_size=None,
                num_classes: int | None = None, resize_method: str = 'bilinear',
                full_batches: bool = True) -> None:
    """What a run checks before its first step about a split it will read.

    Args:
        source: the split's source.
        what: names the split in the message (e.g. "eval_split 'test'").
        batch_size: the global batch size.
        image_size: the pipeline's `image_size`; `None`: the source's shape.
        num_classes: the label range; `None`: `source.info`'s.
        resize_method: the resize method (`sources.RESIZE_METHODS`).
        full_batches: require at least `batch_size` examples (training batches are never
          padded, so a larger batch would repeat examples).

    Raises:
        DataError: (one line) the split has no examples; it has fewer than `batch_size` with
          `full_batches`; its images vary in size and no `image_size` is given; or its first
          example does not load, or decode to the pipeline's shape with a label in range.
    """
    info = source.info
    n = len(source)
    if n == 0:
        raise DataError(f'{what}: {info.name} has no examples')
    if full_batches and batch_size > n:
        raise DataError(f'{what}: batch_size {batch_size} is larger than the split, which has '
                        f'{n} examples ({info.name}); lower batch_size or add data')
    shape = _target_shape(info, image_size)
    try:
        _Reader(source, shape, int(num_classes or info.num_classes), resize_method)(0)
    except Exception as e:  # a DataError, or a source's own failure (tfds feature keys, I/O)
        why = e if isinstance(e, DataError) else f'{type(e).__name__}: {e}'
        raise DataError(f'{what}: its first example does not load: {why}') from None


# ------------------------------------------------------------------------------ from_config

_SOURCE_KEYS = {
    'digits': {'image_size', 'resize_method'},
    'tfds': {'tfds_name', 'data_dir', 'image_key', 'label_key', 'image_size', 'resize_method'},
    'folder': {'root', 'channels', 'image_size', 'resize_method'},
    'arrays': {'images', 'labels', 'num_classes', 'image_size', 'resize_method'},
    'fashion_mnist': {'root', 'image_size', 'resize_method', 'classes', 'label_fraction',
                      'validation_per_class', 'subset_seed'},
}
_COMMON_KEYS = {'name', 'augment', 'mean', 'std', 'splits'}
KNOWN_DATASETS = tuple(sorted(_SOURCE_KEYS))


def _as_dict(cfg) -> dict[str, Any]:
    if hasattr(cfg, 'to_dict'):
        cfg = cfg.to_dict()
    if not isinstance(cfg, Mapping):
        raise DataError(f'data config must be a dict or ConfigDict, got {type(cfg).__name__}')
    return dict(cfg)


def check_config(data_config) -> dict[str, Any]:
    """The data config as a dict, after checking it; nothing is read.

    Args:
        data_config: a dict or ConfigDict (see `from_config`).

    Returns:
        The config as a plain dict.

    Raises:
        DataError: it is not a mapping; its `name` is not in `KNOWN_DATASETS`; it has keys
          its source does not take; its `augment` is invalid; or a fashion_mnist config's
          selection fields are invalid (`subsets.check_options`).
    """
    cfg = _as_dict(data_config)
    name = cfg.get('name')
    if name not in _SOURCE_KEYS:
        raise DataError(f'unknown dataset name {name!r}; known: {list(KNOWN_DATASETS)}')
    unknown = set(cfg) - _SOURCE_KEYS[name] - _COMMON_KEYS
    if unknown:
        raise DataError(f'data config for {name!r} has unknown keys {sorted(unknown)}; allowed: '
                        f'{sorted(_SOURCE_KEYS[name] | _COMMON_KEYS)}')
    if cfg.get('augment'):
        Augment.create(cfg['augment'])
    if name == 'fashion_mnist':
        _subset_options(cfg)
    return cfg


def _subset_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A fashion_mnist config's selection fields as `fashion_mnist(...)` keywords, checked."""
    classes, fraction = cfg.get('classes') or None, cfg.get('label_fraction', 1.0)
    per_class, seed = cfg.get('validation_per_class', 0), cfg.get('subset_seed', 0)
    try:
        subsets.check_options(classes=classes, label_fraction=fraction,
                              validation_per_class=per_class, seed=seed,
                              num_classes=len(fashion.CLASS_NAMES))
    except DataError as e:
        raise DataError(f"data config 'fashion_mnist': {e}") from None
    return dict(classes=classes, label_fraction=fraction, validation_per_class=per_class,
                subset_seed=seed)


def source_from_config(data_config, split: str):
    """Builds the source named by `data_config['name']` for `split` (see `from_config`).

    Args:
        data_config: a dict or ConfigDict (see `from_config`).
        split: the split, mapped through the config's `splits` where it names one.

    Returns:
        The source, an `ArraySource` ('digits', 'fashion_mnist', 'arrays'), a `TfdsSource`
        or an `ImageFolderSource`.

    Raises:
        DataError: the config fails `check_config`; a 'tfds' config has no `tfds_name`, a
          'folder' config no `root`, an 'arrays' config no `images` or `labels`; or the
          source cannot be built.
    """
    cfg = check_config(data_config)
    name = cfg['name']
    split = dict(cfg.get('splits') or {}).get(split, split)
    method = cfg.get('resize_method', 'bilinear')
    if name == 'digits':
        return sources.digits(split, image_size=cfg.get('image_size', 16), resize_method=method)
    if name == 'fashion_mnist':
        return fashion.fashion_mnist(split, root=cfg.get('root') or None,
                                     image_size=cfg.get('image_size', fashion.SIZE),
                                     resize_method=method, **_subset_options(cfg))
    if name == 'tfds':
        if not cfg.get('tfds_name'):
            raise DataError("data config 'tfds' needs 'tfds_name' (e.g. 'cifar10'; the template: "
                            '--config digits_vit:tfds --config.data.tfds_name=NAME)')
        return sources.tfds_source(cfg['tfds_name'], split, cfg.get('data_dir') or None,
                                   image_key=cfg.get('image_key', 'image'),
                                   label_key=cfg.get('label_key', 'label'))
    if name == 'folder':
        if not cfg.get('root'):
            raise DataError("data config 'folder' needs 'root' (root/<split>/<label>/*.png; the "
                            'template: --config digits_vit:folder --config.data.root=DIR)')
        return sources.image_folder(cfg['root'], split, image_size=cfg.get('image_size'),
                                    channels=cfg.get('channels'), resize_method=method)
    if cfg.get('images') is None or cfg.get('labels') is None:
        raise DataError("data config 'arrays' needs 'images' and 'labels'")
    return sources.array_source(cfg['images'], cfg['labels'], num_classes=cfg.get('num_classes'),
                                split=split)


def pipeline_image_size(data_config):
    """The image size the pipeline resizes to for a data config.

    Args:
        data_config: a dict or ConfigDict.

    Returns:
        Its `image_size` (`None` where unset); `None` for 'digits' and 'fashion_mnist', whose
        sources resize already.

    Raises:
        DataError: `data_config` is not a mapping.
    """
    cfg = _as_dict(data_config)
    return None if cfg.get('name') in ('digits', 'fashion_mnist') else cfg.get('image_size')


def from_config(data_config, split: str, *, batch_size: int, seed: int, train: bool,
                process_index: int | None = None, process_count: int | None = None,
                source=None):
    """(iterator, info) for `split` of the dataset a config describes.

    Args:
        data_config: a dict or ConfigDict with `name` in `KNOWN_DATASETS` and, optionally,
          `image_size`, `mean`, `std`, `augment` (dict of `Augment` fields; used only when
          `train`), `splits` (maps 'train'/'test' to the source's split names, e.g.
          `{'test': 'train[90%:]'}`), plus per source: tfds: `tfds_name`, `data_dir`,
          `image_key`, `label_key`; folder: `root`, `channels`; arrays: `images`, `labels`,
          `num_classes`; fashion_mnist (splits 'train', 'validation', 'test'): `root` (the
          only folder read when given; empty: $JLEARNGENE_DATA/fashion_mnist, else Debian's
          folder), `classes` (kept and relabelled 0..k-1; empty: all), `label_fraction` (of
          the training images, equal per class), `validation_per_class` (training images
          held out as 'validation'), `subset_seed` (fixes both choices; see `data.subsets`).
        split: the split to read.
        batch_size: the global batch size.
        seed: the training iterator's seed (unused for evaluation).
        train: `train_iterator` where True, else `eval_batches`.
        process_index: this process's index; `None`: jax's.
        process_count: the process count; `None`: jax's.
        source: the split's source when already built (e.g. by `source_from_config` and
          checked with `check_split`), so it is not built again; `None`: built here.

    Returns:
        The pair `(iterator, info)`, `train_iterator`'s endless iterator or `eval_batches`'
        ceil(info.num_examples / batch_size) batches, and the source's `DataInfo`.

    Raises:
        DataError: as `source_from_config` (where `source` is `None`) and the chosen
          pipeline raise it.
    """
    cfg = _as_dict(data_config)
    source = source_from_config(cfg, split) if source is None else source
    kwargs = dict(batch_size=batch_size, image_size=pipeline_image_size(cfg), mean=cfg.get('mean'),
                  std=cfg.get('std'), process_index=process_index, process_count=process_count,
                  resize_method=cfg.get('resize_method', 'bilinear'))
    it = (train_iterator(source, seed=seed, augment=cfg.get('augment'), **kwargs) if train
          else eval_batches(source, **kwargs))
    return it, source.info


__all__ = ['Augment', 'DataError', 'DataInfo', 'KNOWN_DATASETS', 'check_config', 'check_split',
           'eval_batches', 'from_config', 'pipeline_image_size', 'source_from_config',
           'train_iterator']
