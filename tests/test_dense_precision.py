"""`ViTConfig.dense_precision='bfloat16'`: the dense layers multiply bfloat16-rounded operands
with float32 accumulation, forward and backward, and the model stays close to float32.

Compiled with XLA's full optimisation pipeline (the `optimized_compile` fixture): whether
XLA:CPU keeps a bfloat16 dot in bfloat16 depends on it, and a dot it keeps but cannot run
fails at run time. The products are the reference's (`jlearngene.ops.reference`), eager and
under the trainer's `compiler.jit`.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jlearngene import compiler, ops
from jlearngene.models import config as config_lib, layout, vit

pytestmark = pytest.mark.usefixtures('optimized_compile')

BF16 = jnp.bfloat16


def _rounded_product(a, b):
    return jnp.matmul(a.astype(BF16), b.astype(BF16), preferred_element_type=jnp.float32)


@pytest.mark.parametrize('jit', [None, compiler.jit])
@pytest.mark.parametrize('shape', [((12, 16), (16, 24)), ((12, 24), (24, 16))])
def test_bf16_dense_is_the_rounded_product_forward_and_backward(shape, jit):
    """x narrower and wider than the output."""
    (n, k), (_, m) = shape
    x = jax.random.normal(jax.random.key(0), (n, k))
    w = jax.random.normal(jax.random.key(1), (k, m))
    g = jax.random.normal(jax.random.key(2), (n, m))
    fwd = jit(ops.dense, static_argnums=2) if jit else ops.dense
    y = fwd(x, w, 'bfloat16')
    np.testing.assert_allclose(y, _rounded_product(x, w), rtol=1e-6, atol=1e-6)
    assert float(jnp.max(jnp.abs(y - x @ w))) > 1e-4   # the operands really were rounded

    vjp = lambda x, w, g: jax.vjp(lambda x, w: ops.dense(x, w, 'bfloat16'), x, w)[1](g)
    dx, dw = (jit(vjp) if jit else vjp)(x, w, g)
    np.testing.assert_allclose(dx, _rounded_product(g, w.T), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, _rounded_product(x.T, g), rtol=1e-5, atol=1e-5)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype


def test_config_rejects_an_unknown_dense_precision(tiny_cfg):
    with pytest.raises(config_lib.ConfigError, match='dense_precision'):
        tiny_cfg.replace(dense_precision='float16')
    cfg = tiny_cfg.replace(dense_precision='bfloat16')
    assert config_lib.ViTConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize('changes, batch, stacked', [
    pytest.param({}, 4, True, marks=pytest.mark.slow),      # the pruned last block
    ({'distill_token': True, 'num_classes': 1}, 1, False),  # one image, one-output heads
])
def test_bf16_dense_model_is_close_to_float32(tiny_cfg, changes, batch, stacked):
    cfg32 = tiny_cfg.replace(**changes)
    cfg16 = cfg32.replace(dense_precision='bfloat16')
    params = vit.init(cfg32, jax.random.key(0))
    if not stacked:
        params = layout.unstack_blocks(params)
    images = jax.random.normal(jax.random.key(1), (batch, 16, 16, 3))

    def loss(p, cfg):
        return jnp.sum(jnp.sin(vit.apply(p, images, cfg)[0]))

    grad_fn = compiler.jit(jax.value_and_grad(loss), static_argnums=1)
    (v32, g32), (v16, g16) = grad_fn(params, cfg32), grad_fn(params, cfg16)
    err = float(optax.tree.norm(jax.tree.map(jnp.subtract, g16, g32)) / optax.tree.norm(g32))
    assert 0 < err < 1e-2, err
    np.testing.assert_allclose(v16, v32, rtol=2e-2, atol=2e-3)
