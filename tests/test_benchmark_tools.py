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


@pytest.mark.parametrize('target', ['jlearngene_weight_grad', 'jlearngene_attention_fwd',
                                    'jlearngene_attention_bwd'])
def test_hlo_ops_counts_the_kernels_as_matmul_work(target):
    from jlearngene.ops.cpu import library
    assert target in library.TARGETS
    line = (f'  %w.1 = f32[16,4]{{1,0}} custom-call(f32[8,16]{{1,0}} %x, f32[8,4]{{1,0}} %g), '
            f'custom_call_target="{target}", metadata={{op_name="jit(f)/w"}}\n')
    ops = profile_step.hlo_ops('ENTRY %main {\n' + line + '}\n')
    assert ops['w.1']['category'] == 'matmul'


def test_run_rejects_an_unknown_extra_row_before_measuring(capsys):
    with pytest.raises(SystemExit):
        bench_run.main(['--extra-rows', 'single,nonsense', '--no-torch'])
    assert "unknown entry ['nonsense']" in capsys.readouterr().err
    assert bench_run._extra_row('accum4', 'float32') == (['--microbatches', '4'], '4 micro-batches')
    assert bench_run._extra_row('accum1', 'float32') is None


def test_kernel_shapes_cover_the_step_matmul_flops():
    variant, depth, batch = 'Ti', 12, 128
    total = sum(count * 2 * math.prod(shape)
                for _, count, shape in kernels.step_shapes(variant, depth, batch))
    step = bench_run.model_flops(variant, depth, batch)['train_step']
    # Everything but the patch embedding and the head (well under 1 % of the work).
    assert 0.99 * step < total <= step


_VERBOSE = """\
onednn_verbose,v1,info,oneDNN v3.7.3 (commit N/A)
onednn_verbose,v1,primitive,exec,cpu,reorder,brgemm_matmul_copy_reorder_t,undef,src:f32::blocked:ba::f0 dst:f32::blocked:ab::f0,attr-scratchpad:user,,192x8320,2.5
onednn_verbose,v1,primitive,exec,cpu,reorder,brgemm_matmul_copy_reorder_t,undef,src:f32::blocked:ab::f0 dst:f32::blocked:BA16a64b::f0,attr-scratchpad:user,,8320x768,8.0
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,src:f32:a:blocked:ab::f0 wei:f32:a:blocked:BA16a64b::f0 dst:f32:a:blocked:ab::f0,attr-scratchpad:user,,192x8320:8320x768,10.0
onednn_verbose,v1,graph,exec,cpu,100002,matmul_post_ops,MatMul_0,,in0_f32:0:strided:undef:8320x192:192s1,fpm:strict,matmul_t,dnnl_backend,21.0
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,src:f32:a:blocked:abcd::f0,,,128x3x65x64:128x3x64x65,1.0
"""


def test_onednn_breakdown_parses_kernels_and_both_kinds_of_reorder():
    import onednn_breakdown
    records = onednn_breakdown.parse_verbose(_VERBOSE.splitlines())
    assert [r['kind'] for r in records] == ['reorder: transpose', 'reorder: to blocked',
                                            'matmul', 'matmul']
    assert records[2]['flop'] == 2 * 192 * 8320 * 768
    assert records[3]['flop'] == 2 * 128 * 3 * 65 * 64 * 65
    table = onednn_breakdown.summarise(records, calls=1, steps_per_call=2)
    # Per optimiser step: 21.5 ms of primitives over a call of 2 steps.
    assert 'all' in table and '10.8' in table.splitlines()[4]
    assert '245.4' in table   # 192x8320x768 GEMM: 2.45 GFLOP in 10 ms
