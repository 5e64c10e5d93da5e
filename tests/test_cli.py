"""`jlearngene train/eval/plot/info/convert` end to end on a seconds-long digits run (slow
tier), and the command line's errors, checked before anything runs (default tier)."""
import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from jlearngene import cli
from jlearngene.commands import config_args
from jlearngene.experiments import configs
from jlearngene.train import metrics

from helpers import cli_status

CONFIG = os.path.join('jlearngene', 'experiments', 'configs', 'digits_vit.py')   # a config by its path
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('cli') / 'run')
    rc = cli.main(_train_argv(workdir))
    return rc, workdir


def _train_argv(workdir: str) -> list:
    # 4 steps against the smoke config's warmup of 5: the warmup is clipped to the run
    return ['train', '--config', os.path.join(ROOT, CONFIG) + ':smoke', '--config.steps=4',
            '--config.model.depth=1', '--config.batch_size=32', '--config.log_every=2',
            '--config.steps_per_call=2', '--workdir', workdir, '--noprogress']


@pytest.mark.slow
def test_train_writes_resolved_config_metrics_and_model(run):
    rc, workdir = run
    assert rc == 0
    config = json.load(open(os.path.join(workdir, 'config.json')))
    assert config['steps'] == 4 and config['model']['depth'] == 1 and config['batch_size'] == 32
    kinds = [r['kind'] for r in metrics.read_metrics(workdir)]
    assert kinds.count('train') == 2 and kinds.count('eval') == 1
    assert os.path.isdir(os.path.join(workdir, 'model'))


@pytest.mark.slow
def test_training_a_finished_run_again_says_so_and_keeps_its_model(run, capsys):
    _, workdir = run
    model = os.path.join(workdir, 'model')

    def stamps():
        return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
                for d, _, names in os.walk(model) for f in names}
    before = stamps()
    capsys.readouterr()
    assert cli.main(_train_argv(workdir)) == 0
    out = capsys.readouterr().out
    assert f'already finished: 4 steps in {workdir}; its last evaluation eval/accuracy=' in out
    assert stamps() == before


def test_bad_configs_fail_clearly(tmp_path, capsys):
    assert cli_status(['train', '--config', os.path.join(ROOT, CONFIG), '--config.stpes=3',
                       '--workdir', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'stpes'" in err and "did you mean 'steps'" in err
    assert cli_status(['train', '--config', os.path.join(ROOT, CONFIG), '--config.model.nosuch=1',
                       '--workdir', str(tmp_path)]) == 2
    assert "'model.nosuch'" in capsys.readouterr().err
    for override, message in (('--config.steps=many', r"steps must be an integer, got 'many'"),
                              ('--config.model.pool=', r"pool=''"),
                              ('--config.steps', r'--config\.FIELD=VALUE')):
        assert cli_status(['train', '--config', os.path.join(ROOT, CONFIG), override,
                           '--workdir', str(tmp_path / 'typed')]) == 2
        assert re.search(message, _one_line(capsys.readouterr(), 'jlearngene train: ')), override
    assert not os.path.exists(tmp_path / 'typed')
    for override, message in (('--config.optim.lr=-0.001', r'\blr\b.*-0\.001'),
                              ('--config.steps=-1', r'\bsteps\b.*-1'),
                              ('--config.batch_size=0', r'\bbatch_size\b.*\b0\b')):
        code = cli_status(['train', '--config', os.path.join(ROOT, CONFIG), override,
                           '--workdir', str(tmp_path / 'neg')])
        captured = capsys.readouterr()
        assert code and re.search(message, captured.out + captured.err), (override, captured)
        assert 'warmup' not in captured.out + captured.err
        assert not os.path.exists(tmp_path / 'neg')          # reported before anything is written
    assert cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.microbatches=3',
                     '--workdir', str(tmp_path / 'mb')]) == 1
    err = capsys.readouterr().err
    assert 'batch_size 128' in err and 'microbatches 3' in err
    assert not os.path.exists(tmp_path / 'mb')
    assert cli.main(['train', '--config', os.path.join(ROOT, CONFIG), '--config.steps_per_call=fast',
                     '--workdir', str(tmp_path / 'spc')]) == 1
    err = capsys.readouterr().err
    assert 'steps_per_call' in err and "'fast'" in err
    assert not os.path.exists(tmp_path / 'spc')


@pytest.mark.slow
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
    err = capsys.readouterr().err
    assert 'no checkpoint at step 3' in err and '(its steps: 4)' in err


def test_plot(tmp_path):
    workdir = str(tmp_path / 'run')
    writer = metrics.MetricWriter(workdir, console=False, tensorboard=False)
    for step in (2, 4):
        writer.write(step, {'loss': 2.0 / step, 'accuracy': 0.1 * step})
    writer.write(4, {'eval/loss': 0.6, 'eval/accuracy': 0.5}, kind='eval')
    writer.close()
    out = str(tmp_path / 'c.png')
    assert cli.main(['plot', workdir, '--out', out]) == 0
    assert open(out, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
    assert cli.main(['plot', str(tmp_path / 'empty')]) == 1   # not a workdir


@pytest.mark.slow
def test_info(run, capsys):
    _, workdir = run
    assert cli.main(['info', workdir]) == 0
    out = capsys.readouterr().out
    assert 'blocks/attn/q/kernel | (1, 64, 4, 16)' in out and "'depth': 1" in out
    assert cli.main(['info', os.path.join(workdir, 'checkpoints', '4')]) == 0
    assert 'run checkpoint' in capsys.readouterr().out
    assert cli.main(['info', os.path.join(ROOT, CONFIG)]) == 0
    assert '| 64 | 4 | 4 | 128 |' in capsys.readouterr().out


def _one_line(captured, prefix: str) -> str:
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), captured.err
    assert 'Traceback' not in captured.out + captured.err
    return lines[0]


def test_expected_errors_are_one_line_and_verbose_adds_the_traceback(tmp_path, capsys, monkeypatch):
    assert cli.main(['info', 'Q']) == 1
    assert "'Q'" in _one_line(capsys.readouterr(), 'jlearngene info: ')
    assert cli.main(['info', str(tmp_path / 'nosuch.py')]) == 1
    assert 'nosuch.py' in _one_line(capsys.readouterr(), 'jlearngene info: ')
    assert cli_status(['train', '--config', str(tmp_path / 'nosuch.py'), '--workdir', str(tmp_path)]) == 2
    assert 'nosuch.py' in _one_line(capsys.readouterr(), 'jlearngene train: ')
    bad = tmp_path / 'random.safetensors'
    bad.write_bytes(os.urandom(256))
    assert cli.main(['convert', '--from-timm', str(bad), '--out', str(tmp_path / 'o')]) == 1
    assert 'random.safetensors' in _one_line(capsys.readouterr(), 'jlearngene convert: ')
    assert cli.main(['info', 'Q', '--verbose']) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert 'Traceback' in err and last.startswith('jlearngene info: ') and "'Q'" in last
    monkeypatch.setenv(cli.TRACEBACK_ENV, '1')
    assert cli.main(['info', 'Q']) == 1 and 'Traceback' in capsys.readouterr().err


def test_ctrl_c_and_bugs_outside_training(capsys, monkeypatch):
    from jlearngene.commands import info

    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(info, 'main', interrupted)
    assert cli.main(['info']) == 130
    assert 'interrupted (Ctrl-C)' in _one_line(capsys.readouterr(), 'jlearngene info: ')

    def broken(argv):
        return {}['missing']
    monkeypatch.setattr(info, 'main', broken)
    assert cli.main(['info']) == 1                 # a bug keeps its traceback
    err = capsys.readouterr().err
    assert 'Traceback' in err and "jlearngene info: internal error: KeyError: missing" in err


def test_config_files_are_checked_like_overrides(tmp_path, capsys):
    bad = tmp_path / 'typo.py'
    bad.write_text('from jlearngene.experiments.configs import digits_vit\n\n'
                   'def get_config(arg=None):\n'
                   '    c = digits_vit.get_config(arg)\n'
                   '    c.checkpiont_every = 10\n'
                   '    return c\n')
    for spec in (str(bad), str(bad) + ':smoke'):
        assert cli_status(['train', '--config', spec, '--workdir', str(tmp_path / 'w')]) == 2
        line = _one_line(capsys.readouterr(), 'jlearngene train: ')
        assert "'checkpiont_every'" in line and "'checkpoint_every'" in line
    assert not os.path.exists(tmp_path / 'w')
    # the folder template picks the source from the command line; without a root it says so
    assert cli_status(['train', '--config', 'digits_vit:folder', '--workdir', str(tmp_path / 'f')]) == 1
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert "'folder'" in printed and "'root'" in printed


def test_readme_snippets_define_every_name_they_use():
    """Each python block of the README, read after the ones before it (the text says where
    one continues another), uses only names it or they define; images are NHWC."""
    import ast
    import builtins
    import re
    text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    defined = set(dir(builtins))
    for block in re.findall(r'```python\n(.*?)```', text, re.S):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split('.')[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):          # lambda and function parameters
                defined.add(node.arg)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert used <= defined, (sorted(used - defined), block)
    model_block = text.split('## One example')[1].split('```', 2)[1]
    assert 'NHWC' in model_block


@pytest.mark.slow
def test_convert_to_timm_of_a_trained_model(run, tmp_path):
    from jlearngene.interop.state_dict import load_state_dict
    _, workdir = run
    out = str(tmp_path / 'trained.safetensors')
    assert cli.main(['convert', '--to-timm', os.path.join(workdir, 'model'), '--out', out]) == 0
    assert load_state_dict(out)['blocks.0.attn.qkv.weight'].shape == (192, 64)


def test_eval_model_needs_a_config(tmp_path, capsys):
    assert cli_status(['eval', '--model', str(tmp_path / 'model')]) == 2
    line = _one_line(capsys.readouterr(), 'jlearngene eval: ')
    assert '--model' in line and '--config' in line


def test_overrides_are_checked_before_anything_runs(tmp_path, capsys):
    assert cli_status(['train', '--config', 'digits_vit', '--config.steps=-1',
                       '--workdir', str(tmp_path / 'w')]) == 2
    line = _one_line(capsys.readouterr(), 'jlearngene train: ')
    assert 'steps' in line and '-1' in line
    assert not os.path.exists(tmp_path / 'w')


def test_python_m_jlearngene_is_the_cli():
    done = subprocess.run([sys.executable, '-m', 'jlearngene', '--help'], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and 'descend' in done.stdout and not done.stderr


def test_option_overrides_are_typed_and_bundled_config_names_resolve():
    assert config_args.parse_override('kk=2') == ('kk', 2)
    assert config_args.parse_override('lr=0.5') == ('lr', 0.5)
    assert config_args.parse_override('flag=True') == ('flag', True)
    assert config_args.parse_override('head=new') == ('head', 'new')
    with pytest.raises(argparse.ArgumentTypeError, match="'kk'"):
        config_args.parse_override('kk')
    p = config_args.Parser('p')
    config_args.add_config(p)
    args, overrides = config_args.parse(p, ['--config', 'tleg:paper', '--config.seeds=3,4,5',
                                            '--config.shapes=((32,1),)', '--config.data.data_dir=~/d',
                                            '--config.descend.official_pool_order=true'])
    config = config_args.load(args.config, overrides)
    assert config.seeds == (3, 4, 5) and config.shapes == ((32, 1),) and config.data.data_dir == '~/d'
    assert config.descend.official_pool_order is True
    with pytest.raises(config_args.UsageError, match=r'unrecognized arguments: --x tleg'):
        config_args.parse(p, ['--config', 'tleg', '--x', 'tleg'])
    with pytest.raises(config_args.UsageError, match="'huge'"):
        config_args.load('tleg:huge', {})
    with pytest.raises(config_args.UsageError, match="descend.official_pool_order must be true or false, got 'yes'"):
        config_args.load('tleg', {'descend.official_pool_order': 'yes'})


def test_info_says_what_a_study_config_trains(tmp_path, capsys):
    assert cli.main(['info', 'tleg:fashion']) == 0
    out = capsys.readouterr().out
    assert out.startswith('the tleg study: 6 rows against Scratch (TLEG, Share-Init')
    assert 'reference shape (the teacher, Aux-Nets or slimmable network): w64 L6, 4 heads' in out
    assert 'source task: classes [0, 1, 2, 3, 4]' in out and 'descendant task: classes [5, 6, 7, 8, 9]' in out
    assert 'label budget 1%: seeds 0, 1, 2, 3, 4, Scratch swept at 600 steps' in out
    assert 'upstream models trained to convergence (the teacher, source models): lr 0.001 / 0.002 / 0.004 ' \
           'at weight decay 0.05, swept at 3,000 steps' in out
    assert 'Scratch: lr 0.001 / 0.002 / 0.004 × weight decay 0.05 / 0.3, swept at each label budget' in out
    assert ('each chosen setting doubled until twice the steps ends less than 0.5 pt higher on held-out '
            'accuracy, up to 48,000 steps') in out
    assert "0.35·S (the papers' budgets), and Scratch's own steps" in out
    assert '| Ceiling (source model fine-tuned) | 4 heads, 0.11 M | 4 heads, 0.21 M |' in out
    # a config file says the same as its bundled name, and a shape a method cannot make says why
    assert cli.main(['info', configs.path('compare') + ':fashion']) == 0
    rows = {line.split(' | ')[0]: line for line in capsys.readouterr().out.splitlines()}
    assert 'cannot: descend:' in rows['| TLEG'] and 'cannot' not in rows['| LeTra']
    # a model config keeps its parameter table; a broken config file is one line
    assert cli.main(['info', 'digits_vit']) == 0
    assert '| digits_vit | 64 | 4 | 4 | 128 |' in capsys.readouterr().out
    bad = tmp_path / 'bad.py'
    bad.write_text('def get_config(:\n')
    assert cli.main(['info', str(bad)]) == 1
    assert 'is not valid Python (line 1' in _one_line(capsys.readouterr(), 'jlearngene info: ')


@pytest.mark.slow
def test_readme_command_line_example_makes_the_snippets_model_and_trains_it(tmp_path, monkeypatch):
    """The README's `descend` then `train` (cut to 2 steps) run as written, and the descendant
    is the one its Python snippet makes (the same parameter count)."""
    import shlex
    from jlearngene import artefacts, costs, zoo
    from jlearngene.train import checkpoint
    text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    block = text.split('The same from the command line')[1].split('```bash\n', 1)[1].split('```', 1)[0]
    page = open(os.path.join(ROOT, 'docs', 'getting_started.md'), encoding='utf-8').read()
    assert block in page                     # the getting-started page gives the same two commands
    monkeypatch.chdir(tmp_path)
    for command in block.replace('\\\n', ' ').strip().splitlines():
        argv = shlex.split(command)
        assert argv[0] == 'jlearngene', command
        extra = ['--config.steps=2', '--noprogress'] if argv[1] == 'train' else []
        assert cli.main(argv[1:] + extra) == 0, command
    _, _, meta = artefacts.load_gene(zoo.path('letra_digits'))
    snippet = artefacts.configs(meta)['source'].replace(width=48, num_heads=6, depth=4)
    with open(tmp_path / 'runs' / 'des48' / 'config.json', encoding='utf-8') as f:
        model = json.load(f)['model']
    assert (model['width'], model['num_heads']) == (snippet.width, snippet.num_heads)
    assert costs.param_count(checkpoint.load_model(str(tmp_path / 'des48'))[0]) == costs.param_count(snippet)


def test_descend_prints_the_train_overrides_that_make_its_model(tmp_path, capsys):
    """The `train` command `descend` prints, with a bundled config in place of CONFIG, asks
    for exactly the descendant's model config."""
    import shlex

    from jlearngene.models import model_config
    from jlearngene.train import checkpoint
    out = str(tmp_path / 'des')
    assert cli.main(['descend', 'letra_digits', '--width', '48', '--depth', '4', '--out', out]) == 0
    hint = capsys.readouterr().out.split('train from it: ')[1].split(' (CONFIG')[0]
    argv = shlex.split(hint.replace('CONFIG', 'digits_vit'))
    assert argv[:4] == ['jlearngene', 'train', '--config', 'digits_vit'] and f'--config.init={out}' in argv
    overrides = dict(config_args.parse_override(a[len('--config.'):]) for a in argv[4:])
    config = config_args.load('digits_vit', overrides)
    assert model_config(config.model) == checkpoint.load_model(out)[1]


def test_eval_of_a_saved_model_uses_the_config_it_stores(tmp_path, capsys):
    """`eval --model` of a model another shape than --config's evaluates it as saved; a
    model of other classes than the data's is one line naming both counts."""
    import jax

    from jlearngene.models import init, model_config
    from jlearngene.train import checkpoint
    cfg = model_config(configs.load('digits_vit').model).replace(width=48, num_heads=6, depth=1)
    checkpoint.save_model(str(tmp_path / 'w48'), init(cfg, jax.random.key(0)), cfg)
    assert cli.main(['eval', '--model', str(tmp_path / 'w48'), '--config', 'digits_vit']) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result['count'] == 364 and 0.0 <= result['accuracy'] <= 1.0
    five = cfg.replace(num_classes=5)
    checkpoint.save_model(str(tmp_path / 'k5'), init(five, jax.random.key(0)), five)
    assert cli.main(['eval', '--model', str(tmp_path / 'k5'), '--config', 'digits_vit']) == 1
    line = _one_line(capsys.readouterr(), 'jlearngene eval: ')
    assert 'does not fit the model' in line and 'num_classes: data 10 vs model 5' in line


def test_eval_applies_overrides_to_a_workdirs_config_and_refuses_model_overrides_of_a_saved_model(
        tmp_path, capsys):
    import jax

    from jlearngene.models import init, model_config
    from jlearngene.train import checkpoint
    config = configs.load('digits_vit')
    cfg = model_config(config.model).replace(depth=1)
    workdir = tmp_path / 'run'
    checkpoint.save_model(str(workdir / 'model'), init(cfg, jax.random.key(0)), cfg)
    plain = json.loads(config.to_json())
    plain['model']['depth'] = 1
    (workdir / 'config.json').write_text(json.dumps(plain))
    assert cli.main(['eval', '--workdir', str(workdir), '--config.eval_batch_size=50']) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])['count'] == 364
    assert cli_status(['eval', '--workdir', str(workdir), '--config.eval_batch_sise=50']) == 2
    assert "did you mean 'eval_batch_size'" in _one_line(capsys.readouterr(), 'jlearngene eval: ')
    assert cli_status(['eval', '--model', str(workdir / 'model'), '--config', 'digits_vit',
                       '--config.model.width=32']) == 2
    line = _one_line(capsys.readouterr(), 'jlearngene eval: ')
    assert '--config.model.width' in line and 'as the model config it stores' in line
