"""The generic trainer end to end on tiny models: logging, exact resume, devices, guards."""
import glob
import importlib.util
import json
import os
import re
import signal

import chex
import jax
import numpy as np
import optax
import pytest

from jlearngene import parallel, pytree
from jlearngene.models import init, vit_config
from jlearngene.train import hooks, integrity, metrics, optim, run_checkpoint, tasks, trainer
from jlearngene.train import state as state_lib
from jlearngene.train import step as step_lib

CFG = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=2, image_size=8, patch_size=4,
                 num_classes=3)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8, 8, 3)).astype(np.float32)
Y = (X[..., 0].mean((1, 2)) > 0).astype(np.int32) + (X[..., 1].mean((1, 2)) > 0.2)


class Batches:
    """Endless deterministic batches with a grain-like get_state/set_state; optional hooks."""

    def __init__(self, batch_size=16, hook=None):
        self.i, self.bs, self.hook = 0, batch_size, hook

    def __next__(self):
        if self.hook:
            self.hook(self.i)
        j = (self.i * self.bs) % len(X)
        self.i += 1
        return {'image': X[j:j + self.bs], 'label': Y[j:j + self.bs]}

    def get_state(self):
        return {'i': self.i}

    def set_state(self, state):
        self.i = state['i']


PARAMS = jax.jit(init, static_argnums=0)(CFG, jax.random.key(0))
_LOSS = tasks.classification_loss(CFG, label_smoothing=0.1)
TRACES = [0]


def LOSS(params, batch, rng):  # noqa: N802 - a module-level loss that counts its traces
    TRACES[0] += 1
    return _LOSS(params, batch, rng)


OPT = dict(lr=3e-3, warmup_steps=2)
TX = optim.make_optimizer(OPT, PARAMS, total_steps=8)
EVAL = [{'image': X[:24], 'label': Y[:24], 'mask': np.arange(24) < 20}]


HOOK_ARGS = ('eval_fn', 'eval_data', 'eval_every', 'stop_when')


def _fit(workdir, steps, data=None, **kw):
    """Shared params, loss and optimiser under one compile key: fits with equal shardings
    compile once. `eval_fn`/`eval_data`/`eval_every` add an Evaluation hook, `stop_when` a
    StopWhen after it; the rest are FitConfig fields."""
    run_hooks = []
    ev = {k: kw.pop(k) for k in HOOK_ARGS if k in kw}
    if 'eval_fn' in ev:
        run_hooks.append(hooks.Evaluation(ev['eval_fn'], ev.get('eval_data'), every=ev.get('eval_every')))
    if ev.get('stop_when') is not None:
        run_hooks.append(hooks.StopWhen(ev['stop_when']))
    if 'config' in kw:
        kw['experiment_config'] = kw.pop('config')
    kw.setdefault('log_every', 2)
    kw.setdefault('console', False)
    kw.setdefault('compile_key', ('test_trainer.LOSS', 'test_trainer.TX'))
    config = trainer.FitConfig(workdir=str(workdir), steps=steps, seed=1, progress=False,
                               model_config=CFG, **kw)
    return trainer.fit(LOSS, PARAMS, data or Batches(), TX, config, run_hooks)


def test_fit_logs_evaluates_and_checkpoints(tmp_path):
    params, hist = _fit(tmp_path, 8, eval_fn=tasks.classification_eval(CFG), eval_data=EVAL,
                        eval_every=4, best_metric='eval/accuracy', config={'steps': 8})
    assert [r['step'] for r in hist['train']] == [2, 4, 6, 8]
    assert hist['train'][-1]['loss'] < hist['train'][0]['loss']
    assert [r['step'] for r in hist['eval']] == [4, 8]
    assert hist['eval'][0]['eval/count'] == 20.0  # the mask drops 4 padded examples
    recs = metrics.read_metrics(tmp_path)
    assert {r['kind'] for r in recs} == {'train', 'eval'} and len(recs) == 6
    assert {'loss', 'accuracy', 'grad_norm', 'lr', 'steps_per_sec'} <= set(recs[0])
    assert json.load(open(tmp_path / 'config.json')) == {'steps': 8}
    if importlib.util.find_spec('tensorboardX'):  # optional: the dev extra installs it
        assert os.listdir(tmp_path / 'tensorboard')
    else:
        assert not os.path.exists(tmp_path / 'tensorboard')
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.latest_step() == 8
        state, meta = ck.restore(jax.eval_shape(lambda: state_lib.init_state(PARAMS, TX)))
    chex.assert_trees_all_equal(state['params'], params)
    assert meta['config'] == {'steps': 8}


def test_stop_when_ends_the_run_at_an_evaluation(tmp_path, caplog):
    seen = []

    def stop(rec):
        seen.append(rec['eval/accuracy'])
        return len(seen) == 2                        # the second evaluation says stop

    with caplog.at_level('INFO', logger='jlearngene.train.metrics'):
        params, hist = _fit(tmp_path, 8, eval_fn=tasks.classification_eval(CFG), eval_data=EVAL,
                            eval_every=2, stop_when=stop)
    assert [r['step'] for r in hist['eval']] == [2, 4] and len(seen) == 2
    assert hist['train'][-1]['step'] == 4
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.latest_step() == 4                 # the stopped step is saved
    assert 'step 4: stopped at step 4 of 8: the stop condition is met' in caplog.text


def test_exact_resume(tmp_path):
    full, _ = _fit(tmp_path / 'full', 6, steps_per_call=1)
    traces = TRACES[0]
    _fit(tmp_path / 'part', 3, steps_per_call=1)   # stop at k = 3 (final checkpoint)
    resumed, hist = _fit(tmp_path / 'part', 6, steps_per_call=1)  # fresh iterator, resumes at 3
    assert TRACES[0] == traces                     # the step compiled once for all three fits
    assert [r['step'] for r in hist['train']] == [4, 6]
    assert pytree.trees_equal(jax.device_get(full), jax.device_get(resumed))


def test_no_resume_starts_fresh(tmp_path):
    _fit(tmp_path, 6)
    params, hist = _fit(tmp_path, 4, resume=False)
    assert [r['step'] for r in hist['train']] == [2, 4]
    assert [r['step'] for r in metrics.read_metrics(tmp_path)] == [2, 4]
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.steps() == [4]


def test_resume_refuses_a_checkpoint_past_the_runs_end(tmp_path):
    _fit(tmp_path, 6, config={'steps': 6})
    before = (tmp_path / 'config.json').read_text()
    with pytest.raises(integrity.CheckpointError, match='checkpoint at step 6, past this run.s 4 steps'):
        _fit(tmp_path, 4, config={'steps': 4})
    assert (tmp_path / 'config.json').read_text() == before       # the run's record is unchanged
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.latest_step() == 6


def test_resume_refuses_other_model(tmp_path):
    _fit(tmp_path, 2)
    other = CFG.replace(num_classes=4)
    params = jax.jit(init, static_argnums=0)(other, jax.random.key(0))
    tx = optim.make_optimizer({'lr': 1e-3}, params, total_steps=4)
    with pytest.raises(integrity.CheckpointError, match='num_classes.*3.*4'):
        trainer.fit(tasks.classification_loss(other), params, Batches(), tx,
                    {'workdir': str(tmp_path), 'steps': 4, 'progress': False, 'console': False,
                     'model_config': other})


def _assert_same_training(a, b):
    """Equal up to float32 reordering, except the key bias. Softmax ignores a shift of the
    logits, so the key bias's gradient is zero in exact arithmetic and its AdamW updates are
    normalised rounding noise, which differs with the device layout and the matmul kernels:
    there both runs must only keep it near zero (the other parameters are ~1e-2 and more)."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        if "['k']['bias']" in jax.tree_util.keystr(path):
            assert max(np.abs(x).max(), np.abs(y).max()) < 1e-4
        else:
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6, err_msg=jax.tree_util.keystr(path))


def test_same_result_on_one_and_eight_devices(tmp_path):
    assert jax.device_count() == 8
    one, _ = _fit(tmp_path / 'one', 4, mesh=parallel.make_mesh(1))
    eight, _ = _fit(tmp_path / 'eight', 4)
    fsdp, _ = _fit(tmp_path / 'fsdp', 4, sharding='fsdp', fsdp_min_size=0)
    _assert_same_training(jax.device_get(one), jax.device_get(eight))
    _assert_same_training(jax.device_get(one), jax.device_get(fsdp))
    assert fsdp['blocks']['mlp']['fc1']['kernel'].sharding.spec == jax.P(None, None, 'data')


def test_microbatches_give_the_one_pass_update():
    # SGD: the update is linear in the gradient (Adam's first step is sign(g)·lr, which turns
    # the rounding noise of an exactly-zero gradient, e.g. the key bias's, into a full step).
    tx = optax.sgd(0.1)
    state = state_lib.init_state(PARAMS, tx)
    batch = {'image': X[:16], 'label': Y[:16]}
    rng = jax.random.key_data(jax.random.key(3))

    def run(n, jit=True, batch=batch):
        step = step_lib.make_train_step(LOSS, tx, microbatches=n)
        return (jax.jit(step) if jit else step)(state, batch, rng)

    one_state, one_metrics = run(1)
    for new_state, new_metrics in (run(4), run(2, jit=False)):
        chex.assert_trees_all_close(new_metrics, one_metrics, rtol=1e-5, atol=1e-6)
        chex.assert_trees_all_close(new_state, one_state, rtol=1e-5, atol=1e-6)
    # Not vacuous: one part alone gives another loss and update.
    part_state, part_metrics = run(1, batch=jax.tree.map(lambda x: x[::2], batch))
    assert abs(float(part_metrics['loss']) - float(one_metrics['loss'])) > 1e-4
    assert not pytree.trees_equal(jax.device_get(part_state['params']),
                                  jax.device_get(one_state['params']))
    assert not pytree.trees_equal(jax.device_get(one_state['params']), jax.device_get(PARAMS))


def test_microbatches_on_eight_devices(tmp_path):
    one, _ = _fit(tmp_path / 'one', 4, mesh=parallel.make_mesh(1))
    split, hist = _fit(tmp_path / 'split', 4, microbatches=2)
    chex.assert_trees_all_close(jax.device_get(one), jax.device_get(split), rtol=2e-5, atol=2e-6)
    assert hist['train'][-1]['loss'] < hist['train'][0]['loss']


def test_microbatches_refuse_bad_values(tmp_path):
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=f'microbatches.*got {re.escape(repr(bad))}'):
            step_lib.make_train_step(LOSS, TX, microbatches=bad)
    with pytest.raises(ValueError, match='microbatches.*got 0'):
        _fit(tmp_path / 'zero', 2, microbatches=0)
    assert not os.path.exists(tmp_path / 'zero')       # refused before touching the workdir
    step = step_lib.make_train_step(LOSS, TX, microbatches=3)
    with pytest.raises(ValueError, match=r"microbatches=3.*\['image'\].*16"):
        step(state_lib.init_state(PARAMS, TX), {'image': X[:16], 'label': Y[:16]},
             jax.random.key_data(jax.random.key(0)))


def test_steps_per_call_runs_the_same_steps():
    state = state_lib.init_state(PARAMS, TX)
    rng = jax.random.key_data(jax.random.key(3))
    data = Batches()
    batches = [next(data) for _ in range(3)]
    one = jax.jit(step_lib.make_train_step(LOSS, TX))
    s, expected = state, []
    for b in batches:
        s, m = one(s, b, rng)
        expected.append(m)
    stacked = jax.tree.map(lambda *x: np.stack(x), *batches)
    for jit in (True, False):
        three = step_lib.make_train_step(LOSS, TX, steps_per_call=3)
        new_state, metrics = (jax.jit(three) if jit else three)(state, stacked, rng)
        _assert_same_training(jax.device_get(new_state), jax.device_get(s))
        chex.assert_trees_all_close(metrics, jax.tree.map(lambda *x: np.stack(x), *expected),
                                    rtol=1e-6, atol=1e-7)
        assert metrics['loss'].shape == (3,) and new_state['step'] == 3
    assert len({float(m['loss']) for m in expected}) == 3     # three different steps
    with pytest.raises(ValueError, match=r"steps_per_call=2.*\['image'\].*3"):
        step_lib.make_train_step(LOSS, TX, steps_per_call=2)(state, stacked, rng)


def test_fit_with_several_steps_per_call(tmp_path, monkeypatch):
    calls = []
    run_call = step_lib.StepProgram.__call__

    def spy(program, state, host_batches):
        calls.append(len(host_batches))    # steps in this compiled call
        return run_call(program, state, host_batches)
    monkeypatch.setattr(step_lib.StepProgram, '__call__', spy)
    kw = dict(log_every=5, eval_fn=tasks.classification_eval(CFG), eval_data=EVAL, eval_every=5)
    one, hist1 = _fit(tmp_path / 'one', 10, steps_per_call=1, **kw)
    assert set(calls) == {1}
    # 3 steps per call where no log/eval step falls inside: 0-3, 3, 4, 5-8, 8, 9.
    calls.clear()
    three, hist3 = _fit(tmp_path / 'three', 10, steps_per_call=3, **kw)
    assert calls == [3, 1, 1, 3, 1, 1]
    _assert_same_training(jax.device_get(one), jax.device_get(three))
    for a, b in zip(hist1['train'] + hist1['eval'], hist3['train'] + hist3['eval'], strict=True):
        assert a['step'] == b['step']
        np.testing.assert_allclose([a[k] for k in sorted(a) if k != 'steps_per_sec'],
                                   [b[k] for k in sorted(b) if k != 'steps_per_sec'], rtol=1e-5)
    # Resume: a run stopped at step 4 (0-3, 3) continues with 4, 5-8, 8, 9.
    calls.clear()
    _fit(tmp_path / 'part', 4, steps_per_call=3, log_every=4)
    resumed, hist = _fit(tmp_path / 'part', 10, steps_per_call=3, **kw)
    assert calls == [3, 1, 1, 3, 1, 1] and [r['step'] for r in hist['train']] == [5, 10]
    _assert_same_training(jax.device_get(one), jax.device_get(resumed))
    # 'auto' on CPU: the largest K <= 8 dividing log_every, eval_every and steps.
    calls.clear()
    _fit(tmp_path / 'auto', 10, **kw)
    assert calls == [5, 5]


def test_auto_steps_per_call():
    assert step_lib.auto_steps_per_call('cpu', [100, 500, 500, 1500]) == 5
    assert step_lib.auto_steps_per_call('cpu', [16, 64]) == 8
    assert step_lib.auto_steps_per_call('cpu', []) == step_lib.AUTO_STEPS_PER_CALL_MAX
    assert step_lib.auto_steps_per_call('cpu', [2, 3]) == 1
    assert step_lib.auto_steps_per_call('gpu', [100, 500]) == 1
    assert step_lib.auto_steps_per_call('tpu', [100, 500]) == 1


def test_steps_per_call_refuses_bad_values_and_ragged_batches(tmp_path):
    for bad in (0, 2.0, True, 'fast'):
        with pytest.raises(ValueError, match=f'steps_per_call.*got {re.escape(repr(bad))}'):
            _fit(tmp_path / 'bad', 2, steps_per_call=bad)
        assert not os.path.exists(tmp_path / 'bad')       # refused before touching the workdir
    with pytest.raises(ValueError, match='steps_per_call.*got 0'):
        step_lib.make_train_step(LOSS, TX, steps_per_call=0)

    class Ragged(Batches):
        def __next__(self):
            b = super().__next__()
            return jax.tree.map(lambda x: x[:8], b) if self.i % 2 == 0 else b
    with pytest.raises(ValueError, match=r"'image'.*steps_per_call=2"):
        _fit(tmp_path / 'ragged', 4, data=Ragged(), steps_per_call=2)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    class Poisoned(Batches):
        def __next__(self):
            b = super().__next__()
            if self.i == 5:  # the 5th batch
                b = dict(b, image=np.full_like(b['image'], np.nan))
            return b
    with pytest.raises(hooks.NonFiniteLossError, match='nan.*step 5'):
        _fit(tmp_path, 8, data=Poisoned(), checkpoint_every=2, log_every=1)
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.latest_step() == 4
        state, _ = ck.restore(state_lib.init_state(PARAMS, TX))
    chex.assert_tree_all_finite(state)


def test_sigterm_saves_then_exits(tmp_path, capsys):
    def hook(i):
        if i == 3:  # while fetching the 4th batch
            os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        _fit(tmp_path, 8, data=Batches(hook=hook), console=True)
    assert exc.value.code == 143 and exc.value.step == 4
    assert f'preempted (SIGTERM) at step 4; checkpoint saved to {tmp_path / "checkpoints" / "4"}' \
        in capsys.readouterr().out
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.steps() == [4]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # handler restored
    resumed, _ = _fit(tmp_path, 8, console=True)               # the preempted job restarts
    assert f'resumed from {tmp_path / "checkpoints"} at step 4' in capsys.readouterr().out
    full, _ = _fit(tmp_path / 'full', 8)
    assert pytree.trees_equal(jax.device_get(full), jax.device_get(resumed))
    _fit(tmp_path / 'full', 10)                                 # console=False: no lines
    assert 'resumed' not in capsys.readouterr().out


def test_preemption_is_agreed_across_processes():
    # One process: its own flag, at every call, and nothing is gathered.
    def no_gather(flag):
        raise AssertionError('one process gathers nothing')
    one = hooks.Preemption(process_count=1, gather=no_gather)
    assert not one.requested(3, sync_point=True)
    one.flag = True
    assert one.requested(3, sync_point=False)
    # Several: another process's SIGTERM stops this one at the same sync point.
    gathered = []

    def gather(flag):
        gathered.append(flag)
        return np.array([0, int(len(gathered) >= 2), 0])
    many = hooks.Preemption(process_count=3, gather=gather, sync_point=lambda step: False)
    assert not many.requested(1, sync_point=False) and gathered == []   # between sync points
    assert not many.requested(2, sync_point=True)
    assert many.requested(4, sync_point=True) and gathered == [False, False]
    # jax's preemption service decides on its own; without it (None) it is not asked again.
    asked = []

    def service(step):
        asked.append(step)
        return step == 7
    svc = hooks.Preemption(process_count=2, gather=lambda f: np.array([0, 0]), sync_point=service)
    assert not svc.requested(6, sync_point=False) and svc.requested(7, sync_point=False)
    off = hooks.Preemption(process_count=2, gather=lambda f: np.array([0, 0]),
                           sync_point=lambda step: asked.append(step))
    asked.clear()
    assert not off.requested(1, sync_point=False) and not off.requested(2, sync_point=False)
    assert asked == [1]
    assert not hooks.Preemption(False, process_count=1).requested(1, sync_point=True)
    assert hooks.agree_to_stop([False, True]) and not hooks.agree_to_stop(np.zeros(4, bool))


def test_fit_saves_the_step_another_process_was_preempted_at(tmp_path, monkeypatch):
    """A SIGTERM on another host (seen through the gathered flags at the sync points, every
    2 steps here) makes this process save and stop at the agreed step."""
    calls = []

    def gather(flag):
        calls.append(flag)
        return np.array([flag, len(calls) == 2])
    real = hooks.Preemption
    monkeypatch.setattr(trainer, 'Preemption', lambda enabled: real(
        enabled, process_count=2, gather=gather, sync_point=lambda step: False))
    with pytest.raises(hooks.Preempted) as exc:
        _fit(tmp_path, 8, steps_per_call=1)
    assert exc.value.step == 4 and calls == [False, False]
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.steps() == [4]


def test_metric_writer_round_trip(tmp_path):
    w = metrics.MetricWriter(str(tmp_path), console=False, tensorboard=False)
    w.write(1, {'loss': 2.0}, 'train')
    w.write(1, {'loss': float('nan')}, 'train')   # a resumed run rewrites step 1: last wins
    w.write(2, {'eval/accuracy': 0.5}, 'eval')
    w.close()
    recs = metrics.read_metrics(str(tmp_path))
    assert [(r['step'], r['kind']) for r in recs] == [(1, 'train'), (2, 'eval')]
    assert recs[0]['loss'] == 'nan'                 # valid JSON, not a bare NaN
    assert metrics.format_line(3, 'train', {'loss': 0.25, 'lr': 1e-5}) == \
        '[train] step       3  loss=0.2500  lr=1.000e-05'
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / 'none'))):
        metrics.read_metrics(str(tmp_path / 'none'))


def _tree_bytes(path):
    return {f: open(f, 'rb').read() for f in glob.glob(os.path.join(path, '**'), recursive=True)
            if os.path.isfile(f)}


def test_resume_skips_an_unreadable_checkpoint_and_keeps_it(tmp_path, capsys):
    _fit(tmp_path, 4, checkpoint_every=2)
    latest = tmp_path / 'checkpoints' / '4'
    manifest = latest / 'state' / 'manifest.ocdbt'
    manifest.write_bytes(manifest.read_bytes()[:20])          # a truncated file
    damaged = _tree_bytes(latest)
    resumed, _ = _fit(tmp_path, 6, checkpoint_every=2, console=True,
                      config={'steps': 6})
    out, err = capsys.readouterr()
    aside = tmp_path / 'checkpoints.unreadable' / '4'
    assert 'step 4' in err and str(aside) in err
    assert f'resumed from {tmp_path / "checkpoints"} at step 2' in out
    # never deleted: moved aside byte for byte, out of reach of retention and later saves
    assert {os.path.relpath(f, aside): b for f, b in _tree_bytes(aside).items()} == \
        {os.path.relpath(f, latest): b for f, b in damaged.items()}
    full, _ = _fit(tmp_path / 'full', 6)
    assert pytree.trees_equal(jax.device_get(full), jax.device_get(resumed))   # exact from step 2
    # the config stored at step 6 ({'steps': 6}) against a resumed run with steps=8
    _fit(tmp_path, 8, console=True, config={'steps': 8})
    assert 'steps: 6 -> 8' in capsys.readouterr().err


def test_resume_refuses_when_no_checkpoint_can_be_read(tmp_path):
    _fit(tmp_path, 2)
    for f in glob.glob(str(tmp_path / 'checkpoints' / '2' / 'state' / 'manifest.ocdbt')):
        open(f, 'wb').close()
    with pytest.raises(integrity.CorruptCheckpointError, match=r'step 2.*checkpoints\.unreadable'):
        _fit(tmp_path, 4)
    assert os.path.isdir(tmp_path / 'checkpoints.unreadable' / '2')


def test_ctrl_c_saves_like_sigterm(tmp_path, capsys):
    def hook(i):
        if i == 1:  # while fetching the 2nd batch
            os.kill(os.getpid(), signal.SIGINT)
    old = signal.getsignal(signal.SIGINT)
    with pytest.raises(hooks.Preempted) as exc:
        _fit(tmp_path, 4, data=Batches(hook=hook), console=True)
    assert exc.value.code == 130 and exc.value.step == 2
    assert 'press Ctrl-C again to stop without saving' in capsys.readouterr().err
    assert str(exc.value) == (f'interrupted (Ctrl-C) at step 2; checkpoint saved to '
                              f'{tmp_path / "checkpoints" / "2"}')
    assert signal.getsignal(signal.SIGINT) is old   # handler restored
    with run_checkpoint.RunCheckpointer(tmp_path / 'checkpoints') as ck:
        assert ck.steps() == [2]


# ----------------------------------------------------------------------------------------
# The trainer's parts on their own (state, step program, loop, hooks), without `fit`.

def _counting_sgd(counts):
    """SGD whose `init` counts its traces (one per compiled initialisation)."""
    sgd = optax.sgd(0.1)

    def init(params):
        counts.append(1)
        return sgd.init(params)
    return optax.GradientTransformation(init, sgd.update)


def test_state_placement_init_and_resume_without_fit(tmp_path):
    mesh, counts = parallel.make_mesh(), []
    state, sh = state_lib.create_state(PARAMS, _counting_sgd(counts), mesh, sharding='fsdp',
                                       fsdp_min_size=0, seed=5, key=('sgd', 0.1))
    assert int(state['step']) == 0 and pytree.trees_equal(jax.device_get(state['params']), PARAMS)
    np.testing.assert_array_equal(state['rng'], jax.random.key_data(jax.random.key(5)))
    assert state['params']['blocks']['mlp']['fc1']['kernel'].sharding == \
        sh['params']['blocks']['mlp']['fc1']['kernel']
    state_lib.create_state(PARAMS, _counting_sgd(counts), mesh, sharding='fsdp', fsdp_min_size=0,
                           seed=5, key=('sgd', 0.1))
    assert len(counts) == 1          # an equal key: the same program, traced once
    state_lib.create_state(PARAMS, _counting_sgd(counts), mesh, sharding='fsdp', fsdp_min_size=0,
                           seed=5)
    assert len(counts) == 2          # no key: its own program
    # restore_or_start: a fresh start, then the saved step and data position
    with run_checkpoint.RunCheckpointer(str(tmp_path / 'ck')) as ck:
        batches = state_lib.Batches(Batches())
        assert state_lib.restore_or_start(ck, state, batches, str(tmp_path), resume=True)[1] == 0
        moved = dict(state, step=jnp_int(3))
        ck.save(3, moved, data_state={'kind': 'iterator', 'state': {'i': 7}, 'consumed': 3})
        again = state_lib.Batches(Batches())
        restored, start = state_lib.restore_or_start(ck, state, again, str(tmp_path), resume=True)
    assert start == 3 and int(restored['step']) == 3
    assert again.it.i == 7 and again.consumed == 3


def jnp_int(n):
    return jax.numpy.asarray(n, jax.numpy.int32)


def test_step_program_without_fit_is_shared_by_its_key():
    mesh = parallel.make_mesh()
    state, sh = state_lib.create_state(PARAMS, TX, mesh)
    rng = jax.device_put(jax.random.key_data(jax.random.key(1)), parallel.replicated(mesh))
    host = [{'image': X[:16], 'label': Y[:16]}, {'image': X[16:32], 'label': Y[16:32]}]
    program = step_lib.StepProgram(LOSS, TX, sh, mesh, rng, key=('test_program', 1))
    out, metrics_ = program(state, host)
    assert metrics_['loss'].shape == (2,) and int(out['step']) == 2
    # the same two steps as the pure step, one at a time
    step = jax.jit(step_lib.make_train_step(LOSS, TX))
    ref = state_lib.init_state(PARAMS, TX)
    for b in host:
        ref, _ = step(ref, b, rng)
    chex.assert_trees_all_close(jax.device_get(out['params']), jax.device_get(ref['params']),
                                rtol=1e-5, atol=1e-6)
    traces = TRACES[0]
    again, _ = state_lib.create_state(PARAMS, TX, mesh)
    step_lib.StepProgram(LOSS, TX, sh, mesh, rng, key=('test_program', 1))(again, host)
    assert TRACES[0] == traces                         # equal key: compiled once
    step_lib.StepProgram(LOSS, TX, sh, mesh, rng)(state_lib.create_state(PARAMS, TX, mesh)[0], host)
    assert TRACES[0] == traces + 1                     # no key: its own program


class _Record(hooks.Hook):
    """Records the steps it sees; stops after `stop_at`."""

    def __init__(self, every=None, stop_at=None):
        self.every, self.stop_at, self.steps, self.started = every, stop_at, [], None

    def start(self, run):
        self.started = run.start

    def after_call(self, run, step, state):
        self.steps.append((step, state['n']))
        if step == self.stop_at:
            run.stop = 'enough'


def test_train_loop_without_fit(tmp_path, caplog):
    """Any program and iterator, an open list of hooks: calls end at every hook's interval,
    each hook sees each call, a hook's `run.stop` ends the run."""
    def program(state, host_batches):
        return {'n': state['n'] + len(host_batches)}, {'loss': np.float32(len(host_batches))}
    writer = metrics.MetricWriter(str(tmp_path), console=False, tensorboard=False)
    every3, plain = _Record(every=3), _Record(stop_at=9)
    run = hooks.Run(10, writer, start=1)
    with caplog.at_level('INFO', logger='jlearngene.train.metrics'):
        state = trainer.train_loop({'n': 1}, program, iter(range(100)), [every3, plain], run,
                                   steps_per_call=3)
    writer.close()
    assert every3.started == 1 and state == {'n': 9}
    # single steps up to the multiple 3, then calls of 3 steps that end on 6 and 9
    assert [s for s, _ in plain.steps] == [2, 3, 6, 9]
    assert plain.steps == every3.steps and run.stop == 'enough'
    assert 'stopped at step 9 of 10: enough' in caplog.text


def test_hooks_without_fit(tmp_path):
    writer = metrics.MetricWriter(str(tmp_path), console=False, tensorboard=False)
    run = hooks.Run(4, writer)
    log_ = hooks.TrainLog(2)
    evaluation = hooks.Evaluation(tasks.classification_eval(CFG), EVAL, every=4)
    stop = hooks.StopWhen(lambda rec: True, 'always')
    with run_checkpoint.RunCheckpointer(str(tmp_path / 'ck')) as ck:
        saves = hooks.Checkpoints(ck, state_lib.Batches(Batches()), every=2)
        run_hooks = [log_, evaluation, stop, saves]
        for h in run_hooks:
            h.start(run)
        state = state_lib.init_state(PARAMS, TX)
        for step, loss in ((1, 1.0), (2, 3.0), (3, 2.0), (4, 2.0)):
            run.begin_call({'loss': jax.numpy.float32(loss)})
            for h in run_hooks:
                h.after_call(run, step, state)
            assert run.synced == (step % 2 == 0)
            assert (run.saved is not None) == (step % 2 == 0)
        assert ck.steps() == [2, 4]
    writer.close()
    assert [(r['step'], r['loss']) for r in run.history['train']] == [(2, 2.0), (4, 2.0)]
    assert [r['step'] for r in run.history['eval']] == [4] and run.eval_record['eval/count'] == 20
    assert run.stop is None                  # the last step: nothing left to stop
    run.begin_call({'loss': jax.numpy.float32(np.nan)})
    log_.after_call(run, 5, state)                       # not due: kept for the next sync
    with pytest.raises(hooks.NonFiniteLossError, match=r'loss is nan at step 5 \(of 4\)'):
        log_.flush(5)
    run.eval_record, run.steps = {'eval/accuracy': 1.0}, 10
    stop.after_call(run, 6, state)
    assert run.stop == 'always'
    with pytest.raises(ValueError, match='Evaluation needs eval_data'):
        hooks.Evaluation(tasks.classification_eval(CFG), None)
    with pytest.raises(ValueError, match='log_every must be a positive integer, got 0'):
        hooks.TrainLog(0)


def test_fit_runs_an_open_list_of_hooks(tmp_path):
    seen = []

    class After(hooks.Hook):
        def after_call(self, run, step, state):
            seen.append((step, None if run.eval_record is None else run.eval_record['eval/count']))
    params, hist = trainer.fit(LOSS, PARAMS, Batches(), TX, trainer.FitConfig(
        workdir=str(tmp_path / 'hooks'), steps=4, log_every=2, steps_per_call=1, seed=1,
        progress=False, console=False, compile_key=('test_trainer.LOSS', 'test_trainer.TX')),
        [hooks.Evaluation(tasks.classification_eval(CFG), EVAL, every=2), After()])
    assert seen == [(1, None), (2, 20.0), (3, None), (4, 20.0)]
    assert [r['step'] for r in hist['eval']] == [2, 4]


def test_fit_config_refuses_unknown_fields_and_bad_values(tmp_path):
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['eval_every'\]"):
        trainer.fit(LOSS, PARAMS, Batches(), TX, {'workdir': str(tmp_path), 'steps': 2,
                                                  'eval_every': 2})
    with pytest.raises(ValueError, match='steps must be a non-negative integer, got -1'):
        trainer.FitConfig(workdir=str(tmp_path), steps=-1)
    with pytest.raises(ValueError, match='checkpoint_every must be a non-negative integer'):
        trainer.FitConfig(workdir=str(tmp_path), steps=2, checkpoint_every=1.5)
    assert not os.listdir(tmp_path)
