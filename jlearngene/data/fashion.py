"""Fashion-MNIST (Zalando; 28x28 grey, 60,000 train / 10,000 test, 10 classes) from its four
IDX files on local disk, gzipped or not; nothing is downloaded.

The files are read from one folder (`data_dir`): `root` (config `data.root`) when given,
else `$JLEARNGENE_DATA/fashion_mnist` when that variable is set, else where Debian's
`dataset-fashion-mnist` package installs them (`DEBIAN_DIR`). A folder that is chosen is the
only place read: a missing folder, a file in its place or a folder without the files is a
one-line DataError naming it, never a fall back to another copy. The folder read is the
sources' `DataInfo.location`. Every file is checked (gzip stream,
magic number, shape, count against its bytes, images against labels, label range); a
problem is a one-line DataError naming the file and how to get the data.

Splits: 'train', 'validation' (held out of 'train') and 'test', optionally restricted to
`classes` and, for 'train', to a labelled fraction: `jlearngene.data.subsets`.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import os
import zlib

import numpy as np

from jlearngene.data import subsets
from jlearngene.data.sources import ArraySource, DataError, DataInfo, resize

DEBIAN_DIR = '/usr/share/datasets/fashion-mnist'
ENV_VAR = 'JLEARNGENE_DATA'
FILES = {'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
         'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte')}
SPLITS = ('train', 'validation', 'test')
CLASS_NAMES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
               'Sneaker', 'Bag', 'Ankle boot')
SIZE = 28
# The pixel mean and std of the 60,000 training images, scaled to [0, 1].
MEAN, STD = (0.2860,), (0.3530,)
# IDX magic numbers: 0x0000, type 0x08 (unsigned byte), then the number of dimensions.
MAGIC = {'images': 0x00000803, 'labels': 0x00000801}
HOW_TO_GET = ('get Fashion-MNIST with `apt-get install dataset-fashion-mnist` (into '
              f'{DEBIAN_DIR}) or put its four IDX files (gzipped or not) in '
              f'${ENV_VAR}/fashion_mnist or data.root')


def data_dir(root: str | None = None) -> tuple[str, str]:
    """The folder the files are to be read from, and what chose it.

    Nothing is looked for: `find_dir` checks the folder.

    Args:
        root: the folder given (config `data.root`); `None` or empty: not given.

    Returns:
        The pair `(folder, chosen)`, `folder` being `root` when given ('data.root'), else
        $JLEARNGENE_DATA/fashion_mnist when that variable is set, else `DEBIAN_DIR` (Debian's
        dataset-fashion-mnist); `chosen` says which, in words, for messages.
    """
    if root:
        return os.path.expanduser(os.fspath(root)), 'data.root'
    if os.environ.get(ENV_VAR):
        return (os.path.join(os.path.expanduser(os.environ[ENV_VAR]), 'fashion_mnist'),
                f'${ENV_VAR}/fashion_mnist')
    return DEBIAN_DIR, "Debian's dataset-fashion-mnist folder"


def _present(folder: str, name: str) -> str | None:
    for path in (os.path.join(folder, name), os.path.join(folder, name + '.gz')):
        if os.path.isfile(path):
            return path
    return None


def find_dir(root: str | None = None) -> str:
    """The folder the files are read from (`data_dir(root)`), once checked.

    Args:
        root: the folder given (config `data.root`); `None`: as `data_dir` chooses.

    Returns:
        The folder.

    Raises:
        DataError: (one line, naming the folder and what chose it) it does not exist, is a
          file, or holds none of the four files.
    """
    folder, chosen = data_dir(root)
    if not os.path.exists(folder):
        raise DataError(f'fashion_mnist: {chosen} {folder} does not exist; {HOW_TO_GET}')
    if not os.path.isdir(folder):
        raise DataError(f'fashion_mnist: {chosen} {folder} is a file, not a folder; {HOW_TO_GET}')
    if not any(_present(folder, n) for names in FILES.values() for n in names):
        raise DataError(f'fashion_mnist: {FILES["train"][0]}[.gz] not found in {folder} '
                        f'({chosen}); {HOW_TO_GET}')
    return folder


def files(split: str, root: str | None = None) -> tuple[str, str]:
    """The IDX files of 'train' or 'test'.

    Args:
        split: 'train' or 'test'.
        root: the folder given (config `data.root`); `None`: as `data_dir` chooses.

    Returns:
        The pair `(images_file, labels_file)`, each the raw file where both it and its `.gz`
        are there.

    Raises:
        DataError: the folder fails `find_dir`'s checks, or one of the split's files is missing.
    """
    folder = find_dir(root)
    paths = []
    for name in FILES[split]:
        path = _present(folder, name)
        if path is None:
            raise DataError(f'fashion_mnist: {os.path.join(folder, name)}[.gz] is missing; '
                            f'{HOW_TO_GET}')
        paths.append(path)
    return tuple(paths)


def read_idx(path: str, kind: str) -> np.ndarray:
    """The uint8 array of an IDX file, gzipped or not.

    Args:
        path: the file; a name ending in `.gz` is read through gzip.
        kind: 'images' or 'labels'.

    Returns:
        A read-only uint8 array, (N, 28, 28) images or (N,) labels.

    Raises:
        DataError: (built by the local `fail`, naming the file and how to get the data) the
          file cannot be read or decompressed, is shorter than its header, has the wrong
          magic number or image size, or its body is shorter or longer than its header says.
    """
    def fail(problem: str):
        return DataError(f'fashion_mnist: {path} {problem}; {HOW_TO_GET}')

    try:
        with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise fail(f'cannot be read ({type(e).__name__}: {e})') from None
    ndim = 3 if kind == 'images' else 1
    if len(raw) < 4 + 4 * ndim:
        raise fail(f'is truncated: {len(raw)} bytes, shorter than an IDX {kind} header')
    magic = int.from_bytes(raw[:4], 'big')
    if magic != MAGIC[kind]:
        raise fail(f'is not an IDX {kind} file (magic 0x{magic:08x}, expected '
                   f'0x{MAGIC[kind]:08x})')
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    if shape[1:] != (SIZE, SIZE)[:ndim - 1]:
        raise fail(f'holds images of {shape[1]}x{shape[2]}, not {SIZE}x{SIZE}')
    body = memoryview(raw)[4 + 4 * ndim:]
    want = int(np.prod(shape))
    if len(body) < want:
        raise fail(f'is truncated: its header says {shape[0]} {kind} ({want} bytes) but '
                   f'{len(body)} bytes follow')
    if len(body) > want:
        raise fail(f'does not end after its header\'s {shape[0]} {kind} '
                   f'({len(body) - want} more bytes follow)')
    return np.frombuffer(body, np.uint8).reshape(shape)


@functools.lru_cache(maxsize=4)
def _read(images_path: str, labels_path: str, _stamp) -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_idx(images_path, 'images'), read_idx(labels_path, 'labels')
    if len(images) != len(labels):
        raise DataError(f'fashion_mnist: {images_path} holds {len(images)} images but '
                        f'{labels_path} holds {len(labels)} labels; {HOW_TO_GET}')
    if len(labels) and labels.max() >= len(CLASS_NAMES):
        raise DataError(f'fashion_mnist: {labels_path} has label {labels.max()} outside '
                        f'0..{len(CLASS_NAMES) - 1}; {HOW_TO_GET}')
    images, labels = images[..., None], labels.astype(np.int64)
    labels.setflags(write=False)
    return images, labels


def arrays(split: str, root: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The arrays of the files' 'train' or 'test', cached while the files are unchanged.

    Args:
        split: 'train' or 'test'.
        root: the folder given (config `data.root`); `None`: as `data_dir` chooses.

    Returns:
        The pair `(images, labels)`, read-only uint8 (N, 28, 28, 1) and int64 (N,).

    Raises:
        DataError: `split` is neither 'train' nor 'test'; the folder or a file is missing;
          a file fails `read_idx`'s checks; the images and labels differ in count; or a
          label is outside 0..9.
    """
    if split not in FILES:
        raise DataError(f'fashion_mnist files hold splits {tuple(FILES)}, got {split!r}')
    paths = files(split, root)
    stamp = tuple((s.st_mtime_ns, s.st_size) for s in map(os.stat, paths))
    return _read(*paths, stamp)


def fashion_mnist(split: str = 'train', *, root: str | None = None, classes=None,
                  label_fraction: float = 1.0, validation_per_class: int = 0,
                  subset_seed: int = 0, image_size: int = SIZE,
                  resize_method: str = 'bilinear') -> ArraySource:
    """Fashion-MNIST as uint8 (image_size, image_size, 1) images; mean/std of its train set.

    The study protocol's downstream task is `classes=(5, 6, 7, 8, 9),
    validation_per_class=200` at fractions 0.01 and 0.1 (300 and 3,000 images).

    Args:
        split: 'train' (the labelled training images), 'validation' (`validation_per_class`
          training images per class, never in 'train') or 'test' (every test image of
          `classes`).
        root: the folder of the IDX files; `None`: as `data_dir` chooses.
        classes: the class ids kept, relabelled 0..k-1 in the order given; `None` or empty:
          all 10.
        label_fraction: below 1, 'train' keeps round(fraction × images of the classes / k)
          per class, chosen with `subset_seed` (`subsets`).
        validation_per_class: training images per class held out as 'validation'.
        subset_seed: the seed of both choices.
        image_size: the side in pixels; other than 28 resizes with PIL.
        resize_method: the resize method (`sources.RESIZE_METHODS`).

    Returns:
        An `ArraySource` of the split, its arrays read-only.

    Raises:
        DataError: `split` or `image_size` is invalid; the files are missing or damaged
          (`arrays`); or the selection options are invalid or leave a class too few images
          (`subsets.subset_indices`).
    """
    if split not in SPLITS:
        raise DataError(f"fashion_mnist has splits {', '.join(map(repr, SPLITS))}, got {split!r}")
    if (isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer))
            or image_size < 1):
        raise DataError(f'fashion_mnist: image_size must be a positive int, got {image_size!r}')
    images, labels = arrays('test' if split == 'test' else 'train', root)
    info = DataInfo(name='fashion_mnist', split=split, num_classes=len(CLASS_NAMES),
                    image_shape=(SIZE, SIZE, 1), num_examples=len(labels), mean=MEAN, std=STD,
                    class_names=CLASS_NAMES, location=os.path.abspath(find_dir(root)))
    part = {'train': 'labelled', 'validation': 'validation', 'test': 'all'}[split]
    src = subsets.subset(ArraySource(images, labels, info), part, classes=classes,
                         label_fraction=label_fraction, validation_per_class=validation_per_class,
                         seed=subset_seed)
    if image_size != SIZE:
        size = int(image_size)
        small = np.stack([resize(im, size, resize_method) for im in src.images]
                         or [np.zeros((size, size, 1), np.uint8)])[:len(src)]
        small.setflags(write=False)
        src = ArraySource(small, src.labels,
                          dataclasses.replace(src.info, image_shape=(size, size, 1)))
    return src


__all__ = ['CLASS_NAMES', 'DEBIAN_DIR', 'ENV_VAR', 'FILES', 'SPLITS', 'arrays', 'data_dir',
           'fashion_mnist', 'files', 'find_dir', 'read_idx']
