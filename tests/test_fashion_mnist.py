"""The fashion_mnist source on tiny IDX files written here (default tier): reading gzipped and
raw files, the folder read, one-line errors naming the file, class subsets, the labelled
fraction and the validation part; and a few training steps on Debian's real files (slow)."""
import gzip
import os

import numpy as np
import pytest

from jlearngene import cli, data
from jlearngene.commands import run
from jlearngene.data import fashion, subsets
from jlearngene.experiments import configs
from jlearngene.models import model_config

REAL_DIR = fashion.DEBIAN_DIR
HOW = 'apt-get install dataset-fashion-mnist'
PER_CLASS, TEST_PER_CLASS = 20, 4


@pytest.fixture(autouse=True)
def _no_installed_data(monkeypatch, tmp_path):
    """Tests read only the files they write: no $JLEARNGENE_DATA, no Debian folder."""
    monkeypatch.delenv(fashion.ENV_VAR, raising=False)
    monkeypatch.setattr(fashion, 'DEBIAN_DIR', str(tmp_path / 'no_debian'))


def _idx(array: np.ndarray, magic: int) -> bytes:
    dims = b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
    return magic.to_bytes(4, 'big') + dims + array.astype(np.uint8).tobytes()


def _write(folder, name: str, payload: bytes, gz: bool):
    path = folder / (name + ('.gz' if gz else ''))
    path.write_bytes(gzip.compress(payload, 1) if gz else payload)
    return path


def _make(folder, *, gz=False, mark=0, per_class=PER_CLASS, test_per_class=TEST_PER_CLASS):
    """Four IDX files: example i of a split has label i % 10 and pixels (0, 0), (0, 1)
    holding i, pixel (0, 2) holding `mark` (which folder it came from)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (('train', per_class), ('test', test_per_class)):
        count = 10 * n
        images = np.zeros((count, 28, 28), np.uint8)
        images[:, 0, 0], images[:, 0, 1] = np.arange(count) % 256, np.arange(count) // 256
        images[:, 0, 2] = mark
        image_name, label_name = fashion.FILES[split]
        _write(folder, image_name, _idx(images, 0x803), gz)
        _write(folder, label_name, _idx(np.arange(count) % 10, 0x801), gz)
    return folder


def _ids(src) -> np.ndarray:
    """The original index of each example of a source built from `_make`'s files."""
    images = np.asarray(src.images, np.int64)
    return images[:, 0, 0, 0] + 256 * images[:, 0, 1, 0]


def _mark(src) -> int:
    return int(src.images[0, 0, 2, 0])


# ------------------------------------------------------------------------------ reading

def test_gzipped_and_raw_files_read_alike(tmp_path):
    raw, gz = _make(tmp_path / 'raw'), _make(tmp_path / 'gz', gz=True)
    for split, n in (('train', 10 * PER_CLASS), ('test', 10 * TEST_PER_CLASS)):
        a, b = data.fashion_mnist(split, root=str(raw)), data.fashion_mnist(split, root=str(gz))
        assert len(a) == len(b) == n
        np.testing.assert_array_equal(a.images, b.images)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.labels, np.arange(n) % 10)
        np.testing.assert_array_equal(_ids(a), np.arange(n))
    ex = a[3]
    assert ex['image'].shape == (28, 28, 1) and ex['image'].dtype == np.uint8 and ex['label'] == 3
    assert a.info.num_classes == 10 and a.info.image_shape == (28, 28, 1)
    assert a.info.mean == fashion.MEAN and a.info.std == fashion.STD
    assert a.info.class_names[0] == 'T-shirt/top' and a.info.split == 'test'


def test_one_folder_is_read_root_else_env_else_debian(tmp_path, monkeypatch):
    root, debian = _make(tmp_path / 'root', mark=1), _make(tmp_path / 'debian', mark=3)
    env = _make(tmp_path / 'env' / 'fashion_mnist', mark=2)
    monkeypatch.setattr(fashion, 'DEBIAN_DIR', str(debian))
    monkeypatch.setenv(fashion.ENV_VAR, str(tmp_path / 'env'))
    assert _mark(data.fashion_mnist('test', root=str(root))) == 1
    assert _mark(data.fashion_mnist('test')) == 2
    assert fashion.data_dir(str(root)) == (str(root), 'data.root')
    assert fashion.data_dir()[0] == str(env)
    monkeypatch.delenv(fashion.ENV_VAR)
    assert _mark(data.fashion_mnist('test')) == 3
    src = data.source_from_config({'name': 'fashion_mnist', 'root': str(root)}, 'test')
    assert _mark(src) == 1 and src.info.location == str(root)


def test_nothing_found_names_the_file_the_folder_and_how_to_get_it(tmp_path, monkeypatch):
    (tmp_path / 'root').mkdir()
    monkeypatch.setenv(fashion.ENV_VAR, str(tmp_path / 'env'))
    with pytest.raises(data.DataError) as e:
        data.fashion_mnist('train', root=str(tmp_path / 'root'))
    msg = str(e.value)
    assert '\n' not in msg and 'train-images-idx3-ubyte' in msg and HOW in msg
    assert str(tmp_path / 'root') in msg and 'data.root' in msg


def _magic(folder):
    images = np.zeros((10 * PER_CLASS, 28, 28), np.uint8)
    return _write(folder, fashion.FILES['train'][0], _idx(images, 0x801), False)


def _foreign(folder):
    return _write(folder, fashion.FILES['train'][0], b'<html>not found</html>' * 10, False)


def _truncated(folder):
    path = folder / fashion.FILES['train'][0]
    path.write_bytes(path.read_bytes()[:-100])
    return path


def _truncated_gz(folder):
    path = folder / (fashion.FILES['train'][0] + '.gz')
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    return path


def _not_gzip(folder):
    path = folder / (fashion.FILES['train'][1] + '.gz')
    path.write_bytes(_idx(np.arange(10 * PER_CLASS) % 10, 0x801))
    return path


def _trailing(folder):
    path = folder / fashion.FILES['train'][1]
    path.write_bytes(path.read_bytes() + b'\0')
    return path


def _wrong_size(folder):
    return _write(folder, fashion.FILES['train'][0],
                  _idx(np.zeros((10 * PER_CLASS, 27, 27), np.uint8), 0x803), False)


def _count_mismatch(folder):
    labels = np.arange(10 * PER_CLASS - 1) % 10
    _write(folder, fashion.FILES['train'][1], _idx(labels, 0x801), False)
    return folder / fashion.FILES['train'][0]   # the message names both files


def _label_range(folder):
    labels = np.arange(10 * PER_CLASS) % 10
    labels[7] = 10
    return _write(folder, fashion.FILES['train'][1], _idx(labels, 0x801), False)


def _missing(folder):
    path = folder / fashion.FILES['train'][1]
    path.unlink()
    return path


@pytest.mark.parametrize('breaker, gz, says', [
    (_magic, False, 'not an IDX images file'), (_foreign, False, 'not an IDX images file'),
    (_truncated, False, 'truncated'), (_truncated_gz, True, 'cannot be read'),
    (_not_gzip, True, 'cannot be read'), (_trailing, False, 'more bytes follow'),
    (_wrong_size, False, '27x27'), (_count_mismatch, False, 'labels'),
    (_label_range, False, 'label 10'), (_missing, False, 'missing')],
    ids=lambda x: getattr(x, '__name__', '').strip('_') or None)
def test_a_bad_file_is_one_line_naming_it(tmp_path, breaker, gz, says):
    folder = _make(tmp_path / 'd', gz=gz)
    path = breaker(folder)
    with pytest.raises(data.DataError) as e:
        data.fashion_mnist('train', root=str(folder))
    msg = str(e.value)
    assert '\n' not in msg and str(path) in msg and says in msg and HOW in msg
    data.fashion_mnist('test', root=str(folder))   # the other split's files still read


# ------------------------------------------------------------------------------ subsets

def test_classes_are_kept_and_relabelled_in_the_order_given(tmp_path):
    root = str(_make(tmp_path / 'd'))
    for split, n in (('train', PER_CLASS), ('test', TEST_PER_CLASS)):
        src = data.fashion_mnist(split, root=root, classes=(7, 2))
        assert src.info.num_classes == 2 and src.info.class_names == ('Sneaker', 'Pullover')
        original = _ids(src) % 10
        assert sorted(set(original)) == [2, 7] and len(src) == 2 * n
        np.testing.assert_array_equal(src.labels, np.where(original == 7, 0, 1))
        assert all(src[i]['label'] in (0, 1) for i in range(len(src)))


def test_fraction_and_validation_are_equal_per_class_nested_disjoint_and_fixed(tmp_path):
    root = str(_make(tmp_path / 'd'))
    task = dict(root=root, classes=(5, 6, 7, 8, 9), validation_per_class=4, subset_seed=0)
    small = data.fashion_mnist('train', label_fraction=0.1, **task)    # 0.1 * 100 / 5 = 2
    large = data.fashion_mnist('train', label_fraction=0.5, **task)    # 10 per class
    every = data.fashion_mnist('train', **task)                        # the 16 left per class
    val = data.fashion_mnist('validation', label_fraction=0.1, **task)
    for src, per in ((small, 2), (large, 10), (every, 16), (val, 4)):
        np.testing.assert_array_equal(np.bincount(src.labels, minlength=5), [per] * 5)
        np.testing.assert_array_equal(src.labels, _ids(src) % 10 - 5)
    s, l, e, v = (set(_ids(x)) for x in (small, large, every, val))
    assert s < l < e and not v & e
    assert v | e == {i for i in range(10 * PER_CLASS) if i % 10 >= 5}
    np.testing.assert_array_equal(_ids(val), _ids(data.fashion_mnist('validation', **task)))
    again = data.fashion_mnist('train', label_fraction=0.1, **task)
    np.testing.assert_array_equal(_ids(again), _ids(small))
    # A class's choice depends on the seed and the class alone, not on the other classes.
    alone = data.fashion_mnist('train', label_fraction=0.1, **{**task, 'classes': (9,)})
    assert set(_ids(alone)) == {i for i in s if i % 10 == 9}
    other = data.fashion_mnist('validation', **{**task, 'subset_seed': 1})
    assert set(_ids(other)) != v
    test = data.fashion_mnist('test', label_fraction=0.1, **task)
    assert len(test) == 5 * TEST_PER_CLASS   # the test split is never subsampled


def test_the_protocol_sizes_on_a_full_size_label_file():
    labels = np.repeat(np.arange(10), 6000)
    task = dict(classes=(5, 6, 7, 8, 9), validation_per_class=200, seed=0)
    one = subsets.subset_indices(labels, 'labelled', label_fraction=0.01, **task)
    ten = subsets.subset_indices(labels, 'labelled', label_fraction=0.1, **task)
    val = subsets.subset_indices(labels, 'validation', label_fraction=0.01, **task)
    assert (len(one), len(ten), len(val)) == (300, 3000, 1000)
    assert set(one) < set(ten) and not set(val) & set(ten)
    assert len(subsets.subset_indices(labels, 'all', classes=(5, 6, 7, 8, 9))) == 30000


def test_subset_serves_any_source():
    images = np.arange(30, dtype=np.uint8)[:, None, None] * np.ones((1, 4, 4), np.uint8)
    src = data.array_source(images, np.arange(30) % 3, class_names=('a', 'b', 'c'))
    part = data.subset(src, 'labelled', classes=(2, 0), validation_per_class=2, seed=3, split='x')
    assert part.info.num_classes == 2 and part.info.class_names == ('c', 'a')
    assert part.info.split == 'x' and len(part) == 16
    np.testing.assert_array_equal(part.labels, np.where(part.images[:, 0, 0, 0] % 3 == 2, 0, 1))


@pytest.mark.parametrize('options, says', [
    (dict(label_fraction=0.0), 'label_fraction'), (dict(label_fraction=1.5), 'label_fraction'),
    (dict(classes=(1, 1)), 'repeat'), (dict(classes=(3, 10)), '[10]'),
    (dict(validation_per_class=-1), 'validation_per_class'), (dict(subset_seed=-2), 'subset_seed'),
    (dict(classes='5'), 'sequence')])
def test_bad_selection_fields_fail_at_config_check(options, says):
    with pytest.raises(data.DataError) as e:
        data.check_config({'name': 'fashion_mnist', **options})
    assert says in str(e.value) and "'fashion_mnist'" in str(e.value)


def test_impossible_selections_are_clear(tmp_path):
    root = str(_make(tmp_path / 'd'))
    with pytest.raises(data.DataError, match='validation_per_class'):
        data.fashion_mnist('validation', root=root)
    with pytest.raises(data.DataError, match='fewer than the 19 validation'):
        data.fashion_mnist('train', root=root, validation_per_class=19, label_fraction=0.1)
    with pytest.raises(data.DataError, match='no example per class'):
        data.fashion_mnist('train', root=root, label_fraction=0.001)
    with pytest.raises(data.DataError, match="'validation', 'test'"):
        data.fashion_mnist('half_train', root=root)
    with pytest.raises(data.DataError, match='unknown keys'):
        data.check_config({'name': 'fashion_mnist', 'channels': 1})


# ------------------------------------------------------------------------------ pipelines and runs

def test_pipeline_normalises_with_the_sources_statistics_and_resizes_in_the_source(tmp_path):
    cfg = {'name': 'fashion_mnist', 'root': str(_make(tmp_path / 'd')), 'classes': (0, 1)}
    assert data.pipeline_image_size({**cfg, 'image_size': 16}) is None
    ev, info = data.from_config(cfg, 'test', batch_size=8, seed=0, train=False,
                                process_index=0, process_count=1)
    batch = next(ev)
    assert batch['image'].shape == (8, 28, 28, 1) and info.num_classes == 2
    np.testing.assert_allclose(batch['image'][0, 5, 5, 0], -fashion.MEAN[0] / fashion.STD[0],
                               rtol=1e-5)
    small = data.source_from_config({**cfg, 'image_size': 16}, 'train')
    assert small.info.image_shape == (16, 16, 1) and small[0]['image'].shape == (16, 16, 1)


def test_the_classification_config_takes_fashion_mnist_from_the_command_line(tmp_path, monkeypatch):
    _make(tmp_path / 'data' / 'fashion_mnist', gz=True)
    monkeypatch.setenv(fashion.ENV_VAR, str(tmp_path / 'data'))
    config = configs.load('digits_vit:smoke', {
        'data.name': 'fashion_mnist', 'data.image_size': '28', 'model.image_size': '28',
        'model.patch_size': '7', 'batch_size': '32', 'eval_batch_size': '16'}, from_text=True)
    sources = run.check_run_data(config, model_config(config.model))
    assert len(sources['train']) == 10 * PER_CLASS and len(sources['eval']) == 10 * TEST_PER_CLASS
    config.unlock()
    config.data.update(classes=(5, 6, 7, 8, 9), label_fraction=0.5, validation_per_class=2)
    config.model.num_classes, config.eval_split = 5, 'validation'
    configs.validate(config)
    sources = run.check_run_data(config, model_config(config.model))
    assert (len(sources['train']), len(sources['eval'])) == (50, 10)


@pytest.mark.slow
def test_a_few_training_steps_on_the_real_files(tmp_path, monkeypatch):
    if not all(any(os.path.isfile(os.path.join(REAL_DIR, n + ext)) for ext in ('', '.gz'))
               for names in fashion.FILES.values() for n in names):
        pytest.skip(f'Fashion-MNIST is not installed in {REAL_DIR} (apt-get install '
                    'dataset-fashion-mnist)')
    monkeypatch.setattr(fashion, 'DEBIAN_DIR', REAL_DIR)
    train, test = data.fashion_mnist('train'), data.fashion_mnist('test')
    assert (len(train), len(test)) == (60000, 10000)
    np.testing.assert_array_equal(np.bincount(train.labels), [6000] * 10)
    task = dict(classes=(5, 6, 7, 8, 9), validation_per_class=200)
    one, ten = (data.fashion_mnist('train', label_fraction=f, **task) for f in (0.01, 0.1))
    val = data.fashion_mnist('validation', **task)
    test = data.fashion_mnist('test', **task)
    assert (len(one), len(ten), len(val), len(test)) == (300, 3000, 1000, 5000)
    workdir = str(tmp_path / 'run')
    assert cli.main(['train', '--config', 'digits_vit:smoke', '--config.data.name=fashion_mnist',
                     '--config.data.image_size=28', '--config.model.image_size=28',
                     '--config.model.patch_size=7', '--config.steps=4', '--config.batch_size=32',
                     '--config.eval_batch_size=1000', '--config.eval_every=4',
                     '--config.log_every=2', '--workdir', workdir, '--noprogress']) == 0
    assert os.path.isdir(os.path.join(workdir, 'model'))


def test_the_fashion_mnist_config_takes_every_selection_field_on_the_command_line():
    from jlearngene.commands import train
    args = train.parse_flags(['--config', 'digits_vit:fashion_mnist', '--config.data.classes=5,6,7,8,9',
                              '--config.model.num_classes=5', '--config.data.label_fraction=0.01',
                              '--config.data.validation_per_class=200', '--workdir=w'], 'p')
    data = args.config.data
    assert data.name == 'fashion_mnist' and tuple(data.classes) == (5, 6, 7, 8, 9)
    assert (data.label_fraction, data.validation_per_class, data.image_size) == (0.01, 200, 28)
    assert (args.config.model.image_size, args.config.model.patch_size) == (28, 7)
