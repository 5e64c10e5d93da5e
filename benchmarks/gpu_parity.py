#!/usr/bin/env python3
"""Correctness of the ViT forward/backward on an accelerator against the host CPU.

    python benchmarks/gpu_parity.py [--variant Ti] [--depth 12] [--batch 32]
    python benchmarks/gpu_parity.py --variant S --image 224 --patch 16 --classes 1000 --batch 4

Runs the same parameters and images through `classification_loss` and its gradient on
`jax.devices('cpu')[0]` and on the default accelerator, and prints one JSON line with the
largest absolute differences of logits, loss and gradients, and those relative to the
largest reference value of each quantity, for:
  * float32 with `jax.default_matmul_precision('highest')` (strict float32 matmuls): should
    agree to float32 rounding;
  * float32 at the default precision (TF32 matmuls on Ampere and later GPUs);
  * `ViTConfig.dtype='bfloat16'` (bf16 activations and matmuls, float32 parameters), with
    the `jlearngene.ops` backends (on a GPU: cuDNN's fused attention), and the same against
    `ops.use_reference()` on the accelerator (the backends' own error: cuDNN against XLA's
    attention, both in bfloat16).
Exits with status 1 when the strict float32 comparison exceeds `--tol` or the bfloat16
backends-against-reference comparison exceeds `--bf16-tol`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys

import jax
import numpy as np

from jlearngene import ops
from jlearngene.models import vit
from jlearngene.models.config import vit_config
from jlearngene.train import tasks

CUDNN_ATTENTION_TARGET = '__cudnn$fmha'    # the custom-call targets of cuDNN's fused attention


def run_model(cfg, params, batch, device, reference: bool = False) -> dict:
    """Loss, logits and gradients of `cfg`'s classification loss on `device`, one compiled
    program (with every ops backend off when `reference`); 'cudnn_calls' counts the cuDNN
    attention calls in its lowered program."""
    params, batch = jax.device_put((params, batch), device)
    loss_fn = tasks.classification_loss(cfg)

    def f(p, b):
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, b, jax.random.key(0))
        return {'loss': loss, 'logits': vit.apply(p, b['image'], cfg)[0], 'grads': grads}
    with ops.use_reference() if reference else contextlib.nullcontext():
        lowered = jax.jit(f).lower(params, batch)
    out = jax.device_get(lowered.compile()(params, batch))
    out['cudnn_calls'] = cudnn_calls(lowered.as_text())
    return out


def cudnn_calls(program_text: str) -> int:
    """The cuDNN fused-attention calls (forward and backward) in a lowered program's text."""
    return len(re.findall(r'custom_call @"?' + re.escape(CUDNN_ATTENTION_TARGET), program_text))


def diff(ref, out) -> dict:
    """Largest absolute difference over all leaves, and it over the largest |ref| value."""
    leaves_r, leaves_o = jax.tree.leaves(ref), jax.tree.leaves(out)
    if len(leaves_r) != len(leaves_o):
        raise ValueError(f'diff: {len(leaves_r)} reference leaves against {len(leaves_o)}')
    abs_d = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                for a, b in zip(leaves_r, leaves_o))
    scale = max(float(np.max(np.abs(np.asarray(a, np.float64)))) for a in leaves_r)
    return {'max_abs': abs_d, 'max_rel_to_scale': abs_d / max(scale, 1e-30)}


def _diffs(ref, out) -> dict:
    return {k: diff(ref[k], out[k]) for k in ('logits', 'loss', 'grads')}


def worst(report_part: dict) -> float:
    return max(v['max_rel_to_scale'] for v in report_part.values())


def parity(cfg, batch_size: int, accel, host, tol: float = 1e-4, bf16_tol: float = 5e-2,
           with_default: bool = True) -> dict:
    """The comparisons of the module docstring for `cfg` on `batch_size` random images
    (`with_default=False` leaves out float32 at the default precision); 'ok' is whether both
    gates hold."""
    params = vit.init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    s = cfg.image_size
    batch = {'image': rng.standard_normal((batch_size, s, s, cfg.channels), np.float32),
             'label': rng.integers(0, cfg.num_classes, (batch_size,)).astype(np.int32)}
    with jax.default_matmul_precision('highest'):
        ref = run_model(cfg, params, batch, host)
        strict = run_model(cfg, params, batch, accel)
    bf16_cfg = cfg.replace(dtype='bfloat16')
    bf16 = run_model(bf16_cfg, params, batch, accel)
    bf16_ref = run_model(bf16_cfg, params, batch, accel, reference=True)
    report = {'device': str(accel), 'host': str(host), 'width': cfg.width, 'depth': cfg.depth, 'image': s,
              'patch': cfg.patch_size, 'classes': cfg.num_classes, 'batch': batch_size,
              'loss_cpu': float(ref['loss']), 'tol': tol, 'bf16_tol': bf16_tol,
              'float32_highest': _diffs(ref, strict),
              'bfloat16': _diffs(ref, bf16),
              'bfloat16_backends_vs_reference': _diffs(bf16_ref, bf16),
              'cudnn_attention_calls': {'bfloat16': bf16['cudnn_calls'],
                                        'bfloat16_reference': bf16_ref['cudnn_calls'],
                                        'float32': strict['cudnn_calls']}}
    if with_default:
        report['float32_default'] = _diffs(ref, run_model(cfg, params, batch, accel))
    report['ok'] = (worst(report['float32_highest']) <= tol
                    and worst(report['bfloat16_backends_vs_reference']) <= bf16_tol)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--variant', default='Ti')
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--image', type=int, default=32)
    p.add_argument('--patch', type=int, default=4)
    p.add_argument('--classes', type=int, default=100)
    p.add_argument('--tol', type=float, default=1e-4)
    p.add_argument('--bf16-tol', type=float, default=5e-2)
    a = p.parse_args(argv)
    accel = jax.devices()[0]
    if accel.platform == 'cpu':
        print('gpu_parity: no accelerator visible to jax (jax.devices()[0] is a CPU)', file=sys.stderr)
        return 2
    cfg = vit_config(a.variant, depth=a.depth, image_size=a.image, patch_size=a.patch,
                     num_classes=a.classes)
    report = parity(cfg, a.batch, accel, jax.devices('cpu')[0], a.tol, a.bf16_tol)
    report['variant'] = a.variant
    print(json.dumps(report))
    if not report['ok']:
        print(f"gpu_parity: strict float32 differs from CPU by {worst(report['float32_highest']):.2e} "
              f"(relative, tolerance {a.tol}); bfloat16 backends differ from the reference by "
              f"{worst(report['bfloat16_backends_vs_reference']):.2e} (tolerance {a.bf16_tol})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
