"""The experiment harness, its config files and `jlearngene demo`'s flags (the end-to-end
smoke run from an installed wheel is tests/test_demo_wheel.py)."""
import os

import pytest

from jlearngene import cli, genes
from jlearngene.commands import demo, train
from jlearngene.experiments import cluster, configs, harness, letra, scala, tleg
from jlearngene.models import vit_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tleg_config_for_every_arg():
    full = configs.load('tleg:digits')
    assert configs.load('tleg').to_dict() == full.to_dict()            # 'digits' is the default
    assert full.task == 'experiment' and full.experiment == 'tleg'
    assert full.aux.alpha == 1.0 and full.aux.tau == 1.0               # official pure KD
    assert full.descend.depths == (2, 3, 4, 6)
    assert full.methods == ('tleg', 'share_init', 'he_lg', 'scratch')
    quick = configs.load('tleg:digits,quick')
    for section in ('teacher', 'aux', 'descend'):
        assert quick[section].steps == full[section].steps // 2
    assert quick.descend.eval_every == full.descend.eval_every // 2
    smoke = configs.load('tleg:smoke')
    assert smoke.descend.depths == (1, 2) and smoke.teacher.depth == smoke.aux.depth == 2
    paper = configs.load('tleg:paper')
    assert paper.model.image_size == 224 and paper.aux.depth == 12 and paper.descend.official_pool_order
    assert harness.model_config(paper, 12, 1000).width == 384
    assert configs.load('tleg:paper,quick').aux.epochs == paper.aux.epochs / 2
    for bad, arg in (('huge', 'huge'), ('digits,smoke', 'digits,smoke'), ('digits,fast', 'fast')):
        with pytest.raises(ValueError, match=f"'{arg}'"):
            configs.load(f'tleg:{bad}')


def test_digits_vit_config_and_its_source_tree_path():
    bundled = configs.load('digits_vit')
    assert bundled.task == 'classification' and bundled.steps == 1500
    assert configs.load('digits_vit:smoke').steps == 20
    by_path = configs.load(os.path.join(ROOT, 'experiments', 'configs', 'digits_vit.py'))
    assert by_path.to_dict() == bundled.to_dict()


def test_bundled_names_resolve_to_files():
    assert {'tleg', 'digits_vit'} <= set(configs.names())
    where, arg = configs.split(configs.resolve('tleg:smoke'))
    assert arg == 'smoke' and os.path.isfile(where) and where.endswith(os.path.join('configs', 'tleg.py'))
    assert configs.resolve('digits_vit') == configs.path('digits_vit')
    own = os.path.join(ROOT, 'experiments', 'configs', 'digits_vit.py') + ':smoke'
    assert configs.resolve(own) == own                     # an existing file stays a file
    with pytest.raises(ValueError, match="'nosuch'"):
        configs.resolve('nosuch:smoke')


def test_overrides_are_typed_and_locked():
    c = configs.load('tleg:smoke', {'descend.steps': 3, 'seed': 5})
    assert c.descend.steps == 3 and c.seed == 5
    with pytest.raises(ValueError, match=r"'descend\.stpes'"):
        configs.load('tleg:smoke', {'descend.stpes': 3})
    with pytest.raises(TypeError):
        configs.load('tleg:smoke', {'descend.steps': 'many'})

    fv = train.parse_flags(['--config', 'tleg:smoke', '--config.descend.steps=3',
                            '--config.descend.depths=(1,)', '--workdir', 'w'])
    assert fv.config.descend.steps == 3 and fv.config.descend.depths == (1,) and fv.workdir == 'w'
    fv = train.parse_flags(['--config=digits_vit:smoke', '--workdir=w'], 'p')
    assert fv.config.steps == 20


def test_cli_config_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(['train', '--config', 'nosuch', '--workdir', str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'jlearngene train: ' in err and "'nosuch'" in err
    with pytest.raises(SystemExit):
        cli.main(['train', '--config', 'tleg:smoke', '--config.descend.stpes=3', '--workdir', str(tmp_path)])
    err = capsys.readouterr().err
    assert 'stpes' in err and '"steps"' in err
    with pytest.raises(SystemExit):
        cli.main(['train', '--config', 'tleg:huge', '--workdir', str(tmp_path)])
    assert "'huge'" in capsys.readouterr().err
    rc = cli.main(['train', '--config', 'tleg:smoke', "--config.methods=('tleg','nosuch')",
                   '--config.compile_cache=false', '--workdir', str(tmp_path / 'm')])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith('jlearngene train: ') and "'nosuch'" in err[-1]


def test_demo_flags_become_config_overrides():
    argv = demo.train_argv(['--quick', '--seed', '3', '--official-pool-order', '--quiet',
                            '--config.descend.lr=0.01'])
    assert argv == ['--config', 'tleg:digits,quick', '--workdir', 'workdirs/demo', '--config.seed=3',
                    '--config.descend.official_pool_order=true', '--noprogress',
                    '--config.descend.lr=0.01']
    fv = train.parse_flags(argv, 'jlearngene demo')
    full = configs.load('tleg:digits')
    assert fv.config.seed == 3 and fv.config.descend.official_pool_order and not fv.progress
    assert fv.config.descend.steps == full.descend.steps // 2 and fv.config.descend.lr == 0.01
    assert demo.train_argv(['--scale', 'paper', '--data-dir', '/d', '--teacher', 'T', '--variant', 'B'])[:2] == [
        '--config', 'tleg:paper']
    with pytest.raises(SystemExit):
        demo.train_argv(['--qiuck'])


def test_paper_scale_needs_data_dir(tmp_path):
    with pytest.raises(ValueError, match='data_dir'):
        harness.run(configs.load('tleg:paper', {'compile_cache': False}), str(tmp_path), quiet=True)


def test_unknown_method_or_experiment(tmp_path):
    with pytest.raises(genes.GeneError, match="'nosuch'"):
        harness.run(configs.load('tleg:smoke', {'methods': ('tleg', 'nosuch')}), str(tmp_path))
    with pytest.raises(ValueError, match="'nosuch'"):
        harness.run(configs.load('tleg:smoke', {'experiment': 'nosuch'}), str(tmp_path))
    assert not os.listdir(tmp_path)                        # nothing ran, nothing written


def test_budgets():
    assert harness.budget({'steps': 7, 'epochs': 3.0}, 100, 10, 'x') == 7
    assert harness.budget({'steps': 0, 'epochs': 2.5}, 100, 10, 'x') == 25
    with pytest.raises(ValueError, match="'aux'.*steps.*epochs"):
        harness.budget({'steps': 0, 'epochs': 0.0}, 100, 10, 'aux')


def test_tleg_part_options():
    config = configs.load('tleg:digits')
    teacher = vit_config('Ti', width=64, num_heads=4, mlp_dim=128, depth=6, image_size=16,
                         patch_size=4, channels=1, num_classes=10)
    opts = lambda name, depth, c=config, t=teacher: tleg.PART.options(genes.get(name), depth, c, t)
    assert opts('tleg', None) == {'gene': {'expand': ('msa', 'mlp', 'ln'), 'from_layer': 0},
                                  'descend': {'head': 'inherit'}}
    assert opts('share_init', 4)['descend'] == {'head': 'inherit'}
    assert [opts('he_lg', d)['gene']['k'] for d in (2, 3, 4, 6)] == [1, 2, 2, 3]   # ⌈L_d / 2⌉
    assert opts('he_lg', 6, t=teacher.replace(depth=2))['gene']['k'] == 2      # ≤ teacher depth
    fixed = configs.load('tleg:digits', {'method_options.he_lg.k': 1})
    assert opts('he_lg', 6, c=fixed)['gene']['k'] == 1
    assert opts('scratch', 2) == {'gene': {}, 'descend': {}}
    assert tleg.PART.label(genes.get('he_lg'), opts('he_lg', 3)) == 'He-LG (k=2)'
    assert tleg.PART.label(genes.get('tleg'), opts('tleg', 3)) == 'TLEG'
    d_cfg = teacher.replace(depth=3)
    assert tleg.PART.descendant_config(d_cfg, config) == d_cfg
    official = tleg.PART.descendant_config(d_cfg, configs.load('tleg', {'descend.official_pool_order': True}))
    assert official.pool_norm == 'after' and official.ln_eps == 1e-6 and official.depth == 3


def _results():
    return {
        'finetune_steps': 10, 'teacher': {'depth': 2, 'accuracy': 0.9}, 'aux': {'tleg': 0.8},
        'labels': {'tleg': 'TLEG'}, 'seconds': 1.0,
        'upstream': {'runs': [{'name': 'teacher', 'epochs': 1.0, 'flops': 2e9},
                              {'name': 'aux_tleg', 'epochs': 1.0, 'flops': 3e9}]},
        'rows': [dict(depth=2, method='tleg', label='TLEG', acc_init=0.5, acc=0.75, params=1e6,
                      s_params=2e5, flops=3e6, finetune_flops=4e9, upstream_flops=5e9),
                 dict(depth=2, method='he_lg', label='He-LG (k=1)', acc_init=0.1, acc=0.6, params=1e6,
                      s_params=1e5, flops=3e6, finetune_flops=4e9, upstream_flops=2e9),
                 dict(depth=2, method='scratch', label='Scratch', acc_init=0.1, acc=0.3, params=1e6,
                      s_params=0, flops=3e6, finetune_flops=4e9, upstream_flops=0.0)],
        'curves': {'des2_tleg': [(0, 0.5), (5, 0.7), (10, 0.75)],
                   'des2_he_lg': [(0, 0.1), (5, 0.4), (10, 0.6)],
                   'des2_scratch': [(0, 0.1), (5, 0.2), (10, 0.3)]},
    }


def test_markdown_table_layout():
    table = harness.markdown(_results()).splitlines()
    assert table[0] == 'Descendants fine-tuned 10 steps each (teacher depth 2: 0.9000, Aux-Net TLEG: 0.8000).'
    assert table[2].startswith('| depth | method |')
    assert table[4] == '| 2 | TLEG | 0.5000 | **0.7500** | 1.000 | 0.200 | 3.00 | 4.0 | 5.0 |'
    assert table[5] == '| 2 | He-LG (k=1) | 0.1000 | **0.6000** | 1.000 | 0.100 | 3.00 | 4.0 | 2.0 |'
    assert 'teacher 1.0 epochs = 2.0 GFLOPs, aux_tleg 1.0 epochs = 3.0 GFLOPs' in table[8]


def test_flops_curves_and_plots(tmp_path):
    results = _results()
    tleg_row, _, scratch_row = results['rows']
    # upstream cost first, then 4e9 / 10 steps of fine-tuning per step
    assert harness.flops_curve(results, tleg_row) == [(5e9, 0.5), (7e9, 0.7), (9e9, 0.75)]
    assert harness.flops_curve(results, scratch_row)[0] == (0.0, 0.1)
    paths = harness.plot(results, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ['accuracy_vs_steps.png', 'accuracy_vs_flops.png']
    for p in paths:
        assert open(p, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_eval_fn_is_one_object_per_config():
    cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=1, image_size=16, patch_size=8,
                     channels=1, num_classes=10)
    assert harness.eval_fn(cfg) is harness.eval_fn(cfg.replace())
    assert harness.eval_fn(cfg) is not harness.eval_fn(cfg.replace(depth=2))


def test_upstream_runs_follow_the_gene_source():
    assert harness.upstream_runs(genes.get('tleg')) == ['teacher', 'aux_tleg']
    assert harness.upstream_runs(genes.get('he_lg')) == ['teacher']
    assert harness.upstream_runs(genes.get('scratch')) == []


def test_letra_descendant_shapes_and_steps_to_a_target():
    config = configs.load('letra:smoke')
    base = harness.model_config(config, 4, 10)
    cfg = letra.descendant_config(config, 2 * base.head_dim, 3, 10)
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.head_dim) == (2 * base.head_dim, 3, 2, base.head_dim)
    assert cfg.mlp_dim == int(config['mlp_ratio']) * cfg.width
    with pytest.raises(ValueError, match=f'width {base.head_dim + 1}'):
        letra.descendant_config(config, base.head_dim + 1, 3, 10)
    curve = [(0, 0.1), (10, 0.4), (20, 0.6), (30, 0.55)]
    assert letra.steps_to(curve, 0.5) == 20 and letra.steps_to(curve, 0.7) is None


def test_scala_unseen_widths_lie_between_grid_widths_in_whole_heads():
    cfg = vit_config('Ti', width=32, num_heads=4, mlp_dim=64, depth=1, image_size=8, patch_size=4,
                     num_classes=5)
    assert scala.unseen_widths(cfg, (0.25, 0.5, 0.75, 1.0)) == (0.375, 0.625, 0.875)
    # width 32 at 0.3125 is 10 channels: not 4 whole heads
    assert scala.unseen_widths(cfg, (0.25, 0.375)) == ()


def test_cluster_task_data_relabels_its_classes_and_refuses_others():
    config = configs.load('cluster:smoke')
    task = cluster.TaskData(config, (7, 3))
    labels = {int(task.sources['train'][i]['label']) for i in range(len(task.sources['train']))}
    assert task.num_classes == 2 and labels == {0, 1}
    with pytest.raises(ValueError, match=r'\(3, 3\)'):
        cluster.TaskData(config, (3, 3))
    with pytest.raises(ValueError, match=r'\[12\]'):
        cluster.TaskData(config, (1, 12))
