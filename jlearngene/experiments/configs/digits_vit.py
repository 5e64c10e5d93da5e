r"""Plain supervised ViT on the bundled scikit-learn digits (no download): the baseline run.

    jlearngene train --config digits_vit --workdir /tmp/digits_vit

Overrides use ml_collections syntax, e.g. `--config.steps=200 --config.model.depth=2`;
`--config digits_vit:smoke` gives a seconds-long smoke run.

The same run on other data sources (templates; the model's image size, channels and class
count must fit the data, which the run checks before training):

    jlearngene train --config digits_vit:folder --config.data.root=DIR \
        --config.model.num_classes=N --workdir W      # DIR/train/<label>/*.png, DIR/test/...
    jlearngene train --config digits_vit:tfds --config.data.tfds_name=cifar10 \
        --config.data.data_dir=~/tensorflow_datasets --workdir W   # prepared array_record data
    jlearngene train --config digits_vit:fashion_mnist --workdir W    # Fashion-MNIST's IDX files
    jlearngene train --config digits_vit:fashion_mnist --config.data.classes=5,6,7,8,9 \
        --config.model.num_classes=5 --config.data.label_fraction=0.01 --workdir W  # 300 labels

Arguments: 'digits' (default), 'folder', 'tfds' or 'fashion_mnist', optionally followed by
',smoke'.
Expected: >= 95% test accuracy in under 5 minutes on 2 CPU cores. Measured (1500 steps, quiet
2-core machine): 98.9% test accuracy (364 images), 85 s wall including compilation, 1.1 GB
peak RSS; 98.4% at step 1000.
"""
import ml_collections

from jlearngene.experiments.configs import parse_arg

SOURCES = ('digits', 'folder', 'tfds', 'fashion_mnist')


def get_config(arg=None):
    """The classification run's config for `arg`, 'SOURCE[,smoke]' (the sources: the module
    docstring).

    Args:
        arg: one of `SOURCES`: 'digits' (the default, also for None or ''), 'folder', 'tfds'
            or 'fashion_mnist'; ',smoke' makes it a 20-step, depth-2 run.

    Returns:
        The run's ml_collections.ConfigDict (task 'classification').

    Raises:
        ValueError: an unknown source or flag (`configs.parse_arg`).
    """
    source, flags = parse_arg(arg, SOURCES, ('smoke',))
    c = ml_collections.ConfigDict()
    c.task = 'classification'
    c.seed = 0
    c.steps = 1500
    c.batch_size = 128
    c.log_every = 100
    c.eval_every = 500
    c.checkpoint_every = 500
    c.keep_checkpoints = 2
    c.best_metric = 'eval/accuracy'
    c.sharding = 'replicate'
    c.model_parallel = 1   # devices of the mesh's 'model' axis (heads/MLP/embed split; parallel.py)
    c.microbatches = 1     # gradient accumulation: parts per batch (see step.make_train_step)
    c.steps_per_call = 'auto'   # optimiser steps per compiled call, or an integer (trainer.fit)
    c.init = ''            # optional model artefact (checkpoint.save_model) to start from
    c.label_smoothing = 0.1

    # Digits are 8x8 grey; the source resizes them to 16 px, patches of 4 -> 16 tokens.
    c.model = ml_collections.ConfigDict(dict(
        variant='Ti', width=64, depth=4, num_heads=4, mlp_dim=128, patch_size=4,
        image_size=16, channels=1, num_classes=10, pool='avg', class_token=False,
        dense_precision='float32'))   # 'bfloat16': faster dense layers, see ViTConfig
    c.data = ml_collections.ConfigDict(dict(
        name='digits', image_size=16,
        augment=ml_collections.ConfigDict(dict(crop_padding=2))))
    c.eval_split = 'test'
    c.eval_batch_size = 256

    c.optim = ml_collections.ConfigDict(dict(
        lr=2e-3, warmup_steps=100, min_lr_ratio=0.01, weight_decay=0.05, clip_norm=1.0))

    if source == 'folder':
        # root/<split>/<label>/*.png|jpg|jpeg, resized to image_size; channels 1 or 3
        c.data = ml_collections.ConfigDict(dict(
            name='folder', root='', image_size=32, channels=3,
            augment=ml_collections.ConfigDict(dict(crop_padding=4, flip=True))))
        c.model.update(image_size=32, channels=3)
    elif source == 'tfds':
        # a TFDS dataset prepared as array_record under data_dir ('' = ~/tensorflow_datasets)
        c.data = ml_collections.ConfigDict(dict(
            name='tfds', tfds_name='cifar10', data_dir='', image_size=32,
            augment=ml_collections.ConfigDict(dict(crop_padding=4, flip=True))))
        c.model.update(image_size=32, channels=3)
    elif source == 'fashion_mnist':
        # 28 px grey from local IDX files (data.root, $JLEARNGENE_DATA/fashion_mnist or Debian's
        # dataset-fashion-mnist); patches of 7 -> 16 tokens; a class subset (relabelled),
        # a seeded labelled fraction and a validation part held out of it (jlearngene.data.subsets)
        c.data = ml_collections.ConfigDict(dict(
            name='fashion_mnist', root='', image_size=28, classes=(), label_fraction=1.0,
            validation_per_class=0, subset_seed=0,
            augment=ml_collections.ConfigDict(dict(crop_padding=2))))
        c.model.update(image_size=28, patch_size=7)

    if 'smoke' in flags:
        c.steps, c.log_every, c.eval_every, c.checkpoint_every = 20, 5, 10, 10
        c.optim.warmup_steps = 5
        c.model.depth = 2
    return c
