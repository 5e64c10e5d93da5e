"""`jlearngene.compiler`: `jax.jit` with the ops backends' XLA options (oneDNN dots on CPU),
which follow every switch and keep products float32-exact."""
import os

import jax
import numpy as np
import pytest

from jlearngene import compiler, ops
from jlearngene.models import vit
from jlearngene.ops.cpu import onednn
from jlearngene.train import optim, tasks, trainer

pytestmark = [pytest.mark.skipif(jax.default_backend() != 'cpu', reason='CPU compiler options'),
              pytest.mark.usefixtures('no_persistent_cache')]


@pytest.fixture(autouse=True)
def onednn_on(monkeypatch):
    """The oneDNN options are opt-in (JLEARNGENE_CPU_ONEDNN=1); these tests opt in."""
    monkeypatch.setenv(onednn.ENV_SWITCH, '1')


def test_the_onednn_options_are_opt_in(monkeypatch):
    monkeypatch.delenv(onednn.ENV_SWITCH)
    assert compiler.options() == {}


def _mm(a, b):
    return a @ b


def test_options_are_the_onednn_ones_on_cpu_and_follow_the_switches(monkeypatch):
    assert compiler.options() == onednn.OPTIONS     # the pinned jaxlib has them
    assert compiler.options_key() == tuple(sorted(onednn.OPTIONS.items()))
    with ops.use_reference():
        assert compiler.options() == {}
    monkeypatch.setenv(ops.ENV_SWITCH, 'reference')
    assert compiler.options() == {}
    monkeypatch.setenv(ops.ENV_SWITCH, 'cpu')
    assert compiler.options() == onednn.OPTIONS
    monkeypatch.setenv(onednn.ENV_SWITCH, '0')
    assert compiler.options() == {}
    monkeypatch.setenv(onednn.ENV_SWITCH, 'sometimes')
    with pytest.raises(ValueError, match=onednn.ENV_SWITCH):
        compiler.options()


@pytest.mark.parametrize('jit', [jax.jit, compiler.jit])
def test_products_and_their_gradients_are_float32_exact(jit):
    """Against float64: a float32 product errs by ~1e-7 of its scale, a bfloat16 one by ~1e-3."""
    rng = np.random.default_rng(0)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((96, 200), (200, 80), (96, 80)))
    y, (dx, dw) = jit(lambda x, w, g: (_mm(x, w), jax.vjp(_mm, x, w)[1](g)))(x, w, g)
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    for got, ref in ((y, x64 @ w64), (dx, g64 @ w64.T), (dw, x64.T @ g64)):
        assert np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref)) < 2e-6


def test_no_options_when_the_persistent_cache_is_on(tmp_path):
    """oneDNN fusions cannot be written to jax's persistent compilation cache."""
    old = jax.config.jax_compilation_cache_dir
    jax.config.update('jax_compilation_cache_dir', str(tmp_path))
    try:
        assert compiler.options() == {}
    finally:
        jax.config.update('jax_compilation_cache_dir', old)


def test_options_this_jaxlib_rejects_are_dropped(monkeypatch):
    monkeypatch.setattr(onednn, 'OPTIONS', {'xla_cpu_no_such_option': True})
    onednn._works.cache_clear()
    try:
        assert compiler.options() == {}
    finally:
        monkeypatch.undo()
        onednn._works.cache_clear()
    monkeypatch.setenv(onednn.ENV_SWITCH, '1')          # undone with the rest above
    assert compiler.options() == onednn.OPTIONS


@pytest.mark.skipif(os.environ.get(onednn.ENV_SWITCH) != '1',
                    reason='trains with oneDNN programs, which have aborted processes that ran '
                           'them among others: only where JLEARNGENE_CPU_ONEDNN=1 opts in')
def test_trainer_and_predict_compile_with_the_options(tiny_cfg, monkeypatch, tmp_path):
    """What each compile got: predict and the training step the options, and the step again,
    compiled anew, none once they are switched off later in the process."""
    used, jit = [], compiler.jit

    def spy(fun, *, compiler_options=None, **kwargs):
        used.append(compiler.options() if compiler_options is None else compiler_options)
        return jit(fun, compiler_options=compiler_options, **kwargs)

    monkeypatch.setattr(compiler, 'jit', spy)
    params = vit.init(tiny_cfg, jax.random.key(0))
    images = np.ones((8, 16, 16, 3), np.float32)
    tasks.predict_fn(tiny_cfg)(params, images)
    tx = optim.make_optimizer(dict(lr=1e-3, schedule='constant'), params)
    loss = tasks.classification_loss(tiny_cfg)
    batch = {'image': images, 'label': np.zeros((8,), np.int32)}
    loss_fn = lambda p, b, r: loss(p, b, r)   # noqa: E731 - a fresh object: no cached step
    for run in ('on', 'off'):
        if run == 'off':
            monkeypatch.setenv(onednn.ENV_SWITCH, '0')
        trainer.fit(loss_fn, params, [batch], tx, workdir=str(tmp_path / run), steps=1,
                    progress=False, console=False)
    assert used == [onednn.OPTIONS, onednn.OPTIONS, {}]
