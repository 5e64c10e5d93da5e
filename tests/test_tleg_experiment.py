"""The TLEG experiment (experiments/tleg/run.py) and `jlearngene demo`: a miniature end to end."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jlearngene.commands import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
experiment = demo.load_experiment()


def _clean_env():
    env = dict(os.environ)
    flags = [f for f in env.get('XLA_FLAGS', '').split() if 'force_host_platform_device_count' not in f]
    env['XLA_FLAGS'] = ' '.join(flags)
    env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '1'    # compile faster; the run is tiny
    return env


@pytest.mark.slow
def test_demo_smoke_end_to_end(tmp_path):
    workdir = str(tmp_path / 'demo')
    proc = subprocess.run([sys.executable, '-m', 'jlearngene', 'demo', '--scale', 'smoke', '--quiet',
                           '--workdir', workdir], cwd=ROOT, env=_clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '| depth | method | acc. at init |' in proc.stdout           # the table is printed
    for name in ('results.json', 'results.md', 'accuracy_vs_steps.png'):
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    with open(os.path.join(workdir, 'results.json')) as f:
        results = json.load(f)
    rows = results['rows']
    assert [(r['depth'], r['method']) for r in rows] == [
        (d, m) for d in (1, 2) for m in ('tleg', 'share_init', 'he_lg', 'scratch')]
    for r in rows:
        assert 0.0 <= r['acc'] <= 1.0 and r['params'] > 0 and r['flops'] > 0
        assert len(results['curves'][f"des{r['depth']}_{r['method']}"]) == 3   # steps 0, 2, 4
    by = {(r['depth'], r['method']): r for r in rows}
    # the descendant at the Aux-Net's depth is the Aux-Net: same test accuracy before fine-tuning
    assert by[(2, 'tleg')]['acc_init'] == pytest.approx(results['aux']['tleg'], abs=1e-9)
    assert by[(2, 'share_init')]['acc_init'] == pytest.approx(results['aux']['share_init'], abs=1e-9)
    assert by[(2, 'scratch')]['s_params'] == 0
    assert by[(1, 'tleg')]['s_params'] == by[(2, 'tleg')]['s_params'] == results['gene_params']
    assert by[(1, 'tleg')]['params'] < by[(2, 'tleg')]['params']
    names = [r['name'] for r in results['upstream']['runs']]
    assert names == ['teacher', 'aux_tleg', 'aux_share_init']

    # the saved gene is a loadable artefact that initialises any depth
    from jlearngene.genes import tleg
    from jlearngene.train import checkpoint
    gene, aux_cfg, extra = checkpoint.load_model(os.path.join(workdir, 'gene'))
    assert extra['kind'] == 'tleg_gene' and aux_cfg.depth == 2
    des = tleg.descend(gene, aux_cfg.replace(depth=5))
    assert np.asarray(des['blocks']['attn']['q']['kernel']).shape[0] == 5


def test_configs_and_cli_options():
    args = experiment.parser().parse_args(['--quick', '--seed', '3', '--official-pool-order'])
    cfg = experiment.config_from_args(args)
    full = experiment.default_config('digits')
    assert cfg['seed'] == 3 and cfg['descend']['official_pool_order']
    assert cfg['descend']['steps'] == full['descend']['steps'] // 2
    assert cfg['aux']['alpha'] == 1.0 and cfg['aux']['tau'] == 1.0      # official pure KD
    assert cfg['descend']['depths'] == [2, 3, 4, 6]
    paper = experiment.default_config('paper')
    assert paper['model']['image_size'] == 224 and paper['aux']['depth'] == 12
    assert experiment.model_config(paper, 12, 1000).width == 384
    with pytest.raises(ValueError, match='unknown scale'):
        experiment.default_config('huge')


def test_paper_scale_needs_data_dir(tmp_path):
    with pytest.raises(ValueError, match='--data-dir'):
        experiment.run(experiment.default_config('paper'), str(tmp_path), quiet=True)


def test_markdown_table_layout():
    results = {
        'finetune_steps': 10, 'teacher': {'depth': 2, 'accuracy': 0.9}, 'aux': {'tleg': 0.8},
        'seconds': 1.0,
        'upstream': {'runs': [{'name': 'teacher', 'epochs': 1.0, 'flops': 2e9},
                              {'name': 'aux_tleg', 'epochs': 1.0, 'flops': 3e9}]},
        'rows': [dict(depth=2, method='tleg', acc_init=0.5, acc=0.75, params=1e6, s_params=2e5,
                      flops=3e6, finetune_flops=4e9, he_lg_k=None),
                 dict(depth=2, method='he_lg', acc_init=0.1, acc=0.6, params=1e6, s_params=1e5,
                      flops=3e6, finetune_flops=4e9, he_lg_k=1)],
    }
    table = experiment.markdown(results).splitlines()
    assert table[2].startswith('| depth | method |')
    assert table[4] == '| 2 | TLEG | 0.5000 | **0.7500** | 1.000 | 0.200 | 3.00 | 4.0 | 5.0 |'
    assert table[5] == '| 2 | He-LG (k=1) | 0.1000 | **0.6000** | 1.000 | 0.100 | 3.00 | 4.0 | 2.0 |'
