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

import torch

from run import _median_time   # benchmarks/run.py, beside this script


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--ref', required=True, help='path of torch_vit_reference.py')
    p.add_argument('--device', default='cuda')
    # The reference script's shape and timing flags, with its defaults.
    for flag, kind, default in (('dim', int, 192), ('depth', int, 12), ('heads', int, 3),
                                ('mlp-ratio', float, 4.0), ('image', int, 32), ('patch', int, 4),
                                ('channels', int, 3), ('classes', int, 100), ('batch', int, 128),
                                ('steps', int, 5), ('warmup', int, 2), ('threads', int, 0)):
        p.add_argument('--' + flag, type=kind, default=default)
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

    med, _ = _median_time(step, a.steps, a.warmup)
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
