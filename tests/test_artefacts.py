"""Gene directories (`jlearngene.artefacts`): every method's gene round trip, bad files,
target configs from requests, and the `descend` / `info` commands with the train init path
and timm export."""
import json
import os
import re

import chex
import jax
import ml_collections
import numpy as np
import pytest

from jlearngene import artefacts, cli, genes
from jlearngene.artefacts import GeneFileError
from jlearngene.interop import timm
from jlearngene.interop.state_dict import load_state_dict
from jlearngene.models import vit_config
from jlearngene.commands import run
from jlearngene.train import checkpoint, integrity


AUX = vit_config('Ti', width=16, num_heads=4, mlp_dim=32, depth=4, image_size=8, patch_size=4,
                 num_classes=5, pool='avg')
SMALL = AUX.replace(width=8, num_heads=2, mlp_dim=16, depth=2)
GROWN = ('net2net', 'stackbert', 'bert2bert', 'ligo', 'mango')   # SMALL -> AUX
GENE_OPTIONS = {'cluster': {'clusters': ((0, 2), (1,), (3, 0, 1), (2,))}, 'ligo': {'large_cfg': AUX},
                'mango': {'large_cfg': AUX, 'rank': 2}}
DESCEND_OPTIONS = {'scala': {'smallest': 0.5}, 'stackbert': {'width': 'net2net'}}


def make(name, seed=0):
    """(gene, configs) of method `name` on tiny configs: the method's gene shapes for its
    source (`Method.gene_shapes`, nothing computed) filled with random values, as after
    training."""
    m = genes.get(name)
    src = SMALL if name in GROWN else AUX
    cfgs = {'source': src, 'target': AUX} if name in GROWN else {'source': src}
    shapes = m.gene_shapes(src, **GENE_OPTIONS.get(name, {}))
    rng = np.random.default_rng(seed)
    gene = jax.tree.map(lambda x: (0.1 * rng.standard_normal(x.shape)).astype(x.dtype), shapes)
    return gene, cfgs


@pytest.fixture(scope='module')
def letra_dir(tmp_path_factory):
    gene, cfgs = make('letra')
    path = str(tmp_path_factory.mktemp('genes') / 'letra')
    artefacts.save_gene(path, 'letra', gene, configs=cfgs, provenance={'run': 'test'})
    return path, gene


def corrupt_copy(src, dst, edit=None, drop=None, truncate=None):
    """A copy of gene directory `src` with its JSON edited, a file dropped or truncated."""
    os.makedirs(dst)
    for f in (artefacts.META_FILE, artefacts.ARRAYS_FILE):
        if f == drop:
            continue
        data = open(os.path.join(src, f), 'rb').read()
        if f == artefacts.META_FILE and edit:
            meta = json.loads(data)
            edit(meta)
            data = json.dumps(meta).encode()
        if f == truncate:
            data = data[:len(data) - 17]
        open(os.path.join(dst, f), 'wb').write(data)
    return dst


# ----------------------------------------------------------------------------------------
# Every method's gene round trip.

@pytest.mark.parametrize('name', genes.names())
def test_every_gene_round_trips_bit_exactly_and_descends_the_same(name, tmp_path):
    m = genes.get(name)
    gene, cfgs = make(name)
    path = artefacts.save_gene(tmp_path / name, name, gene, configs=cfgs,
                               gene_options=GENE_OPTIONS.get(name),
                               descend_options=DESCEND_OPTIONS.get(name),
                               provenance={'from': 'test'})
    assert sorted(os.listdir(path)) == ['gene.json', 'gene.safetensors']
    method, loaded, meta = artefacts.load_gene(path)
    assert method is m and meta['method'] == name and meta['format_version'] == 1
    assert jax.tree.structure(loaded) == jax.tree.structure(jax.device_get(gene))
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(gene)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint32), np.asarray(b).view(np.uint32))
    assert meta['params']['s_params'] == m.gene_param_count(gene, include_head=False)
    assert artefacts.configs(meta) == cfgs
    assert meta['provenance']['from'] == 'test' and meta['provenance']['created']
    # the same descendant, for the default request on the gene's config
    cfg, opts = artefacts.descendant_config(m, loaded, artefacts.base_config(meta),
                                            options=meta['descend_options'])
    assert cfg == (cfgs.get('target') or cfgs['source'])
    run = jax.jit(lambda g: m.descend(g, cfg, key=jax.random.key(3), **opts))
    chex.assert_trees_all_equal(run(loaded), run(gene))
    # gene.json alone gives the shapes
    chex.assert_trees_all_equal_shapes_and_dtypes(artefacts.gene_shapes(meta), loaded)


def test_cluster_gene_keeps_its_per_layer_structure(tmp_path):
    gene, cfgs = make('cluster')
    path = artefacts.save_gene(tmp_path / 'c', 'cluster', gene, configs=cfgs,
                               gene_options=GENE_OPTIONS['cluster'])
    _, loaded, meta = artefacts.load_gene(path)
    assert isinstance(loaded['blocks'], list)
    assert [b['attn']['q']['kernel'].shape[1] for b in loaded['blocks']] == [2, 1, 3, 1]
    assert 'blocks/2/attn/q/kernel' in meta['arrays']
    assert meta['gene_options']['clusters'] == [[0, 2], [1], [3, 0, 1], [2]]


# ----------------------------------------------------------------------------------------
# Bad files: one line naming the file and the problem.

BAD = [
    ('missing_json', dict(drop='gene.json'), r'gene\.json: missing'),
    ('missing_arrays', dict(drop='gene.safetensors'), r'gene\.safetensors: missing'),
    ('truncated', dict(truncate='gene.safetensors'),
     r'gene\.safetensors'),
    ('newer', dict(edit=lambda m: m.update(format_version=2)),
     r'gene\.json.*format_version 2'),
    ('format', dict(edit=lambda m: m.update(format='jlearngene.model/1')),
     r"gene\.json.*'jlearngene\.model/1'"),
    ('unknown_method', dict(edit=lambda m: m.update(method='no_such_method')),
     r"gene\.json.*'no_such_method'"),
    ('wrong_method', dict(edit=lambda m: m.update(method='tleg')),
     r"gene\.json.*'tleg'"),
    ('future_config', dict(edit=lambda m: m['configs']['source'].update(hyper_heads=3)),
     r"gene\.json.*configs\['source'\].*hyper_heads"),
    ('shape', dict(edit=lambda m: m['arrays']['pos_embed'].update(shape=[1, 5, 16])),
     r"'pos_embed'.*\(1, 4, 16\).*\(1, 5, 16\)"),
    ('tree', dict(edit=lambda m: m['tree'].pop('pos_embed')),
     r"gene\.json.*'pos_embed'"),
]


@pytest.mark.parametrize('case,change,message', BAD, ids=[b[0] for b in BAD])
def test_bad_gene_files_are_one_line_errors(letra_dir, tmp_path, case, change, message, capsys):
    bad = corrupt_copy(letra_dir[0], str(tmp_path / case), **change)
    with pytest.raises(GeneFileError, match=message) as e:
        artefacts.load_gene(bad)
    assert '\n' not in str(e.value) and bad in str(e.value)
    assert cli.main(['info', bad]) == 1                 # the CLI: one line, status 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('jlearngene info: ') and bad in err[0]


def test_not_json_and_no_directory(letra_dir, tmp_path):
    bad = corrupt_copy(letra_dir[0], str(tmp_path / 'bad'))
    open(os.path.join(bad, 'gene.json'), 'w').write('{"format": ')
    with pytest.raises(GeneFileError, match=r'gene\.json'):
        artefacts.load_gene(bad)
    with pytest.raises(GeneFileError, match=re.escape(str(tmp_path / 'nothing'))):
        artefacts.load_gene(tmp_path / 'nothing')


def test_a_version_bump_still_reads_old_files(letra_dir, tmp_path):
    """Another jlearngene version, and configs written before a field existed, load."""
    def older(meta):
        meta['jlearngene_version'] = '0.0.1'
        meta['configs']['source'].pop('init_truncation')
    old = corrupt_copy(letra_dir[0], str(tmp_path / 'old'), edit=older)
    method, gene, meta = artefacts.load_gene(old)
    assert meta['jlearngene_version'] == '0.0.1' and method.name == 'letra'
    assert artefacts.configs(meta)['source'] == AUX
    chex.assert_trees_all_equal(gene, jax.device_get(letra_dir[1]))


def test_save_never_replaces_a_directory_unasked(letra_dir, tmp_path):
    _, gene = letra_dir
    path = artefacts.save_gene(tmp_path / 'g', 'letra', gene, configs={'source': AUX})
    with pytest.raises(GeneFileError, match='overwrite=True'):
        artefacts.save_gene(path, 'letra', gene)
    artefacts.save_gene(path, 'letra', gene, overwrite=True, provenance={'n': 2})
    assert artefacts.read_meta(path)['provenance']['n'] == 2
    other = tmp_path / 'notes'
    other.mkdir()
    (other / 'keep.txt').write_text('mine')
    with pytest.raises(GeneFileError, match=re.escape(str(other))):
        artefacts.save_gene(other, 'letra', gene, overwrite=True)
    assert (other / 'keep.txt').read_text() == 'mine'
    with pytest.raises(GeneFileError, match='TLEG'):
        artefacts.save_gene(tmp_path / 'x', 'tleg', gene)
    assert not (tmp_path / 'x').exists()


# ----------------------------------------------------------------------------------------
# Requests -> target configs.

def test_descendant_config_keeps_what_each_method_keeps(letra_dir):
    letra_gene = letra_dir[1]
    cfg, _ = artefacts.descendant_config('letra', letra_gene, AUX, width=12, depth=9)
    assert (cfg.width, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.depth) == (12, 3, 4, 24, 9)
    scala_gene = make('scala')[0]
    cfg, _ = artefacts.descendant_config('scala', scala_gene, AUX, width=8)
    assert (cfg.width, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.depth) == (8, 4, 2, 16, 4)
    cluster_gene = make('cluster')[0]
    cfg, opts = artefacts.descendant_config('cluster', cluster_gene, AUX, heads=[4, 2, 3, 1, 2])
    assert (cfg.width, cfg.num_heads, cfg.head_dim, cfg.depth) == (16, 4, 4, 5)
    assert opts == {'heads': (4, 2, 3, 1, 2)}
    with pytest.raises(genes.GeneError, match='width=20.*16'):
        artefacts.descendant_config('letra', letra_gene, AUX, width=20)
    with pytest.raises(genes.GeneError, match=r'\[2, 2\]'):
        artefacts.descendant_config('letra', letra_gene, AUX, heads=[2, 2])


def test_capabilities_tries_widths_and_depths_on_shapes(letra_dir):
    cap = artefacts.capabilities('letra', letra_dir[1], AUX)
    assert cap['widths'] == [8, 12, 16] and cap['depths'] == [1, 2, 4, 8, 16]
    assert cap['heads'] == [2, 4]          # the learngene's 2 to the Aux-Net's 4 heads of 4
    assert "below the learngene's 8" in cap['width_limit']
    cap = artefacts.capabilities('cluster', make('cluster')[0], AUX)
    assert cap['widths'] == [16] and cap['heads'] == [1, 2, 4, 8]
    cap = artefacts.capabilities('scala', make('scala')[0], AUX)
    assert cap['depths'] == [4] and 'depth is never sliced' in cap['depth_limit']


# ----------------------------------------------------------------------------------------
# The commands.

def test_descend_command_writes_a_trainable_and_timm_descendant(letra_dir, tmp_path, capsys):
    path, gene = letra_dir
    out, pt = str(tmp_path / 'des'), str(tmp_path / 'des.safetensors')
    assert cli.main(['descend', path, '--width', '12', '--depth', '8', '--seed', '4',
                     '--out', out, '--to-timm', pt]) == 0
    printed = capsys.readouterr().out
    assert 'LeTra descendant, ViT width=12 depth=8 heads=3' in printed and '--config.init=' in printed
    params, cfg, extra = checkpoint.load_model(out)
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim) == (12, 8, 3, 24)
    assert extra['source']['method'] == 'letra' and extra['source']['gene'] == path
    want = jax.jit(lambda g: genes.get('letra').descend(g, cfg, key=jax.random.key(4)))(gene)
    chex.assert_trees_all_equal(params, jax.device_get(want))
    # the train init path reads it for the same model config (and refuses another)
    config = ml_collections.ConfigDict({'init': out, 'seed': 0})
    chex.assert_trees_all_equal(run.initial_params(config, cfg), params)
    with pytest.raises(integrity.CheckpointError, match='depth.*8.*4'):
        run.initial_params(config, cfg.replace(depth=4))
    # timm: the state dict reads back into the same params and config
    tcfg, tparams = timm.from_timm(load_state_dict(pt), num_heads=3, pool='avg',
                                   class_token=False, pool_norm='before')
    assert (tcfg.width, tcfg.depth, tcfg.num_heads) == (12, 8, 3)
    chex.assert_trees_all_equal(tparams, params)
    # outputs are not replaced unasked; a request the gene cannot make is one line
    assert cli.main(['descend', path, '--out', out]) == 1
    assert out in capsys.readouterr().err
    assert cli.main(['descend', path, '--width', '20', '--out', str(tmp_path / 'd2')]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'width=20' in err[0]
    assert not os.path.exists(tmp_path / 'd2')


def test_descend_command_with_per_layer_heads_and_options(tmp_path, capsys):
    gene, cfgs = make('cluster')
    path = artefacts.save_gene(tmp_path / 'c', 'cluster', gene, configs=cfgs)
    out = str(tmp_path / 'des')
    assert cli.main(['descend', path, '--heads', '4,2,4', '--out', out,
                     '--option', 'head=inherit']) == 0
    params, cfg, extra = checkpoint.load_model(out)
    assert cfg.depth == 3 and cfg.num_heads == 4
    assert [b['attn']['q']['kernel'].shape[1] for b in params['blocks']] == [4, 2, 4]
    assert extra['source']['options'] == {'head': 'inherit', 'heads': [4, 2, 4]}
    np.testing.assert_array_equal(params['head']['kernel'], gene['head']['kernel'])
    assert cli.main(['descend', path, '--heads', '4,2,4', '--out', str(tmp_path / 't'),
                     '--to-timm', str(tmp_path / 't.safetensors')]) == 1
    assert not os.path.exists(tmp_path / 't')          # timm refused before anything was written
    capsys.readouterr()


def test_info_describes_a_gene_directory(letra_dir, capsys):
    assert cli.main(['info', letra_dir[0]]) == 0
    out = capsys.readouterr().out
    assert "LeTra ('letra', source 'learned'), format jlearngene.gene v1" in out
    assert 'source config: width=16 depth=4 heads=4' in out
    s_params = genes.get('letra').gene_param_count(letra_dir[1])
    assert f'S-Params {s_params:,}' in out
    assert 'widths 8, 12, 16 of 4, 8, 12, 16, 20, 24, 28, 32' in out
    assert '| width/embed | (8, 8) | float32 | 64 |' in out
    assert cli.main(['--help']) == 0
    usage = capsys.readouterr().out
    assert 'descend' in usage and 'gene' in usage


def test_gene_command_from_a_run_and_from_a_model(tmp_path, capsys):
    """A run's gene saved as a model checkpoint (as the experiments save them), and a
    source-'model' method's gene taken from a model checkpoint, become gene directories."""
    gene, _ = make('tleg', seed=5)
    run_gene = str(tmp_path / 'run' / 'genes' / 'tleg')
    checkpoint.save_model(run_gene, gene, AUX, extra={'method': 'tleg', 'options': {'from_layer': 0},
                                                      'aux_test_accuracy': 0.5})
    out = str(tmp_path / 'tleg')
    assert cli.main(['gene', '--from-run', run_gene, '--out', out]) == 0
    assert "TLEG ('tleg'" in capsys.readouterr().out
    method, loaded, meta = artefacts.load_gene(out)
    chex.assert_trees_all_equal(loaded, gene)
    assert artefacts.configs(meta) == {'source': AUX} and meta['gene_options'] == {'from_layer': 0}
    assert meta['provenance']['from'] == run_gene
    assert meta['provenance']['checkpoint_extra']['aux_test_accuracy'] == 0.5

    model = str(tmp_path / 'ancestor')
    checkpoint.save_model(model, make('pre_fin', seed=6)[0], AUX)
    out = str(tmp_path / 'cluster')
    assert cli.main(['gene', '--method', 'cluster', '--from-model', model, '--out', out,
                     '--option', 'clusters=[[0, 2], [1], [3, 0, 1], [2]]']) == 0
    _, loaded, meta = artefacts.load_gene(out)
    assert [b['attn']['q']['kernel'].shape[1] for b in loaded['blocks']] == [2, 1, 3, 1]
    assert meta['gene_options'] == {'clusters': [[0, 2], [1], [3, 0, 1], [2]]}
    capsys.readouterr()
    assert cli.main(['gene', '--method', 'tleg', '--from-model', model,
                     '--out', str(tmp_path / 'x')]) == 2
    assert "TLEG (source 'learned')" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------
# Checksums: a damaged array is named; files without checksums still load.

def _flip_bytes_in(src, dst, n=100):
    """A copy of gene directory `src` with `n` bytes flipped inside the data of the array
    stored last in gene.safetensors; returns (dst, that array's key)."""
    dst = corrupt_copy(src, dst)
    file = os.path.join(dst, artefacts.ARRAYS_FILE)
    data = bytearray(open(file, 'rb').read())
    size = int.from_bytes(data[:8], 'little')
    header = json.loads(data[8:8 + size])
    key = max((k for k in header if k != '__metadata__'), key=lambda k: header[k]['data_offsets'][1])
    start, end = (8 + size + o for o in header[key]['data_offsets'])
    for i in np.random.default_rng(0).choice(np.arange(start, end), min(n, end - start), replace=False):
        data[i] ^= 0xFF
    open(file, 'wb').write(bytes(data))
    return dst, key


def test_flipped_bytes_in_the_arrays_are_refused_naming_the_array(letra_dir, tmp_path, capsys):
    bad, key = _flip_bytes_in(letra_dir[0], str(tmp_path / 'bad'))
    file = os.path.join(bad, artefacts.ARRAYS_FILE)
    with pytest.raises(GeneFileError, match=re.escape(file) + f".*{re.escape(repr(key))}.*damaged") as e:
        artefacts.load_gene(bad)
    assert '\n' not in str(e.value)
    out = str(tmp_path / 'des')
    assert cli.main(['descend', bad, '--out', out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and file in err[0] and repr(key) in err[0]
    assert not os.path.exists(out)
    meta = artefacts.read_meta(letra_dir[0])          # every array carries one
    assert all(len(v['sha256']) == 64 for v in meta['arrays'].values())


def test_gene_files_without_checksums_still_load(letra_dir, tmp_path, capsys):
    def no_checksums(meta):
        for v in meta['arrays'].values():
            v.pop('sha256')
    old = corrupt_copy(letra_dir[0], str(tmp_path / 'old'), edit=no_checksums)
    method, gene, meta = artefacts.load_gene(old)
    assert method.name == 'letra' and not artefacts.has_checksums(meta)
    chex.assert_trees_all_equal(gene, jax.device_get(letra_dir[1]))
    assert cli.main(['info', old]) == 0
    assert 'checksums: none' in capsys.readouterr().out
    assert cli.main(['info', letra_dir[0]]) == 0
    assert 'checksums: a sha256 of every array' in capsys.readouterr().out


@pytest.mark.parametrize('edit,message', [
    (lambda m: m['arrays']['pos_embed'].update(sha256='abc'), r"'pos_embed'.*'abc'.*sha256"),
    (lambda m: m['arrays']['pos_embed'].pop('sha256'), r"'pos_embed'.*no sha256"),
    (lambda m: m['arrays']['pos_embed'].update(sha256='0' * 64), r"'pos_embed'.*damaged"),
], ids=['not_a_digest', 'one_missing', 'wrong'])
def test_bad_checksum_fields_are_one_line_errors(letra_dir, tmp_path, edit, message):
    bad = corrupt_copy(letra_dir[0], str(tmp_path / 'bad'), edit=edit)
    with pytest.raises(GeneFileError, match=message) as e:
        artefacts.load_gene(bad)
    assert '\n' not in str(e.value) and bad in str(e.value)


# ----------------------------------------------------------------------------------------
# Permissions: gene directories and .safetensors files as the umask makes every other file.

@pytest.mark.parametrize('umask', [0o022, 0o077])
def test_gene_and_timm_files_get_the_umask_modes(letra_dir, tmp_path, umask, capsys):
    old = os.umask(umask)
    try:
        path = artefacts.save_gene(tmp_path / 'g', 'letra', letra_dir[1], configs={'source': AUX})
        pt = str(tmp_path / 'des.safetensors')
        assert cli.main(['descend', path, '--out', str(tmp_path / 'des'), '--to-timm', pt]) == 0
        capsys.readouterr()
    finally:
        os.umask(old)
    mode = lambda p: oct(os.stat(p).st_mode & 0o777)            # noqa: E731
    assert mode(path) == oct(0o777 & ~umask)
    for f in (artefacts.META_FILE, artefacts.ARRAYS_FILE):
        assert mode(os.path.join(path, f)) == oct(0o666 & ~umask), f
    assert mode(pt) == oct(0o666 & ~umask)
    assert sorted(os.listdir(tmp_path)) == ['des', 'des.safetensors', 'g']    # no temp dir left
