"""The experiment harness and its config files (the end-to-end smoke run from an installed
wheel is tests/test_demo_wheel.py)."""
import os

import numpy as np
import pytest

from jlearngene import cli
from jlearngene.commands import compare, train
from jlearngene.experiments import configs, harness, study, tleg
from jlearngene.models import vit_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tleg_config_for_every_arg():
    full = configs.load('tleg:digits')
    assert configs.load('tleg').to_dict() == full.to_dict()            # 'digits' is the default
    assert full.task == 'experiment' and full.experiment == 'tleg'
    assert full.aux.alpha == 1.0 and full.aux.tau == 1.0               # official pure KD
    assert [d for _, d in full.shapes] == [2, 3, 4, 6] and full.depth == 6
    assert full.methods == ('tleg', 'share_init', 'mini_init', 'he_lg', 'pre_fin') and full.seeds == (0, 1, 2)
    quick = configs.load('tleg:digits,quick')
    assert quick.seeds == (0,) and quick.scratch.to_dict() == full.scratch.to_dict()
    smoke = configs.load('tleg:smoke')
    assert [d for _, d in smoke.shapes] == [1, 2] and smoke.depth == 2
    paper = configs.load('tleg:paper')
    assert paper.model.image_size == 224 and paper.depth == 12 and paper.descend.official_pool_order
    assert harness.reference_config(paper, 1000).width == 384
    for bad, arg in (('huge', 'huge'), ('digits,smoke', 'digits,smoke'), ('digits,fast', 'fast')):
        with pytest.raises(ValueError, match=f"'{arg}'"):
            configs.load(f'tleg:{bad}')


def test_digits_vit_config_by_name_and_by_path():
    bundled = configs.load('digits_vit')
    assert bundled.task == 'classification' and bundled.steps == 1500
    assert configs.load('digits_vit:smoke').steps == 20
    by_path = configs.load(configs.path('digits_vit'))
    assert by_path.to_dict() == bundled.to_dict()


def test_bundled_names_resolve_to_files():
    assert {'tleg', 'digits_vit'} <= set(configs.names())
    where, arg = configs.split(configs.resolve('tleg:smoke'))
    assert arg == 'smoke' and os.path.isfile(where) and where.endswith(os.path.join('configs', 'tleg.py'))
    assert configs.resolve('digits_vit') == configs.path('digits_vit')
    own = os.path.join(ROOT, 'jlearngene', 'experiments', 'configs', 'digits_vit.py') + ':smoke'
    assert configs.resolve(own) == own                     # an existing file stays a file
    with pytest.raises(ValueError, match="'nosuch'"):
        configs.resolve('nosuch:smoke')


def test_overrides_are_typed_and_locked():
    c = configs.load('tleg:smoke', {'descend.evals': 3, 'seed': 5})
    assert c.descend.evals == 3 and c.seed == 5
    with pytest.raises(ValueError, match=r"'descend\.evls'"):
        configs.load('tleg:smoke', {'descend.evls': 3})
    with pytest.raises(configs.ConfigError, match="descend.evals must be an integer.*'many'"):
        configs.load('tleg:smoke', {'descend.evals': 'many'})

    fv = train.parse_flags(['--config', 'tleg:smoke', '--config.descend.evals=3',
                            '--config.shapes=((32,1),)', '--workdir', 'w'])
    assert fv.config.descend.evals == 3 and fv.config.shapes == ((32, 1),) and fv.workdir == 'w'
    fv = train.parse_flags(['--config=digits_vit:smoke', '--workdir=w'], 'p')
    assert fv.config.steps == 20


def test_cli_config_errors_are_one_line(tmp_path, capsys):
    assert cli.main(['train', '--config', 'nosuch', '--workdir', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'jlearngene train: ' in err and "'nosuch'" in err
    assert cli.main(['train', '--config', 'tleg:smoke', '--config.descend.evls=3',
                     '--workdir', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'evls' in err and "'descend.evals'" in err
    assert cli.main(['train', '--config', 'tleg:huge', '--workdir', str(tmp_path)]) == 2
    assert "'huge'" in capsys.readouterr().err
    rc = cli.main(['train', '--config', 'tleg:smoke', "--config.methods=('tleg','nosuch')",
                   '--config.compile_cache=false', '--workdir', str(tmp_path / 'm')])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith('jlearngene train: ') and "'nosuch'" in err[-1]


def _compare_args(argv):
    return train.parse_named(argv, 'jlearngene compare', compare.CONFIG, compare.WORKDIR,
                             compare.__doc__, compare.VARIANTS)


def test_a_named_config_command_takes_its_variant_and_overrides():
    args = _compare_args(['quick', '--noprogress', '--config.descend.lr=0.01'])
    assert args.config.seeds == (0,) and not args.progress
    assert args.config.descend.lr == 0.01 and args.workdir == 'workdirs/compare'
    assert args.config.scale == 'digits'
    assert _compare_args([]).config.to_dict() == configs.load('compare:digits').to_dict()
    assert _compare_args(['--config.seeds=3,4,5']).config.seeds == (3, 4, 5)
    paper = _compare_args(['paper', '--config.data.data_dir=/d', '--config.model.variant=B']).config
    assert (paper.scale, paper.data.data_dir, paper.model.variant) == ('paper', '/d', 'B')
    from jlearngene.commands.config_args import UsageError
    with pytest.raises(UsageError, match="'qiuck'"):
        _compare_args(['qiuck'])
    with pytest.raises(UsageError, match='--quick'):
        _compare_args(['--quick'])      # no flag re-spells a config field or variant


def test_paper_scale_needs_data_dir(tmp_path):
    with pytest.raises(ValueError, match='data_dir'):
        study.run_experiment(configs.load('tleg:paper', {'compile_cache': False}), str(tmp_path), quiet=True)


def test_unknown_method_or_experiment(tmp_path):
    with pytest.raises(ValueError, match="'nosuch'"):
        study.run_experiment(configs.load('tleg:smoke', {'methods': ('tleg', 'nosuch')}), str(tmp_path))
    with pytest.raises(ValueError, match="'nosuch'"):
        study.run_experiment(configs.load('tleg:smoke', {'experiment': 'nosuch'}), str(tmp_path))
    assert not os.listdir(tmp_path)                        # nothing ran, nothing written


def test_budgets():
    assert harness.budget({'steps': 7, 'epochs': 3.0}, 100, 10, 'x') == 7
    assert harness.budget({'steps': 0, 'epochs': 2.5}, 100, 10, 'x') == 25
    with pytest.raises(ValueError, match="'aux'.*steps.*epochs"):
        harness.budget({'steps': 0, 'epochs': 0.0}, 100, 10, 'aux')


def _row(config, name):
    return next(r for r in study.make_rows(config) if r.name == name)


def test_tleg_study_options():
    config = configs.load('tleg:digits')
    teacher = harness.reference_config(config, 10)
    assert (teacher.width, teacher.num_heads, teacher.depth) == (64, 4, 6)

    def k(d, c=config, t=teacher):
        ctx = harness.Context(c, num_classes=10)
        ctx.ref = t
        return _row(c, 'he_lg').recipe.gene_options(ctx, _row(c, 'he_lg'), t.replace(depth=d))['k']
    assert [k(d) for d in (2, 3, 4, 6)] == [1, 2, 2, 3]                        # ⌈L_d / 2⌉
    assert k(6, t=teacher.replace(depth=2)) == 2                                 # ≤ teacher depth
    assert k(6, c=configs.load('tleg:digits', {'method_options.he_lg.gene.k': 1})) == 1
    assert _row(config, 'tleg').gene == {'expand': ('msa', 'mlp', 'ln'), 'from_layer': 0}
    assert _row(config, 'tleg').descend == {} and _row(config, 'he_lg').descend == {'head': 'new'}
    assert _row(config, 'he_lg').recipe.label(_row(config, 'he_lg')) == 'He-LG'
    letra = configs.load('letra:smoke')
    assert study.label(_row(letra, 'letra/random')) == 'LeTra (random)'
    d_cfg = teacher.replace(depth=3)
    assert tleg.STUDY.descendant_config(d_cfg, config) == d_cfg
    official = tleg.STUDY.descendant_config(d_cfg, configs.load('tleg', {'descend.official_pool_order': True}))
    assert official.pool_norm == 'after' and official.ln_eps == 1e-6 and official.depth == 3
    assert _row(config, 'tleg').recipe.billed(_row(config, 'tleg')) == ('teacher', 'aux_tleg')
    assert _row(config, 'he_lg').recipe.billed(_row(config, 'he_lg')) == ('teacher',)
    mango = configs.load('mango')
    assert _row(mango, 'mango/1').recipe.billed(_row(mango, 'mango/1')) == ('small',)


def test_eval_fn_is_one_object_per_config():
    cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=1, image_size=16, patch_size=8,
                     channels=1, num_classes=10)
    assert harness.eval_fn(cfg) is harness.eval_fn(cfg.replace())
    assert harness.eval_fn(cfg) is not harness.eval_fn(cfg.replace(depth=2))


def test_study_shapes_split_into_heads_of_the_model():
    config = configs.load('letra:smoke')
    base = harness.reference_config(config, 10)
    cfg = harness.shape_configs(config, (2 * base.head_dim, 3), 10)[0]
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.head_dim) == (2 * base.head_dim, 3, 2, base.head_dim)
    assert cfg.mlp_dim == int(config['mlp_ratio']) * cfg.width
    with pytest.raises(ValueError, match=f'width {base.head_dim + 1}'):
        harness.shape_configs(config, (base.head_dim + 1, 3), 10)
    # (width, depth, heads): that many heads of the model's head_dim (Cluster-Learngene's ω)
    wide = harness.shape_configs(config, (2 * base.head_dim, 3, 5), 10)
    assert [(c.num_heads, c.head_dim) for c in wide] == [(5, base.head_dim)]
    with pytest.raises(ValueError, match=r'\(32, 0\)'):
        study.study_shapes({'shapes': ((32, 0),)})


def test_task_data_relabels_its_classes_and_refuses_others():
    config = configs.load('cluster:smoke')
    task = harness.Data(config, (7, 3))
    labels = {int(task.sources['train'][i]['label']) for i in range(len(task.sources['train']))}
    assert task.num_classes == 2 and labels == {0, 1}
    batch = next(iter(task.train(0)))
    assert set(np.asarray(batch['label']).tolist()) <= {0, 1}
    assert sum(int(b['mask'].sum()) for b in task.test()) == len(task.sources['test'])
    (raw,) = task.raw_batches(8, 64)
    assert raw.shape[0] == 8 and 0 <= raw.min() and raw.max() <= 1
    with pytest.raises(ValueError, match=r'\(3, 3\)'):
        harness.Data(config, (3, 3))
    with pytest.raises(ValueError, match=r'\[12\]'):
        harness.Data(config, (1, 12))
