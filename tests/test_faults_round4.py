"""Faults and friction, round four (issue 69, part A): each test names the fault it guards
against. `--overwrite` that deletes what no command wrote (a folder of the user's files, a
training workdir, the gene being read), a data root that silently falls back to another
copy, `info` and `plot` on the folders and files a crash or the demo leaves, images of the
wrong dtype, numpy numbers and ranges refused as data options, lazy imports that miss a
subpackage, and messages that say what the code does (LeTra's depths, descend's status and
flag, the Ctrl-C line of each command).

The shipped gene is only ever read: every test that writes near a gene uses a copy."""
import gzip
import json
import logging
import os
import pkgutil
import shutil
import threading

import jax
import numpy as np
import pytest
import safetensors.numpy

import jlearngene as jlg
from jlearngene import artefacts, cli, data, zoo
from jlearngene.data import fashion
from jlearngene.models import init, vit, vit_config
from jlearngene.train import checkpoint, integrity, metrics

from helpers import cli_error, cli_status

CFG = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16, patch_size=8,
                 num_classes=10)
README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'README.md')


@pytest.fixture(scope='module')
def params():
    return init(CFG, jax.random.key(0))


@pytest.fixture
def gene(tmp_path):
    """A copy of the shipped LeTra gene (the original is never written)."""
    return shutil.copytree(zoo.path('letra_digits'), tmp_path / 'gene')


def _contents(folder) -> dict:
    """{relative path: bytes} of every file under `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, folder)] = open(p, 'rb').read()
    return out


def _user_folder(path):
    path.mkdir()
    (path / 'notes.txt').write_text('mine')
    return path


def _training_workdir(path):
    path.mkdir()
    (path / 'metrics.jsonl').write_text('{"step": 1, "kind": "train", "loss": 1.0}\n')
    (path / 'config.json').write_text('{}')
    (path / 'checkpoints').mkdir()
    (path / 'checkpoints' / 'keep').write_text('x')
    return path


def _a_file(path):
    path.write_text('a file of mine')
    return path


# ------------------------------------------------------------------ 2. --overwrite

@pytest.mark.parametrize('make', [_user_folder, _training_workdir, _a_file])
def test_descend_overwrite_never_deletes_what_is_not_a_model(gene, tmp_path, capsys, make):
    out = make(tmp_path / 'out')
    before = _contents(out) if out.is_dir() else out.read_bytes()
    line = cli_error(capsys, ['descend', str(gene), '--width', '32', '--depth', '2', '--out',
                              str(out), '--overwrite'], 'descend')
    assert str(out) in line and 'not a model checkpoint' in line, line
    assert (_contents(out) if out.is_dir() else out.read_bytes()) == before


def test_descend_overwrite_never_replaces_the_gene_it_reads(gene, tmp_path, capsys, monkeypatch):
    before = _contents(gene)
    line = cli_error(capsys, ['descend', str(gene), '--out', str(gene), '--overwrite'], 'descend')
    assert 'input' in line and str(gene) in line, line
    # a shipped gene, by name (a copy of the zoo stands in for the package's folder)
    root = tmp_path / 'zoo'
    shutil.copytree(gene, root / 'letra_digits')
    monkeypatch.setattr(zoo, 'ROOT', str(root))
    line = cli_error(capsys, ['descend', 'letra_digits', '--out', str(root / 'letra_digits'),
                              '--overwrite'], 'descend')
    assert 'input' in line, line
    assert _contents(gene) == before == _contents(root / 'letra_digits')


def test_descend_overwrite_never_replaces_a_model_that_holds_the_gene(gene, tmp_path, capsys, params):
    model = checkpoint.save_model(str(tmp_path / 'model'), params, CFG)
    inner = shutil.copytree(gene, os.path.join(model, 'gene'))
    before = _contents(model)
    line = cli_error(capsys, ['descend', inner, '--width', '32', '--depth', '2', '--out', model,
                              '--overwrite'], 'descend')
    assert 'contains' in line and 'input' in line, line
    assert _contents(model) == before


def test_descend_overwrite_replaces_a_model_and_a_timm_file(gene, tmp_path, capsys):
    out, pt = str(tmp_path / 'm'), str(tmp_path / 'm.safetensors')
    argv = ['descend', str(gene), '--width', '32', '--depth', '2', '--out', out, '--to-timm', pt]
    assert cli.main(argv) == 0
    assert cli.main(argv[:6] + ['--depth', '3', '--out', out, '--to-timm', pt, '--overwrite']) == 0
    assert checkpoint.load_model(out)[1].depth == 3
    capsys.readouterr()
    # a .safetensors that is not a ViT state dict is never replaced
    other = str(tmp_path / 'other.safetensors')
    safetensors.numpy.save_file({'x': np.zeros(3, np.float32)}, other)
    line = cli_error(capsys, argv[:7] + [str(tmp_path / 'm2'), '--to-timm', other, '--overwrite'],
                     'descend')
    assert other in line and 'not a timm state dict' in line, line
    assert not os.path.exists(tmp_path / 'm2')


def test_the_python_api_refuses_what_is_not_a_model_and_names_its_keyword(tmp_path, params):
    folder = _user_folder(tmp_path / 'mine')
    with pytest.raises(integrity.CheckpointError, match='not a model checkpoint'):
        checkpoint.save_model(str(folder), params, CFG, overwrite=True)
    assert (folder / 'notes.txt').read_text() == 'mine'
    model = checkpoint.save_model(str(tmp_path / 'm'), params, CFG)
    with pytest.raises(integrity.CheckpointError, match=r'pass overwrite=True'):
        checkpoint.save_model(model, params, CFG)
    with pytest.raises(integrity.CheckpointError, match='input'):
        checkpoint.save_model(model, params, CFG, overwrite=True, inputs=[os.path.join(model, 'x')])
    checkpoint.save_model(model, params, CFG, overwrite=True)     # a model is replaced
    empty = tmp_path / 'empty'
    empty.mkdir()
    checkpoint.save_model(str(empty), params, CFG)                # an empty folder is written
    assert checkpoint.is_model(str(empty)) and not checkpoint.is_model(str(folder))


@pytest.fixture
def timm_file(tmp_path, params):
    from jlearngene.interop import timm as T
    cfg = CFG.replace(pool='avg', class_token=False)
    path = str(tmp_path / 'deit.safetensors')
    T.save_model_safetensors(T.to_timm(init(cfg, jax.random.key(0)), cfg), path, cfg, T.timm_kwargs(cfg))
    return path


@pytest.mark.parametrize('make', [_user_folder, _training_workdir])
def test_convert_overwrite_never_deletes_what_is_not_a_model(timm_file, tmp_path, capsys, make):
    out = make(tmp_path / 'out')
    before = _contents(out)
    line = cli_error(capsys, ['convert', '--from-timm', timm_file, '--out', str(out), '--overwrite'],
                     'convert')
    assert str(out) in line and 'not a model checkpoint' in line and 'overwrite=True' not in line
    assert _contents(out) == before


def test_convert_overwrite_never_replaces_a_model_holding_its_input(timm_file, tmp_path, capsys, params):
    model = checkpoint.save_model(str(tmp_path / 'model'), params, CFG)
    inside = shutil.copy(timm_file, os.path.join(model, 'deit.safetensors'))
    before = _contents(model)
    line = cli_error(capsys, ['convert', '--from-timm', inside, '--out', model, '--overwrite'], 'convert')
    assert 'input' in line, line
    assert _contents(model) == before


@pytest.mark.parametrize('flag,name', [('--to-timm', 'x.safetensors'), ('--to-big-vision', 'x.npz')])
def test_convert_export_overwrite_replaces_only_an_export_of_its_format(tmp_path, capsys, params,
                                                                       flag, name):
    model = checkpoint.save_model(str(tmp_path / 'model'), params, CFG)
    out = str(tmp_path / name)
    if name.endswith('.npz'):
        np.savez(out, a=np.zeros(2))                   # an .npz of the user's arrays
    else:
        safetensors.numpy.save_file({'a': np.zeros(2, np.float32)}, out)
    before = open(out, 'rb').read()
    line = cli_error(capsys, ['convert', flag, model, '--out', out, '--overwrite'], 'convert')
    assert out in line and 'exists and is a file, not a' in line, line
    assert open(out, 'rb').read() == before
    os.remove(out)
    assert cli.main(['convert', flag, model, '--out', out]) == 0
    capsys.readouterr()
    line = cli_error(capsys, ['convert', flag, model, '--out', out], 'convert')
    assert '--overwrite' in line and 'overwrite=True' not in line, line
    assert cli.main(['convert', flag, model, '--out', out, '--overwrite']) == 0   # its own kind


def test_gene_overwrite_never_replaces_a_gene_that_holds_its_input(gene, tmp_path, capsys, params):
    model = checkpoint.save_model(os.path.join(gene, 'model'), params, CFG)
    before = _contents(gene)
    line = cli_error(capsys, ['gene', '--method', 'he_lg', '--from-model', model, '--option', 'k=1',
                              '--out', str(gene), '--overwrite'], 'gene')
    assert 'input' in line and '--overwrite' not in line, line
    assert _contents(gene) == before


def test_a_plain_run_refuses_a_model_folder_that_is_not_a_model_before_training(tmp_path):
    from jlearngene.commands import run
    from jlearngene.experiments import configs
    workdir = _user_folder(tmp_path / 'w')
    (workdir / 'model').mkdir()
    (workdir / 'model' / 'keep.txt').write_text('mine')
    config = configs.load('digits_vit:smoke', {}, from_text=True)
    with pytest.raises(integrity.CheckpointError, match='not a model checkpoint'):
        run.run_classification(config, str(workdir), progress=False)
    assert sorted(os.listdir(workdir)) == ['model', 'notes.txt']      # nothing was trained


# ------------------------------------------------------------------ 6. data.root

def _idx(array: np.ndarray, magic: int) -> bytes:
    dims = b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
    return magic.to_bytes(4, 'big') + dims + array.astype(np.uint8).tobytes()


def _fashion(folder, per_class=10, mark=0):
    """Four tiny IDX files: example i has label i % 10 and pixel (0, 0) holding `mark`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (('train', per_class), ('test', 2)):
        images = np.full((10 * n, 28, 28), mark, np.uint8)
        image_name, label_name = fashion.FILES[split]
        (folder / (image_name + '.gz')).write_bytes(gzip.compress(_idx(images, 0x803), 1))
        (folder / (label_name + '.gz')).write_bytes(gzip.compress(_idx(np.arange(10 * n) % 10, 0x801), 1))
    return folder


@pytest.fixture
def debian(tmp_path, monkeypatch):
    """Debian's folder, with files in it (marked 9), and no $JLEARNGENE_DATA."""
    monkeypatch.delenv(fashion.ENV_VAR, raising=False)
    folder = _fashion(tmp_path / 'debian', mark=9)
    monkeypatch.setattr(fashion, 'DEBIAN_DIR', str(folder))
    return folder


def _no_fallback(root, what):
    with pytest.raises(data.DataError) as e:
        data.fashion_mnist('test', root=None if root is None else str(root))
    msg = str(e.value)
    assert '\n' not in msg and what in msg, msg
    return msg


def test_an_explicit_root_is_the_only_folder_read(debian, tmp_path):
    assert str(tmp_path / 'typo') in _no_fallback(tmp_path / 'typo', 'does not exist')
    _a_file(tmp_path / 'file')
    assert str(tmp_path / 'file') in _no_fallback(tmp_path / 'file', 'is a file')
    (tmp_path / 'empty').mkdir()
    assert str(tmp_path / 'empty') in _no_fallback(tmp_path / 'empty', 'not found')
    cfg = {'name': 'fashion_mnist', 'root': str(tmp_path / 'typo')}
    with pytest.raises(data.DataError, match='typo'):
        data.source_from_config(cfg, 'test')


def test_data_env_without_its_fashion_mnist_folder_is_refused(debian, tmp_path, monkeypatch):
    (tmp_path / 'env').mkdir()
    monkeypatch.setenv(fashion.ENV_VAR, str(tmp_path / 'env'))
    msg = _no_fallback(None, 'does not exist')
    assert str(tmp_path / 'env' / 'fashion_mnist') in msg and fashion.ENV_VAR in msg


def test_the_folder_read_is_said_and_recorded_where_the_root_is_empty(debian, capsys):
    from jlearngene.commands import run
    from jlearngene.experiments import configs
    from jlearngene.models import model_config
    config = configs.load('digits_vit:fashion_mnist', {
        'batch_size': '8', 'eval_batch_size': '8', 'model.image_size': '28'}, from_text=True)
    assert config.data.root == ''
    sources = run.check_run_data(config, model_config(config.model))
    assert sources['train'].info.location == str(debian)
    assert run.record_data_location(config, sources['train'].info) == str(debian)
    assert config.data.root == str(debian)          # config.json records the folder read
    assert str(debian) in capsys.readouterr().out
    assert run.record_data_location(config, sources['train'].info) is None   # named: nothing to say


# ------------------------------------------------------------------ 11. smaller findings

def _run_dir(workdir, name, steps=(1, 2)):
    run = workdir / 'runs' / name
    run.mkdir(parents=True)
    (run / 'metrics.jsonl').write_text(''.join(
        json.dumps({'step': s, 'kind': 'eval', 'eval/accuracy': 0.5}) + '\n' for s in steps))
    (run / 'finished.json').write_text(json.dumps({'seconds': 3.0, 'curve': [[2, 0.5]]}))


def test_info_describes_the_demos_workdir(tmp_path, capsys):
    demo = tmp_path / 'demo'
    _run_dir(demo, 'gene_w32_d4_k10_s0')
    _run_dir(demo, 'scratch_w32_d4_k10_s0')
    (demo / 'demo_curves.png').write_bytes(b'\x89PNG\r\n\x1a\n')
    assert cli.main(['info', str(demo)]) == 0
    out = capsys.readouterr().out
    assert 'no study' in out and '2 finished' in out and 'checkpoint' not in out


def test_info_names_a_damaged_study_json(tmp_path, capsys):
    _run_dir(tmp_path, 'scratch_w32_d4_lr0.001_s0')
    (tmp_path / 'study.json').write_text('{"experiment": "le')
    line = cli_error(capsys, ['info', str(tmp_path)], 'info')
    assert str(tmp_path / 'study.json') in line, line
    (tmp_path / 'study.json').write_text('[1, 2]')
    line = cli_error(capsys, ['info', str(tmp_path)], 'info')
    assert str(tmp_path / 'study.json') in line and 'list' in line, line


@pytest.mark.parametrize('dtype', [np.uint8, np.bool_, np.int32, np.complex64])
def test_apply_refuses_images_that_are_not_real_floats(params, dtype):
    images = np.zeros((2, 16, 16, 3), dtype)
    with pytest.raises(ValueError, match=np.dtype(dtype).name):
        vit.apply(params, images, CFG)
    with pytest.raises(ValueError, match='not a floating type'):
        jax.jit(vit.apply, static_argnames='cfg')(params, images, cfg=CFG)
    jlg.apply(params, images.real.astype(np.float32) if dtype == np.complex64
              else images.astype(np.float32), CFG)


def test_fashion_mnist_takes_numpy_numbers_and_ranges(debian):
    one = data.fashion_mnist('train', label_fraction=np.float32(0.5), classes=range(5))
    two = data.fashion_mnist('train', label_fraction=0.5, classes=(0, 1, 2, 3, 4))
    np.testing.assert_array_equal(one.labels, two.labels)
    assert len(one) == 25 and one.info.num_classes == 5
    three = data.fashion_mnist('test', classes=np.arange(3), validation_per_class=np.int64(0))
    assert three.info.num_classes == 3
    with pytest.raises(data.DataError, match='ordered sequence'):
        data.fashion_mnist('test', classes={1, 2})


def _unblock(fifo: str) -> None:
    """Open and close the write end of `fifo`, so that a reader blocked on it sees its end."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _in_thread(fn, seconds: float = 30.0):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault('rc', fn()), daemon=True)
    t.start()
    t.join(seconds)
    return t, out


def test_plot_and_info_refuse_a_fifo_metrics_file(tmp_path, capsys):
    fifo = str(tmp_path / metrics.METRICS_FILE)
    os.mkfifo(fifo)
    try:
        for argv in (['plot', str(tmp_path)], ['plot', fifo], ['info', fifo]):
            t, out = _in_thread(lambda a=argv: cli_status(a))
            blocked = t.is_alive()
            _unblock(fifo)
            t.join(10)
            assert not blocked, f'{argv} blocked on the FIFO'
            err = capsys.readouterr().err.strip().splitlines()
            assert out['rc'] == 1 and len(err) == 1 and 'not a regular file' in err[0], err
    finally:
        _unblock(fifo)


def test_plot_and_info_skip_a_last_line_cut_off_mid_write(tmp_path, capsys, caplog):
    rows = [{'step': s, 'kind': 'train', 'loss': 1.0 / s} for s in (1, 2, 3)]
    text = ''.join(json.dumps(r) + '\n' for r in rows)
    path = tmp_path / metrics.METRICS_FILE
    path.write_text(text + '{"step": 4, "kind": "tr')
    with caplog.at_level(logging.WARNING):
        assert [r['step'] for r in metrics.read_metrics(str(tmp_path))] == [1, 2, 3]
    assert 'cut off' in caplog.text and str(path) in caplog.text
    assert cli.main(['plot', str(tmp_path)]) == 0
    assert cli.main(['info', str(path)]) == 0 and '3 records' in capsys.readouterr().out
    path.write_text('{"step": 1, "ki\n' + text)        # damage before the end: still refused
    line = cli_error(capsys, ['plot', str(tmp_path)], 'plot')
    assert f'{path}:1' in line, line


def test_every_subpackage_is_an_attribute_of_the_package():
    names = [m.name for m in pkgutil.iter_modules(jlg.__path__) if not m.name.startswith('_')]
    assert {'genes', 'data', 'train', 'artefacts', 'interop', 'models'} <= set(names)
    for name in names:
        assert getattr(jlg, name).__name__ == f'jlearngene.{name}'
        assert name in dir(jlg)
    assert not hasattr(jlg, 'no_such_module')


# ------------------------------------------------------------------ 12. what the messages say

def test_letra_makes_depths_beyond_the_aux_net_as_the_readme_says(gene):
    method, g, meta = artefacts.load_gene(str(gene))
    base = artefacts.base_config(meta)
    cfg, _ = artefacts.descendant_config(method, g, base, depth=2 * base.depth)
    assert cfg.depth == 2 * base.depth
    row = next(line for line in open(README, encoding='utf-8') if line.startswith('| `letra`'))
    assert "up to the Aux-Net" not in row and 'any depth' in row, row


@pytest.mark.parametrize('flags', [['--width', '-3'], ['--width', '8'], ['--set', 'nosuch=1'],
                                   ['--option', 'nosuch=1']])
def test_bad_descend_arguments_exit_2(gene, tmp_path, capsys, flags):
    out = tmp_path / 'out'
    line = cli_error(capsys, ['descend', str(gene), *flags, '--out', str(out)], 'descend', code=2)
    assert flags[0] in line, line
    assert not out.exists()


def test_descend_names_the_flag_on_the_command_line_and_the_keyword_in_python(gene, tmp_path, capsys):
    out = str(tmp_path / 'm')
    argv = ['descend', str(gene), '--width', '32', '--depth', '2', '--out', out]
    assert cli.main(argv) == 0
    capsys.readouterr()
    line = cli_error(capsys, argv, 'descend')
    assert 'pass --overwrite' in line and 'overwrite=True' not in line, line
    method, g, meta = artefacts.load_gene(str(gene))
    cfg = checkpoint.load_model(out)[1]
    with pytest.raises(integrity.CheckpointError, match='pass overwrite=True'):
        artefacts.write_descendant(out, checkpoint.load_model(out)[0], cfg, meta=meta, options={},
                                   seed=0)


@pytest.mark.parametrize('command', ['plot', 'render', 'info'])
def test_the_ctrl_c_line_fits_the_command(capsys, monkeypatch, command):
    import importlib
    module = importlib.import_module(f'jlearngene.commands.{command}')

    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(module, 'main', interrupted)
    assert cli.main([command, 'x']) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith(f'jlearngene {command}: interrupted (Ctrl-C)'), err
    assert 'checkpoint' not in err and 'classification' not in err and 'study' not in err, err
    monkeypatch.setattr(importlib.import_module('jlearngene.commands.train'), 'main', interrupted)
    assert cli.main(['train']) == 130
    assert 'checkpoint' in capsys.readouterr().err
