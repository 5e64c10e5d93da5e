#!/usr/bin/env python3
"""Run the PyTorch reference ViT step on an accelerator (e.g. `--device cuda`).

    python benchmarks/torch_on_device.py --ref ../shared/bench/torch_vit_reference.py \
        --device cuda --dim 192 --depth 12 --heads 3 --batch 1024
    python benchmarks/torch_on_device.py --ref ... --device cuda --dim 768 --heads 12 \
        --image 224 --patch 16 --classes 1000 --batch 256 --sync end \
        --variants bf16-eager,bf16-compile,fp32-eager,fp32-compile

The reference script builds its model and batch on the CPU; this wrapper imports its
`ReferenceViT` unchanged (attention through `scaled_dot_product_attention`: its encoder
layers call their attention with need_weights=False), moves model and batch to `--device`
and times the same step: AdamW lr 1e-3, weight decay 0.05, cross-entropy. Each of
`--variants` (default fp32-eager) is one JSON line:

  * fp32 / bf16: float32, or `torch.autocast(bfloat16)` around the forward and loss
    (float32 parameters and AdamW state; autocast keeps LayerNorm and the softmax in float32);
  * eager / compile: the model as is, or `torch.compile(model)` (compile_s: the first
    step's time less a steady step's, the compilation of forward and backward).

TF32 matmuls are allowed, as XLA does by default on the GPU. `--sync step` (default) ends
every step with `loss.item()` and reports the median step; `--sync end` runs the timed steps
back to back and synchronises once (no host sync in the loop, as the jax step runs).
`--fused-adamw` uses AdamW's fused CUDA kernel. The first line's format is what `run.py
--torch-device cuda` reads.
"""
import argparse
import importlib.util
import json
import sys
import time

import torch

from run import _median_time   # benchmarks/run.py, beside this script

VARIANTS = ('fp32-eager', 'fp32-compile', 'bf16-eager', 'bf16-compile')


def load_reference(path: str):
    """The reference script as a module (its `ReferenceViT`)."""
    spec = importlib.util.spec_from_file_location('torch_vit_reference', path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    return ref


def count_sdpa_calls(model, x) -> int:
    """How many times one forward of `model` on `x` calls
    `torch.nn.functional.scaled_dot_product_attention`."""
    f = torch.nn.functional
    original, calls = f.scaled_dot_product_attention, []

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    f.scaled_dot_product_attention = counting
    try:
        with torch.no_grad():
            model(x)
    finally:
        f.scaled_dot_product_attention = original
    return len(calls)


def _sync(dev):
    if dev.type == 'cuda':
        torch.cuda.synchronize(dev)


def measure(ref, a, variant: str) -> dict:
    """Build, warm up and time one variant; the result line's fields."""
    precision, mode = variant.split('-')
    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = ref.ReferenceViT(a).to(dev)
    kwargs = {'fused': True} if a.fused_adamw else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, **kwargs)
    fwd = torch.compile(model) if mode == 'compile' else model
    x = torch.randn(a.batch, a.channels, a.image, a.image, device=dev)
    y = torch.randint(0, a.classes, (a.batch,), device=dev)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16,
                              enabled=precision == 'bf16')
    sdpa = count_sdpa_calls(model, x[:2])
    if dev.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    t = time.perf_counter()
    step().item()
    first = time.perf_counter() - t
    if a.sync == 'step':
        med, _ = _median_time(lambda: step().item(), a.steps, max(a.warmup - 1, 0))
    else:
        for _ in range(max(a.warmup - 1, 0)):
            step()
        _sync(dev)
        t = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        _sync(dev)
        med = (time.perf_counter() - t) / a.steps
        loss.item()
    name = 'torch-compile' if mode == 'compile' else 'torch-eager'
    out = {'framework': f'{name} ({a.device})', 'variant': variant, 'torch': torch.__version__,
           'params': sum(q.numel() for q in model.parameters()),
           'step_ms': round(med * 1e3, 3), 'img_per_s': round(a.batch / med, 2),
           'compile_s': round(max(first - med, 0.0), 3) if mode == 'compile' else None,
           'first_step_s': round(first, 3), 'sync': a.sync, 'fused_adamw': a.fused_adamw,
           'sdpa_calls_per_forward': sdpa,
           'shape': {k: getattr(a, k) for k in SHAPE_FLAGS}}
    if dev.type == 'cuda':
        out['device_peak_mb'] = torch.cuda.max_memory_allocated(dev) / 2 ** 20
    return out


# The reference script's shape and timing flags, with its defaults.
FLAGS = (('dim', int, 192), ('depth', int, 12), ('heads', int, 3), ('mlp-ratio', float, 4.0),
         ('image', int, 32), ('patch', int, 4), ('channels', int, 3), ('classes', int, 100),
         ('batch', int, 128), ('steps', int, 5), ('warmup', int, 2), ('threads', int, 0))
SHAPE_FLAGS = tuple(f.replace('-', '_') for f, _, _ in FLAGS
                    if f not in ('steps', 'warmup', 'threads'))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--ref', required=True, help='path of torch_vit_reference.py')
    p.add_argument('--device', default='cuda')
    for flag, kind, default in FLAGS:
        p.add_argument('--' + flag, type=kind, default=default)
    p.add_argument('--variants', default='fp32-eager',
                   help=f'comma-separated, among {", ".join(VARIANTS)}')
    p.add_argument('--sync', choices=('step', 'end'), default='step')
    p.add_argument('--fused-adamw', action='store_true')
    a = p.parse_args(argv)
    a.variants = [v for v in a.variants.split(',') if v]
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown or not a.variants:
        p.error(f'--variants: unknown {unknown}, expected some of {", ".join(VARIANTS)}')
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    ref = load_reference(a.ref)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    failed = 0
    for variant in a.variants:
        try:
            out = measure(ref, a, variant)
        except Exception as e:   # one variant's failure (e.g. out of memory) keeps the others
            out, failed = {'variant': variant, 'error': f'{type(e).__name__}: {e}'[:500]}, 1
        print(json.dumps(out), flush=True)
        if hasattr(torch, '_dynamo'):
            torch._dynamo.reset()
        if a.device.startswith('cuda'):
            torch.cuda.empty_cache()
    return failed


if __name__ == '__main__':
    sys.exit(main())
