"""`jlearngene.compiler`: `jit` (`jax.jit` with XLA's default options, whose products are
float32-exact) and `run_once_jit` (small run-once programs compiled quickly on CPU)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import compiler

pytestmark = pytest.mark.skipif(jax.default_backend() != 'cpu', reason='CPU compilation')


def _mm(a, b):
    return a @ b


@pytest.mark.parametrize('jit', [jax.jit, compiler.jit])
def test_products_and_their_gradients_are_float32_exact(jit):
    """Against float64: a float32 product errs by ~1e-7 of its scale, a bfloat16 one by ~1e-3."""
    rng = np.random.default_rng(0)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((96, 200), (200, 80), (96, 80)))
    y, (dx, dw) = jit(lambda x, w, g: (_mm(x, w), jax.vjp(_mm, x, w)[1](g)))(x, w, g)
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    for got, ref in ((y, x64 @ w64), (dx, g64 @ w64.T), (dw, x64.T @ g64)):
        assert np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref)) < 2e-6


def test_jit_passes_jax_jit_arguments_through():
    f = compiler.jit(lambda x, n: x * n, static_argnums=1, donate_argnums=())
    np.testing.assert_array_equal(f(jnp.ones(3), 2), 2.0)
    g = compiler.jit(_mm, compiler_options={'xla_backend_optimization_level': 0})
    np.testing.assert_array_equal(g(jnp.ones((2, 3)), jnp.ones((3, 4))), 3.0)


@pytest.fixture
def jit_options(monkeypatch):
    """The `compiler_options` of every program `run_once_jit` compiles, in call order."""
    used, jit = [], jax.jit

    def spy(fun, *, compiler_options=None, **kwargs):
        jitted = jit(fun, compiler_options=compiler_options, **kwargs)

        def call(*args, **kw):
            used.append(compiler_options)
            return jitted(*args, **kw)
        return call

    monkeypatch.setattr(jax, 'jit', spy)
    return used


def _draw(n, key):
    return jax.random.normal(key, (n, 4))


QUICK = {'xla_backend_optimization_level': 0}


def test_run_once_jit_compiles_small_top_level_calls_quickly(jit_options, monkeypatch):
    monkeypatch.setattr(compiler, 'RUN_ONCE_MAX_ELEMENTS', 16)
    f = compiler.run_once_jit(_draw, lambda n, key: 4 * n, static_argnums=0)
    key = jax.random.key(0)
    small, big = f(3, key), f(5, key)         # 12 and 20 values
    assert jit_options == [QUICK, None]
    np.testing.assert_allclose(small, jax.random.normal(key, (3, 4)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(big, jax.random.normal(key, (5, 4)), rtol=1e-6, atol=1e-6)


def test_run_once_jit_inside_another_trace_is_the_plain_jitted_function(jit_options):
    f = compiler.run_once_jit(lambda x: jnp.sin(x) * 2.0, lambda x: x.size)
    x = jnp.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(jax.jit(f)(x), 2.0 * np.sin(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), 2.0 * np.cos(x), rtol=1e-6)
    assert jax.eval_shape(f, x).shape == (5,)
    assert QUICK not in jit_options
    np.testing.assert_allclose(f(x), 2.0 * np.sin(x), rtol=1e-6)     # top level: quick
    assert jit_options[-1] == QUICK


def test_run_once_jit_with_concrete_arguments_inside_a_trace_is_the_plain_jitted_function(jit_options):
    """Concrete arguments, but a jaxpr is being built (jit, eval_shape): a program with
    compiler options cannot nest there, so the plain one runs (decided before the call)."""
    f = compiler.run_once_jit(lambda x: jnp.sin(x) * 2.0, lambda x: x.size)
    x = jnp.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(jax.jit(lambda: f(x))(), 2.0 * np.sin(x), rtol=1e-6)
    assert jax.eval_shape(lambda: f(x)).shape == (5,)
    assert jit_options and QUICK not in jit_options
