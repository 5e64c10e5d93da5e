"""The pure helpers of the benchmark tools (the measurements themselves are not tests)."""
import math
import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), 'benchmarks'))
import kernels  # noqa: E402
import profile_step  # noqa: E402
import run as bench_run  # noqa: E402


def test_wall_shares_split_concurrent_time_and_add_up_to_the_wall():
    events = [{'name': 'a', 'ts': 0, 'dur': 10}, {'name': 'b', 'ts': 5, 'dur': 10},
              {'name': 'c', 'ts': 20, 'dur': 4}]
    shares = profile_step.wall_shares(events)
    assert shares == pytest.approx({'a': 7.5, 'b': 7.5, 'c': 4.0})
    assert sum(shares.values()) == pytest.approx(15 + 4)   # the busy wall time


def test_hlo_ops_puts_dots_under_matmul_and_keeps_the_jax_source():
    x = jnp.ones((8, 16))
    w = jnp.ones((16, 4))
    text = jax.jit(lambda x, w: jnp.tanh(x @ w) + 1.0).lower(x, w).compile().as_text()
    ops = profile_step.hlo_ops(text)
    matmuls = [o for o in ops.values() if o['category'] == 'matmul']
    assert matmuls and all('dot_general' in o['source'] for o in matmuls)
    assert any(o['shape'].startswith('f32[8,4]') for o in matmuls)


def test_kernel_shapes_cover_the_step_matmul_flops():
    variant, depth, batch = 'Ti', 12, 128
    total = sum(count * 2 * math.prod(shape)
                for _, count, shape in kernels.step_shapes(variant, depth, batch))
    step = bench_run.model_flops(variant, depth, batch)['train_step']
    # Everything but the patch embedding and the head (well under 1 % of the work).
    assert 0.99 * step < total <= step
