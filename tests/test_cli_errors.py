"""What the command line says about the files and flags a new user gets wrong: `info` of
the files `convert` and `plot` write, distinct one-line errors for a path that does not
exist, an empty file, a file of another kind, a directory or a file where a directory
belongs, and every error on stderr (results, and nothing else, on stdout)."""
import argparse
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jlearngene import cli
from jlearngene.interop import big_vision
from jlearngene.interop import state_dict as SD
from jlearngene.models import init, vit_config
from jlearngene.train import checkpoint, metrics

from helpers import cli_error

CFG = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16, patch_size=4,
                 channels=1, num_classes=10, pool='avg', class_token=False)


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """A model checkpoint, the timm .safetensors and big_vision .npz `convert` writes of it,
    an empty file, a file of random bytes and an empty directory."""
    root = tmp_path_factory.mktemp('files')
    params = init(CFG, jax.random.key(0))
    paths = {'model': checkpoint.save_model(str(root / 'model'), params, CFG)}
    paths['timm'] = str(root / 'model.safetensors')
    paths['big_vision'] = str(root / 'model.npz')
    assert cli.main(['convert', '--to-timm', paths['model'], '--out', paths['timm']]) == 0
    assert cli.main(['convert', '--to-big-vision', paths['model'], '--out', paths['big_vision']]) == 0
    paths['empty'] = str(root / 'empty.safetensors')
    open(paths['empty'], 'wb').close()
    paths['random'] = str(root / 'random.bin')
    with open(paths['random'], 'wb') as f:
        f.write(np.random.default_rng(0).bytes(300))
    paths['dir'] = str(root / 'dir')
    os.makedirs(paths['dir'])
    paths['n_params'] = sum(int(np.size(x)) for x in jax.tree.leaves(params))
    return paths


def test_a_trained_model_converts_to_both_formats(tmp_path):
    """`train` stores its source as a string; `convert` then takes the default layouts."""
    model = checkpoint.save_model(str(tmp_path / 'model'), init(CFG, jax.random.key(0)), CFG,
                                  extra={'source': 'jlearngene train'})
    for flag, out in (('--to-timm', 'm.safetensors'), ('--to-big-vision', 'm.npz')):
        assert cli.main(['convert', flag, model, '--out', str(tmp_path / out)]) == 0


# ------------------------------------------------------------------------------------ info

def test_info_describes_the_timm_file_convert_wrote(files, capsys):
    assert cli.main(['info', files['timm']]) == 0
    captured = capsys.readouterr()
    assert captured.err == ''
    out = captured.out
    assert 'timm state dict' in out and 'unknown ViT variant' not in out
    assert "'width': 32" in out and "'depth': 2" in out and "'num_heads': 2" in out  # header metadata
    assert '| blocks.0.attn.qkv.weight | (96, 32) | float32 | 3,072 |' in out
    assert f"total {files['n_params']:,} parameters" in out


def test_info_describes_the_big_vision_file_convert_wrote(files, capsys):
    assert cli.main(['info', files['big_vision']]) == 0
    captured = capsys.readouterr()
    assert captured.err == ''
    out = captured.out
    assert 'big_vision checkpoint' in out and "'big_vision' layout" in out
    assert "'width': 32" in out and "'depth': 2" in out and "'num_heads': 2" in out
    assert '| embedding/kernel | (4, 4, 1, 32) | float32 | 512 |' in out
    assert f"total {files['n_params']:,} parameters" in out


def test_info_of_a_timm_file_it_cannot_read_as_a_vit_lists_its_tensors(tmp_path, capsys):
    path = SD.save_safetensors({'x': np.ones((2, 3), np.float32)}, str(tmp_path / 'other.safetensors'))
    assert cli.main(['info', path]) == 0
    out = capsys.readouterr().out
    assert '| x | (2, 3) | float32 | 6 |' in out and 'no ViT config can be inferred' in out
    assert 'patch_embed.proj.weight' in out        # the first thing it misses


def test_info_of_a_file_named_for_another_format(files, tmp_path, capsys):
    renamed = str(tmp_path / 'model.bin')
    with open(files['timm'], 'rb') as src, open(renamed, 'wb') as dst:
        dst.write(src.read())
    line = cli_error(capsys, ['info', renamed], 'info')
    assert 'model.bin' in line and 'safetensors' in line


def test_info_tells_a_missing_path_an_empty_file_and_an_unknown_file_apart(files, tmp_path, capsys):
    missing = cli_error(capsys, ['info', str(tmp_path / 'nosuch.safetensors')], 'info')
    assert 'nosuch.safetensors' in missing and 'does not exist' in missing
    assert 'unknown ViT variant' not in missing
    assert 'does not exist' in cli_error(capsys, ['info', str(tmp_path / 'nosuch')], 'info')
    empty = cli_error(capsys, ['info', files['empty']], 'info')
    assert 'empty.safetensors' in empty and 'empty file' in empty
    unknown = cli_error(capsys, ['info', files['random']], 'info')
    assert 'random.bin' in unknown and 'unknown kind' in unknown
    assert len({missing, empty, unknown}) == 3
    # a bare name that is neither a variant nor a path says both
    line = cli_error(capsys, ['info', 'nosuch'], 'info')
    assert "'nosuch'" in line and 'variant' in line and 'file or directory' in line
    assert cli.main(['info', 'S/16']) == 0 and '| S/16 |' in capsys.readouterr().out


def test_info_of_a_missing_or_broken_config_file(tmp_path, capsys):
    line = cli_error(capsys, ['info', str(tmp_path / 'nosuch.py')], 'info')
    assert 'nosuch.py' in line and 'does not exist' in line
    (tmp_path / 'broken.py').write_text('def get_config(:\n')
    line = cli_error(capsys, ['info', str(tmp_path / 'broken.py')], 'info')
    assert 'broken.py' in line and 'line 1' in line
    (tmp_path / 'empty.py').write_text('x = 1\n')
    assert 'get_config' in cli_error(capsys, ['info', str(tmp_path / 'empty.py')], 'info')


def test_info_of_a_directory_that_is_no_checkpoint_reports_on_stderr(files, tmp_path, capsys):
    line = cli_error(capsys, ['info', files['dir']], 'info')
    assert 'dir' in line and 'empty directory' in line
    (tmp_path / 'other').mkdir()
    (tmp_path / 'other' / 'x').write_text('x')
    assert 'other' in cli_error(capsys, ['info', str(tmp_path / 'other')], 'info')


def test_info_describes_the_files_plot_and_a_run_write(tmp_path, capsys):
    workdir = str(tmp_path / 'run')
    writer = metrics.MetricWriter(workdir, console=False, tensorboard=False)
    for step in (2, 4):
        writer.write(step, {'loss': 1.0 / step})
    writer.write(4, {'eval/accuracy': 0.5}, kind='eval')
    writer.close()
    assert cli.main(['plot', workdir]) == 0
    png = capsys.readouterr().out.strip()
    assert cli.main(['info', png]) == 0
    assert 'PNG image' in capsys.readouterr().out
    assert cli.main(['info', os.path.join(workdir, metrics.METRICS_FILE)]) == 0
    out = capsys.readouterr().out
    assert '3 records' in out and 'train: 2 records, steps 2..4' in out and 'eval/accuracy' in out
    from jlearngene.experiments import configs
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
        json.dump(configs.load('digits_vit:smoke').to_dict(), f)
    assert cli.main(['info', os.path.join(workdir, 'config.json')]) == 0
    assert 'run config' in capsys.readouterr().out
    with open(os.path.join(workdir, 'config.txt'), 'w') as f:
        f.write(str(configs.load('digits_vit:smoke')))
    assert cli.main(['info', os.path.join(workdir, 'config.txt')]) == 0
    assert 'config.json' in capsys.readouterr().out


# ----------------------------------------------------------------------------------- train

def test_train_init_names_what_is_wrong_with_the_file(files, tmp_path, capsys):
    workdir = str(tmp_path / 'w')
    argv = ['train', '--config', 'digits_vit:smoke', '--workdir', workdir, '--noprogress']
    line = cli_error(capsys, argv + [f'--config.init={files["timm"]}'], 'train')
    assert '--config.init' in line and 'timm' in line and '--from-timm' in line
    assert 'does not exist' not in line
    line = cli_error(capsys, argv + [f'--config.init={files["big_vision"]}'], 'train')
    assert '--config.init' in line and '--from-big-vision' in line
    line = cli_error(capsys, argv + [f'--config.init={files["random"]}'], 'train')
    assert 'not a model checkpoint directory' in line
    line = cli_error(capsys, argv + [f'--config.init={tmp_path / "nosuch"}'], 'train')
    assert '--config.init' in line and 'does not exist' in line
    assert not os.path.exists(workdir)               # nothing ran


def test_train_workdir_that_is_a_file(files, tmp_path, capsys):
    argv = ['train', '--config', 'digits_vit:smoke', '--noprogress', '--workdir']
    line = cli_error(capsys, argv + [files['random']], 'train', code=2)
    assert '--workdir' in line and 'is a file' in line and 'Errno' not in line
    line = cli_error(capsys, argv + [os.path.join(files['random'], 'run')], 'train', code=2)
    assert 'random.bin' in line and 'is a file' in line


# ------------------------------------------------------------------------------------ eval

def test_eval_model_names_what_is_wrong_with_the_file(files, tmp_path, capsys):
    argv = ['eval', '--config', 'digits_vit', '--model']
    line = cli_error(capsys, argv + [files['random']], 'eval')
    assert '--model' in line and 'random.bin' in line and 'not a model checkpoint directory' in line
    assert 'does not exist' not in line
    line = cli_error(capsys, argv + [files['timm']], 'eval')
    assert '--model' in line and '--from-timm' in line
    assert 'empty file' in cli_error(capsys, argv + [files['empty']], 'eval')
    assert 'does not exist' in cli_error(capsys, argv + [str(tmp_path / 'nosuch')], 'eval')


def test_eval_checkpoint_must_be_a_step_or_a_name(tmp_path, capsys):
    workdir = tmp_path / 'w'
    workdir.mkdir()
    line = cli_error(capsys, ['eval', '--workdir', str(workdir), '--config', 'digits_vit',
                              '--checkpoint', 'newest'], 'eval', code=2)
    assert '--checkpoint' in line and "'newest'" in line and 'latest' in line and 'int()' not in line
    # a workdir without checkpoints is reported, and left as it was
    line = cli_error(capsys, ['eval', '--workdir', str(workdir), '--config', 'digits_vit',
                              '--checkpoint', 'latest'], 'eval')
    assert 'checkpoints' in line
    assert os.listdir(workdir) == []


def test_eval_errors_go_to_stderr(files, tmp_path, capsys):
    assert '--workdir' in cli_error(capsys, ['eval'], 'eval', code=2)
    line = cli_error(capsys, ['eval', '--workdir', files['random']], 'eval')
    assert '--workdir' in line and 'is a file' in line
    line = cli_error(capsys, ['eval', '--workdir', str(tmp_path / 'nosuch')], 'eval')
    assert '--workdir' in line and 'does not exist' in line
    assert 'config.json' in cli_error(capsys, ['eval', '--workdir', files['dir']], 'eval')


# --------------------------------------------------------------------------------- convert

def test_convert_names_directories_and_files_of_the_other_kind(files, tmp_path, capsys):
    out = str(tmp_path / 'o')
    line = cli_error(capsys, ['convert', '--from-timm', files['dir'], '--out', out], 'convert')
    assert '--from-timm' in line and 'is a directory' in line and 'does not exist' not in line
    line = cli_error(capsys, ['convert', '--from-timm', files['model'], '--out', out], 'convert')
    assert 'is a directory' in line and '--to-timm' in line          # a model checkpoint
    line = cli_error(capsys, ['convert', '--from-big-vision', files['dir'], '--out', out], 'convert')
    assert '--from-big-vision' in line and 'is a directory' in line
    line = cli_error(capsys, ['convert', '--from-timm', files['big_vision'], '--out', out], 'convert')
    assert '--from-big-vision' in line
    line = cli_error(capsys, ['convert', '--to-timm', files['timm'], '--out',
                              str(tmp_path / 'x.safetensors')], 'convert')
    assert '--to-timm' in line and 'not a model checkpoint directory' in line
    line = cli_error(capsys, ['convert', '--to-big-vision', str(tmp_path / 'nosuch'), '--out',
                              str(tmp_path / 'x.npz')], 'convert')
    assert '--to-big-vision' in line and 'does not exist' in line
    assert not os.path.exists(out)


# ------------------------------------------------------------------------------------ plot

def test_plot_errors_go_to_stderr(tmp_path, capsys):
    line = cli_error(capsys, ['plot', str(tmp_path / 'nosuch')], 'plot')
    assert 'nosuch' in line and 'does not exist' in line
    (tmp_path / 'empty').mkdir()
    assert metrics.METRICS_FILE in cli_error(capsys, ['plot', str(tmp_path / 'empty')], 'plot')


def test_plot_of_a_metrics_file_writes_the_png_beside_it(tmp_path, capsys):
    writer = metrics.MetricWriter(str(tmp_path), console=False, tensorboard=False)
    writer.write(1, {'loss': 1.0})
    writer.close()
    assert cli.main(['plot', str(tmp_path / metrics.METRICS_FILE)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / 'curves.png')
    assert open(tmp_path / 'curves.png', 'rb').read(4) == b'\x89PNG'


# -------------------------------------------------------------------------------- progress

def test_progress_bar_writes_to_stderr(capsys):
    bar = metrics.Progress(total=3, primary=True)
    bar.update(3, loss=0.5)
    bar.close()
    captured = capsys.readouterr()
    assert captured.out == '' and '3/3' in captured.err


def test_file_kind_reads_the_contents_not_the_name(files, tmp_path):
    assert SD.file_kind(files['timm']) == 'safetensors'
    assert SD.file_kind(files['big_vision']) == 'npz'
    assert SD.file_kind(files['empty']) == 'empty'
    assert SD.file_kind(files['random']) == 'unknown'
    with pytest.raises(IsADirectoryError, match='dir'):
        SD.file_kind(files['dir'])
    with pytest.raises(FileNotFoundError, match='does not exist'):
        SD.file_kind(str(tmp_path / 'nosuch'))
    assert big_vision.infer_config(big_vision.load_npz(files['big_vision'])).width == CFG.width


def test_option_values_are_json_or_plain_strings_and_broken_json_is_an_error():
    from jlearngene.commands.descend import parse_option
    assert parse_option('clusters=[[0, 2]]') == ('clusters', [[0, 2]])
    assert parse_option('head=new') == ('head', 'new')
    assert parse_option('k=2') == ('k', 2)
    with pytest.raises(argparse.ArgumentTypeError, match=r'--option clusters.*\[\[0,2\]'):
        parse_option('clusters=[[0,2]')
    with pytest.raises(argparse.ArgumentTypeError, match="'kk'"):
        parse_option('kk')


def test_broken_option_json_is_one_line_on_the_command_line(files, tmp_path, capsys):
    line = cli_error(capsys, ['gene', '--method', 'cluster', '--from-model', files['model'],
                              '--option', 'clusters=[[0,2]', '--out', str(tmp_path / 'g')], 'gene', code=2)
    assert '--option clusters' in line and 'not valid JSON' in line
    assert not os.path.exists(tmp_path / 'g')


# ------------------------------------------------------------------ faulted runs' stderr

_TINY_RUN = ['train', '--config', 'digits_vit:smoke', '--config.model.depth=1', '--config.batch_size=32',
             '--config.log_every=2', '--config.checkpoint_every=2', '--config.steps=6', '--noprogress']


def _stderr_of_run(workdir, shell_prefix: str = '') -> tuple[int, list[str]]:
    """`python -m jlearngene train` of the tiny run in a fresh process (the console as a
    user sees it: library loggers, uvloop's and asyncio's reports, threads' tracebacks),
    after the `sh` commands `shell_prefix`."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, '-m', 'jlearngene', *_TINY_RUN, '--workdir', str(workdir)]
    # XLA's C++ log is left out: on a loaded machine its compiler reports a slow constant
    # folding there, which is timing, not this command's output
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    proc = subprocess.run(['sh', '-c', shell_prefix + 'exec "$@"', 'sh', *argv], cwd=root,
                          capture_output=True, text=True, timeout=300, env=env)
    return proc.returncode, [ln for ln in proc.stderr.splitlines() if ln.strip()]


def _no_debris(lines):
    debris = ('Traceback', 'WARNING', 'ERROR', 'asyncio', 'uvloop', 'Exception ignored', 'absl')
    assert not [ln for ln in lines if any(d in ln for d in debris)], lines


@pytest.mark.slow
def test_a_truncated_checkpoint_is_one_line_on_resume(tmp_path):
    """A damaged `_CHECKPOINT_METADATA` in the newest checkpoint: the resumed run says in
    one line that it skips it, and nothing else (orbax logs its own errors about it)."""
    workdir = tmp_path / 'run'
    assert cli.main(_TINY_RUN + ['--workdir', str(workdir)]) == 0
    meta = workdir / 'checkpoints' / '6' / '_CHECKPOINT_METADATA'
    meta.write_bytes(meta.read_bytes()[:len(meta.read_bytes()) // 2])
    rc, lines = _stderr_of_run(workdir)
    assert rc == 0, lines
    assert len(lines) == 1 and lines[0].startswith('[  run] skipping the checkpoint of step 6'), lines
    assert 'checkpoints.unreadable' in lines[0]
    _no_debris(lines)


def test_a_full_disk_is_one_line(tmp_path):
    """A checkpoint write that fails (a file-size limit stands in for a full disk: the same
    failed write(2)) is the command's one line, without orbax's logged tracebacks."""
    # Files of at most 40 blocks of 512 bytes; SIGXFSZ ignored: a failed write, not a kill.
    rc, lines = _stderr_of_run(tmp_path / 'run', shell_prefix="ulimit -f 40 && trap '' XFSZ && ")
    assert rc == 1, lines
    assert len(lines) == 1 and lines[0].startswith('jlearngene train: run checkpoint '), lines
    assert 'could not be written' in lines[0] and 'File too large' in lines[0], lines
    _no_debris(lines)


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """`jlearngene info | head -1`: the closed pipe ends the command with SIGPIPE's exit
    code and no error line."""
    proc = subprocess.Popen([sys.executable, '-m', 'jlearngene', 'info', 'S', '--set', 'depth=2'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()              # before the table is written
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 141 and stderr == '', stderr


def test_a_training_workdir_given_for_a_model_names_its_model(tmp_path, capsys):
    workdir = tmp_path / 'run'
    (workdir / 'model').mkdir(parents=True)
    (workdir / 'metrics.jsonl').write_text('{"step": 2, "kind": "train", "loss": 1.0}\n')
    for argv, command in ((['convert', '--to-timm', str(workdir), '--out', str(tmp_path / 'x.safetensors')], 'convert'),
                          (['eval', '--model', str(workdir), '--config', 'digits_vit'], 'eval')):
        line = cli_error(capsys, argv, command)
        assert f"is a training workdir, not a checkpoint: its saved model is '{workdir / 'model'}'" in line, line
    assert not (tmp_path / 'x.safetensors').exists()


def test_eval_of_a_study_or_one_of_its_runs_points_to_info(tmp_path, capsys):
    from jlearngene.experiments.harness import FINISHED, OWNER
    study = tmp_path / 'study'
    run = study / 'runs' / 'teacher_s0'
    run.mkdir(parents=True)
    (study / OWNER).write_text('{}')
    (run / FINISHED).write_text('{}')
    line = cli_error(capsys, ['eval', '--workdir', str(study)], 'eval')
    assert 'holds the runs of a study' in line and f'jlearngene info {study}' in line
    line = cli_error(capsys, ['eval', '--workdir', str(run)], 'eval')
    assert f'is a run of the study in {study}' in line and f'jlearngene info {study}' in line
    (tmp_path / 'other').mkdir()
    assert 'not a jlearngene train workdir' in cli_error(capsys, ['eval', '--workdir', str(tmp_path / 'other')], 'eval')


def test_a_misspelt_set_field_names_the_closest_one(tmp_path, capsys):
    line = cli_error(capsys, ['descend', 'letra_digits', '--set', 'num_clases=5', '--out',
                              str(tmp_path / 'd')], 'descend', code=2)
    assert "no field 'num_clases' (did you mean 'num_classes'?)" in line
    line = cli_error(capsys, ['info', 'S', '--set', 'dept=6'], 'info')
    assert "['dept'] (did you mean 'depth' for 'dept'?)" in line


# ---------------------------------------------------------------------------------- render

def test_render_names_what_a_folder_without_results_json_is(files, tmp_path, capsys):
    line = cli_error(capsys, ['render', str(tmp_path / 'nosuch')], 'render')
    assert 'does not exist' in line and 'Errno' not in line
    workdir = tmp_path / 'run'
    workdir.mkdir()
    (workdir / 'config.json').write_text('{}')
    (workdir / 'metrics.jsonl').write_text('{"step": 2, "kind": "train", "loss": 1.0}\n')
    assert 'is a training workdir, not a study' in cli_error(capsys, ['render', str(workdir)], 'render')
    study = tmp_path / 'study'
    (study / 'runs').mkdir(parents=True)
    (study / 'study.json').write_text('{}')
    for argv in (['render', str(study)], ['render', '--headline', str(study)]):
        line = cli_error(capsys, argv, 'render')
        assert "is a study's workdir that has not finished" in line, line
        assert f'jlearngene info {study}' in line
    assert "not a study's folder" in cli_error(capsys, ['render', files['dir']], 'render')
    line = cli_error(capsys, ['render', str(study / 'study.json')], 'render')
    assert 'is a file' in line and 'Errno' not in line


# ----------------------------------------------------------------------------- usage errors

def test_gene_and_convert_flag_errors_exit_2_before_anything_is_read(files, tmp_path, capsys):
    """Status 2, like descend's: the checkpoint named does not even exist."""
    model, out = str(tmp_path / 'nosuch'), str(tmp_path / 'g')
    for argv, says in (
            (['gene', '--method', 'he_lg', '--from-model', model, '--option', 'bogus=1'], "no option 'bogus'"),
            (['gene', '--from-model', model], '--from-model needs --method NAME'),
            (['gene', '--method', 'bogus', '--from-model', model], "--method 'bogus': no such method"),
            (['gene', '--method', 'tleg', '--from-model', model], "TLEG (source 'learned') does not take"),
            (['gene', '--method', 'he_lg', '--from-model', model, '--target-set', 'width=64'],
             'takes no target config'),
            (['gene', '--method', 'mango', '--from-model', model, '--target-set', 'widht=64'],
             "no field 'widht' (did you mean 'width'?)"),
            (['gene', '--from-run', model, '--option', 'k=1'], 'apply to --from-model only')):
        line = cli_error(capsys, argv + ['--out', out], 'gene', code=2)
        assert says in line, line
    for argv, says in (
            (['--to-timm', model, '--out', str(tmp_path / 'x.npz')], 'give a file name ending in .safetensors'),
            (['--to-big-vision', model, '--out', str(tmp_path / 'x.safetensors')], 'ending in .npz'),
            (['--to-timm', model, '--out', str(tmp_path / 'x.safetensors'), '--set', 'depth=2'],
             'apply to --from-timm / --from-big-vision only'),
            (['--from-timm', files['timm'], '--out', out, '--set', 'bogus=1'], "no field 'bogus'"),
            (['--from-timm', files['timm'], '--out', out, '--layout', 'vit'], '--to-big-vision only'),
            (['--from-timm', files['timm'], '--out', out, '--embed-class'], '--to-timm only'),
            (['--from-big-vision', files['big_vision'], '--out', out, '--num-heads', '2'], '--num-heads')):
        line = cli_error(capsys, ['convert', *argv], 'convert', code=2)
        assert says in line, line
    assert not os.listdir(tmp_path)


def test_mango_and_ligo_name_the_flag_of_their_target_config(tmp_path, capsys):
    for method in ('mango', 'ligo'):
        line = cli_error(capsys, ['gene', '--method', method, '--from-model', str(tmp_path / 'nosuch'),
                                  '--out', str(tmp_path / 'g')], 'gene', code=2)
        assert '--target-set FIELD=VALUE' in line and 'large_cfg' not in line, line


# -------------------------------------------------------------------------------------- gene

def test_gene_help_prints_its_examples_as_written(capsys):
    from helpers import cli_status
    assert cli_status(['gene', '--help']) == 0
    out = capsys.readouterr().out
    assert '--out genes/cluster \\\n      --option ' in out, out


def test_no_command_docstring_swallows_a_backslash_newline():
    """`--help` and the docs' CLI page print each command's module docstring as written."""
    import importlib
    for name in cli.COMMANDS:
        module = importlib.import_module(f'jlearngene.commands.{name}')
        with open(module.__file__, encoding='utf-8') as f:
            source = f.read()
        assert source.count('\\\n', 0, source.index('"""', 3)) == module.__doc__.count('\\\n'), name


def test_gene_from_run_of_a_study_names_the_genes_in_it(tmp_path, capsys):
    study = tmp_path / 'study'
    for seed in (0, 1, 10, 2):
        (study / 'genes' / 'tleg' / f'seed_{seed}').mkdir(parents=True)
    (study / 'runs').mkdir()
    (study / 'study.json').write_text('{}')
    out = str(tmp_path / 'g')
    line = cli_error(capsys, ['gene', '--from-run', str(study), '--out', out], 'gene')
    assert "is a study's workdir, not a saved gene" in line and 'orbax' not in line, line
    assert 'genes/tleg/seed_0, genes/tleg/seed_1, genes/tleg/seed_2, genes/tleg/seed_10' in line
    assert f'--from-run {study}/genes/tleg/seed_0' in line
    line = cli_error(capsys, ['gene', '--from-run', str(study / 'genes' / 'tleg'), '--out', out], 'gene')
    assert "a study's 'tleg' genes" in line and 'seed_0, seed_1' in line, line
    (tmp_path / 'empty' / 'runs').mkdir(parents=True)
    line = cli_error(capsys, ['gene', '--from-run', str(tmp_path / 'empty'), '--out', out], 'gene')
    assert "is a study's workdir, not a saved gene, and holds none" in line, line
    assert not os.path.exists(out)
