"""Faults, round five (data, diagnostics, state dicts, ops): each test names the fault it guards
against.

A scalar normalisation refused with a TypeError, a crop padding wider than the image, an empty
class list, a numpy integer image size, an unknown resize method that passes where no resize is
needed, a state dict file with no arrays read as {}, a directory called missing, an empty
environment switch read as on, and 3-D keys that reach the attention math."""
import jax
import numpy as np
import pytest
from PIL import Image

from jlearngene import diagnostics, ops
from jlearngene.data import augment, sources, subsets
from jlearngene.data.sources import DataError
from jlearngene.interop import state_dict as SD
from jlearngene.models import vit, vit_config


# ---- 1. normalise with one scalar mean/std

def test_normalise_takes_a_scalar_mean_and_std():
    images = np.full((2, 4, 4, 3), 0.75, np.float32)
    out = np.asarray(diagnostics.normalise(images, 0.5, 0.5))
    np.testing.assert_allclose(out, 0.5)
    official = np.asarray(diagnostics.normalise(images, 0.5, 0.25, official=True))
    np.testing.assert_allclose(official, (0.75 - 127.5) / 63.75, rtol=1e-6)


def test_normalise_wrong_length_is_a_clear_value_error():
    with pytest.raises(ValueError, match=r'normalise: mean \(0\.1, 0\.2\) and std \(0\.1, 0\.2\)'):
        diagnostics.normalise(np.zeros((1, 2, 2, 3)), (0.1, 0.2), (0.1, 0.2))
    with pytest.raises(ValueError, match='normalise: mean'):
        diagnostics.normalise(np.zeros((1, 2, 2, 3)), 0.5, (0.5, 0.5, 0.5))


def test_mean_attention_distance_takes_a_scalar_mean_and_std():
    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                     num_classes=3, channels=1)
    params = vit.init(cfg, jax.random.key(0))
    images = np.random.default_rng(0).random((2, 8, 8, 1)).astype(np.float32)
    got = diagnostics.mean_attention_distance(params, cfg, [images], mean=0.5, std=0.5)
    want = diagnostics.mean_attention_distance(params, cfg, [images], mean=(0.5,), std=(0.5,))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))


# ---- 2. crop padding as wide as the image

def test_shift_crop_refuses_a_pad_as_wide_as_the_image():
    image = np.ones((4, 6, 1), np.uint8)
    rng = np.random.default_rng(0)
    with pytest.raises(DataError, match=r'crop_padding 4 .* 4x6'):
        augment.augment_image(image, augment.Augment(crop_padding=4), rng)
    with pytest.raises(DataError, match=r'shift_crop: pad 9 .* 4x6'):
        augment.shift_crop(image, 9, rng)
    assert augment.shift_crop(image, 3, rng).shape == image.shape


# ---- 3. relabel with no classes

def test_relabel_refuses_empty_classes():
    with pytest.raises(DataError, match='relabel: classes is empty'):
        subsets.relabel([0, 1, 2], ())
    np.testing.assert_array_equal(subsets.relabel([0, 1, 2], None), [0, 1, 2])


# ---- 4. numpy integer image sizes; an unknown resize method checked up front

def _folder(tmp_path):
    for split in ('train',):
        d = tmp_path / split / 'a'
        d.mkdir(parents=True)
        Image.fromarray(np.zeros((5, 7), np.uint8)).save(d / 'x.png')
    return str(tmp_path)


def test_image_folder_takes_a_numpy_integer_image_size(tmp_path):
    src = sources.image_folder(_folder(tmp_path), 'train', image_size=np.int64(8))
    assert src.info.image_shape == (8, 8, 1)
    assert all(type(d) is int for d in src.info.image_shape)
    assert src[0]['image'].shape == (8, 8, 1)


def test_resize_takes_a_numpy_integer_size():
    assert sources.resize(np.zeros((4, 4, 1), np.uint8), np.int32(2)).shape == (2, 2, 1)


def test_unknown_resize_method_is_refused_where_no_resize_is_needed(tmp_path):
    with pytest.raises(DataError, match="unknown resize method 'bogus'"):
        sources.digits(image_size=8, resize_method='bogus')
    with pytest.raises(DataError, match="unknown resize method 'bogus'"):
        sources.resize(np.zeros((4, 4, 1), np.uint8), 4, 'bogus')
    with pytest.raises(DataError, match="unknown resize method 'bogus'"):
        sources.image_folder(_folder(tmp_path), 'train', resize_method='bogus')


# ---- 5. state dict files with no arrays; a directory as the path

def test_npz_with_no_arrays_is_a_state_dict_error(tmp_path):
    path = str(tmp_path / 'empty.npz')
    np.savez(path)
    with pytest.raises(SD.StateDictError, match=r"empty\.npz' holds no arrays"):
        SD.load_state_dict(path)


def test_safetensors_with_no_arrays_is_a_state_dict_error(tmp_path):
    path = SD.save_safetensors({}, str(tmp_path / 'empty.safetensors'))
    with pytest.raises(SD.StateDictError, match=r"empty\.safetensors' holds no arrays"):
        SD.load_state_dict(path)


def test_a_directory_is_named_a_directory(tmp_path):
    d = tmp_path / 'weights.safetensors'
    d.mkdir()
    with pytest.raises(IsADirectoryError, match='is a directory, not a file'):
        SD.load_state_dict(str(d))
    with pytest.raises(FileNotFoundError, match='does not exist'):
        SD.load_state_dict(str(tmp_path / 'missing.npz'))


# ---- 6. an empty switch means unset; k and v must be 4-D

@pytest.mark.parametrize('default', [False, True])
def test_empty_env_switch_reads_as_its_default(monkeypatch, default):
    monkeypatch.setenv('JLEARNGENE_TEST_SWITCH', '  ')
    assert ops.env_switch_on('JLEARNGENE_TEST_SWITCH', default=default) is default
    monkeypatch.setenv('JLEARNGENE_TEST_SWITCH', 'on')
    assert ops.env_switch_on('JLEARNGENE_TEST_SWITCH', default=False) is True


def test_attention_refuses_3d_keys_and_values():
    q = np.zeros((2, 5, 4, 4), np.float32)     # H == Dh: a 3-D k (B, T, Dh) used to pass
    k = np.zeros((2, 5, 4), np.float32)
    with pytest.raises(ValueError, match=r'attention: expected q \(B, Tq, H, Dh\) and k, v'):
        ops.attention(q, k, k, 0.5)
