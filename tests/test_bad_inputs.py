"""Every file reader fed empty, truncated, random and wrong-schema files: each raises its
documented error type (never another), or, for a checkpoint file that holds nothing the
load needs, returns exactly what was saved; and none of them changes its input. Gene
directories and the `descend` / `gene` commands: a request the gene cannot make, a gene of
another method and an option the method lacks are one-line errors naming the flag or part."""
import glob
import json
import os
import shutil

import jax
import numpy as np
import pytest
from PIL import Image

from jlearngene import artefacts, cli, genes
from jlearngene.data import DataError, image_folder
from jlearngene.interop import state_dict as SD
from jlearngene.interop import timm
from jlearngene.models import init, vit_config
from jlearngene.train import checkpoint, integrity, run_checkpoint
from jlearngene.train import state as state_lib


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
    return open(SD.save_safetensors(sd, str(tmp_path / 'good.safetensors')), 'rb').read()


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
        message = _raises_only(SD.StateDictError, lambda path=path: SD.load_state_dict(path), path)
        assert repr(path) in message, (name, message)
        if name not in ('truncated', 'tensor without offsets'):   # headers that cannot be parsed
            _raises_only(SD.StateDictError, lambda path=path: SD.read_safetensors_metadata(path), path)
    # a readable file of another model: the converter lists what does not fit
    other = _mangled(tmp_path, 'other.safetensors',
                     _safetensors_bytes(tmp_path, {'x': np.ones(3, np.float32)}))
    _raises_only(SD.StateDictError, lambda: timm.from_timm(SD.load_state_dict(other)), other)


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
        message = _raises_only(SD.StateDictError, lambda path=path: SD.load_state_dict(path), path)
        assert 'allow_pickle' not in message, message


def test_torch_reader(tmp_path, state_dict):
    torch = pytest.importorskip('torch')
    torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, tmp_path / 'good.pth')
    good = open(tmp_path / 'good.pth', 'rb').read()
    for name, mangle in MANGLES.items():
        path = _mangled(tmp_path, f'{name}.pth', mangle(good))
        _raises_only(SD.StateDictError, lambda path=path: SD.load_state_dict(path), path)


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
        except integrity.CheckpointError:
            outcomes[rel] = 'refused'
        else:
            assert _same(jax.device_get(loaded), jax.device_get(params)), (rel, mode)
            outcomes[rel] = 'unused'
        assert _fingerprint(path) == before, rel
    assert outcomes[os.path.join('params', 'manifest.ocdbt')] == 'refused', outcomes
    _raises_only(integrity.CheckpointError, lambda: checkpoint.load_model(str(tmp_path / 'nothing')),
                 str(tmp_path))


def test_run_checkpoint_reader(tmp_path):
    import optax
    params = jax.jit(init, static_argnums=0)(CFG, jax.random.key(2))
    state = jax.jit(state_lib.init_state, static_argnums=(1,))(params, optax.sgd(0.1))
    with run_checkpoint.RunCheckpointer(tmp_path / 'run') as ck:
        root = ck.save(3, state, data_state={'consumed': 3})
    outcomes = {}
    for rel, mode in _each_mangled_file(root, tmp_path):
        before = _fingerprint(root)
        try:
            with run_checkpoint.RunCheckpointer(tmp_path / 'run') as ck:
                loaded, _ = ck.restore(state)
        except integrity.CheckpointError:
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


# ------------------------------------------------------------ gene directories and descend
# Every request flag is checked before anything is written; a width/depth/heads the gene
# cannot make is an error naming the flag and what the gene makes (never the gene's own
# config in its place); a gene of another method is refused by that method's parts check.

GENE_CFG = vit_config('Ti', width=16, num_heads=4, mlp_dim=32, depth=4, image_size=8, patch_size=4,
                      num_classes=5, pool='avg')
GENE_OPTIONS = {'cluster': {'clusters': ((0, 2), (1,), (3, 0, 1), (2,))},
                'ligo': {'large_cfg': GENE_CFG.replace(depth=6)},
                'mango': {'large_cfg': GENE_CFG.replace(depth=6), 'rank': 2}}


def _gene(name: str):
    """A gene of method `name` for a source of GENE_CFG: its shapes filled with noise."""
    shapes = genes.get(name).gene_shapes(GENE_CFG, **GENE_OPTIONS.get(name, {}))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda x: (0.1 * rng.standard_normal(x.shape)).astype(x.dtype), shapes)


@pytest.fixture(scope='module')
def gene_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp('genes')
    return {name: artefacts.save_gene(root / name, name, _gene(name), configs={'source': GENE_CFG},
                                      gene_options=GENE_OPTIONS.get(name))
            for name in ('tleg', 'share_init', 'he_lg', 'cluster', 'letra')}


def _relabelled(src: str, dst, **fields) -> str:
    """A copy of gene directory `src` with gene.json fields replaced."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, artefacts.META_FILE)
    meta = json.load(open(path))
    meta.update(fields)
    json.dump(meta, open(path, 'w'))
    return str(dst)


def _cli_error(argv, capsys, code: int = 1) -> str:
    """`cli.main(argv)` fails (status `code`: 2 for a request no config fits, a usage error)
    with one line on stderr, no traceback; the line."""
    assert cli.main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'internal error' not in err[0], err
    return err[0]


@pytest.mark.parametrize('name,makes', [('tleg', 'widths 16 of'), ('he_lg', 'widths 16 of'),
                                        ('cluster', 'widths 16 of'), ('letra', 'widths 8, 12, 16 of')])
def test_descend_refuses_a_width_the_gene_cannot_make(gene_dirs, tmp_path, capsys, name, makes):
    for width in ('50', '3', '0', '-64'):
        out = tmp_path / f'w{width}'
        line = _cli_error(['descend', gene_dirs[name], '--width', width, '--out', str(out)], capsys, 2)
        assert f'--width {width}' in line, line
        assert (makes if int(width) > 0 else 'positive integer') in line, line
        assert not out.exists()
    method, gene, meta = artefacts.load_gene(gene_dirs[name])
    with pytest.raises(artefacts.NoDescendant, match='--width 50'):
        artefacts.descendant_config(method, gene, artefacts.base_config(meta), width=50)


def test_descend_checks_every_request_flag(gene_dirs, tmp_path, capsys):
    path = gene_dirs['tleg']
    cases = [(['--depth', '0'], ['--depth 0', 'positive']), (['--depth', '-3'], ['--depth -3']),
             (['--mlp-dim', '0'], ['--mlp-dim 0']), (['--heads', '3'], ['--heads 3', 'heads 4 of']),
             (['--set', 'nosuch=1'], ['--set', "'nosuch'"]),
             (['--set', 'width=50'], ['--set width=50', 'widths 16 of']),
             (['--option', 'kk=2'], ['--option kk', 'head, others, embeddings'])]
    for flags, facts in cases:
        out = tmp_path / 'out'
        line = _cli_error(['descend', path, *flags, '--out', str(out)], capsys, 2)
        assert all(f in line for f in facts), (flags, line)
        assert not out.exists()
    method, gene, meta = artefacts.load_gene(path)
    base = artefacts.base_config(meta)
    for request, flag in (({'width': 1.5}, '--width'), ({'depth': True}, '--depth'),
                          ({'heads': [2, 0]}, '--heads'), ({'mlp_dim': '32'}, '--mlp-dim')):
        with pytest.raises(genes.GeneError, match=flag):
            artefacts.descendant_config(method, gene, base, **request)
    with pytest.raises(artefacts.NoDescendant, match=r'--depth 3.*depths 4 of'):   # no fallback
        artefacts.descendant_config('scala', _gene('scala'), GENE_CFG, depth=3)


WRONG_METHODS = {'scala': "'blocks'", 'net2net': "'blocks'", 'stackbert': "'blocks'",
                 'bert2bert': "'blocks'", 'us_net': "'blocks'", 'matformer': "'blocks'",
                 'imwlm': "'blocks'", 'he_lg': "'blocks'", 'cluster': "'blocks'",
                 'letra': "'learngene'", 'ligo': "'small'", 'share_init': "'theta_a'",
                 'scratch': 'no gene'}


def test_a_gene_relabelled_as_another_method_is_refused_by_its_parts(gene_dirs, tmp_path, capsys):
    for name, part in WRONG_METHODS.items():
        bad = _relabelled(gene_dirs['tleg'], tmp_path / name, method=name)
        with pytest.raises(artefacts.GeneFileError) as e:
            artefacts.load_gene(bad)
        assert repr(name) in str(e.value) and part in str(e.value), str(e.value)
        out = tmp_path / f'out_{name}'
        line = _cli_error(['descend', bad, '--out', str(out)], capsys)
        assert repr(name) in line and part in line
        assert not out.exists()
    # a per-layer-blocks gene where stacked blocks belong: the part's kind is named
    with pytest.raises(artefacts.GeneFileError, match="'blocks'.*list"):
        artefacts.load_gene(_relabelled(gene_dirs['cluster'], tmp_path / 'c_as_he_lg', method='he_lg'))


def test_every_method_checks_its_own_gene_parts_and_declares_its_options():
    tleg_gene = _gene('tleg')
    for name in genes.names():
        m = genes.get(name)
        m.check_gene(None if m.source == 'none' else _gene(name))      # its own gene passes
        if name != 'tleg':
            with pytest.raises(genes.GeneError, match=f'{m.label}.*{name}'):
                m.check_gene(tleg_gene)
        assert m.options('descend') is not None, name                  # every option is known
        if m.gene_from_model is not None:
            assert m.options('gene_from_model') is not None, name
    m = genes.get('he_lg')
    with pytest.raises(genes.GeneError, match='gene_parts'):
        genes.Method(name='x', label='X', source='model', descend=m.descend,
                     gene_param_count=m.gene_param_count, gene_from_model=m.gene_from_model)
    with pytest.raises(genes.GeneError, match="'blocks'"):          # a model check, not a KeyError
        m.gene_from_model(tleg_gene, GENE_CFG)


def test_descend_labels_the_descendant_by_its_method(gene_dirs, tmp_path, capsys):
    bad = _relabelled(gene_dirs['share_init'], tmp_path / 'g', label='TLEG')
    assert cli.main(['descend', bad, '--out', str(tmp_path / 'out')]) == 0
    printed = capsys.readouterr().out
    assert 'Share-Init descendant' in printed and 'TLEG' not in printed


def test_gene_command_refuses_a_run_gene_and_options_the_method_lacks(tmp_path, capsys):
    run_gene = str(tmp_path / 'run' / 'genes' / 'tleg')
    checkpoint.save_model(run_gene, _gene('tleg'), GENE_CFG, extra={'method': 'tleg', 'options': {}})
    line = _cli_error(['gene', '--method', 'he_lg', '--from-model', run_gene,
                       '--out', str(tmp_path / 'a')], capsys)
    assert "'tleg'" in line and '--from-run' in line
    model = str(tmp_path / 'model')
    checkpoint.save_model(model, _gene('pre_fin'), GENE_CFG)
    line = _cli_error(['gene', '--method', 'he_lg', '--from-model', model, '--out', str(tmp_path / 'b'),
                       '--option', 'kk=2'], capsys, code=2)
    assert "'kk'" in line and "'he_lg'" in line and 'k, embeddings' in line
    with pytest.raises(genes.GeneError, match="'epsilon'.*eps"):
        artefacts.save_model_gene(model, 'cluster', tmp_path / 'c', options={'clusters': None,
                                                                              'epsilon': 1.0})
    line = _cli_error(['gene', '--method', 'mango', '--from-model', model, '--out', str(tmp_path / 'm'),
                       '--target-set', 'nosuch=1'], capsys, code=2)
    assert "'nosuch'" in line
    assert not any((tmp_path / d).exists() for d in ('a', 'b', 'c', 'm'))
