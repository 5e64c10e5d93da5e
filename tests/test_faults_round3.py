"""Faults and friction, round three (issue 57): each test names the fault it guards against.

A model that trains without the regularisation its config asks for, a jitted `apply` whose
config is traced, losses that broadcast mismatched batches or average empty ones, `eval`
output that is not JSON, a resumed run that keeps a cut-off metrics line or a compilation
cache entry that warns on every run, a dangling symlink as a workdir, a foreign file given
to `--from-big-vision`, and the cost model's gaps (epochs, non-ViT teachers, I-Params,
Scala's sub-networks, LeTra's 320 epochs, full shapes in a printed plan)."""
import dataclasses
import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import cli, costs, losses
from jlearngene.genes import cluster, common, scala
from jlearngene.models import init, vit, vit_config
from jlearngene.train import metrics

from helpers import cli_error

CFG = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16, patch_size=8,
                 num_classes=10)
X = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))


@pytest.fixture(scope='module')
def params():
    return init(CFG, jax.random.key(0))


# ------------------------------------------------------------------ 1. train=True, no rng

@pytest.mark.parametrize('field', ['dropout', 'drop_path'])
def test_training_with_dropout_or_drop_path_needs_an_rng(params, field):
    cfg = CFG.replace(**{field: 0.1})
    with pytest.raises(ValueError, match=f'{field}=0.1.*rng'):
        vit.apply(params, X, cfg, train=True)
    with pytest.raises(ValueError, match='rng'):
        jax.jit(lambda p, x: vit.apply(p, x, cfg, train=True))(params, X)
    logits, _ = vit.apply(params, X, cfg, train=True, rng=jax.random.key(2))   # with one: fine
    assert logits.shape == (2, 10)
    vit.apply(params, X, cfg)                                    # evaluation needs none
    vit.apply(params, X, CFG, train=True)                        # nothing stochastic: none


# ------------------------------------------------------------------ 2. jit with a traced config

def test_jit_of_apply_with_a_traced_config_says_to_mark_it_static(params):
    with pytest.raises(TypeError, match=r"static.*static_argnames='cfg'") as e:
        jax.jit(vit.apply)(params, X, CFG)
    assert 'DynamicJaxprTracer' not in str(e.value)
    with pytest.raises(TypeError, match='static'):
        jax.jit(vit.init)(CFG, jax.random.key(0))
    logits, _ = jax.jit(vit.apply, static_argnames='cfg')(params, X, CFG)   # the advice works
    np.testing.assert_allclose(logits, vit.apply(params, X, CFG)[0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ 3. losses' shapes

def test_accuracy_with_mismatched_lengths_names_both_shapes():
    logits = np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match=r'\(4, 5\).*\(3,\)'):
        losses.accuracy(logits, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r'\(4, 5\).*\(1,\)'):    # broadcast silently before
        losses.accuracy(logits, np.zeros(1, np.int32))
    with pytest.raises(ValueError, match=r'\(4, 5\).*\(3,\)'):
        losses.cross_entropy(logits, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r'\(4, 5\).*\(2, 5\)'):
        losses.kl_per_example(logits, np.zeros((2, 5), np.float32))


@pytest.mark.parametrize('jit', [False, True])
def test_losses_of_an_empty_batch_raise_instead_of_nan(jit):
    z, y = np.zeros((0, 5), np.float32), np.zeros((0,), np.int32)
    wrap = jax.jit if jit else (lambda f: f)
    for name, fn in (('cross_entropy', lambda z, y: losses.cross_entropy(z, y)),
                     ('accuracy', lambda z, y: losses.accuracy(z, y)),
                     ('soft_distillation', lambda z, y: losses.soft_distillation(z, z, y)),
                     ('hard_distillation', lambda z, y: losses.hard_distillation(z, z, y))):
        with pytest.raises(ValueError, match=f'{name}.*empty batch'):
            wrap(fn)(z, y)


# ------------------------------------------------------------------ 4. eval writes JSON

def test_eval_prints_strict_json_when_a_metric_is_not_finite(monkeypatch, tmp_path, capsys):
    from jlearngene.commands import convert
    from jlearngene.commands import eval as eval_cmd
    monkeypatch.setattr(convert, 'check_model_checkpoint', lambda path, flag: None)
    monkeypatch.setattr(eval_cmd, 'load_params', lambda *a: (None, None, 'model'))
    monkeypatch.setattr(eval_cmd, 'evaluate', lambda *a: {
        'split': 'test', 'count': 8.0, 'accuracy': 0.125, 'loss': float('nan'),
        'extra': float('inf')})
    assert cli.main(['eval', '--model', str(tmp_path), '--config', 'digits_vit']) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]

    def refuse(name):
        raise ValueError(f'not JSON: {name}')
    result = json.loads(last, parse_constant=refuse)
    assert result == {'split': 'test', 'count': 8.0, 'accuracy': 0.125, 'loss': None,
                      'extra': None}


# ------------------------------------------------------------------ 5. resume repairs

def _write_rows(path, steps):
    with open(path, 'w', encoding='utf-8') as f:
        for step in steps:
            f.write(json.dumps({'step': step, 'kind': 'train', 'time': 0.0, 'loss': 1.0 / step}) + '\n')


def test_resume_drops_a_cut_off_metrics_line_so_plot_and_info_work(tmp_path, capsys):
    path = tmp_path / metrics.METRICS_FILE
    _write_rows(path, (1, 2))
    with open(path, 'a', encoding='utf-8') as f:
        f.write('{"step": 3, "kind": "train", "ti')            # a full disk or a kill
    writer = metrics.MetricWriter(str(tmp_path), console=False, tensorboard=False, start_step=2)
    writer.write(3, {'loss': 0.25})
    writer.close()
    assert [r['step'] for r in metrics.read_metrics(str(tmp_path))] == [1, 2, 3]
    assert all(json.loads(line) for line in path.read_text().splitlines())
    assert cli.main(['plot', str(tmp_path)]) == 0
    assert cli.main(['info', str(path)]) == 0
    assert '3 records' in capsys.readouterr().out


def test_a_trained_resume_repairs_metrics_too(tmp_path):
    from jlearngene.train import optim, tasks, trainer
    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                     num_classes=2, channels=1)
    p0 = jax.jit(init, static_argnums=0)(cfg, jax.random.key(0))
    x = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype(np.float32)
    batches = lambda: iter(lambda: {'image': x, 'label': np.arange(8) % 2}, None)  # noqa: E731

    def fit(steps):
        return trainer.fit(tasks.classification_loss(cfg), p0, batches(),
                           optim.make_optimizer({'lr': 1e-3}, p0, total_steps=4),
                           trainer.FitConfig(workdir=str(tmp_path), steps=steps, seed=1,
                                             log_every=2, progress=False, console=False,
                                             tensorboard=False, steps_per_call=1))
    fit(2)
    with open(tmp_path / metrics.METRICS_FILE, 'a', encoding='utf-8') as f:
        f.write('{"step": 3, "kind": "tr')
    fit(4)
    assert [r['step'] for r in metrics.read_metrics(str(tmp_path))] == [2, 4]


def test_a_cache_entry_that_does_not_decompress_is_removed(tmp_path):
    from jax.experimental.compilation_cache import compilation_cache

    from jlearngene import compiler
    from jlearngene.commands import run
    if jax.config.jax_compilation_cache_dir:
        pytest.skip('a compilation cache is set from outside the tests')
    cache = tmp_path / 'cache'
    fn = lambda x: jnp.sin(x) * 3.25 + jnp.cos(x) / 1.75   # noqa: E731 - a program of its own

    def later_run():
        """What a later process does: a fresh cache switch, a fresh compile."""
        jax.config.update('jax_compilation_cache_dir', None)
        compilation_cache.reset_cache()
        jax.clear_caches()
        assert run.enable_compile_cache(str(cache))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            jax.jit(fn)(jnp.arange(5.0)).block_until_ready()
        return [str(w.message) for w in caught if 'compilation cache' in str(w.message)]

    assert later_run() == []
    entries = sorted(p for p in cache.iterdir() if p.name.endswith('-cache'))
    assert entries
    for p in entries:
        p.write_bytes(p.read_bytes()[:7])                     # cut off, as by a kill
    assert later_run() == []                                  # removed before jax reads it
    assert later_run() == []                                  # and written again
    assert sorted(p for p in cache.iterdir() if p.name.endswith('-cache')) == entries
    assert compiler.repair_compile_cache(str(cache)) == []
    jax.config.update('jax_compilation_cache_dir', None)
    compilation_cache.reset_cache()


def test_repair_removes_only_broken_entries(tmp_path):
    from jlearngene import compiler
    assert compiler.repair_compile_cache(str(tmp_path / 'none')) == []
    (tmp_path / 'k1-cache').write_bytes(b'\x00' * 40)
    (tmp_path / 'k1-atime').write_bytes(b'\x00' * 8)
    (tmp_path / 'other.txt').write_text('not an entry')
    assert compiler.repair_compile_cache(str(tmp_path)) == ['k1-cache']
    assert sorted(os.listdir(tmp_path)) == sorted(['other.txt', compiler.CACHE_CHECKED])


# ------------------------------------------------------------------ 6. dangling workdir

def test_a_dangling_symlink_as_workdir_is_named_before_anything_runs(tmp_path, capsys, monkeypatch):
    from jlearngene.commands import run
    link, target = tmp_path / 'link', tmp_path / 'gone'
    os.symlink(target, link)

    def no_data(*a, **k):
        raise AssertionError('data set up before the workdir was checked')
    monkeypatch.setattr(run, 'check_run_data', no_data)
    line = cli_error(capsys, ['train', '--config', 'digits_vit:smoke', '--noprogress', '--workdir',
                           str(link)], 'train', code=2)
    assert f"'{link}' is a dangling symlink to '{target}'" in line
    line = cli_error(capsys, ['train', '--config', 'digits_vit:smoke', '--noprogress', '--workdir',
                           str(link / 'run')], 'train', code=2)
    assert 'dangling symlink' in line and str(target) in line
    for argv, command in ((['eval', '--workdir', str(link)], 'eval'),
                          (['plot', str(link)], 'plot'), (['info', str(link)], 'info')):
        line = cli_error(capsys, argv, command)
        assert f"'{link}' is a dangling symlink to '{target}'" in line, line
    assert not target.exists()


# ------------------------------------------------------------------ 7. --from-big-vision

@pytest.fixture
def foreign_files(tmp_path):
    import zipfile
    paths = {'empty': tmp_path / 'empty.npz', 'text': tmp_path / 'notes.npz',
             'arrays': tmp_path / 'arrays.npz', 'zip': tmp_path / 'other.npz',
             'npy': tmp_path / 'one.npy', 'png': tmp_path / 'image.npz'}
    paths['empty'].write_bytes(b'')
    paths['text'].write_text('just some text\n')
    np.savez(paths['arrays'], x=np.zeros(3), y=np.ones(2))
    with zipfile.ZipFile(paths['zip'], 'w') as z:
        z.writestr('readme.txt', 'hello')
    np.save(paths['npy'], np.zeros(3))
    paths['png'].write_bytes(b'\x89PNG\r\n\x1a\n' + b'\x00' * 16)
    return {k: str(v) for k, v in paths.items()}


def test_from_big_vision_says_what_a_foreign_file_is(foreign_files, tmp_path, capsys):
    want = {'empty': 'an empty file', 'text': 'a text file', 'arrays': "an .npz archive of 2 arrays",
            'zip': 'a zip archive', 'npy': 'a single .npy array', 'png': 'a PNG image'}
    for name, what in want.items():
        line = cli_error(capsys, ['convert', '--from-big-vision', foreign_files[name], '--out',
                               str(tmp_path / 'o')], 'convert')
        assert what in line and 'timm state dict' not in line, line
        assert '--from-big-vision' in line
    assert "'x', 'y'" in cli_error(capsys, ['convert', '--from-big-vision', foreign_files['arrays'],
                                         '--out', str(tmp_path / 'o')], 'convert')
    assert not (tmp_path / 'o').exists()


def test_from_big_vision_on_a_timm_file_still_points_to_from_timm(tmp_path, capsys):
    from jlearngene.interop import state_dict
    from jlearngene.train import checkpoint
    cfg = CFG.replace(pool='avg', class_token=False)
    model = checkpoint.save_model(str(tmp_path / 'm'), init(cfg, jax.random.key(0)), cfg)
    assert cli.main(['convert', '--to-timm', model, '--out', str(tmp_path / 'm.safetensors')]) == 0
    np.savez(tmp_path / 'timm.npz', **state_dict.load_state_dict(str(tmp_path / 'm.safetensors')))
    capsys.readouterr()
    for f in ('m.safetensors', 'timm.npz'):
        line = cli_error(capsys, ['convert', '--from-big-vision', str(tmp_path / f), '--out',
                               str(tmp_path / 'o')], 'convert')
        assert 'timm state dict' in line and '--from-timm' in line


def test_big_vision_reader_names_a_checkpoint_without_its_keys(tmp_path):
    from jlearngene.interop import big_vision
    from jlearngene.interop.state_dict import StateDictError
    with pytest.raises(StateDictError, match="none of big_vision's keys.*'x', 'y'") as e:
        big_vision.from_big_vision({'x': np.zeros(3), 'y': np.ones(2)})
    assert '\n' not in str(e.value)


# ------------------------------------------------------------------ 8. the cost model

PAPER_IMAGES = 1_281_167


def _letra_paper_plans():
    """Scratch and LeTra as LeTra's rebuttal counts them (12 Des-Nets: 12 × 100 epochs from
    scratch against 320 Aux-Net epochs + 12 × 1), with the shapes of the letra:paper config:
    its Aux-Net, and its eight Des-Net shapes standing in for the twelve (1.5 runs each)."""
    from jlearngene.experiments import configs
    c = configs.load('letra:paper')
    model = {k: v for k, v in c.model.to_dict().items() if k != 'variant'}
    aux = vit_config(c.model.variant, depth=c.depth, **model)
    des = [aux.replace(width=w, num_heads=w // aux.head_dim, mlp_dim=c.mlp_ratio * w, depth=d)
           for w, d in c.shapes]
    aux_epochs = c.aux.fraction * c.scratch.epochs
    per_shape = 12 / len(des)
    scratch = [costs.Run('scratch', d, c.scratch.epochs * per_shape, PAPER_IMAGES) for d in des]
    letra = [costs.Run('aux', aux, aux_epochs, PAPER_IMAGES, teacher=costs.LEVIT_384_FLOPS)]
    letra += [costs.Run('des', d, 1.0 * per_shape, PAPER_IMAGES) for d in des]
    return scratch, letra, aux_epochs


def test_letra_paper_config_trains_its_aux_net_320_epochs():
    assert _letra_paper_plans()[2] == 320


def test_letra_rebuttal_ratio_in_epochs_and_flops():
    scratch, letra, _ = _letra_paper_plans()
    ratio = costs.cost_ratio(scratch, letra)
    assert round(ratio['epochs'], 2) == 3.61                       # the rebuttal's "3.6×"
    assert round(ratio['flops'], 2) == 1.70                        # LeViT-384's forward paid
    no_teacher = [dataclasses.replace(letra[0], teacher=None)] + letra[1:]
    assert round(costs.cost_ratio(scratch, no_teacher)['flops'], 2) == 1.75


def test_a_teacher_can_be_given_by_its_flops():
    student = vit_config('Ti', depth=3, pool='avg')
    by_cfg = costs.training_cost([costs.Run('kd', student, 2, 10, teacher=vit_config('S', depth=3))])
    flops = costs.flops_per_image(vit_config('S', depth=3))
    by_flops = costs.training_cost([costs.Run('kd', student, 2, 10, teacher=flops)])
    assert by_cfg['flops'] == by_flops['flops']
    assert costs.training_cost([costs.Run('kd', student, 1, 1, teacher=costs.LEVIT_384_FLOPS)])[
        'flops'] == 3 * costs.flops_per_image(student) + 2.353e9
    for bad in (-1.0, float('nan'), 'levit_384', True):
        with pytest.raises(ValueError, match='teacher'):
            costs.training_cost([costs.Run('kd', student, 1, 1, teacher=bad)])


def test_plan_table_prints_full_shapes_epochs_and_flops():
    scratch, letra, _ = _letra_paper_plans()
    text = costs.plan_table(letra, baseline=scratch)
    aux_row = next(line for line in text.splitlines() if line.startswith('| aux |'))
    assert '| 768 | 16 | 12 | 3072 |' in aux_row and '| 320 |' in aux_row
    assert '| 576 | 10 | 9 | 2304 |' in text                       # width, depth, heads, MLP
    assert 'heads' in text and 'mlp' in text and 'epochs' in text and 'FLOPs' in text
    assert '3.61× in epochs' in text and '1.70× in FLOPs' in text
    assert 'LeViT' not in text and '2.35 GFLOPs' in text          # a teacher given by FLOPs


def test_cluster_inherited_params():
    cfg = CFG.replace(depth=3, pool='avg', class_token=False)
    p = init(cfg, jax.random.key(0))
    gene = cluster.gene_from_model(p, cfg)                # every head its own centroid
    assert cluster.inherited_param_count(gene, cfg) == costs.param_count(cfg)
    assert cluster.inherited_param_count(gene, cfg, head='new') == costs.param_count(
        cfg, include_head=False)
    fresh_embeddings = cluster.inherited_param_count(gene, cfg, head='new', embeddings='random')
    assert fresh_embeddings == costs.param_count(cfg, include_head=False) - costs.embedding_param_count(cfg)
    deeper = cfg.replace(depth=4)                         # a layer beyond the ancestor: drawn
    assert cluster.inherited_param_count(gene, deeper, head='new') == costs.param_count(
        cfg, include_head=False)
    heads = (1, 2, 1)
    target = cluster.descendant_config(cfg, heads)
    made = cluster.descend(gene, target, heads=heads, head='new', key=jax.random.key(1))
    assert cluster.inherited_param_count(gene, target, heads=heads, head='new') == common.count(
        made, include_head=False)
    # one FFN for three layers: stored once (S-Params), inherited three times (I-Params)
    grouped = cluster.gene_from_model(p, cfg, clusters=[(0,), (1,), (0,)])
    assert cluster.gene_groups(grouped) == ((0, 1, 2),)
    assert cluster.inherited_param_count(grouped, cfg) == costs.param_count(cfg)
    assert cluster.gene_param_count(grouped) < cluster.inherited_param_count(grouped, cfg, head='new')


def test_scala_lists_a_grids_sub_networks():
    cfg = vit_config('S')
    grid = scala.width_grid(0.25, 1 / 16)
    subs = scala.subnet_configs(cfg, grid)
    assert len(subs) == 13                                   # X = 13 on Scala's default grid
    assert [r for r, _ in subs] == list(grid)
    assert [c.width for _, c in subs] == list(range(96, 385, 24))
    assert all(c.num_heads == 6 and c.mlp_dim == 4 * c.width and c.depth == 12 for _, c in subs)
    assert subs[-1][1] == cfg
    official = scala.subnet_configs(cfg, grid, rule='official')
    assert all(c.ln_eps == scala.OFFICIAL_LN_EPS for _, c in official)
    with pytest.raises(common.GeneError, match='0.3'):
        scala.subnet_configs(cfg, (0.3, 1.0))


# ================================================================== part two
# Writes that fail or are killed, one run per workdir, failed writes that hang, parameters
# that are not finite floats, runs that diverge, full-disk messages.

import contextlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def _file_size_limit(nbytes: int):
    """Writes that would grow a file past `nbytes` fail (EFBIG), as on a full disk; no root
    needed (RLIMIT_FSIZE, with SIGXFSZ ignored so the write fails instead of killing us)."""
    import resource
    import signal
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)


_LIMITED_CLI = '''
    import resource, runpy, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(sys.argv.pop(1))
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    runpy.run_module('jlearngene', run_name='__main__', alter_sys=True)
'''


def _contents(path) -> dict:
    """{relative path: bytes} of a file, or of every file under a directory."""
    path = str(path)
    if os.path.isfile(path):
        with open(path, 'rb') as f:
            return {'': f.read()}
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            with open(full, 'rb') as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def _largest_file(path) -> int:
    return max(len(b) for b in _contents(path).values())


def _python(code: str, *args, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter of this venv (the repository importable)."""
    env = {**os.environ, 'PYTHONPATH': REPO + os.pathsep + os.environ.get('PYTHONPATH', '')}
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, **kw)


# ------------------------------------------------------------------ 9. nothing is lost

def test_a_failed_model_overwrite_keeps_the_old_model(tmp_path, params):
    from jlearngene.train import checkpoint
    from jlearngene.train.integrity import CheckpointError
    old = checkpoint.save_model(str(tmp_path / 'm'), params, CFG)
    before = _contents(old)
    big = CFG.replace(width=128, mlp_dim=2048)
    with _file_size_limit(2 * _largest_file(old) + 4096):
        with pytest.raises(CheckpointError, match=re.escape(old)):
            checkpoint.save_model(old, init(big, jax.random.key(1)), big, overwrite=True)
    assert _contents(old) == before
    assert os.listdir(tmp_path) == ['m']              # nothing half-written beside it
    np.testing.assert_array_equal(checkpoint.load_model(old)[0]['head']['kernel'],
                                  params['head']['kernel'])


_KILLED_SAVE = '''
    import os, signal, sys
    import jax
    from orbax.checkpoint._src.serialization import jax_array_handlers
    from jlearngene.models import init, vit_config
    from jlearngene.train import checkpoint

    async def killed(*args, **kwargs):       # kill -9 in the middle of writing the arrays
        os.kill(os.getpid(), signal.SIGKILL)
    jax_array_handlers._async_serialize_replica_slices = killed
    cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16,
                     patch_size=8, num_classes=10)
    checkpoint.save_model(sys.argv[1], init(cfg, jax.random.key(7)), cfg, overwrite=True)
'''


def test_a_model_overwrite_killed_mid_write_keeps_the_old_model(tmp_path, params):
    from jlearngene.train import checkpoint
    old = checkpoint.save_model(str(tmp_path / 'm'), params, CFG)
    before = _contents(old)
    done = _python(_KILLED_SAVE, old)
    assert done.returncode == -9, done.stderr[-2000:]
    assert _contents(old) == before
    # the next save cleans up what the killed one left, and replaces the model
    new = init(CFG, jax.random.key(3))
    checkpoint.save_model(old, new, CFG, overwrite=True)
    assert os.listdir(tmp_path) == ['m']
    np.testing.assert_array_equal(checkpoint.load_model(old)[0]['head']['kernel'], new['head']['kernel'])


@pytest.mark.parametrize('flag,name', [('--to-timm', 'm.safetensors'), ('--to-big-vision', 'm.npz')])
def test_a_failed_export_keeps_the_old_file_and_names_it(tmp_path, capsys, flag, name):
    from jlearngene.train import checkpoint
    cfg = CFG.replace(pool='avg', class_token=False)
    small = checkpoint.save_model(str(tmp_path / 'small'), init(cfg, jax.random.key(0)), cfg)
    big_cfg = cfg.replace(width=128, mlp_dim=2048)
    big = checkpoint.save_model(str(tmp_path / 'big'), init(big_cfg, jax.random.key(0)), big_cfg)
    out = str(tmp_path / name)
    assert cli.main(['convert', flag, small, '--out', out]) == 0
    before = _contents(out)
    capsys.readouterr()
    with _file_size_limit(len(before['']) + 4096):
        line = cli_error(capsys, ['convert', flag, big, '--out', out, '--overwrite'], 'convert')
    assert out in line and ('File too large' in line or 'No space' in line), line
    assert _contents(out) == before
    assert sorted(os.listdir(tmp_path)) == sorted(['small', 'big', name])


def test_a_failed_plot_keeps_the_old_png(tmp_path, capsys):
    _write_rows(tmp_path / metrics.METRICS_FILE, range(1, 40))
    png = str(tmp_path / 'curves.png')
    assert cli.main(['plot', str(tmp_path), '--out', png]) == 0
    before = _contents(png)
    capsys.readouterr()
    with _file_size_limit(len(before['']) // 2):
        line = cli_error(capsys, ['plot', str(tmp_path), '--out', png], 'plot')
    assert png in line, line
    assert _contents(png) == before
    assert sorted(os.listdir(tmp_path)) == sorted([metrics.METRICS_FILE, 'curves.png'])


def test_a_failed_gene_overwrite_keeps_the_old_gene(tmp_path):
    from jlearngene import artefacts, genes
    from jlearngene.genes import tleg
    method = genes.get('tleg')
    gene = tleg.init_gene(CFG, jax.random.key(0))
    path = artefacts.save_gene(str(tmp_path / 'g'), method, gene, configs={'source': CFG})
    before = _contents(path)
    big = CFG.replace(width=128, mlp_dim=2048)
    with _file_size_limit(2 * _largest_file(path) + 4096):
        with pytest.raises(OSError, match=re.escape(str(tmp_path))):
            artefacts.save_gene(path, method, tleg.init_gene(big, jax.random.key(0)),
                                configs={'source': big}, overwrite=True)
    assert _contents(path) == before
    assert os.listdir(tmp_path) == ['g']


def test_replace_dir_without_an_atomic_swap_and_an_interrupted_one(tmp_path, monkeypatch):
    from jlearngene.train import files
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    path, new = tmp_path / 'm', tmp_path / 'new'
    path.mkdir()
    (path / 'a').write_text('old')
    new.mkdir()
    (new / 'a').write_text('new')
    monkeypatch.setattr(files, '_exchange', lambda a, b: False)     # a file system without it
    files.replace_dir(str(new), str(path))
    assert (path / 'a').read_text() == 'new' and os.listdir(tmp_path) == ['m']
    # killed between its two renames: the old copy is set aside and `path` is missing
    os.rename(path, tmp_path / f'.old-{dead.pid}.m')
    (tmp_path / f'.partial-{dead.pid}.m').mkdir()
    files.remove_stale(str(path))
    assert (path / 'a').read_text() == 'new' and os.listdir(tmp_path) == ['m']


# ------------------------------------------------------------------ 10. one run per workdir

def _lock_holder(tmp_path, pid: int) -> str:
    from jlearngene.train import workdir_lock
    os.makedirs(tmp_path, exist_ok=True)
    path = os.path.join(tmp_path, workdir_lock.LOCK_FILE)
    with open(path, 'w', encoding='utf-8') as f:
        json.dump({'pid': pid, 'host': workdir_lock.host(), 'command': 'jlearngene train --config x',
                   'started': '2026-12-01T00:00:00'}, f)
    return path


def test_a_second_run_on_a_workdir_in_use_is_refused_at_once(tmp_path, capsys, monkeypatch):
    from jlearngene.commands import run
    other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        lock = _lock_holder(tmp_path, other.pid)

        def no_run(*a, **k):
            raise AssertionError('the run started on a workdir in use')
        monkeypatch.setattr(run, 'check_run_data', no_run)
        monkeypatch.setattr(run, 'run_classification', no_run)
        for argv, command in (
                (['train', '--config', 'digits_vit:smoke', '--noprogress', '--workdir', str(tmp_path)], 'train'),
                (['train', '--config', 'tleg:digits', '--noprogress', '--workdir', str(tmp_path)], 'train')):
            line = cli_error(capsys, argv, command)
            assert f'process {other.pid}' in line and 'jlearngene train --config x' in line, line
            assert str(tmp_path) in line
        assert json.load(open(lock))['pid'] == other.pid       # the holder's lock is left alone
    finally:
        other.kill()
        other.wait()


def test_a_stale_lock_is_taken_over_with_a_warning_and_removed_after(tmp_path, capsys, monkeypatch,
                                                                       caplog):
    from jlearngene.commands import run
    from jlearngene.train import workdir_lock
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    lock = _lock_holder(tmp_path, dead.pid)
    seen = []

    def fake_run(config, workdir, progress=True):
        seen.append(json.load(open(lock))['pid'])
        return None, {'eval': []}
    monkeypatch.setattr(run, 'run_classification', fake_run)
    with caplog.at_level('WARNING', logger=workdir_lock.__name__):
        assert cli.main(['train', '--config', 'digits_vit:smoke', '--noprogress', '--workdir',
                         str(tmp_path)]) == 0
    assert seen == [os.getpid()]
    assert any('stale' in r.getMessage() and str(dead.pid) in r.getMessage() for r in caplog.records)
    assert not os.path.exists(lock)

    def failing_run(config, workdir, progress=True):      # an error path removes it too
        assert os.path.exists(lock)
        raise ValueError('bad data')
    monkeypatch.setattr(run, 'run_classification', failing_run)
    capsys.readouterr()                                    # the first run's lines
    cli_error(capsys, ['train', '--config', 'digits_vit:smoke', '--noprogress', '--workdir',
                    str(tmp_path)], 'train')
    assert not os.path.exists(lock)


def test_workdir_lock_nests_in_one_process_and_names_the_holder(tmp_path):
    from jlearngene.train import workdir_lock
    with workdir_lock.hold_workdir(str(tmp_path)):
        with workdir_lock.hold_workdir(str(tmp_path)):      # train -> study: the same process
            pass
        assert os.path.exists(tmp_path / workdir_lock.LOCK_FILE)
        done = _python('''
            import sys
            from jlearngene.train import workdir_lock
            try:
                with workdir_lock.hold_workdir(sys.argv[1]):
                    pass
            except workdir_lock.WorkdirInUseError as e:
                print(e)
                sys.exit(3)
        ''', tmp_path, timeout=120)
        assert done.returncode == 3, done.stderr[-2000:]
        assert f'process {os.getpid()}' in done.stdout and '\n' not in done.stdout.strip()
    assert not os.path.exists(tmp_path / workdir_lock.LOCK_FILE)


def test_run_checkpoints_have_one_writer(tmp_path, params):
    from jlearngene.train import workdir_lock
    from jlearngene.train.run_checkpoint import RunCheckpointer
    state = {'params': params, 'step': jnp.asarray(0)}
    lock = tmp_path / 'a' / workdir_lock.LOCK_FILE
    with RunCheckpointer(str(tmp_path / 'a')) as ck:
        assert not lock.exists()                       # a reader takes no lock
        ck.save(1, state)
        assert json.load(open(lock))['pid'] == os.getpid()
        assert ck.steps() == [1]
    assert not lock.exists()
    other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        _lock_holder(tmp_path / 'b', other.pid)
        with RunCheckpointer(str(tmp_path / 'b')) as ck:
            with pytest.raises(workdir_lock.WorkdirInUseError, match=f'in use by process {other.pid}'):
                ck.save(1, state)
            assert ck.steps() == []
    finally:
        other.kill()
        other.wait()


# ------------------------------------------------------------------ 11. no hang after a failed write

_LINGERING = '''
    import sys, threading
    from jlearngene import cli
    from jlearngene.commands import info

    def failing(argv):
        # what orbax leaves after a failed write: a non-daemon thread that waits on a
        # signal the failed thread never sends
        threading.Thread(target=threading.Event().wait, name='signaling', daemon=False).start()
        raise OSError('model checkpoint /x could not be written (injected)')
    info.main = failing
    sys.argv = ['jlearngene', 'info', 'x']
    sys.exit(cli.main())
'''


def test_a_failed_command_exits_despite_threads_a_failed_write_leaves():
    start = time.monotonic()
    try:
        done = _python(_LINGERING, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail('the command printed its error and then hung on a thread it left')
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        'jlearngene info: model checkpoint /x could not be written (injected)']
    assert time.monotonic() - start < 90


_RACER = '''
    import sys
    import jax
    from jlearngene.models import init, vit_config
    from jlearngene.train import checkpoint
    from jlearngene.train.run_checkpoint import RunCheckpointer
    cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=2, image_size=16,
                     patch_size=8, num_classes=10)
    p = init(cfg, jax.random.key(0))
    state = {'params': p, 'step': jax.numpy.asarray(0)}
    try:
        with RunCheckpointer(sys.argv[1] + '/checkpoints', keep=2) as ck:
            for step in range(1, 16):
                ck.save(step, state)
                checkpoint.save_model(sys.argv[1] + '/model', p, cfg, overwrite=True)
    except Exception as e:
        print('failed:', e)
        sys.exit(1)
'''


@pytest.mark.slow
def test_two_processes_racing_on_one_checkpoint_both_exit(tmp_path):
    """Two processes saving the same run's checkpoints: the second is refused at its first
    save; before, the loser of a step both wrote waited 5 minutes per orbax signal."""
    from jlearngene.train import checkpoint
    env = {**os.environ, 'PYTHONPATH': REPO}
    for attempt in range(3):
        work = tmp_path / str(attempt)
        procs = [subprocess.Popen([sys.executable, '-c', textwrap.dedent(_RACER), str(work)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, cwd=REPO) for _ in range(2)]
        deadline, outs = time.monotonic() + 150, []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                pytest.fail('a process racing on one checkpoint did not exit')
        assert sorted(p.returncode for p in procs) in ([0, 0], [0, 1]), outs
        assert all('in use by process' in out for p, out in zip(procs, outs) if p.returncode), outs
        checkpoint.load_model(str(work / 'model'))          # the model is whole either way


# ------------------------------------------------------------------ 12. finite float parameters

def _nan_like(tree):
    return jax.tree.map(lambda x: np.full(np.shape(x), np.nan, np.float32), tree)


def test_convert_refuses_non_finite_timm_and_big_vision_files(tmp_path, capsys):
    from jlearngene.interop import big_vision, state_dict, timm
    cfg = CFG.replace(pool='avg', class_token=False)
    p = _nan_like(init(cfg, jax.random.key(0)))
    sd = timm.to_timm(p, cfg)
    state_dict.save_safetensors(sd, tmp_path / 'nan.safetensors')
    big_vision.save_npz(big_vision.to_big_vision(p, cfg), tmp_path / 'nan.npz')
    for flag, src, more in (('--from-timm', 'nan.safetensors', ['--num-heads', '2']),
                            ('--from-big-vision', 'nan.npz', [])):
        line = cli_error(capsys, ['convert', flag, str(tmp_path / src), '--out', str(tmp_path / 'o'),
                               *more], 'convert')
        assert 'NaN' in line and src in line and re.search(r"'[\w/]+'", line), line
        assert not (tmp_path / 'o').exists()


def test_non_finite_or_integer_parameters_are_refused_where_they_enter(tmp_path, params):
    from jlearngene import artefacts, genes
    from jlearngene.commands import run
    from jlearngene.experiments import configs
    from jlearngene.genes import tleg
    from jlearngene.interop.state_dict import check_values
    check_values(params, 'model')                            # a good tree passes
    bad = jax.tree.map(np.asarray, params)
    bad['head']['bias'] = np.array(bad['head']['bias'])
    bad['head']['bias'][3] = np.inf
    with pytest.raises(ValueError, match=r"model: parameter 'head/bias' holds 1 inf"):
        check_values(bad, 'model')
    ints = jax.tree.map(lambda x: np.asarray(x).astype(np.int32), params)
    with pytest.raises(ValueError, match=r"parameter '[\w/]+' is int32, not a floating"):
        check_values(ints, 'model')
    # save_gene
    gene = _nan_like(tleg.init_gene(CFG, jax.random.key(0)))
    with pytest.raises(ValueError, match='NaN'):
        artefacts.save_gene(str(tmp_path / 'g'), genes.get('tleg'), gene)
    assert not (tmp_path / 'g').exists()
    # descend
    with pytest.raises(ValueError, match='NaN'):
        artefacts.write_descendant(str(tmp_path / 'd'), _nan_like(params), CFG,
                                   meta={'path': 'g', 'method': 'tleg'}, options={}, seed=0)
    assert not (tmp_path / 'd').exists()
    # --config.init
    from jlearngene.train import checkpoint
    for name, tree in (('nan', _nan_like(params)), ('int', ints)):
        checkpoint.save_model(str(tmp_path / name), tree, CFG)
        config = configs.load('digits_vit:smoke')
        config.init = str(tmp_path / name)
        with pytest.raises(ValueError, match=re.escape(f'--config.init {str(tmp_path / name)!r}')):
            run.initial_params(config, CFG)


# ------------------------------------------------------------------ 13. a diverged run says so

def test_a_run_whose_loss_ends_far_above_its_start_warns_and_info_shows_it(tmp_path, capsys, caplog):
    import optax

    from jlearngene.train import trainer

    def loss_fn(trainable, batch, rng):        # gradient ascent on w²: the loss grows
        del batch, rng
        return jnp.mean(trainable['w'] ** 2), {}
    batches = iter(lambda: {'x': np.zeros((8, 1), np.float32)}, None)
    with caplog.at_level('WARNING'):
        trainer.fit(loss_fn, {'w': jnp.ones(3)}, batches, optax.sgd(-0.25),
                    trainer.FitConfig(workdir=str(tmp_path), steps=12, log_every=3, progress=False,
                                      console=False, tensorboard=False, steps_per_call=1))
    warned = [r.getMessage() for r in caplog.records if 'diverged' in r.getMessage()]
    assert len(warned) == 1 and '1 at the start' in warned[0], warned
    rows = metrics.read_metrics(str(tmp_path), kind='warning')
    assert len(rows) == 1 and rows[0]['step'] == 12 and 'diverged' in rows[0]['text']
    capsys.readouterr()
    for target in (tmp_path / metrics.METRICS_FILE, tmp_path):
        assert cli.main(['info', str(target)]) == 0
        assert 'warning at step 12: the loss diverged' in capsys.readouterr().out

    caplog.clear()                              # a run that learns does not warn
    with caplog.at_level('WARNING'):
        trainer.fit(loss_fn, {'w': jnp.ones(3)}, batches, optax.sgd(0.25),
                    trainer.FitConfig(workdir=str(tmp_path / 'ok'), steps=12, log_every=3,
                                      progress=False, console=False, tensorboard=False,
                                      steps_per_call=1))
    assert not [r for r in caplog.records if 'diverged' in r.getMessage()]
    assert metrics.read_metrics(str(tmp_path / 'ok'), kind='warning') == []


# ------------------------------------------------------------------ 14. one line on a full disk

@contextlib.contextmanager
def _small_tmpfs(tmp_path, size: str = '200k'):
    """A tmpfs of `size` mounted on `tmp_path/disk` (root only; skips elsewhere)."""
    disk = tmp_path / 'disk'
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs',
                                            str(disk)], capture_output=True).returncode:
        pytest.skip('mounting a small tmpfs needs root')
    try:
        yield disk
    finally:
        subprocess.run(['umount', str(disk)], capture_output=True)


def _descend_to_full_disk(folder, limit: int) -> str:
    """`jlearngene descend` into `folder` with writes failing past `limit` bytes a file (0:
    no limit); its one stderr line, after checking that nothing is left in `folder`."""
    out = folder / 'des'
    done = _python(_LIMITED_CLI, limit, 'descend', 'letra_digits', '--width', '48', '--depth', '6',
                   '--out', out)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith('jlearngene descend: ') and str(out) in lines[0], lines
    assert os.listdir(folder) == []
    return lines[0]


def test_descend_to_a_full_disk_prints_one_line_naming_the_path(tmp_path):
    assert 'File too large' in _descend_to_full_disk(tmp_path, 64 * 1024)


def test_descend_to_a_full_tmpfs_prints_one_line_naming_the_path(tmp_path):
    with _small_tmpfs(tmp_path) as disk:
        assert 'No space left on device' in _descend_to_full_disk(disk, 0)
