"""Input data: sources (random access) and grain pipelines for training and evaluation.

Usage (the trainer only needs `from_config`, `train_iterator`, `eval_batches`, `digits`)::

    from jlearngene import data

    # Infinite, shuffled, augmented, per-process sharded, checkpointable iterator.
    it, info = data.from_config({'name': 'digits', 'image_size': 16}, 'train',
                                batch_size=64, seed=0, train=True)
    batch = next(it)   # {'image': float32 (B, H, W, C) normalised, 'label': int32 (B,)}
                       # + 'label_soft': float32 (B, K) when mixup/cutmix is on
    state = it.get_state()      # JSON-able; store it in the checkpoint
    it.set_state(state)         # on a fresh iterator: continues exactly

    # Finite, ordered pass over every example once; last batch padded, `mask` (B,) bool.
    ev, info = data.from_config({'name': 'digits'}, 'test', batch_size=256, seed=0, train=False)
    for b in ev:
        b['image'], b['label'], b['mask']

    info.num_classes, info.image_shape, info.name   # `DataInfo`

Lower level::

    src = data.digits('train', image_size=16)
    len(src); src[0]   # {'image': uint8 (H, W, C), 'label': int}
    it = data.train_iterator(src, batch_size=64, seed=0,
                             augment=data.Augment(crop_padding=2, mixup_alpha=0.2))
    ev = data.eval_batches(src, batch_size=256)

Design: images are uint8 in sources and float32 `(x / 255 - mean) / std` out of the
pipelines (default mean = std = 0.5, so [-1, 1]); digits are upsampled 8 -> 16 px with PIL
bilinear in the source; `Augment.flip` is off by default (flipped digits are other glyphs).
Eval yields ceil(num_examples / batch_size) batches on every process.

Config names: 'digits' (scikit-learn's bundled digits; no download), 'fashion_mnist' (its
IDX files on disk, from one folder: `root`, else $JLEARNGENE_DATA/fashion_mnist, else Debian's
dataset-fashion-mnist; splits 'train', 'validation', 'test'; `classes`, `label_fraction`,
`validation_per_class`, `subset_seed` choose a transfer task's data, see `subsets`), 'tfds'
(`tfds_name`, `data_dir`; prepared array_record data only), 'folder'
(`root/split/<label>/*.png|jpg`), 'arrays' (in-memory `images`, `labels`).

A study's downstream task, its two label budgets and its validation images::

    cfg = {'name': 'fashion_mnist', 'classes': (5, 6, 7, 8, 9), 'label_fraction': 0.01,
           'validation_per_class': 200, 'subset_seed': 0}
    data.source_from_config(cfg, 'train')        # 300 images, labels 0..4 (inside 10 %'s 3,000)
    data.source_from_config(cfg, 'validation')   # 1,000 images, outside every labelled subset
    data.source_from_config(cfg, 'test')         # 5,000 images
"""
from jlearngene.data.augment import Augment
from jlearngene.data.fashion import fashion_mnist
from jlearngene.data.pipeline import (KNOWN_DATASETS, check_config, check_split, eval_batches,
                                      from_config, pipeline_image_size, source_from_config,
                                      train_iterator)
from jlearngene.data.sources import (DataError, DataInfo, array_source, digits,
                                     digits_split_indices, image_folder, resize, tfds_source)
from jlearngene.data.subsets import subset, subset_indices

__all__ = ['Augment', 'DataError', 'DataInfo', 'KNOWN_DATASETS', 'array_source', 'check_config',
           'check_split', 'digits', 'digits_split_indices', 'eval_batches', 'fashion_mnist',
           'from_config', 'image_folder', 'pipeline_image_size', 'resize', 'source_from_config',
           'subset', 'subset_indices', 'tfds_source', 'train_iterator']
