#!/usr/bin/env python3
"""Run the PyTorch-eager reference ViT step on an accelerator (e.g. `--device cuda`).

    python benchmarks/torch_on_device.py --ref ../shared/bench/torch_vit_reference.py \
        --device cuda --dim 192 --depth 12 --heads 3 --batch 1024

The reference script builds its model and batch on the CPU; this wrapper imports its
`ReferenceViT` unchanged, moves model and batch to `--device` and times the same step
(AdamW lr 1e-3, weight decay 0.05, cross-entropy; `loss.item()` synchronises every step).
It prints one JSON line in the reference's format, so `run.py --torch-device cuda` reads it
like the CPU reference. TF32 matmuls are allowed, as XLA does by default on the GPU.
"""
import argparse
import importlib.util
import json
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--ref', required=True, help='path of torch_vit_reference.py')
    p.add_argument('--device', default='cuda')
    p.add_argument('--dim', type=int, default=192)
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--heads', type=int, default=3)
    p.add_argument('--mlp-ratio', type=float, default=4.0)
    p.add_argument('--image', type=int, default=32)
    p.add_argument('--patch', type=int, default=4)
    p.add_argument('--channels', type=int, default=3)
    p.add_argument('--classes', type=int, default=100)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--threads', type=int, default=0)
    a = p.parse_args()
    spec = importlib.util.spec_from_file_location('torch_vit_reference', a.ref)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = ref.ReferenceViT(a).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(a.batch, a.channels, a.image, a.image, device=dev)
    y = torch.randint(0, a.classes, (a.batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    out = {'framework': f'torch-eager ({a.device})', 'torch': torch.__version__,
           'params': sum(q.numel() for q in model.parameters()),
           'step_ms': round(med * 1e3, 3), 'img_per_s': round(a.batch / med, 2),
           'shape': {k: v for k, v in vars(a).items()
                     if k not in ('steps', 'warmup', 'threads', 'ref', 'device')}}
    if dev.type == 'cuda':
        out['device_peak_mb'] = torch.cuda.max_memory_allocated(dev) / 2 ** 20
    print(json.dumps(out))


if __name__ == '__main__':
    main()
