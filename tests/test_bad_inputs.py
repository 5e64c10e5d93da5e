"""Every file reader fed empty, truncated, random and wrong-schema files: each raises its
documented error type (never another), or, for a checkpoint file that holds nothing the
load needs, returns exactly what was saved; and none of them changes its input."""
import glob
import json
import os
import shutil

import jax
import numpy as np
import pytest
from PIL import Image

from jlearngene.data import DataError, image_folder
from jlearngene.interop import timm
from jlearngene.models import init, vit_config
from jlearngene.train import checkpoint, trainer


RNG = np.random.default_rng(0)
MANGLES = {
    'empty': lambda b: b'',
    'truncated': lambda b: b[:len(b) // 2],
    'random': lambda b: RNG.integers(0, 256, max(len(b), 16), np.uint8).tobytes(),
}
CFG = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                 num_classes=3)


def _fingerprint(root) -> dict:
    files = [root] if os.path.isfile(root) else sorted(
        f for f in glob.glob(os.path.join(root, '**'), recursive=True) if os.path.isfile(f))
    return {f: (open(f, 'rb').read(), os.stat(f).st_mtime_ns) for f in files}


def _raises_only(error, read, target):
    """`read()` raises `error` (another type fails the test) and `target` is unchanged."""
    before = _fingerprint(target)
    with pytest.raises(error) as e:
        read()
    assert _fingerprint(target) == before, 'a reader changed its input'
    assert str(e.value).strip(), 'an empty message'
    return str(e.value)


def _mangled(tmp_path, name: str, data: bytes) -> str:
    path = str(tmp_path / name)
    with open(path, 'wb') as f:
        f.write(data)
    return path


# ------------------------------------------------------------------------ state dict files

@pytest.fixture(scope='module')
def state_dict():
    return timm.to_timm(jax.jit(init, static_argnums=0)(CFG, jax.random.key(0)), CFG)


def _safetensors_bytes(tmp_path, sd) -> bytes:
    return open(timm.save_safetensors(sd, str(tmp_path / 'good.safetensors')), 'rb').read()


def test_safetensors_readers(tmp_path, state_dict):
    good = _safetensors_bytes(tmp_path, state_dict)
    n = int.from_bytes(good[:8], 'little')
    header = json.loads(good[8:8 + n])
    bad_header = dict(header, **{'pos_embed': {'dtype': 'F32', 'shape': [1, 4, 16]}})  # no offsets
    cases = {k: m(good) for k, m in MANGLES.items()}
    cases |= {
        'huge header length': (2 ** 40).to_bytes(8, 'little') + good[8:],
        'header not JSON': len(b'{oops').to_bytes(8, 'little') + b'{oops',
        'header a list': len(b'[1, 2]').to_bytes(8, 'little') + b'[1, 2]',
        'tensor without offsets': (lambda h: len(h).to_bytes(8, 'little') + h + good[8 + n:])(
            json.dumps(bad_header).encode()),
    }
    for name, data in cases.items():
        path = _mangled(tmp_path, name.replace(' ', '_') + '.safetensors', data)
        message = _raises_only(timm.StateDictError, lambda: timm.load_state_dict(path), path)
        assert repr(path) in message, (name, message)
        if name not in ('truncated', 'tensor without offsets'):   # headers that cannot be parsed
            _raises_only(timm.StateDictError, lambda: timm.read_safetensors_metadata(path), path)
    # a readable file of another model: the converter lists what does not fit
    other = _mangled(tmp_path, 'other.safetensors',
                     _safetensors_bytes(tmp_path, {'x': np.ones(3, np.float32)}))
    _raises_only(timm.StateDictError, lambda: timm.from_timm(timm.load_state_dict(other)), other)


def test_npz_reader(tmp_path, state_dict):
    np.savez(tmp_path / 'good.npz', **state_dict)
    good = open(tmp_path / 'good.npz', 'rb').read()
    cases = {k: m(good) for k, m in MANGLES.items()}
    np.save(tmp_path / 'plain.npy', np.ones(3))
    cases['an .npy, not an archive'] = open(tmp_path / 'plain.npy', 'rb').read()
    np.savez(tmp_path / 'objects.npz', x=np.array([{'a': 1}], dtype=object))
    cases['object array'] = open(tmp_path / 'objects.npz', 'rb').read()
    for name, data in cases.items():
        path = _mangled(tmp_path, name.replace(' ', '_').replace(',', '') + '.npz', data)
        message = _raises_only(timm.StateDictError, lambda: timm.load_state_dict(path), path)
        assert 'allow_pickle' not in message, message


def test_torch_reader(tmp_path, state_dict):
    torch = pytest.importorskip('torch')
    torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, tmp_path / 'good.pth')
    good = open(tmp_path / 'good.pth', 'rb').read()
    for name, mangle in MANGLES.items():
        path = _mangled(tmp_path, f'{name}.pth', mangle(good))
        _raises_only(timm.StateDictError, lambda: timm.load_state_dict(path), path)


# ------------------------------------------------------------------------------ checkpoints

def _each_mangled_file(root: str, tmp_path):
    """Yields (file, mode) after replacing that one file of a fresh copy of `root` (in place
    at `root`'s path) by its mangled bytes."""
    pristine = str(tmp_path / 'pristine')
    shutil.copytree(root, pristine)
    files = sorted(os.path.relpath(f, pristine) for f in glob.glob(os.path.join(pristine, '**'),
                                                                     recursive=True) if os.path.isfile(f))
    for i, rel in enumerate(files):
        mode = list(MANGLES)[i % len(MANGLES)]   # every mode, spread over the files
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        with open(os.path.join(root, rel), 'r+b') as f:
            data = MANGLES[mode](f.read())
            f.seek(0)
            f.truncate()
            f.write(data)
        yield rel, mode


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))) and \
        jax.tree.structure(a) == jax.tree.structure(b)


def test_model_artefact_reader(tmp_path):
    params = jax.jit(init, static_argnums=0)(CFG, jax.random.key(1))
    path = checkpoint.save_model(str(tmp_path / 'model'), params, CFG)
    outcomes = {}
    for rel, mode in _each_mangled_file(path, tmp_path):
        before = _fingerprint(path)
        try:
            loaded, _, _ = checkpoint.load_model(path)
        except checkpoint.CheckpointError:
            outcomes[rel] = 'refused'
        else:
            assert _same(jax.device_get(loaded), jax.device_get(params)), (rel, mode)
            outcomes[rel] = 'unused'
        assert _fingerprint(path) == before, rel
    assert outcomes[os.path.join('params', 'manifest.ocdbt')] == 'refused', outcomes
    _raises_only(checkpoint.CheckpointError, lambda: checkpoint.load_model(str(tmp_path / 'nothing')),
                 str(tmp_path))


def test_run_checkpoint_reader(tmp_path):
    import optax
    params = jax.jit(init, static_argnums=0)(CFG, jax.random.key(2))
    state = jax.jit(trainer.init_state, static_argnums=(1,))(params, optax.sgd(0.1))
    with checkpoint.RunCheckpointer(tmp_path / 'run') as ck:
        root = ck.save(3, state, data_state={'consumed': 3})
    outcomes = {}
    for rel, mode in _each_mangled_file(root, tmp_path):
        before = _fingerprint(root)
        try:
            with checkpoint.RunCheckpointer(tmp_path / 'run') as ck:
                loaded, _ = ck.restore(state)
        except checkpoint.CheckpointError:
            outcomes[rel] = 'refused'
        else:
            assert _same(jax.device_get(loaded), jax.device_get(state)), (rel, mode)
            outcomes[rel] = 'unused'
        assert _fingerprint(root) == before, rel
    assert outcomes[os.path.join('state', 'manifest.ocdbt')] == 'refused', outcomes


# ---------------------------------------------------------------------------- image folders

def test_image_folder_reader(tmp_path):
    root = tmp_path / 'images'
    for label in ('a', 'b'):
        (root / 'train' / label).mkdir(parents=True)
        Image.fromarray(RNG.integers(0, 256, (8, 8, 3), np.uint8)).save(root / 'train' / label / 'x.png')
    good = open(root / 'train' / 'a' / 'x.png', 'rb').read()

    def read_all():
        src = image_folder(str(root), 'train')
        return [src[i] for i in range(len(src))]
    assert len(read_all()) == 2
    for name, mangle in {**MANGLES, 'text': lambda b: b'not an image\n'}.items():
        (root / 'train' / 'a' / 'x.png').write_bytes(mangle(good))
        message = _raises_only(DataError, read_all, str(root))
        assert 'x.png' in message, (name, message)
    (root / 'train' / 'a' / 'x.png').write_bytes(good)
    _raises_only(DataError, lambda: image_folder(str(root), 'test'), str(root))          # no split
    _raises_only(DataError, lambda: image_folder(str(root / 'train' / 'a'), 'x.png'), str(root))
    _raises_only(DataError, lambda: image_folder(str(tmp_path / 'missing'), 'train'), str(root))
