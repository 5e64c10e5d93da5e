"""`jlearngene.compiler`: per-backend XLA options (oneDNN dots on CPU), float32-exact."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import compiler
from jlearngene.models import vit
from jlearngene.train import optim, tasks, trainer

pytestmark = [pytest.mark.skipif(jax.default_backend() != 'cpu', reason='CPU compiler options'),
              pytest.mark.usefixtures('no_persistent_cache')]


def _mm(a, b):
    return a @ b


def test_cpu_dots_go_to_onednn_only_with_the_options():
    assert compiler.options() == compiler.CPU_ONEDNN_OPTIONS   # the pinned jaxlib has them
    a, b = jnp.ones((32, 48)), jnp.ones((48, 16))
    assert compiler.uses_onednn(compiler.jit(_mm).lower(a, b).compile().as_text())
    assert not compiler.uses_onednn(jax.jit(_mm).lower(a, b).compile().as_text())


@pytest.mark.parametrize('jit', [jax.jit, compiler.jit])
def test_products_and_their_gradients_are_float32_exact(jit):
    """Against float64: a float32 product errs by ~1e-7 of its scale, a bfloat16 one by ~1e-3."""
    rng = np.random.default_rng(0)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((96, 200), (200, 80), (96, 80)))
    y, (dx, dw) = jit(lambda x, w, g: (_mm(x, w), jax.vjp(_mm, x, w)[1](g)))(x, w, g)
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    for got, ref in ((y, x64 @ w64), (dx, g64 @ w64.T), (dw, x64.T @ g64)):
        assert np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref)) < 2e-6


def test_env_switch(monkeypatch):
    monkeypatch.setenv(compiler.ENV_SWITCH, '0')
    assert compiler.options() == {}
    monkeypatch.setenv(compiler.ENV_SWITCH, 'sometimes')
    with pytest.raises(ValueError, match=compiler.ENV_SWITCH):
        compiler.options()
    monkeypatch.setenv(compiler.ENV_SWITCH, '1')
    assert compiler.options() == compiler.CPU_ONEDNN_OPTIONS


def test_no_options_when_the_persistent_cache_is_on(tmp_path):
    """oneDNN fusions cannot be written to jax's persistent compilation cache."""
    jax.config.update('jax_compilation_cache_dir', str(tmp_path))
    assert compiler.options() == {}


def test_options_this_jaxlib_rejects_are_dropped(monkeypatch):
    monkeypatch.setattr(compiler, 'CPU_ONEDNN_OPTIONS', {'xla_cpu_no_such_option': True})
    compiler._cpu_onednn_works.cache_clear()
    try:
        assert compiler.options() == {}
    finally:
        monkeypatch.undo()
        compiler._cpu_onednn_works.cache_clear()
    assert compiler.options() == compiler.CPU_ONEDNN_OPTIONS


def test_trainer_and_predict_compile_with_the_options(tiny_cfg, monkeypatch, tmp_path):
    texts, jit = [], compiler.jit

    def spy(fun, **kwargs):
        jitted = jit(fun, **kwargs)

        def call(*args):
            texts.append(jitted.lower(*args).compile().as_text())
            return jitted(*args)
        return call

    monkeypatch.setattr(compiler, 'jit', spy)
    params = vit.init(tiny_cfg, jax.random.key(0))
    images = jnp.ones((8, 16, 16, 3))
    tasks.predict_fn(tiny_cfg)(params, images)
    tx = optim.make_optimizer(dict(lr=1e-3, schedule='constant'), params)
    loss = tasks.classification_loss(tiny_cfg)
    batch = {'image': images, 'label': jnp.zeros((8,), jnp.int32)}
    loss_fn = lambda p, b, r: loss(p, b, r)   # noqa: E731 - a fresh object: no cached step
    for run in ('on', 'off'):
        if run == 'off':   # switched off later in the process: the step compiles anew
            monkeypatch.setenv(compiler.ENV_SWITCH, '0')
        trainer.fit(loss_fn, params, [batch], tx, workdir=str(tmp_path / run), steps=1,
                    progress=False, console=False)
    assert [compiler.uses_onednn(t) for t in texts] == [True, True, False]
