"""Tests for jlearngene.data: sources, grain pipelines, augmentation, config entry point."""
import json
import re

import ml_collections
import numpy as np
import pytest
from PIL import Image

from jlearngene import data
from jlearngene.data import augment as aug

SOLO = dict(process_index=0, process_count=1)


def _ids_source(n=12, size=8, channels=1, num_classes=None):
    """Example i is a constant image of value 10 + i with label i % num_classes."""
    num_classes = num_classes or n
    images = (10 + np.arange(n, dtype=np.uint8))[:, None, None, None] * np.ones(
        (1, size, size, channels), np.uint8)
    return data.array_source(images, np.arange(n) % num_classes, num_classes=num_classes)


def _ids(batch):
    """Recovers example ids from normalised constant images (mean = std = 0.5)."""
    u8 = np.round((batch['image'][:, 0, 0, 0] * 0.5 + 0.5) * 255).astype(int)
    return list(u8 - 10)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


# ------------------------------------------------------------------------------------ digits

def test_digits_split_is_fixed_disjoint_and_stratified():
    train, test = data.digits_split_indices('train'), data.digits_split_indices('test')
    assert len(train) == 1433 and len(test) == 364
    assert not set(train) & set(test)
    assert sorted(np.concatenate([train, test])) == list(range(1797))
    # Fingerprint of the rule, so that any change to the split is caught.
    assert list(test[:12]) == list(range(10)) + [35, 39] and int(test.sum()) == 323723
    np.testing.assert_array_equal(test, data.digits_split_indices('test'))
    labels = data.digits('test').labels
    counts = np.bincount(labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    with pytest.raises(data.DataError, match='validation'):
        data.digits('validation')


def test_digits_images_match_sklearn_and_are_not_degraded():
    from sklearn.datasets import load_digits
    bunch = load_digits()
    src = data.digits('train', image_size=16, resize_method='nearest')
    idx = data.digits_split_indices('train')
    assert src.info.image_shape == (16, 16, 1) and src.info.num_classes == 10
    ex = src[3]
    assert ex['image'].dtype == np.uint8 and ex['image'].shape == (16, 16, 1)
    assert ex['label'] == bunch.target[idx[3]]
    # Nearest 2x upsampling is lossless: every 2x2 block is one original pixel (0..16 -> 0..255).
    expected = np.round(bunch.images[idx[3]] * 255 / 16).astype(np.uint8)
    np.testing.assert_array_equal(ex['image'][::2, ::2, 0], expected)
    np.testing.assert_array_equal(ex['image'][1::2, 1::2, 0], expected)
    np.testing.assert_array_equal(src.labels, bunch.target[idx])
    bil = data.digits('train', image_size=16)
    assert bil[3]['image'].max() > 200 and bil[3]['label'] == ex['label']
    assert data.digits('test', image_size=24)[0]['image'].shape == (24, 24, 1)


# ------------------------------------------------------------------------------------ arrays

def test_array_source_accepts_rank3_and_validates():
    src = data.array_source(np.zeros((4, 5, 6), np.uint8), np.array([0, 1, 2, 1]))
    assert src.info.image_shape == (5, 6, 1) and src.info.num_classes == 3 and len(src) == 4
    assert src[2]['label'] == 2 and src[2]['image'].shape == (5, 6, 1)
    bad = [
        ((np.zeros((4, 5), np.uint8), np.arange(4)), r'\(4, 5\)'),
        ((np.zeros((4, 5, 5), np.uint8), np.arange(3)), '4 images.*3 labels'),
        ((np.zeros((4, 5, 5), np.float32), np.arange(4)), 'float32'),
        ((np.zeros((4, 5, 5), np.uint8), np.arange(4) * 1.0), 'labels.*float64'),
    ]
    for args, msg in bad:
        with pytest.raises(data.DataError, match=msg):
            data.array_source(*args)
    with pytest.raises(data.DataError, match=r'\[0, 2\)'):
        data.array_source(np.zeros((4, 5, 5), np.uint8), np.arange(4), num_classes=2)


# ------------------------------------------------------------------------------------ folder

def _write_png(path, value, size=(8, 8), mode='L'):
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = size[::-1] if mode == 'L' else size[::-1] + (3,)
    Image.fromarray(np.full(shape, value, np.uint8), mode).save(path)


def test_image_folder_reads_labels_and_pixels(tmp_path):
    for split, per in (('train', 3), ('test', 1)):
        for c, name in enumerate(['cat', 'dog']):
            for i in range(per):
                _write_png(tmp_path / split / name / f'{i}.png', 50 * c + i)
    _write_png(tmp_path / 'test' / 'emu' / '0.png', 200)   # class only in test
    (tmp_path / 'train' / 'cat' / 'notes.txt').write_text('ignored')
    src = data.image_folder(tmp_path, 'train')
    assert src.info.class_names == ('cat', 'dog', 'emu') and src.info.num_classes == 3
    assert len(src) == 6 and src.info.image_shape == (8, 8, 1)
    assert [src[i]['label'] for i in range(6)] == [0, 0, 0, 1, 1, 1]
    assert src[4]['image'].shape == (8, 8, 1) and int(src[4]['image'][0, 0, 0]) == 51
    test = data.image_folder(tmp_path, 'test')
    assert [test[i]['label'] for i in range(3)] == [0, 1, 2]
    it, info = data.from_config({'name': 'folder', 'root': str(tmp_path), 'image_size': 4},
                                'train', batch_size=2, seed=0, train=True, **SOLO)
    assert next(it)['image'].shape == (2, 4, 4, 1) and info.num_examples == 6


def test_image_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(data.DataError, match=re.escape(str(tmp_path / 'nope'))):
        data.image_folder(tmp_path / 'nope', 'train')
    (tmp_path / 'train' / 'cat').mkdir(parents=True)
    with pytest.raises(data.DataError, match=re.escape(str(tmp_path / 'test'))):
        data.image_folder(tmp_path, 'test')
    with pytest.raises(data.DataError, match='png.*' + re.escape(str(tmp_path / 'train'))):
        data.image_folder(tmp_path, 'train')
    _write_png(tmp_path / 'train' / 'cat' / 'a.png', 1)
    (tmp_path / 'train' / 'cat' / 'b.png').write_bytes(b'definitely not a png')
    with pytest.raises(data.DataError, match='b.png'):
        data.image_folder(tmp_path, 'train')
    (tmp_path / 'train' / 'cat' / 'b.png').unlink()
    _write_png(tmp_path / 'train' / 'cat' / 'c.png', 1, size=(9, 8), mode='RGB')
    with pytest.raises(data.DataError, match=r'c\.png.*9x8'):
        data.image_folder(tmp_path, 'train')
    src = data.image_folder(tmp_path, 'train', image_size=6)   # resizing accepts mixed sizes
    assert src.info.image_shape == (6, 6, 3) and src[1]['image'].shape == (6, 6, 3)
    # A file that is truncated after its header is reported when it is decoded.
    noise = np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(noise, 'L').save(tmp_path / 'train' / 'cat' / 'a.png')
    good = (tmp_path / 'train' / 'cat' / 'a.png').read_bytes()
    (tmp_path / 'train' / 'cat' / 'a.png').write_bytes(good[:len(good) // 2])
    src = data.image_folder(tmp_path, 'train', image_size=6)
    with pytest.raises(data.DataError, match=r'a\.png'):
        src[0]


# ------------------------------------------------------------------------------------ tfds

def test_tfds_mock_data_through_source_and_pipeline(tmp_path):
    import tensorflow_datasets as tfds
    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        src = data.tfds_source('mnist', 'train', tmp_path)
        assert src.info.num_classes == 10 and src.info.image_shape == (28, 28, 1)
        assert len(src) == 12
        ex = src[0]
        assert ex['image'].dtype == np.uint8 and ex['image'].shape == (28, 28, 1)
        it = data.train_iterator(src, batch_size=4, seed=0, image_size=16,
                                 augment={'crop_padding': 2, 'mixup_alpha': 0.5}, **SOLO)
        b = next(it)
        assert b['image'].shape == (4, 16, 16, 1) and b['label_soft'].shape == (4, 10)
        it, info = data.from_config({'name': 'tfds', 'tfds_name': 'cifar10',
                                     'data_dir': str(tmp_path)}, 'test', batch_size=8, seed=0,
                                    train=False, **SOLO)
        batches = list(it)
        assert info.image_shape == (32, 32, 3) and len(batches) == 2
        assert sum(b['mask'].sum() for b in batches) == 12


def test_tfds_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(data.DataError, match=r"'mnist'.*" + re.escape(str(tmp_path))):
        data.tfds_source('mnist', 'train', tmp_path)
    with pytest.raises(data.DataError, match=re.escape(str(tmp_path / 'absent'))):
        data.tfds_source('mnist', 'train', tmp_path / 'absent')
    from tensorflow_datasets.core.utils import gcs_utils
    assert not gcs_utils.is_dataset_on_gcs('mnist')      # GCS is off: no look-up at all


# ------------------------------------------------------------------------------------ pipeline

def test_train_iterator_shapes_normalisation_and_epochs():
    src = _ids_source(12)
    it = data.train_iterator(src, batch_size=4, seed=0, **SOLO)
    batches = _take(it, 6)
    b = batches[0]
    assert b['image'].dtype == np.float32 and b['image'].shape == (4, 8, 8, 1)
    assert b['label'].dtype == np.int32 and 'label_soft' not in b
    ids = [i for b in batches for i in _ids(b)]
    for b in batches:   # labels travel with their images
        np.testing.assert_array_equal(b['label'], _ids(b))
    epoch1, epoch2 = ids[:12], ids[12:]
    assert sorted(epoch1) == sorted(epoch2) == list(range(12))
    assert epoch1 != epoch2 and epoch1 != list(range(12))
    # Normalisation: (x / 255 - mean) / std, per channel.
    src3 = _ids_source(4, channels=3)
    it = data.train_iterator(src3, batch_size=2, seed=0, mean=(0.1, 0.2, 0.3), std=(1, 2, 4),
                             **SOLO)
    b = next(it)
    raw = (10 + b['label']) / 255.0   # example i is the constant 10 + i, label i
    np.testing.assert_allclose(b['image'][:, 3, 5, :], (raw[:, None] - [0.1, 0.2, 0.3]) / [1, 2, 4],
                               rtol=1e-6)
    with pytest.raises(data.DataError, match='mean has 2 values'):
        data.train_iterator(src3, batch_size=2, seed=0, mean=(0.1, 0.2), **SOLO)


def test_train_iterator_is_deterministic_and_depends_on_seed():
    src = _ids_source(16)
    opts = dict(batch_size=4, augment={'crop_padding': 2, 'flip': True, 'mixup_alpha': 0.4},
                **SOLO)
    a = _take(data.train_iterator(src, seed=3, **opts), 5)
    b = _take(data.train_iterator(src, seed=3, **opts), 5)
    c = _take(data.train_iterator(src, seed=4, **opts), 5)
    _assert_batches_equal(a, b)
    assert any(not np.array_equal(x['label'], y['label']) for x, y in zip(a, c))
    assert any(not np.array_equal(x['image'], y['image']) for x, y in zip(a, c))


@pytest.mark.parametrize('augment', [None, {'rrc_scale': (0.3, 1.0), 'flip': True,
                                            'mixup_alpha': 0.8, 'cutmix_alpha': 1.0,
                                            'label_smoothing': 0.1}])
def test_resume_from_state_is_exact(augment):
    src = data.digits('train', image_size=8)
    def make():
        return data.train_iterator(src, batch_size=64, seed=7, augment=augment, **SOLO)

    it = make()
    _take(it, 25)   # crosses the first epoch boundary (1433 / 64 = 22.4 steps)
    state = it.get_state()
    json.dumps(state)   # checkpointable as JSON
    expected = _take(it, 4)
    fresh = make()
    fresh.set_state(state)
    _assert_batches_equal(_take(fresh, 4), expected)


def test_processes_get_disjoint_shards_that_union_to_the_global_batch():
    src = _ids_source(24)
    solo = _take(data.train_iterator(src, batch_size=8, seed=1, **SOLO), 6)
    shards = [_take(data.train_iterator(src, batch_size=8, seed=1, process_index=p,
                                        process_count=4), 6) for p in range(4)]
    for step in range(6):
        parts = [_ids(shards[p][step]) for p in range(4)]
        assert all(len(x) == 2 for x in parts)
        flat = [i for x in parts for i in x]
        assert len(set(flat)) == 8   # disjoint within the step
        assert sorted(flat) == sorted(_ids(solo[step]))
    # Per-example augmentation depends on the global position only, not on the sharding.
    src = data.array_source(np.random.default_rng(0).integers(0, 256, (24, 6, 6, 1), np.uint8),
                            np.arange(24))
    opts = dict(batch_size=8, seed=2, augment={'crop_padding': 2, 'flip': True})
    solo = _take(data.train_iterator(src, **opts, **SOLO), 4)
    shards = [_take(data.train_iterator(src, process_index=p, process_count=2, **opts), 4)
              for p in range(2)]
    for step in range(4):
        by_label = {int(l): im for l, im in zip(solo[step]['label'], solo[step]['image'])}
        for p in range(2):
            for l, im in zip(shards[p][step]['label'], shards[p][step]['image']):
                np.testing.assert_array_equal(im, by_label[int(l)])
    with pytest.raises(data.DataError, match='batch_size 8.*3'):
        data.train_iterator(src, batch_size=8, seed=1, process_index=0, process_count=3)
    with pytest.raises(data.DataError, match='process_index 4'):
        data.train_iterator(src, batch_size=8, seed=1, process_index=4, process_count=4)


def test_eval_batches_cover_every_example_once_with_mask():
    src = _ids_source(10)
    batches = list(data.eval_batches(src, batch_size=4, **SOLO))
    assert len(batches) == 3 and all(b['image'].shape == (4, 8, 8, 1) for b in batches)
    mask = np.concatenate([b['mask'] for b in batches])
    assert mask.dtype == bool and mask.tolist() == [True] * 10 + [False] * 2
    ids = np.concatenate([_ids(b) for b in batches])
    assert ids[mask].tolist() == list(range(10))
    labels = np.concatenate([b['label'] for b in batches])
    assert labels[mask].tolist() == list(range(10))
    seen = []
    for p in range(2):
        shard = list(data.eval_batches(src, batch_size=4, process_index=p, process_count=2))
        assert len(shard) == 3 and shard[0]['image'].shape[0] == 2
        seen += [i for b in shard for i, m in zip(_ids(b), b['mask']) if m]
    assert sorted(seen) == list(range(10))


# ------------------------------------------------------------------------------------ augment

def test_crop_and_flip_move_pixels_not_values():
    image = np.arange(36, dtype=np.uint8).reshape(6, 6, 1) + 1
    rng = np.random.default_rng(0)
    outs = [aug.augment_image(image, aug.Augment(crop_padding=2), rng) for _ in range(20)]
    assert all(o.shape == image.shape for o in outs)
    assert any(not np.array_equal(o, image) for o in outs)
    for o in outs:   # every non-zero pixel comes from the original image, shifted as a whole
        ys, xs = np.nonzero(o[..., 0])
        dy, dx = set((image[..., 0][o[..., 0] > 0] - 1) // 6 - ys), set(
            (image[..., 0][o[..., 0] > 0] - 1) % 6 - xs)
        assert len(dy) == 1 and len(dx) == 1
    flips = [aug.augment_image(image, aug.Augment(flip=True), rng) for _ in range(20)]
    assert all(np.array_equal(f, image) or np.array_equal(f, image[:, ::-1]) for f in flips)
    assert any(np.array_equal(f, image[:, ::-1]) for f in flips)
    rrc = aug.augment_image(image, aug.Augment(rrc_scale=(0.2, 0.5)), rng)
    assert rrc.shape == image.shape and rrc.dtype == np.uint8


def test_mixup_and_cutmix_weights_match_the_pixels():
    b, k = 6, 10
    images = np.arange(b, dtype=np.float32)[:, None, None, None] * np.ones((1, 8, 8, 1), np.float32)
    labels = np.arange(b)
    rng = np.random.default_rng(0)
    for _ in range(10):
        mixed, soft = aug.mix_batch(images, labels, k, aug.Augment(cutmix_alpha=1.0), rng)
        np.testing.assert_allclose(soft.sum(1), 1, rtol=1e-6)
        for i in range(b):
            partner = b - 1 - i
            frac = np.mean(mixed[i] == partner)
            np.testing.assert_allclose(soft[i, partner], frac, atol=1e-6)
            np.testing.assert_allclose(soft[i, i], 1 - frac, atol=1e-6)
        mixed, soft = aug.mix_batch(images, labels, k, aug.Augment(mixup_alpha=0.5), rng)
        lam = soft[0, 0]
        np.testing.assert_allclose(mixed, lam * images + (1 - lam) * images[::-1], rtol=1e-5)
    _, soft = aug.mix_batch(images, labels, k, aug.Augment(label_smoothing=0.1), rng)
    np.testing.assert_allclose(soft, 0.9 * np.eye(k)[labels] + 0.01, rtol=1e-6)


def test_pipeline_mixup_is_mixing_of_the_plain_batch():
    src = _ids_source(8, num_classes=8)
    plain = next(data.train_iterator(src, batch_size=4, seed=5, **SOLO))
    mixed = next(data.train_iterator(src, batch_size=4, seed=5, augment={'mixup_alpha': 1.0},
                                     **SOLO))
    np.testing.assert_array_equal(plain['label'], mixed['label'])
    lam = mixed['label_soft'][0, plain['label'][0]]
    assert 0 < lam < 1
    np.testing.assert_allclose(mixed['image'], lam * plain['image'] +
                               (1 - lam) * plain['image'][::-1], rtol=1e-5, atol=1e-6)


def test_augment_options_are_validated():
    with pytest.raises(data.DataError, match=r"\['flipp'\]"):
        data.Augment.create({'flipp': True})
    with pytest.raises(data.DataError, match='mix_prob'):
        data.Augment(mix_prob=1.5)
    with pytest.raises(data.DataError, match='crop_padding.*rrc_scale'):
        data.Augment(crop_padding=2, rrc_scale=(0.5, 1))
    from_cfg = data.Augment.create(ml_collections.ConfigDict({'rrc_scale': [0.5, 1.0]}))
    assert from_cfg.rrc_scale == (0.5, 1.0)
    assert not data.Augment().flip and not data.Augment().soft_labels


# ------------------------------------------------------------------------------------ config

def test_from_config_digits_and_errors():
    cfg = ml_collections.ConfigDict({'name': 'digits', 'image_size': 16,
                                     'augment': {'crop_padding': 1}})
    it, info = data.from_config(cfg, 'train', batch_size=32, seed=0, train=True, **SOLO)
    b = next(it)
    assert b['image'].shape == (32, 16, 16, 1) and info.num_classes == 10
    assert info.num_examples == 1433
    ev, info = data.from_config(cfg, 'test', batch_size=100, seed=0, train=False, **SOLO)
    assert sum(int(b['mask'].sum()) for b in ev) == 364 == info.num_examples
    with pytest.raises(data.DataError, match=r"'imagenet'.*digits"):
        data.from_config({'name': 'imagenet'}, 'train', batch_size=8, seed=0, train=True)
    with pytest.raises(data.DataError, match=r"\['img_size'\]"):
        data.from_config({'name': 'digits', 'img_size': 16}, 'train', batch_size=8, seed=0,
                         train=True)
    with pytest.raises(data.DataError, match='tfds_name'):
        data.from_config({'name': 'tfds'}, 'train', batch_size=8, seed=0, train=True)


def test_config_templates_choose_the_folder_and_tfds_sources(tmp_path):
    """`digits_vit:folder` / `digits_vit:tfds` hold the keys those sources read, so
    `--config.data.root=...` etc. are command-line overrides; the model fits the data."""
    import tensorflow_datasets as tfds

    from jlearngene.experiments import configs
    from jlearngene.models import model_config
    rng = np.random.default_rng(0)
    for split in ('train', 'test'):
        for label in ('cat', 'dog'):
            (tmp_path / 'img' / split / label).mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), np.uint8)).save(
                tmp_path / 'img' / split / label / 'a.png')
    c = configs.load('digits_vit:folder,smoke', {'data.root': str(tmp_path / 'img'),
                                                  'model.num_classes': 2})
    it, info = data.from_config(c.data, 'train', batch_size=4, seed=0, train=True, **SOLO)
    cfg = model_config(c.model)
    assert next(it)['image'].shape == (4, cfg.image_size, cfg.image_size, cfg.channels)
    assert info.num_classes == cfg.num_classes == 2 and c.model.depth == 2   # smoke applies too
    with tfds.testing.mock_data(num_examples=8, policy=tfds.testing.MockPolicy.USE_CODE):
        t = configs.load('digits_vit:tfds', {'data.data_dir': str(tmp_path)})
        it, info = data.from_config(t.data, 'test', batch_size=8, seed=0, train=False, **SOLO)
        cfg = model_config(t.model)
        assert next(it)['image'].shape == (8, cfg.image_size, cfg.image_size, cfg.channels)
        assert info.num_classes == cfg.num_classes
    with pytest.raises(data.DataError, match="'folder'.*'root'.*digits_vit:folder"):
        data.from_config(configs.load('digits_vit:folder').data, 'train', batch_size=4, seed=0,
                         train=True, **SOLO)
