"""`jlearngene demo` and a study from a plain (non-editable) wheel: the package is built into
a wheel, installed into a folder of its own, and both run from a directory outside the source
tree with only that folder on the path, so everything they need (the shipped gene, the
harness, the method part, the bundled config) must ship inside the wheel. The TLEG study's
smoke run is also the harness's end-to-end test."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jlearngene import costs, genes
from jlearngene.experiments import harness
from jlearngene.train import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ('jlearngene', 'setup.cfg', 'pyproject.toml', 'README.md')
PNG = b'\x89PNG\r\n\x1a\n'


def _env(site):
    env = dict(os.environ)
    flags = [f for f in env.get('XLA_FLAGS', '').split() if 'force_host_platform_device_count' not in f]
    env['XLA_FLAGS'] = ' '.join(flags)
    env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '1'    # compile faster; the run is tiny
    env['PYTHONPATH'] = site
    return env


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    """(site folder, its jlearngene/ path): the wheel built from a copy of the source tree
    (the checkout itself stays untouched by the build) and installed with --target."""
    tmp = tmp_path_factory.mktemp('wheel')
    src = tmp / 'src'
    for name in SOURCES:
        if os.path.isdir(os.path.join(ROOT, name)):
            shutil.copytree(os.path.join(ROOT, name), src / name,
                            ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copy(os.path.join(ROOT, name), src / name)
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '--no-input']
    build = subprocess.run(pip + ['wheel', '--no-deps', '--no-build-isolation', '--no-index', '-w',
                                  str(tmp / 'dist'), str(src)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = os.listdir(tmp / 'dist')
    assert wheel.startswith('jlearngene-') and wheel.endswith('.whl')
    site = str(tmp / 'site')
    install = subprocess.run(pip + ['install', '--no-deps', '--no-index', '--target', site,
                                    str(tmp / 'dist' / wheel)], capture_output=True, text=True,
                             timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    return site, os.path.join(site, 'jlearngene')


@pytest.mark.slow
def test_the_demo_runs_from_the_installed_wheel(installed, tmp_path):
    site, package = installed
    gene = os.path.join(package, 'zoo', 'letra_digits')
    assert sorted(os.listdir(gene)) == ['gene.json', 'gene.safetensors']   # the shipped gene
    workdir = str(tmp_path / 'demo')
    run_dir = tmp_path / 'elsewhere'
    run_dir.mkdir()
    driver = ('import sys, jlearngene; print("jlearngene from", jlearngene.__file__); '
              'from jlearngene import cli; sys.exit(cli.main(sys.argv[1:]))')
    proc = subprocess.run([sys.executable, '-c', driver, 'demo', '--steps', '8', '--workdir', workdir],
                          cwd=run_dir, env=_env(site), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith(f'jlearngene from {os.path.join(package, "__init__.py")}')
    lines = proc.stdout.strip().splitlines()[1:]
    assert len(lines) <= 30 and lines[0].startswith('One LeTra learngene'), proc.stdout
    assert sum(line.startswith('|') for line in lines) == 2 + 4           # header + four shapes
    png = os.path.join(workdir, 'demo_curves.png')
    assert f'curves: {png}' in proc.stdout and open(png, 'rb').read(8) == PNG
    assert proc.stdout.count('\n') + proc.stderr.count('\n') <= 40


@pytest.mark.slow
def test_the_study_smoke_runs_from_the_installed_wheel(installed, tmp_path):
    site, package = installed
    assert os.path.isfile(os.path.join(package, 'experiments', 'configs', 'tleg.py'))
    assert os.path.isfile(os.path.join(site, 'bin', 'jlearngene'))          # the console script
    workdir = str(tmp_path / 'demo')
    run_dir = tmp_path / 'elsewhere'
    run_dir.mkdir()
    driver = ('import sys, jlearngene; print("jlearngene from", jlearngene.__file__); '
              'from jlearngene import cli; sys.exit(cli.main(sys.argv[1:]))')
    proc = subprocess.run([sys.executable, '-c', driver, 'train', '--config', 'tleg:smoke',
                           '--noprogress', '--workdir', workdir], cwd=run_dir, env=_env(site),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith(f'jlearngene from {os.path.join(package, "__init__.py")}')
    assert '| shape | method | budget | acc. at init |' in proc.stdout      # the table is printed
    assert '**Verdicts**' in proc.stdout
    assert 'scratch  w32' not in proc.stdout                               # --quiet: only the table
    for name in ('results.json', 'results.md'):
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    assert open(os.path.join(workdir, 'accuracy_vs_flops.png'), 'rb').read(8) == PNG

    with open(os.path.join(workdir, 'results.json')) as f:
        results = json.load(f)
    assert open(os.path.join(workdir, 'results.md')).read().strip() in proc.stdout
    rows = results['rows']
    assert sorted({(tuple(r['shape']), r['method']) for r in rows}) == sorted(
        ((32, d), m) for d in (1, 2) for m in ('scratch',) + tuple(results['config']['methods']))
    assert 'mini_init' in results['config']['methods']
    for r in rows:
        assert 0.0 <= r['acc'] <= 1.0 and r['params'] > 0 and r['steps'] > 0
    by = {(tuple(r['shape']), r['method']): r for r in rows}
    # fine-tuning: 3 forward passes per image, steps x batch images
    cfg = harness.shape_configs(results['config'], (32, 1), 10)[0]
    r = by[((32, 1), 'tleg')]
    assert r['finetune_flops'] == pytest.approx(
        costs.TRAIN_FACTOR * costs.flops_per_image(cfg) * r['steps'] * results['config']['batch_size'])
    assert r['steps'] == harness.fraction_steps(0.35, results['scratch']['w32_d1']['S'])

    # the saved gene is a loadable artefact that initialises any depth
    gene, aux_cfg, extra = checkpoint.load_model(os.path.join(workdir, 'genes', 'tleg', 'seed_0'))
    assert extra['kind'] == 'tleg_gene' and extra['method'] == 'tleg' and aux_cfg.depth == 2
    des = genes.get('tleg').descend(gene, aux_cfg.replace(depth=5))
    assert np.asarray(des['blocks']['attn']['q']['kernel']).shape[0] == 5
