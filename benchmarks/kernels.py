#!/usr/bin/env python3
"""The matmul kernels of one ViT training step, XLA against PyTorch, shape by shape.

    python benchmarks/kernels.py                  # the Ti-12, batch 128 step's shapes
    python benchmarks/kernels.py --variant S --batch 64

For every distinct matmul of the step (forward, input gradient and weight gradient of the
q/k/v, output, fc1 and fc2 projections, and the batched attention products), times

  xla        jax.jit(x @ w) as compiled by default (YNNPACK dots on XLA:CPU);
  xla-eigen  the same with YNNPACK fusions switched off for this compilation
             (`xla_cpu_experimental_ynn_fusion_type=''`: Eigen dots);
  torch      torch.mm / torch.bmm into a preallocated output (torch's CPU BLAS), if installed;

each for `--rounds` calls after two warm-up calls (median), and prints GFLOP/s per shape and the
step's total matmul time at each rate (the patch embedding and head, under 1 % of the
FLOPs, are left out). Compare the totals with the matmul time inside a real step, which
`profile_step.py` reports: on the 2-core CI machine the two agree to ≈10 %, so the XLA/torch
ratio of the totals is what the step loses to kernel speed alone. The torch column is
measured on the CPU, so it is left out when jax runs on an accelerator.

Fair memory: torch writes into a preallocated output, while every jax call allocates a new
one, which glibc maps fresh (page faults) for large sizes. On glibc the tool therefore keeps
freed memory mapped (`mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD=max)`, this process only), so
both sides write into memory that is already mapped, as inside a training step.
"""
from __future__ import annotations

import argparse
import ctypes
import sys

import numpy as np

from run import _median_time   # benchmarks/run.py, beside this script


def step_shapes(variant: str, depth: int, batch: int) -> list[tuple[str, int, tuple[int, ...]]]:
    """(label, count per step, (M, K, N) or (batch, M, K, N)) of the step's matmuls."""
    from jlearngene.models.config import vit_config
    cfg = vit_config(variant, depth=depth, image_size=32, patch_size=4, num_classes=100)
    n, d, m, h, t = batch * cfg.num_tokens, cfg.width, cfg.mlp_dim, cfg.num_heads, cfg.num_tokens
    dh = d // h
    dense = [('qkv', d, 3 * d), ('out', d, d), ('fc1', d, m), ('fc2', m, d)]
    shapes = []
    for name, k_in, k_out in dense:
        shapes.append((f'{name} forward', depth, (n, k_in, k_out)))
        shapes.append((f'{name} input grad', depth, (n, k_out, k_in)))
        shapes.append((f'{name} weight grad', depth, (k_in, n, k_out)))
    bh = batch * h
    shapes += [('attn q·kᵀ, dp', 2 * depth, (bh, t, dh, t)),          # (T, Dh) x (Dh, T)
               ('attn p·v, dq, dk, dv', 4 * depth, (bh, t, t, dh))]   # (T, T) x (T, Dh)
    return shapes


def _keep_freed_memory_mapped() -> bool:
    """glibc: serve large allocations from the heap and never trim it (see the docstring)."""
    try:
        libc = ctypes.CDLL('libc.so.6')
        return bool(libc.mallopt(-4, 0) and libc.mallopt(-1, 2 ** 31 - 1))  # M_MMAP_MAX, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--variant', default='Ti')
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--rounds', type=int, default=11)
    a = p.parse_args(argv)

    _keep_freed_memory_mapped()
    import jax
    import jax.numpy as jnp
    try:
        import torch
    except ImportError:
        torch = None
    if jax.default_backend() != 'cpu':
        torch = None   # a CPU torch column against accelerator XLA would compare nothing
    rng = np.random.default_rng(0)
    xla_opts = {'xla': None}
    if jax.default_backend() == 'cpu':
        xla_opts['xla-eigen'] = {'xla_cpu_experimental_ynn_fusion_type': ''}
    names = list(xla_opts) + (['torch'] if torch is not None else [])
    totals = dict.fromkeys(names, 0.0)
    print(f"{'matmul':24s} {'shape':>22s} {'x/step':>6s} " + ' '.join(f'{n:>10s}' for n in names)
          + '   (GFLOP/s)')
    for label, count, shape in step_shapes(a.variant, a.depth, a.batch):
        *b, m, k, n = shape
        x = rng.standard_normal((*b, m, k), np.float32)
        w = rng.standard_normal((*b, k, n), np.float32)
        flops = 2 * m * k * n * (b[0] if b else 1)
        runners = {}
        xj, wj = jnp.asarray(x), jnp.asarray(w)
        for name, opts in xla_opts.items():
            f = jax.jit(lambda x, w: x @ w).lower(xj, wj).compile(compiler_options=opts)
            runners[name] = lambda f=f, xj=xj, wj=wj: f(xj, wj).block_until_ready()
        if torch is not None:
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            out = torch.empty((*b, m, n))
            mm = torch.bmm if b else torch.mm
            runners['torch'] = lambda mm=mm, xt=xt, wt=wt, out=out: mm(xt, wt, out=out)
        # One backend at a time: the worker threads of one library keep spinning for a
        # while after its call returns and would slow the other's next call.
        medians = {name: _median_time(r, a.rounds, 2)[0] for name, r in runners.items()}
        rates = {name: flops / t / 1e9 for name, t in medians.items()}
        for name, t in medians.items():
            totals[name] += count * t
        print(f"{label:24s} {'x'.join(map(str, shape)):>22s} {count:6d} "
              + ' '.join(f'{rates[n]:10.0f}' for n in names))
    print(f"{'total per step (ms)':24s} {'':>22s} {'':>6s} "
          + ' '.join(f'{totals[n] * 1e3:10.0f}' for n in names))
    if 'torch' in totals:
        for name in xla_opts:
            print(f"{name} / torch matmul time per step: {totals[name] / totals['torch']:.2f}x")
    return 0


if __name__ == '__main__':
    sys.exit(main())
