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
    compiled = jax.jit(lambda x, w: jnp.tanh(x @ w) + 1.0).lower(x, w).compile()
    ops = profile_step.hlo_ops(compiled)
    matmuls = [o for o in ops.values() if o['category'] == 'matmul']
    assert matmuls and all('dot_general' in o['source'] for o in matmuls)
    assert any(o['shape'].startswith('f32[8,4]') for o in matmuls)


def test_run_rejects_an_unknown_extra_row_before_measuring(capsys):
    with pytest.raises(SystemExit):
        bench_run.main(['--extra-rows', 'single,nonsense', '--no-torch'])
    assert "['nonsense']" in capsys.readouterr().err
    assert bench_run.extra_row('accum4', 'float32') == (['--microbatches', '4'], '4 micro-batches')
    assert bench_run.extra_row('accum1', 'float32') is None


def test_kernel_shapes_cover_the_step_matmul_flops():
    variant, depth, batch = 'Ti', 12, 128
    total = sum(count * 2 * math.prod(shape)
                for _, count, shape in kernels.step_shapes(variant, depth, batch))
    step = bench_run.model_flops(variant, depth, batch)['train_step']
    # Everything but the patch embedding and the head (well under 1 % of the work).
    assert 0.99 * step < total <= step


# ----------------------------------------------------------------------------------------
# The 224-px GPU run (benchmarks/gpu_224.py) and its pieces that run on a CPU.

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

import gpu_224  # noqa: E402
import gpu_parity  # noqa: E402
import overhead  # noqa: E402
from jlearngene import ops  # noqa: E402
from jlearngene.models.config import vit_config  # noqa: E402


def test_gpu_224_exits_with_one_clear_line_without_a_gpu(capsys):
    if gpu_224.gpu_problem() is None:
        pytest.skip('a CUDA GPU is present')
    assert gpu_224.main(['--budget-s', '10']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('gpu_224: ') and 'GPU' in err[0]


def test_gpu_224_flops_are_the_published_vit_counts():
    # DeiT / timm: ViT-S/16 4.6 and ViT-B/16 17.6 GFLOPs (multiply-accumulates) per image at
    # 224 px; the step is 2 FLOPs per MAC, forward and backward (x3).
    for shape, gmacs in (('S/16', 4.6), ('B/16', 17.6)):
        per_image = gpu_224.step_flops(shape, 8) / 8
        assert per_image == pytest.approx(3 * 2 * gmacs * 1e9, rel=0.01)


def _results(peak=600e12):
    jax_row = gpu_224.derive({'framework': 'jlearngene', 'shape': 'B/16', 'precision': 'bf16',
                              'batch': 256, 'step_s': 0.1, 'img_per_s': 2560.0, 'compile_s': 20.0,
                              'device_peak_mb': 10240.0, 'cudnn_attention_calls': 22}, peak)
    torch_row = gpu_224.derive({'framework': 'torch-compile (cuda)', 'shape': 'B/16', 'batch': 256,
                                'step_s': 0.15, 'img_per_s': 256 / 0.15, 'compile_s': 50.0}, peak)
    return {'started': 'now', 'machine': {'device': 'test GPU', 'jax': jax.__version__},
            'peak': {'by_dtype': {'bfloat16': {'peak_tflops': peak / 1e12, 'best_size': 8192}}},
            'rows': {'B/16 bf16': {'jlearngene': jax_row, 'torch-compile': torch_row,
                                   'torch-eager': {'variant': 'bf16-eager', 'error': 'OutOfMemoryError: x'}}},
            'methods': {'B/16 bf16': [{'name': 'tleg', 'shape': 'B/16 at 224 px', 'plain_s': 0.1,
                                       'method_s': 0.102, 'overhead': 0.02},
                                      {'name': 'mango', 'skipped': 'ignores the shape'}]},
            'skipped': ['torch S/16: 3 s left'], 'failed': []}


def test_gpu_224_rows_mfu_ratios_table_and_files(tmp_path):
    r = _results()
    row = r['rows']['B/16 bf16']['jlearngene']
    flops = gpu_224.step_flops('B/16', 256)
    assert row['tflops'] == pytest.approx(flops / 0.1 / 1e12)
    assert row['mfu_pct'] == pytest.approx(100 * flops / 0.1 / 600e12)
    table = gpu_224.format_table(r)
    line = next(ln for ln in table.splitlines() if '| torch-compile |' in ln)
    assert line.endswith('| 1.50 |')                      # 2560 img/s against 1707
    assert f"| {row['mfu_pct']:.1f} |" in next(ln for ln in table.splitlines() if '| jlearngene |' in ln)
    assert 'OutOfMemoryError' in table and '+2.0 %' in table and 'ignores the shape' in table
    args = argparse.Namespace(budget_s=10, out=str(tmp_path / 'r'), parts={'jax'})
    driver = gpu_224.Driver(args)
    driver.r.update(r)
    aim = driver.aim()
    assert aim['vs_torch_compile'] == pytest.approx(1.5) and aim['met'] == (row['mfu_pct'] >= 45)
    driver.save()
    saved = json.loads((tmp_path / 'r.json').read_text())
    assert saved['rows']['B/16 bf16']['jlearngene']['mfu_pct'] == pytest.approx(row['mfu_pct'])
    assert saved['args']['parts'] == ['jax']
    assert (tmp_path / 'r.md').read_text() == gpu_224.format_table(driver.r)
    # A parity report whose cuDNN step disagrees with the reference turns cuDNN off after it.
    close = {'max_rel_to_scale': 1e-3}
    driver.cudnn_check({'bf16_tol': 0.05, 'bfloat16_backends_vs_reference': {'logits': close}})
    assert 'JLEARNGENE_GPU_CUDNN_ATTENTION' not in driver.env
    driver.cudnn_check({'bf16_tol': 0.05, 'bfloat16_backends_vs_reference': {'grads': {'max_rel_to_scale': 0.2}}})
    assert driver.env['JLEARNGENE_GPU_CUDNN_ATTENTION'] == '0'
    assert 'attention off' in gpu_224.format_table(driver.r)


def test_gpu_224_plan_filters_and_case_shape_check():
    assert gpu_224.selected('jax', ('B/16', 'bf16'), {'B/16'}, {'bf16'})
    assert not gpu_224.selected('jax', ('B/16', 'fp32'), {'B/16'}, {'bf16'})
    assert gpu_224.selected('torch', ('S/16', 'bf16-eager,bf16-compile'), {'S/16'}, {'bf16'})
    assert not gpu_224.selected('methods', ('S/16', 'bf16'), {'B/16'}, {'bf16', 'fp32'})
    assert gpu_224.selected('parity', 'S/16', set(), set())
    case = {'plain': (None, ({'patch': np.zeros((16, 16, 3, 8))}, {'image': np.zeros((4, 8, 8, 3))}))}
    assert gpu_224.case_at_shape(case, 4, 8) and not gpu_224.case_at_shape(case, 2, 8)


def test_overhead_shape_selection(monkeypatch):
    monkeypatch.delenv(overhead.SHAPE_ENV, raising=False)
    cfg, batch = overhead.config(False)
    assert (cfg.width, cfg.depth, cfg.image_size, cfg.num_classes, batch) == (192, 12, 32, 100, 64)
    monkeypatch.setenv(overhead.SHAPE_ENV, 'B/16 224 256 bfloat16')
    cfg, batch = overhead.config(True)
    assert (cfg.width, cfg.depth, cfg.patch_size, cfg.image_size, cfg.num_classes, cfg.dtype,
            batch) == (768, 12, 16, 224, 1000, 'bfloat16', 256)
    assert 'patch 16, bfloat16' in overhead.describe(cfg, batch)
    for bad, msg in (('B/16 224', "'B/16 224'"), ('X/16 224 8', "'X'"),
                     ('S/16 224 8 float64', "'float64'"), ('S/16 225 8', "'S/16 225 8'"),
                     ('S/x 224 8', "'S/x 224 8'")):
        with pytest.raises(ValueError, match=msg):
            overhead.parse_shape(bad)


def test_parity_with_the_cpu_on_both_sides_of_a_tiny_vit():
    cfg = vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=1, image_size=8,
                     patch_size=4, num_classes=5)
    cpu = jax.devices('cpu')[0]
    report = gpu_parity.parity(cfg, 2, cpu, cpu, with_default=False)
    assert report['ok'] and gpu_parity.worst(report['float32_highest']) <= 1e-7
    assert 0 < gpu_parity.worst(report['bfloat16']) < 0.1       # bfloat16 rounding, not zero
    assert report['cudnn_attention_calls'] == {'bfloat16': 0, 'bfloat16_reference': 0, 'float32': 0}
    ref = {'a': np.ones(3), 'b': np.full(2, 4.0)}
    d = gpu_parity.diff(ref, {'a': np.ones(3), 'b': np.array([4.0, 3.0])})
    assert d == {'max_abs': 1.0, 'max_rel_to_scale': 0.25}


def test_the_gpu_backend_declines_where_cudnn_does_not_apply(monkeypatch):
    from jlearngene.ops import gpu
    assert ops.registered()['gpu'].platform == 'gpu'
    q = jnp.zeros((2, 16, 2, 64), jnp.bfloat16)
    assert gpu.decline_reason(q, q, q, False) is None
    assert gpu.decline_reason(q.astype(jnp.float16), *(q.astype(jnp.float16),) * 2, False) is None
    assert 'probabilities' in gpu.decline_reason(q, q, q, True)
    f32 = q.astype(jnp.float32)
    assert 'bfloat16 or float16' in gpu.decline_reason(f32, f32, f32, False)
    assert 'bfloat16 or float16' in gpu.decline_reason(q, f32, q, False)
    assert 'query length 1' in gpu.decline_reason(q[:, :1], q, q, False)
    for dh in (60, 192):
        t = jnp.zeros((2, 16, 2, dh), jnp.bfloat16)
        assert 'head dim' in gpu.decline_reason(t, t, t, False)
    monkeypatch.setenv(gpu.ENV_SWITCH, '0')
    assert not gpu.enabled()
    monkeypatch.delenv(gpu.ENV_SWITCH)
    if gpu.cuda_available():
        pytest.skip('a CUDA GPU is present')
    # No CUDA here: not enabled, and a call it would take is declined (jax's cuDNN check raises).
    assert not gpu.enabled() and 'gpu' not in [b.name for b in ops.active_backends('gpu')]
    assert ops.registered()['gpu'].attention(q, q, q, 0.125, False, None) is NotImplemented


def test_the_torch_reference_step_on_a_device_uses_sdpa():
    torch = pytest.importorskip('torch')
    if not os.path.exists(gpu_224.DEFAULT_TORCH_REF):
        pytest.skip(f'no reference script at {gpu_224.DEFAULT_TORCH_REF}')
    import torch_on_device as tod
    flags = ['--ref', gpu_224.DEFAULT_TORCH_REF, '--device', 'cpu', '--dim', '32', '--depth', '2',
             '--heads', '2', '--image', '8', '--patch', '4', '--classes', '5', '--batch', '2',
             '--steps', '1', '--warmup', '1', '--sync', 'end']
    with pytest.raises(SystemExit):
        tod.parse_args(flags + ['--variants', 'fp64-eager'])
    a = tod.parse_args(flags + ['--variants', 'bf16-eager'])
    ref = tod.load_reference(a.ref)
    assert tod.count_sdpa_calls(ref.ReferenceViT(a), torch.randn(2, 3, 8, 8)) == 2
    out = tod.measure(ref, a, 'bf16-eager')
    assert out['sdpa_calls_per_forward'] == 2 and out['img_per_s'] > 0
    assert out['framework'] == 'torch-eager (cpu)' and out['compile_s'] is None
