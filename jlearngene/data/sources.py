"""Random-access image sources: `len(src)`, `src[i] -> {'image': uint8 (H, W, C), 'label': int}`.

Every source carries `src.info`, a `DataInfo` (name, split, num_classes, image shape, size,
default normalisation). Sources only read and decode; shuffling, sharding, augmentation and
batching live in `jlearngene.data.pipeline` (grain).

* `digits`: scikit-learn's bundled handwritten digits (1,797 real 8x8 images, no download),
  the project's embedded default dataset, with a fixed stratified 80/20 split.
* `tfds_source`: a TFDS dataset already prepared as array_record under a local `data_dir`
  (`tfds.data_source`; no TensorFlow, no download, no GCS).
* `image_folder`: `root/<split>/<label>/*.png|jpg|jpeg`.
* `array_source`: in-memory numpy arrays.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import numbers
import os
from typing import Any
from collections.abc import Sequence

import numpy as np
from PIL import Image

IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg')
RESIZE_METHODS = {'bilinear': Image.Resampling.BILINEAR, 'nearest': Image.Resampling.NEAREST,
                  'bicubic': Image.Resampling.BICUBIC}


class DataError(ValueError):
    """Bad data input: missing files or datasets, wrong shapes, unreadable images, bad configs."""


@dataclasses.dataclass(frozen=True)
class DataInfo:
    """What a model and a trainer need to know about a source.

    `image_shape` is (H, W, C); H and W are None when the images vary in size (then pass
    `image_size` to the pipeline). `mean`/`std` are the default normalisation applied to
    images scaled to [0, 1]: `(x / 255 - mean) / std`. `location` is the folder the images
    were read from (None for data in memory or bundled with a package), so that a run can
    say and record which copy it read.
    """
    name: str
    split: str
    num_classes: int
    image_shape: tuple
    num_examples: int
    mean: tuple = (0.5,)
    std: tuple = (0.5,)
    class_names: tuple | None = None
    location: str | None = None


def _check_resize_method(method: str, where: str = '') -> None:
    """DataError for a method not in `RESIZE_METHODS`; `where` starts the message."""
    if not isinstance(method, str) or method not in RESIZE_METHODS:
        raise DataError(f'{where}unknown resize method {method!r}; known: {sorted(RESIZE_METHODS)}')


def _size_pair(size) -> tuple[int, int]:
    """`s` (any integer, numpy's too) or `(h, w)` as a pair of Python ints."""
    h, w = (size, size) if isinstance(size, numbers.Integral) else tuple(size)
    return int(h), int(w)


def resize(image: np.ndarray, size, method: str = 'bilinear') -> np.ndarray:
    """Resizes a uint8 (H, W, C) image with PIL, channel by channel.

    Args:
        image: a uint8 (H, W, C) image.
        size: the new size, `s` (square) or `(h, w)`.
        method: 'bilinear', 'nearest' or 'bicubic' (`RESIZE_METHODS`).

    Returns:
        The (h, w, C) uint8 image; `image` itself where it has that size already.

    Raises:
        DataError: `method` is unknown (checked even where no resize is needed).
    """
    _check_resize_method(method)
    h, w = _size_pair(size)
    if image.shape[:2] == (h, w):
        return image
    return np.stack([np.asarray(Image.fromarray(image[..., c]).resize((w, h), RESIZE_METHODS[method]))
                     for c in range(image.shape[-1])], axis=-1)


def _as_hwc_uint8(image, where: str) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3:
        raise DataError(f'{where}: expected an image of rank 2 or 3, got shape {image.shape}')
    if image.dtype != np.uint8:
        raise DataError(f'{where}: expected uint8 image, got {image.dtype}')
    return image


# ------------------------------------------------------------------------------------ digits

# within each class, every k-th example (by dataset order) is a test example
DIGITS_TEST_EVERY = {'': 5, 'half_': 2}
DIGITS_SPLITS = ('train', 'test', 'half_train', 'half_test')


def digits_split_indices(split: str) -> np.ndarray:
    """Indices into `sklearn.datasets.load_digits()` of a fixed split.

    The rule uses no random generator, so no library upgrade can change it.

    Args:
        split: 'train' / 'test', stratified 80/20 (1,433 / 364): within each class, taking
          the examples in dataset order, the 1st, 6th, 11th, ... go to 'test' and the rest to
          'train'; or 'half_train' / 'half_test', the same rule with every 2nd example
          (896 / 901), the split the studies share (`experiments.configs.study_base`): a test
          split large enough that one image is 0.11 points.

    Returns:
        The split's indices, an int array sorted ascending.

    Raises:
        DataError: `split` is not one of `DIGITS_SPLITS`.
    """
    if split not in DIGITS_SPLITS:
        raise DataError(f"digits has splits {', '.join(map(repr, DIGITS_SPLITS))}, got {split!r}")
    prefix = 'half_' if split.startswith('half_') else ''
    labels = _digits_raw()[1]
    is_test = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        is_test[np.flatnonzero(labels == c)[::DIGITS_TEST_EVERY[prefix]]] = True
    return np.flatnonzero(is_test if split.endswith('test') else ~is_test)


def _load_digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """(images float (1797, 8, 8) in 0..16, labels) exactly as `sklearn.datasets.load_digits`.

    Reads the CSV that scikit-learn ships (`sklearn/datasets/data/digits.csv.gz`) directly:
    importing `sklearn.datasets` costs seconds. Falls back to `load_digits` if the file moved.
    """
    spec = importlib.util.find_spec('sklearn')
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, 'datasets', 'data', 'digits.csv.gz')
        if os.path.exists(path):
            table = np.loadtxt(path, delimiter=',')
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits  # bundled with scikit-learn, never downloads
    bunch = load_digits()
    return bunch.images, bunch.target.astype(np.int64)


@functools.cache
def _digits_raw():
    images, labels = _load_digits_raw()
    # Values are integers 0..16; map them linearly onto 0..255.
    return np.round(images * (255.0 / 16.0)).astype(np.uint8), labels


@functools.lru_cache(maxsize=8)
def _digits_arrays(split: str, image_size: int, method: str):
    images, labels = _digits_raw()
    idx = digits_split_indices(split)
    arrays = np.stack([resize(images[i][..., None], image_size, method) for i in idx]), labels[idx]
    for a in arrays:
        a.setflags(write=False)
    return arrays


class Source:
    """The base of every source (`isinstance` checks): `repr` names its class and its `info`."""

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.info})'


class ArraySource(Source):
    """A source over in-memory arrays (uint8 images (N, H, W, C), integer labels (N,))."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, info: DataInfo):
        self.images, self.labels, self.info = images, labels, info

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i) -> dict[str, Any]:
        return {'image': self.images[i], 'label': int(self.labels[i])}


def digits(split: str = 'train', image_size: int = 16,
           resize_method: str = 'bilinear') -> ArraySource:
    """scikit-learn's bundled 8x8 digits as uint8 (image_size, image_size, 1), 10 classes.

    Pixel values 0..16 are scaled to 0..255, then the images are resized with PIL.
    Horizontal flips are wrong for digits: keep the pipeline's `flip` off.

    Args:
        split: 'train' (1,433) / 'test' (364), or the studies' 'half_train' (896) /
          'half_test' (901); fixed forever (`digits_split_indices`).
        image_size: the side of the images in pixels, a positive int.
        resize_method: bilinear by default (smooth strokes, no information lost at 2x);
          'nearest' gives exact pixel blocks.

    Returns:
        An `ArraySource` of the split, its arrays read-only.

    Raises:
        DataError: `image_size` is not a positive int, `split` is unknown, or
          `resize_method` is unknown.
    """
    if not isinstance(image_size, (int, np.integer)) or image_size < 1:
        raise DataError(f'digits: image_size must be a positive int, got {image_size!r}')
    _check_resize_method(resize_method, 'digits: ')
    images, labels = _digits_arrays(split, int(image_size), resize_method)
    info = DataInfo(name='digits', split=split, num_classes=10,
                    image_shape=(int(image_size), int(image_size), 1), num_examples=len(labels),
                    class_names=tuple(str(c) for c in range(10)))
    return ArraySource(images, labels, info)


# ------------------------------------------------------------------------------------ arrays

def array_source(images, labels, *, num_classes: int | None = None, name: str = 'arrays',
                 split: str = 'train', class_names: Sequence[str] | None = None) -> ArraySource:
    """Wraps in-memory uint8 images and integer labels as a source.

    Args:
        images: uint8 images (N, H, W) or (N, H, W, C); (N, H, W) gets C = 1.
        labels: integer labels (N,).
        num_classes: the class count; `None`: `len(class_names)` where given, else
          `max(labels) + 1`.
        name: the source's `DataInfo.name`.
        split: the source's `DataInfo.split`.
        class_names: the classes' names; `None`: none.

    Returns:
        An `ArraySource` over the arrays (labels as int64).

    Raises:
        DataError: `images` is not rank 3 or 4 or not uint8; `labels` is not a 1-D integer
          array; the counts differ; there are no examples; or a label lies outside
          [0, `num_classes`).
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim not in (3, 4):
        raise DataError(f'array_source: images must have rank 3 (N, H, W) or 4 (N, H, W, C), '
                        f'got shape {images.shape}')
    if images.ndim == 3:
        images = images[..., None]
    if images.dtype != np.uint8:
        raise DataError(f'array_source: images must be uint8 (0..255), got {images.dtype}')
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f'array_source: labels must be a 1-D integer array, got shape '
                        f'{labels.shape} dtype {labels.dtype}')
    if len(images) != len(labels):
        raise DataError(f'array_source: {len(images)} images but {len(labels)} labels')
    if len(labels) == 0:
        raise DataError('array_source: no examples')
    if num_classes is None:
        num_classes = len(class_names) if class_names is not None else int(labels.max()) + 1
    if labels.min() < 0 or labels.max() >= num_classes:
        raise DataError(f'array_source: labels must lie in [0, {num_classes}), got range '
                        f'[{labels.min()}, {labels.max()}]')
    info = DataInfo(name=name, split=split, num_classes=int(num_classes),
                    image_shape=tuple(int(d) for d in images.shape[1:]), num_examples=len(labels),
                    class_names=tuple(class_names) if class_names is not None else None)
    return ArraySource(images, labels.astype(np.int64), info)


# ------------------------------------------------------------------------------------ folder

class ImageFolderSource(Source):
    """`root/<split>/<label>/*.png|jpg|jpeg`, decoded lazily with PIL (see `image_folder`)."""

    def __init__(self, files: list[str], labels: list[int], mode: str, image_size, method: str,
                 info: DataInfo):
        self.files, self.labels, self.mode = files, labels, mode
        self.image_size, self.method, self.info = image_size, method, info

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i) -> dict[str, Any]:
        path = self.files[i]
        try:
            with Image.open(path) as im:
                image = np.asarray(im.convert(self.mode))
        except Exception as e:  # PIL raises several types for truncated/corrupt files
            raise DataError(f'image_folder: cannot decode {path}: {e}') from e
        image = image[..., None] if image.ndim == 2 else image
        if self.image_size is not None:
            image = resize(image, self.image_size, self.method)
        elif image.shape != self.info.image_shape:
            raise DataError(f'image_folder: {path} has shape {image.shape}, expected '
                            f'{self.info.image_shape}')
        return {'image': image, 'label': self.labels[i]}


def _subdirs(path: str) -> list[str]:
    return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))


def image_folder(root: str, split: str, *, image_size=None, channels: int | None = None,
                 resize_method: str = 'bilinear') -> ImageFolderSource:
    """Images under `root/<split>/<label>/`, labelled by class-folder name.

    Class names are the sorted union of the label folders of every split under `root` (as
    `tfds.ImageFolder` does), so label ids agree between 'train' and 'test'. Headers of all
    files are read at construction: unreadable files and, without `image_size`, differing
    sizes are reported there, naming the file. Images are decoded when read.

    Args:
        root: the folder that holds one folder per split.
        split: the split's folder name.
        image_size: `s` (any integer, numpy's too) or `(h, w)` to resize every image to;
          `None`: all images must have one size.
        channels: 1 (grayscale) or 3 (RGB); `None`: 1 if every image is grayscale, else 3.
        resize_method: the resize method (`RESIZE_METHODS`).

    Returns:
        An `ImageFolderSource` of the split's .png, .jpg and .jpeg files.

    Raises:
        DataError: `root` or its split folder does not exist; the split has no class folders
          or no images; an image's header cannot be read; `channels` is not 1 or 3;
          `resize_method` is unknown; or, without `image_size`, the images differ in size.
    """
    _check_resize_method(resize_method, 'image_folder: ')
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise DataError(f'image_folder: root folder {root!r} does not exist')
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        raise DataError(f'image_folder: split folder {split_dir!r} does not exist '
                        f'(splits found: {_subdirs(root)})')
    class_names = sorted({c for s in _subdirs(root) for c in _subdirs(os.path.join(root, s))})
    if not _subdirs(split_dir):
        raise DataError(f'image_folder: {split_dir!r} has no class folders (expected '
                        f'{split_dir}/<label>/*.png)')
    files, labels = [], []
    for label, name in enumerate(class_names):
        class_dir = os.path.join(split_dir, name)
        if not os.path.isdir(class_dir):
            continue
        for f in sorted(os.listdir(class_dir)):
            if f.lower().endswith(IMAGE_EXTENSIONS):
                files.append(os.path.join(class_dir, f))
                labels.append(label)
    if not files:
        raise DataError(f'image_folder: no {"/".join(IMAGE_EXTENSIONS)} images under {split_dir!r}')
    sizes, modes = set(), set()
    for path in files:
        try:
            with Image.open(path) as im:
                sizes.add((im.size, path))
                modes.add(im.mode)
        except Exception as e:
            raise DataError(f'image_folder: cannot read image {path}: {e}') from e
    if channels is None:
        channels = 1 if modes <= {'L', '1', 'I;16', 'I', 'F'} else 3
    if channels not in (1, 3):
        raise DataError(f'image_folder: channels must be 1 or 3, got {channels!r}')
    if image_size is None:
        (w, h), first = min(sizes)
        for (size, path) in sizes:
            if size != (w, h):
                raise DataError(f'image_folder: {path} is {size[0]}x{size[1]} but {first} is '
                                f'{w}x{h}; pass image_size to resize them all')
        shape = (h, w, channels)
    else:
        shape = (*_size_pair(image_size), channels)
    info = DataInfo(name=f'folder:{root}', split=split, num_classes=len(class_names),
                    image_shape=shape, num_examples=len(files), class_names=tuple(class_names),
                    location=os.path.abspath(root))
    return ImageFolderSource(files, labels, 'L' if channels == 1 else 'RGB', image_size,
                             resize_method, info)


# ------------------------------------------------------------------------------------ tfds

def disable_gcs() -> None:
    """Stops TFDS from looking datasets up on Google Cloud Storage (offline use).

    The only switch is a private attribute, so it lives here alone (spec §3.4).
    """
    os.environ.setdefault('NO_GCE_CHECK', 'true')
    from tensorflow_datasets.core.utils import gcs_utils
    if hasattr(gcs_utils, '_is_gcs_disabled'):
        gcs_utils._is_gcs_disabled = True  # pylint: disable=protected-access


class TfdsSource(Source):
    """A `tfds.data_source` with its features mapped to {'image', 'label'}."""

    def __init__(self, source, image_key: str, label_key: str, info: DataInfo):
        self.source, self.image_key, self.label_key, self.info = source, image_key, label_key, info

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i) -> dict[str, Any]:
        ex = self.source[i]
        where = f'tfds {self.info.name}[{self.info.split}] example {i}'
        return {'image': _as_hwc_uint8(ex[self.image_key], where), 'label': int(ex[self.label_key])}


def tfds_source(name: str, split: str, data_dir: str | None = None, *, image_key: str = 'image',
                label_key: str = 'label') -> TfdsSource:
    """A TFDS dataset prepared as array_record under `data_dir`; never downloads or uses GCS.

    Prepare data elsewhere with `tfds build NAME --data_dir=DIR --file_format=array_record`.

    Args:
        name: the TFDS name, which may carry a config/version ('cifar10:3.0.2').
        split: the split, with TFDS slicing ('train[:90%]').
        data_dir: the folder the data was prepared in; `None`: TFDS's default.
        image_key: the feature that holds the images.
        label_key: the feature that holds the labels (a ClassLabel).

    Returns:
        A `TfdsSource` whose examples are uint8 (H, W, C) images and int labels.

    Raises:
        DataError: `data_dir` does not exist; the dataset or split is not prepared there;
          a feature key is missing; or the label feature is not a ClassLabel.
    """
    import tensorflow_datasets as tfds
    disable_gcs()
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
        if not os.path.isdir(data_dir):
            raise DataError(f'tfds dataset {name!r}: data_dir {data_dir!r} does not exist')
    where = data_dir or '(tfds default data_dir, e.g. ~/tensorflow_datasets)'
    try:
        src = tfds.data_source(name, split=split, data_dir=data_dir, download=False, try_gcs=False)
    except Exception as e:  # tfds raises many error types for a missing or unprepared dataset
        raise DataError(
            f'tfds dataset {name!r} split {split!r} is not available under data_dir {where}: '
            f'it must be prepared there as array_record (`tfds build {name} --data_dir=DIR '
            f'--file_format=array_record`); nothing is downloaded at run time. '
            f'TFDS said: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}') from e
    features = src.dataset_info.features
    missing = [k for k in (image_key, label_key) if k not in features]
    if missing:
        raise DataError(f'tfds dataset {name!r} has no feature(s) {missing}; its features are '
                        f'{sorted(features.keys())} (pass image_key/label_key)')
    label_feature = features[label_key]
    num_classes = getattr(label_feature, 'num_classes', None)
    if not num_classes:
        raise DataError(f'tfds dataset {name!r}: feature {label_key!r} is not a ClassLabel')
    shape = tuple(features[image_key].shape)
    if len(shape) == 2:
        shape = shape + (1,)
    names = getattr(label_feature, 'names', None)
    info = DataInfo(name=f'tfds:{name}', split=split, num_classes=int(num_classes),
                    image_shape=shape, num_examples=len(src),
                    class_names=tuple(names) if names else None)
    return TfdsSource(src, image_key, label_key, info)
