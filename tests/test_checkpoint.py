"""Model artefacts and run checkpoints: round trips, retention, refusals, corruption."""
import glob
import json
import os
import re
import shutil
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import parallel, pytree
from jlearngene.models import init, unstack_blocks
from jlearngene.train import checkpoint, integrity, optim, run_checkpoint
from jlearngene.train import state as state_lib


def _data_files(path):
    files = [f for f in glob.glob(os.path.join(path, '**', 'd', '*'), recursive=True) if os.path.isfile(f)]
    assert files, f'no data files under {path}'
    return files


_init = jax.jit(init, static_argnums=0)


@pytest.fixture
def params(tiny_cfg):
    return _init(tiny_cfg, jax.random.key(0))


@pytest.mark.parametrize('layout', ['stacked', 'list'])
def test_model_round_trip(tmp_path, tiny_cfg, params, layout):
    p = params if layout == 'stacked' else unstack_blocks(params)
    path = checkpoint.save_model(tmp_path / 'm', p, tiny_cfg, extra={'method': 'tleg', 'depths': [3, 6]})
    loaded, cfg, extra = checkpoint.load_model(path, expect_cfg=tiny_cfg)
    chex.assert_trees_all_equal(loaded, p)
    assert cfg == tiny_cfg
    assert extra == {'method': 'tleg', 'depths': [3, 6]}
    meta = checkpoint.model_metadata(path)
    assert meta['layout'] == layout


def test_model_refuses_other_config_and_overwrite(tmp_path, tiny_cfg, params):
    path = checkpoint.save_model(tmp_path / 'm', params, tiny_cfg)
    with pytest.raises(integrity.CheckpointError, match=r'depth.*3.*6'):
        checkpoint.load_model(path, expect_cfg=tiny_cfg.replace(depth=6))
    with pytest.raises(integrity.CheckpointError, match=re.escape(str(path))):
        checkpoint.save_model(path, params, tiny_cfg)
    with pytest.raises(TypeError, match='object'):
        checkpoint.save_model(tmp_path / 'm2', params, tiny_cfg, extra={'x': object()})


def test_model_missing_truncated_corrupted(tmp_path, tiny_cfg, params):
    with pytest.raises(integrity.CheckpointError, match=re.escape(str(tmp_path / 'nope'))):
        checkpoint.load_model(tmp_path / 'nope')
    path = checkpoint.save_model(tmp_path / 'm', params, tiny_cfg)
    for f in _data_files(path):  # truncate every data file
        b = open(f, 'rb').read()
        open(f, 'wb').write(b[: len(b) // 2])
    with pytest.raises(integrity.CheckpointError, match='corrupted'):
        checkpoint.load_model(path)
    path = checkpoint.save_model(tmp_path / 'm2', params, tiny_cfg)
    os.remove(os.path.join(path, 'commit_success.txt'))  # an interrupted write
    with pytest.raises(integrity.CheckpointError, match=re.escape(str(path)) + '.*orbax'):
        checkpoint.load_model(path)


def _state(params, tiny_cfg):
    tx = optim.make_optimizer({'lr': 1e-3, 'warmup_steps': 1, 'freeze': ('patch_embed/.*',)}, params,
                              total_steps=10)
    return jax.jit(state_lib.init_state, static_argnums=(1, 2))(params, tx, 3)


def test_run_round_trip_retention_and_best(tmp_path, tiny_cfg, params):
    state = _state(params, tiny_cfg)
    ck = run_checkpoint.RunCheckpointer(tmp_path / 'c', keep=2, best_metric='acc')
    accs = [0.5, 0.9, 0.1, 0.2, 0.3]
    for step, acc in enumerate(accs, 1):
        s = dict(state, step=jnp.int32(step))
        ck.save(step, s, data_state={'pos': step, 'blob': b'\x00\x01'}, config={'steps': 5},
                model_config=tiny_cfg, metrics={'acc': acc})
    assert ck.steps() == [2, 4, 5]      # latest two plus the best (step 2, acc 0.9)
    assert ck.best_step() == 2 and ck.latest_step() == 5
    restored, meta = ck.restore(state, model_config=tiny_cfg)
    assert meta['data_state'] == {'pos': 5, 'blob': b'\x00\x01'}
    assert meta['config'] == {'steps': 5}
    assert int(restored['step']) == 5
    chex.assert_trees_all_equal(restored['params'], state['params'])
    assert jax.tree.structure(restored) == jax.tree.structure(state)  # optax NamedTuples back
    ck.close()


def test_run_refuses_other_model(tmp_path, tiny_cfg, params):
    state = _state(params, tiny_cfg)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        _refusals(ck, state, params, tiny_cfg)


def _refusals(ck, state, params, tiny_cfg):
    ck.save(1, state, model_config=tiny_cfg)
    with pytest.raises(integrity.CheckpointError, match=r'width.*32.*64'):
        ck.restore(state, model_config=tiny_cfg.replace(width=64, num_heads=2))
    bigger = jax.eval_shape(lambda: _state(init(tiny_cfg.replace(depth=4), jax.random.key(0)), tiny_cfg))
    with pytest.raises(integrity.CheckpointError, match=r'blocks/attn/q/kernel \(3, 32, 2, 16\)'):
        ck.restore(bigger)
    other = jax.eval_shape(lambda: state_lib.init_state(params, optim.make_optimizer({'lr': 1e-3}, params,
                                                                                    total_steps=10)))
    with pytest.raises(integrity.CheckpointError, match='only in the checkpoint'):
        ck.restore(other)


def test_run_truncated(tmp_path, tiny_cfg, params):
    state = _state(params, tiny_cfg)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(1, state)
        for f in _data_files(path):
            open(f, 'wb').write(open(f, 'rb').read()[:10])
        with pytest.raises(integrity.CheckpointError, match='corrupted'):
            ck.restore(state)
    with run_checkpoint.RunCheckpointer(tmp_path / 'empty') as ck:
        with pytest.raises(integrity.CheckpointError, match=re.escape(str(tmp_path / 'empty'))):
            ck.restore(state)


def test_json_helpers():
    obj = {'a': (1, 2), 'b': b'xyz', 'c': np.float32(0.5), 'd': None}
    assert checkpoint.from_json(checkpoint.to_json(obj)) == {'a': [1, 2], 'b': b'xyz', 'c': 0.5, 'd': None}


def test_run_state_is_a_structured_tree_plain_orbax_reads(tmp_path, tiny_cfg, params):
    from orbax.checkpoint import v1 as ocp
    state = _state(params, tiny_cfg)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(7, dict(state, step=jnp.int32(7)))
        shapes = ck.array_shapes(7)
    with warnings.catch_warnings():   # no target tree given: orbax says it reads the shardings from file
        warnings.filterwarnings('ignore', 'Sharding info not provided', UserWarning)
        stored = ocp.load_checkpointables(path)['state']
    assert set(stored) == {'params', 'opt_state', 'step', 'rng'}
    chex.assert_trees_all_equal(stored['params'], jax.device_get(params))
    assert int(stored['step']) == 7
    # optax's NamedTuples and tuples become dicts keyed by field name or index.
    flat_opt = {f'opt_state/{k}' for k in pytree.flatten(stored['opt_state'])}
    assert flat_opt == {k for k in pytree.flatten(state) if k.startswith('opt_state/')}
    assert any(k.endswith('/mu/blocks/attn/q/kernel') for k in flat_opt)
    assert shapes['params']['blocks']['attn']['q']['kernel'].shape == params['blocks']['attn']['q']['kernel'].shape


def test_restore_params_alone(tmp_path, tiny_cfg, params, monkeypatch):
    state = _state(params, tiny_cfg)
    mesh = parallel.make_mesh()
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        ck.save(3, state, model_config=tiny_cfg)
        loaded = []
        real = run_checkpoint.ocp.load_checkpointables

        def spy(path, abstract=None):
            loaded.append(set(abstract['state']))
            return real(path, abstract)
        monkeypatch.setattr(run_checkpoint.ocp, 'load_checkpointables', spy)
        # Into a target's structure and shardings (no optimiser state is built or read).
        target = jax.eval_shape(lambda: init(tiny_cfg, jax.random.key(0)))
        sh = parallel.param_shardings(target, mesh, 'fsdp', min_size=0)
        target = jax.tree.map(lambda t, s: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s), target, sh)
        got, meta = ck.restore_params(target, model_config=tiny_cfg)
        assert loaded == [{'params'}] and meta['step'] == 3
        chex.assert_trees_all_equal(got, params)
        assert got['blocks']['mlp']['fc1']['kernel'].sharding == sh['blocks']['mlp']['fc1']['kernel']
        # Without a target: the stored shapes as nested dicts on one device.
        plain, _ = ck.restore_params()
        chex.assert_trees_all_equal(plain, params)
        parts, _ = ck.restore_subset({'params': target, 'step': jax.ShapeDtypeStruct((), jnp.int32)})
        assert int(parts['step']) == 0 and set(parts) == {'params', 'step'}
        with pytest.raises(integrity.CheckpointError, match=r'depth.*3.*4'):
            ck.restore_params(target, model_config=tiny_cfg.replace(depth=4))
        wrong = jax.eval_shape(lambda: init(tiny_cfg.replace(num_classes=4), jax.random.key(0)))
        with pytest.raises(integrity.CheckpointError, match=r'params/head/kernel \(32, 10\).*\(32, 4\)'):
            ck.restore_params(wrong)


def test_run_damaged_data_file_is_refused(tmp_path, tiny_cfg, params):
    """orbax's own validation of the arrays' data file: a file cut short of the byte ranges
    its index names, and one whose zarr shard indices fail their CRC32C (random bytes of
    the same length), each refuse the checkpoint in one line."""
    state = _state(params, tiny_cfg)
    rng = np.random.default_rng(0)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(1, state)
        pristine = str(tmp_path / 'pristine')
        shutil.copytree(path, pristine)
        f = max(_data_files(path), key=os.path.getsize)   # the arrays' data
        rel = os.path.relpath(f, path)
        mangles = {'cut short': (lambda b: b[:len(b) // 2], 'byte range'),
                   'random': (lambda b: rng.integers(0, 256, len(b), np.uint8).tobytes(), 'digest')}
        for name, (mangle, cause) in mangles.items():
            shutil.rmtree(path)
            shutil.copytree(pristine, path)
            data = open(os.path.join(pristine, rel), 'rb').read()
            open(os.path.join(path, rel), 'wb').write(mangle(data))
            with pytest.raises(integrity.CorruptCheckpointError, match='corrupted') as e:
                ck.restore(state)
            message = str(e.value)
            assert str(path) in message and cause in message.lower() and '\n' not in message, (name, message)
            with pytest.raises(integrity.CorruptCheckpointError, match='corrupted'):
                ck.restore_params()


def _flip(src, dst, rel, pos):
    """`dst`: a fresh copy of checkpoint `src` with one byte of its file `rel` flipped."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    data = bytearray(open(os.path.join(src, rel), 'rb').read())
    data[pos] ^= 0x10
    open(os.path.join(dst, rel), 'wb').write(bytes(data))


def test_run_flipped_byte_is_refused_naming_the_array(tmp_path, tiny_cfg, params):
    """A byte flipped inside the arrays' data file still decompresses (orbax's zstd frames
    carry no checksum) but fails the stored checksums: refused in one line naming the
    changed arrays, never loaded as other values."""
    state = _state(params, tiny_cfg)
    paths = set(pytree.flatten(state))
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(1, state)
        pristine = str(tmp_path / 'pristine')
        shutil.copytree(path, pristine)
        f = max(_data_files(path), key=os.path.getsize)   # the arrays' data
        rel, size = os.path.relpath(f, path), os.path.getsize(f)
        by_checksum = 0
        for k in range(1, 8):
            _flip(pristine, path, rel, size * k // 8)
            with pytest.raises(integrity.CorruptCheckpointError, match='corrupted') as e:
                ck.restore(state)
            message = str(e.value)
            assert str(path) in message and '\n' not in message, (k, message)
            named = re.search(r'stored checksums \(([^)]*)\)', message)
            if named:
                by_checksum += 1
                assert set(named.group(1).split(', ')) <= paths, message
        assert by_checksum >= 5, by_checksum
        _flip(pristine, path, rel, size // 2)
        with pytest.raises(integrity.CorruptCheckpointError, match=r'checksums \(params/'):
            ck.restore_params()


def test_model_flipped_byte_is_refused(tmp_path, tiny_cfg, params):
    path = checkpoint.save_model(tmp_path / 'm', params, tiny_cfg)
    assert set(checkpoint.model_metadata(path)['checksums']) == set(pytree.flatten(params))
    pristine = str(tmp_path / 'pristine')
    shutil.copytree(path, pristine)
    f = max(_data_files(path), key=os.path.getsize)
    _flip(pristine, path, os.path.relpath(f, path), os.path.getsize(f) // 2)
    with pytest.raises(integrity.CorruptCheckpointError, match=r'stored checksums \([a-z_/0-9]+'):
        checkpoint.load_model(path)


def test_checkpoint_without_checksums_loads(tmp_path, tiny_cfg, params):
    """Checkpoints stored without the 'checksums' field load, unverified."""
    state = _state(params, tiny_cfg)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(1, state)
        meta_file = os.path.join(path, '_CHECKPOINT_METADATA')
        with open(meta_file) as fh:
            meta = json.load(fh)
        for k in ('checksum', 'checksums'):
            del meta['custom_metadata'][k]
        with open(meta_file, 'w') as fh:
            json.dump(meta, fh)
        assert 'checksums' not in ck.metadata(1)
        restored, _ = ck.restore(state)
    chex.assert_trees_all_equal(restored, state)


def test_checksums_on_device():
    mesh = parallel.make_mesh()
    tree = {'f32': jnp.arange(64, dtype=jnp.float32).reshape(8, 8), 'bf16': jnp.ones(16, jnp.bfloat16),
            'i8': jnp.arange(24, dtype=jnp.int8), 'flag': jnp.array([True, False]), 'step': jnp.int32(5),
            'rng': jax.random.key(3)}
    sums = integrity.tree_checksums(tree)
    assert set(sums) == set(tree) and all(0 <= v < 2 ** 32 for v in sums.values())
    sharded = dict(tree, f32=jax.device_put(tree['f32'], jax.NamedSharding(mesh, jax.P('data'))))
    assert integrity.tree_checksums(sharded) == sums          # exact for any sharding
    for name in ('f32', 'bf16', 'i8'):                          # every single-byte change shows
        raw = np.asarray(tree[name]).reshape(-1).view(np.uint8).copy()
        for pos in (0, raw.size // 2, raw.size - 1):
            changed = raw.copy()
            changed[pos] ^= 0x80
            other = jnp.asarray(changed.view(np.asarray(tree[name]).dtype).reshape(tree[name].shape))
            assert integrity.tree_checksums({name: other})[name] != sums[name], (name, pos)
    swapped = {'f32': tree['f32'][::-1]}                        # position matters
    assert integrity.tree_checksums(swapped)['f32'] != sums['f32']
    with pytest.raises(ValueError, match='complex64'):
        integrity.tree_checksums({'c': jnp.ones(2, jnp.complex64)})


def test_resume_falls_back_past_a_flipped_byte(tmp_path):
    from test_trainer import _fit   # its shared tiny run
    _fit(tmp_path, 4, checkpoint_every=2)
    latest = tmp_path / 'checkpoints' / '4'
    f = max(_data_files(str(latest)), key=os.path.getsize)
    data = bytearray(open(f, 'rb').read())
    data[len(data) // 2] ^= 0x10
    open(f, 'wb').write(bytes(data))
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.steps() == [2, 4]
    _fit(tmp_path, 6, checkpoint_every=2)
    assert os.path.isdir(tmp_path / 'checkpoints.unreadable' / '4')
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.steps() == [4, 6]   # step 4 saved again, from step 2


def test_run_refuses_the_old_flat_format(tmp_path, tiny_cfg, params):
    import json
    state = _state(params, tiny_cfg)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(1, state)
    meta_file = os.path.join(path, '_CHECKPOINT_METADATA')
    meta = json.load(open(meta_file))
    meta['custom_metadata']['format'] = 'jlearngene.run/1'
    json.dump(meta, open(meta_file, 'w'))
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        with pytest.raises(integrity.CheckpointError,
                           match=r"'jlearngene\.run/1'.*'jlearngene\.run/2'"):
            ck.restore(state)


def test_unreadable_files_give_one_short_message_and_no_orbax_noise(tmp_path, tiny_cfg, params, caplog):
    state = _state(params, tiny_cfg)
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        path = ck.save(1, state)
    pristine = tmp_path / 'pristine'
    shutil.copytree(path, pristine)
    cases = {'state/manifest.ocdbt': lambda b: b[:20],                 # truncated
             'state/array_metadatas/process_0': lambda b: os.urandom(len(b)),   # random bytes
             '_CHECKPOINT_METADATA': lambda b: b[:len(b) // 2]}
    for name, mangle in cases.items():
        shutil.rmtree(path)
        shutil.copytree(pristine, path)
        f = os.path.join(path, name)
        open(f, 'wb').write(mangle(open(f, 'rb').read()))
        caplog.clear()
        with caplog.at_level('WARNING'), run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck, \
                pytest.raises(integrity.CorruptCheckpointError) as e:
            ck.restore(state)
        message = str(e.value)
        assert str(path) in message and 'corrupted' in message
        assert len(message) < 400 and '\n' not in message, message
        assert not any(s in message for s in ('object at 0x', '<class', 'Registry')), message
        if name != '_CHECKPOINT_METADATA':   # orbax logs that one when it lists the steps
            assert not [r for r in caplog.records if r.name == 'absl'], name
