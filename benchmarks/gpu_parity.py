#!/usr/bin/env python3
"""Correctness of the ViT forward/backward on an accelerator against the host CPU.

    python benchmarks/gpu_parity.py [--variant Ti] [--depth 12] [--batch 32]

Runs the same parameters and images through `classification_loss` and its gradient on
`jax.devices('cpu')[0]` and on the default accelerator, and prints one JSON line with the
largest absolute / relative differences of logits, loss and gradients for:
  * float32 with `jax.default_matmul_precision('highest')` (strict float32 matmuls): should
    agree to float32 rounding;
  * float32 at the default precision (TF32 matmuls on Ampere and later GPUs);
  * `ViTConfig.dtype='bfloat16'` (bf16 activations and matmuls, float32 parameters).
Exits with status 1 when the strict float32 comparison exceeds `--tol` (relative to the
largest reference value of each quantity).
"""
from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

from jlearngene.models import vit
from jlearngene.models.config import vit_config
from jlearngene.train import tasks


def _run(cfg, params, batch, device):
    params, batch = jax.device_put((params, batch), device)
    loss_fn = tasks.classification_loss(cfg)
    f = lambda p: loss_fn(p, batch, jax.random.key(0))   # noqa: E731
    (loss, _), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    logits, _ = jax.jit(lambda p, x: vit.apply(p, x, cfg))(params, batch['image'])
    return jax.device_get({'loss': loss, 'logits': logits, 'grads': grads})


def _diff(ref, out) -> dict:
    leaves_r, leaves_o = jax.tree.leaves(ref), jax.tree.leaves(out)
    abs_d = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                for a, b in zip(leaves_r, leaves_o))
    scale = max(float(np.max(np.abs(np.asarray(a, np.float64)))) for a in leaves_r)
    return {'max_abs': abs_d, 'max_rel_to_scale': abs_d / max(scale, 1e-30)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--variant', default='Ti')
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--tol', type=float, default=1e-4)
    a = p.parse_args(argv)
    accel = jax.devices()[0]
    if accel.platform == 'cpu':
        print('gpu_parity: no accelerator visible to jax (jax.devices()[0] is a CPU)', file=sys.stderr)
        return 2
    cpu = jax.devices('cpu')[0]
    cfg = vit_config(a.variant, depth=a.depth, image_size=32, patch_size=4, num_classes=100)
    params = vit.init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    batch = {'image': rng.standard_normal((a.batch, 32, 32, 3), np.float32),
             'label': rng.integers(0, 100, (a.batch,)).astype(np.int32)}
    with jax.default_matmul_precision('highest'):
        ref = _run(cfg, params, batch, cpu)
        strict = _run(cfg, params, batch, accel)
    default = _run(cfg, params, batch, accel)
    bf16 = _run(cfg.replace(dtype='bfloat16'), params, batch, accel)
    report = {'device': str(accel), 'variant': a.variant, 'depth': a.depth, 'batch': a.batch,
              'loss_cpu': float(ref['loss'])}
    for name, out in (('float32_highest', strict), ('float32_default', default), ('bfloat16', bf16)):
        report[name] = {k: _diff(ref[k], out[k]) for k in ('logits', 'loss', 'grads')}
    print(json.dumps(report))
    worst = max(v['max_rel_to_scale'] for v in report['float32_highest'].values())
    if worst > a.tol:
        print(f'gpu_parity: strict float32 differs from CPU by {worst:.2e} (relative) > {a.tol}',
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
