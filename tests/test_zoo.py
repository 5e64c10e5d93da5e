"""The genes shipped with the package (`jlearngene.zoo`): the gene files load with their
checksums verified, descend to other shapes, record how they were made, and the command
line takes them by name."""
import json
import os

import numpy as np
import pytest

from jlearngene import artefacts, cli, zoo
from jlearngene.commands import demo
from jlearngene.commands.descend import descend_gene_dir
from jlearngene.experiments import configs
from jlearngene.experiments.results import shape_key
from jlearngene.models import apply
from jlearngene.zoo import make

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_shipped_gene_loads_with_its_checksums_and_descends_to_two_shapes():
    assert demo.GENE in zoo.names()
    method, gene, meta = artefacts.load_gene(zoo.path(demo.GENE))
    assert method.name == 'letra' and artefacts.has_checksums(meta)
    import safetensors.numpy
    arrays = safetensors.numpy.load_file(os.path.join(zoo.path(demo.GENE), artefacts.ARRAYS_FILE))
    assert set(arrays) == set(meta['arrays']) and gene is not None
    for k, a in arrays.items():                      # the bytes are those gene.json records
        assert artefacts.checksum(a) == meta['arrays'][k]['sha256'], k
    images = np.zeros((2, 16, 16, 1), np.float32)
    for width, depth in ((32, 4), (48, 8)):
        params, cfg, _, _ = descend_gene_dir(demo.GENE, width=width, depth=depth)
        assert (cfg.width, cfg.depth) == (width, depth)
        assert params['blocks']['attn']['q']['kernel'].shape[:2] == (depth, width)
        logits, _ = apply(params, images, cfg)
        assert logits.shape == (2, 10) and np.isfinite(np.asarray(logits)).all()


def test_a_shipped_gene_loads_by_name_unless_a_folder_of_that_name_exists(tmp_path, monkeypatch):
    by_name = artefacts.load_gene(demo.GENE)
    assert by_name[2]['path'] == zoo.path(demo.GENE)
    with pytest.raises(artefacts.GeneFileError, match="'letra_digitz' is neither a gene directory nor a "
                                                      "shipped gene .shipped: letra_digits"):
        artefacts.read_meta('letra_digitz')
    monkeypatch.chdir(tmp_path)
    (tmp_path / demo.GENE).mkdir()           # a folder of that name here is what the name means
    with pytest.raises(artefacts.GeneFileError, match='gene.json: missing'):
        artefacts.load_gene(demo.GENE)


def test_a_damaged_shipped_gene_is_refused(tmp_path):
    import shutil
    copy = tmp_path / 'g'
    shutil.copytree(zoo.path(demo.GENE), copy)
    meta = json.loads((copy / 'gene.json').read_text())
    key = sorted(meta['arrays'])[0]
    meta['arrays'][key]['sha256'] = '0' * 64
    (copy / 'gene.json').write_text(json.dumps(meta))
    with pytest.raises(artefacts.GeneFileError, match='damaged'):
        artefacts.load_gene(copy)


def test_the_gene_records_how_it_was_made_and_the_numbers_the_demo_shows():
    meta = artefacts.read_meta(zoo.path(demo.GENE))
    prov = meta['provenance']
    assert prov['command'].startswith('python -m jlearngene.zoo.make letra_digits')
    assert len(prov['commit']) == 40 and isinstance(prov['dirty'], bool)
    assert prov['data']['name'] == 'digits' and prov['data']['splits']['train'] == 'half_train'
    assert prov['seed'] == 0 and 0.9 < prov['aux_test_accuracy'] <= 1.0
    assert prov['study'] == 'letra:digits'
    # the record is the study's results.json, read by code: the same numbers today
    record = make.study_record(os.path.join(ROOT, 'experiments/letra/results.json'))
    for key in ('scratch', 'reference', 'descend', 'seeds', 'aux_accuracy', 'file'):
        assert prov['record'][key] == record[key], key
    assert prov['record']['file_commit'] and prov['record']['code_commit']
    for shape in demo.SHAPES:                            # the demo's shapes are recorded ones
        assert prov['record']['scratch'][shape_key(shape)]['converged']


def test_the_maker_checks_the_bundled_config_against_the_record():
    record = make.study_record(os.path.join(ROOT, 'experiments/letra/results.json'),
                               os.path.join(ROOT, 'experiments/letra/README.md'))
    assert record['code_commit'] and record['reference']['S'] > 0
    config = configs.load('letra:digits')
    make._check_config(config, record)
    make._check_options(dict(config.method_options.letra.gene), record)
    with pytest.raises(ValueError, match='learngene_depth'):
        make._check_options({'learngene_depth': 3}, record)
    with pytest.raises(ValueError, match='no recipe'):
        make.make('nosuch', 'w')


def test_the_command_line_takes_a_shipped_gene_by_name(tmp_path, capsys):
    assert cli.main(['info']) == 0
    out = capsys.readouterr().out
    assert 'shipped genes' in out and demo.GENE in out and 'LeTra' in out
    assert cli.main(['info', demo.GENE]) == 0
    out = capsys.readouterr().out
    assert 'LeTra' in out and 'aux_test_accuracy' in out
    des = str(tmp_path / 'des')
    assert cli.main(['descend', demo.GENE, '--width', '40', '--depth', '6', '--out', des]) == 0
    assert 'width=40 depth=6' in capsys.readouterr().out
    assert cli.main(['descend', 'nosuch_gene', '--out', str(tmp_path / 'x')]) == 1
    assert demo.GENE in capsys.readouterr().err


def test_a_transfer_study_gene_is_taken_from_its_finished_study_only(tmp_path):
    """tleg_fashion and letra_fashion come from their finished studies (`from_study`, the
    slow transfer test makes one), never trained here; what is not such a study is named."""
    assert {'tleg_fashion', 'letra_fashion'} <= set(make.GENES)
    with pytest.raises(ValueError, match='taken from its finished study'):
        make.make('tleg_fashion', str(tmp_path / 'w'))
    with pytest.raises(ValueError, match="'letra_digits' is not a gene of a transfer study"):
        make.from_study('letra_digits', str(tmp_path))
    with pytest.raises(FileNotFoundError, match='the study is not finished'):
        make.from_study('tleg_fashion', str(tmp_path))
