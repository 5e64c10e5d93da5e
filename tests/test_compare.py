"""The comparison of every method (jlearngene/experiments/configs/compare.py, a study of
jlearngene/experiments/study.py): its plan of shapes, its configs and its command's errors.
Its cost arithmetic and miniature run are in tests/test_study.py."""
import pytest

from jlearngene import cli
from jlearngene.experiments import configs, study


def test_plan_names_what_a_method_cannot_make():
    config = configs.load('compare:smoke')
    plan = study.plan(config, 10)
    assert plan['pre_fin'][(16, 2)].width == 16
    assert "pre_fin: the gene's 'blocks/attn" in plan['pre_fin'][(12, 2)]   # its GeneError
    assert plan['imwlm'][(12, 2)].num_heads == 3                   # heads of the model's head_dim
    assert set(plan['scratch']) == {(16, 2), (12, 2)}
    with pytest.raises(ValueError, match=r'pre_fin.*\(width 12, depth 2\)'):
        study.plan(configs.load('compare:smoke', {'on_missing': 'error'}), 10)
    with pytest.raises(ValueError, match="'nosuch'"):
        study.plan(configs.load('compare:smoke', {'methods': ('imwlm', 'nosuch')}), 10)
    with pytest.raises(ValueError, match=r'\(width 10, depth 2\)'):
        study.plan(configs.load('compare:smoke', {'shapes': ((10, 2),)}), 10)


def test_cli_errors_are_one_line(tmp_path, capsys):
    rc = cli.main(['compare', 'smoke', "--config.methods=('imwlm','nosuch')",
                   '--workdir', str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "'nosuch'" in err[0]
    rc = cli.main(['compare', 'smoke', '--config.on_missing=error',
                   '--workdir', str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and 'pre_fin' in err[0] and '(width 12, depth 2)' in err[0]


def test_configs_resolve_and_the_paper_scale_needs_data():
    digits = configs.load('compare')
    assert configs.load('compare:digits').to_dict() == digits.to_dict()
    assert set(digits.methods) >= {'tleg', 'letra', 'cluster', 'scala', 'mango'}
    paper = configs.load('compare:paper')
    assert paper.data.name == 'tfds' and paper.model.image_size == 224
    with pytest.raises(ValueError, match='data_dir'):
        study.run_experiment(configs.load('compare:paper', {'compile_cache': False}), '/nonexistent', quiet=True)
