"""The CPU backend's compiled weight-gradient kernel (`jlearngene.ops.cpu.dense`, built by
`ops.cpu.library`): the same products as XLA in every autodiff mode, applied where it can
be (one device, float32, the switch on), and a failed build falls back."""
import logging
import os
import platform
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene.ops.cpu import dense, library

needs_kernel = pytest.mark.skipif(jax.default_backend() != 'cpu' or not library.available(),
                                  reason='the compiled CPU kernel is not available here')


def _operands(k, m, n, seed=0):
    kx, kg = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (k, m)), jax.random.normal(kg, (k, n))


@pytest.mark.parametrize('k, m, n', [(300, 8, 48), (1000, 37, 50), (8, 5, 3), (129, 192, 100),
                                     (2048, 64, 96), (0, 4, 6)])
@pytest.mark.parametrize('jit', [True, False])
def test_weight_grad_matches_float64(k, m, n, jit):
    x, g = _operands(k, m, n)
    fn = jax.jit(dense.weight_grad) if jit else dense.weight_grad
    out = np.asarray(fn(x, g))
    ref = np.asarray(x, np.float64).T @ np.asarray(g, np.float64)
    assert out.shape == (m, n) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=2e-6 * max(1.0, np.abs(ref).max()), rtol=0)


def test_kernel_applies_to_float32_on_one_device_with_the_switch_on(monkeypatch):
    f32, bf16 = jnp.float32, jnp.bfloat16
    assert library.kernels_apply([f32, f32], 1) == library.available()
    # Over several devices a custom call would gather both operands: XLA's product instead.
    assert not library.kernels_apply([f32, f32], 8)
    assert not library.kernels_apply([bf16, bf16], 1)
    monkeypatch.setenv(library.ENV_SWITCH, '0')
    assert not library.available() and not library.kernels_apply([f32, f32], 1)


def test_weight_grad_sharded_over_devices_is_the_product():
    x, g = _operands(256, 16, 32)
    mesh = jax.make_mesh((jax.device_count(),), ('data',))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
    out = jax.jit(dense.weight_grad, in_shardings=(rows, rows))(x, g)
    ref = np.asarray(x, np.float64).T @ np.asarray(g, np.float64)
    np.testing.assert_allclose(out, ref, atol=2e-6 * np.abs(ref).max(), rtol=0)


def test_matmul_in_every_autodiff_mode():
    x = jax.random.normal(jax.random.key(0), (300, 7))
    w = jax.random.normal(jax.random.key(1), (7, 9))
    f = lambda x, w: jnp.sum(jnp.sin(dense.matmul(x, w)))
    f_ref = lambda x, w: jnp.sum(jnp.sin(x @ w))
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
    for grad in (jax.grad, lambda f, **kw: jax.jit(jax.grad(f, **kw))):
        for a, b in zip(grad(f, argnums=(0, 1))(x, w), jax.grad(f_ref, argnums=(0, 1))(x, w)):
            close(a, b)
    close(jax.jvp(f, (x, w), (x, w))[1], jax.jvp(f_ref, (x, w), (x, w))[1])
    close(jax.jit(jax.hessian(f, 1))(x, w), jax.hessian(f_ref, 1)(x, w))
    rev_rev = lambda f: jax.grad(lambda w: jnp.sum(jax.grad(f, 0)(x, w) ** 2))(w)
    close(jax.jit(lambda: rev_rev(f))(), rev_rev(f_ref))
    xs = jnp.stack([x, 2 * x])
    close(jax.vmap(jax.grad(f, 1), (0, None))(xs, w), jax.vmap(jax.grad(f_ref, 1), (0, None))(xs, w))


def test_bad_operands_and_switch_are_named(monkeypatch):
    with pytest.raises(ValueError, match='weight_grad'):
        dense.weight_grad(jnp.ones((4, 3)), jnp.ones((5, 2)))
    with pytest.raises(ValueError, match='matmul'):
        dense.matmul(jnp.ones((4, 3)), jnp.ones((4, 2)))
    monkeypatch.setenv(library.ENV_SWITCH, 'maybe')
    with pytest.raises(ValueError, match=library.ENV_SWITCH):
        library.available()


def test_failed_build_falls_back_with_a_warning(monkeypatch, tmp_path, caplog):
    if library.instruction_set() is None:
        pytest.skip('neither AVX-512 nor AVX2: the build is not attempted')
    monkeypatch.setenv('CXX', 'false')            # a "compiler" that always fails
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=library.__name__):
        assert library._build() is None
    assert 'failed' in caplog.text and list(tmp_path.iterdir()) == []   # no partial file left


@pytest.mark.parametrize('isa', sorted(library.ISAS))
def test_source_builds_for_every_instruction_set(isa, monkeypatch, tmp_path):
    """Every register tile compiles, whichever one this machine runs."""
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path))
    cxx = library.compiler_command()
    if platform.machine().lower() not in ('x86_64', 'amd64') or not (cxx and shutil.which(cxx)):
        pytest.skip('no x86-64 C++ compiler here')
    path = library._build(isa)
    assert path is not None and os.path.getsize(path) > 0


@needs_kernel
def test_weight_grad_kernel_is_deterministic():
    """Threads claim the token chunks in any order; the result must not depend on it."""
    x, g = _operands(4096, 64, 96, seed=5)
    fn = jax.jit(dense.weight_grad)   # one device, float32: the kernel
    first = np.asarray(fn(x, g))
    for _ in range(10):
        np.testing.assert_array_equal(np.asarray(fn(x, g)), first)
