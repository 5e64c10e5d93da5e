"""`jlearngene train/eval/plot/info` end to end on a seconds-long digits run."""
import json
import os

import pytest

from jlearngene import cli
from jlearngene.train import metrics

pytestmark = pytest.mark.slow  # a real (seconds-long) digits run through the CLI

CONFIG = 'experiments/configs/digits_vit.py'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def run(tmp_path_factory, fast_compile):
    workdir = str(tmp_path_factory.mktemp('cli') / 'run')
    rc = cli.main(['train', '--config', os.path.join(ROOT, CONFIG) + ':smoke', '--config.steps=4',
                   '--config.model.depth=1', '--config.batch_size=32', '--config.optim.warmup_steps=1', '--config.log_every=2',
                   '--config.steps_per_call=2', '--workdir', workdir, '--noprogress'])
    return rc, workdir


def test_train_writes_resolved_config_metrics_and_model(run):
    rc, workdir = run
    assert rc == 0
    config = json.load(open(os.path.join(workdir, 'config.json')))
    assert config['steps'] == 4 and config['model']['depth'] == 1 and config['batch_size'] == 32
    kinds = [r['kind'] for r in metrics.read_metrics(workdir)]
    assert kinds.count('train') == 2 and kinds.count('eval') == 1
    assert os.path.isdir(os.path.join(workdir, 'model'))


def test_bad_configs_fail_clearly(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.stpes=3', '--workdir', str(tmp_path)])
    assert e.value.code == 2
    assert 'Did you mean "steps"' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.model.nosuch=1',
                  '--workdir', str(tmp_path)])
    assert "the config has no field 'nosuch' to override" in capsys.readouterr().err
    assert cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.steps=3',
                     '--workdir', str(tmp_path)]) == 1
    assert 'warmup_steps=100 exceeds total_steps=3' in capsys.readouterr().out
    assert cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.microbatches=3',
                     '--workdir', str(tmp_path / 'mb')]) == 1
    assert 'batch_size 128 is not a multiple of microbatches 3' in capsys.readouterr().out
    assert not os.path.exists(tmp_path / 'mb')
    assert cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.steps_per_call=fast',
                     '--workdir', str(tmp_path / 'spc')]) == 1
    assert "steps_per_call must be 'auto' or a positive integer, got 'fast'" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / 'spc')


def test_eval(run, capsys):
    _, workdir = run
    assert cli.main(['eval', '--workdir', workdir]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result['count'] == 364 and 0.0 <= result['accuracy'] <= 1.0
    assert cli.main(['eval', '--workdir', workdir, '--checkpoint', 'latest']) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again['accuracy'] == pytest.approx(result['accuracy'])   # final checkpoint = saved model
    assert cli.main(['eval', '--workdir', workdir, '--checkpoint', '3']) == 1
    assert 'does not exist' in capsys.readouterr().out


def test_plot(run, tmp_path):
    _, workdir = run
    out = str(tmp_path / 'c.png')
    assert cli.main(['plot', workdir, '--out', out]) == 0
    assert open(out, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
    assert cli.main(['plot', str(tmp_path)]) == 1   # not a workdir


def test_info(run, capsys):
    _, workdir = run
    assert cli.main(['info', workdir]) == 0
    out = capsys.readouterr().out
    assert 'blocks/attn/q/kernel | (1, 64, 4, 16)' in out and "'depth': 1" in out
    assert cli.main(['info', os.path.join(workdir, 'checkpoints', '4')]) == 0
    assert 'run checkpoint' in capsys.readouterr().out
    assert cli.main(['info', os.path.join(ROOT, CONFIG)]) == 0
    assert '| 64 | 4 | 4 | 128 |' in capsys.readouterr().out
