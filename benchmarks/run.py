#!/usr/bin/env python3
"""Throughput, compile-time and memory benchmarks of the jlearngene ViT training step.

    python benchmarks/run.py                  # full run (CPU: ~10-15 minutes on 2 cores)
    python benchmarks/run.py --quick          # short version (fewer steps, ~4-6 minutes)
    python benchmarks/run.py --json out.json  # where the results go (default benchmarks/results.json)

Measures, each case in its own subprocess (so peak host memory is per case):

  (a) the float32 matmul peak of the machine, measured with jax (median GFLOP/s of large
      square matmuls; the best size is the peak);
  (b) the REAL training step (`step.make_train_step` + `tasks.classification_loss` +
      `optim.make_optimizer`: AdamW, cross-entropy, exact GELU, float32) for Ti-12 (batch 128)
      and S-12 (batch 64) at 32 px, patch 4, 100 classes: images/s, model FLOP/s and % of the
      matmul peak;
  (c) the same shapes through the PyTorch-eager reference (`--torch-ref`, default
      ../shared/bench/torch_vit_reference.py) when torch imports, and the ratio jlearngene/torch;
  (d) the TLEG Aux-Net step (gene -> tleg.expand(gene, L) -> apply) against a plain step of
      the same shape, both compiled in one process and timed alternately: overhead %;
  (e) compile time of the train step at depth 6, 12, 24 (`jit(...).lower(...).compile()`;
      median of 3 processes per depth);
  (f) peak host memory (max RSS) of every case's process (from os.wait4).

FLOP count (`model_flops`): 2 FLOPs per multiply-accumulate of every matmul of the forward
pass (patch embedding, q/k/v/out projections, QK^T, attention x V, MLP fc1/fc2, head),
times 3 for forward + backward (the backward of a matmul is two matmuls of the same size).
LayerNorm, softmax, GELU, adds, the loss and the optimiser update are not counted, so the
model FLOP/s is a matmul-only utilisation figure comparable with the matmul peak. (This is
2x the fvcore "FLOPs" = MACs of `jlearngene.costs.flops_per_image`, minus its LayerNorm term.)

Steps per call: the jax step runs as `trainer.fit` runs it, `--steps-per-call` optimiser
steps per compiled call ('auto': fit's choice on this backend, 8 on CPU, 1 elsewhere; the
K copies of the batch are stacked); the 'single' extra row (on by default) runs one step per
call. Times are per optimiser step (a call's time / K). torch runs eagerly, step by step.

Timing: a warm-up of `--warmup` steps, then the median of `--steps` steps, each ended by
`block_until_ready` on the step's outputs (with K steps per call: at least one warm-up
call and two timed calls, each call's time / K). The machine's 1-minute load average is
recorded with every case: on a shared machine compare the ratios measured back-to-back in one run,
not absolute numbers across runs. `--threads N` pins every case (jax and torch) to the
first N CPUs (default: all CPUs, torch uses as many intra-op threads).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_TORCH_REF = os.path.join('..', 'shared', 'bench', 'torch_vit_reference.py')

# The shapes of the issue: (name, variant, depth, batch).
SHAPES = (('Ti-12', 'Ti', 12, 128), ('S-12', 'S', 12, 64))
COMPILE_DEPTHS = (6, 12, 24)


# ----------------------------------------------------------------------------------------
# FLOP count.

def model_flops(variant: str, depth: int, batch: int, image: int = 32, patch: int = 4,
                classes: int = 100, channels: int = 3) -> dict[str, float]:
    """Matmul FLOPs of one training step (see the module docstring)."""
    from jlearngene.models.config import vit_config
    cfg = vit_config(variant, depth=depth, image_size=image, patch_size=patch,
                     num_classes=classes, channels=channels)
    t, d, m = cfg.num_tokens, cfg.width, cfg.mlp_dim
    per_layer = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * m
    embed = 2 * cfg.num_patches * patch * patch * channels * d
    head = 2 * d * classes
    fwd = batch * (depth * per_layer + embed + head)
    return {'forward': float(fwd), 'train_step': 3.0 * fwd}


# ----------------------------------------------------------------------------------------
# Workers (run in subprocesses).

def _median_time(fn, steps: int, warmup: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def worker_peak(a) -> dict:
    """Median GFLOP/s of square float32 (or --dtype) matmuls, compiled with XLA's default
    options (as the training step is); the best size is the peak."""
    import jax
    import jax.numpy as jnp
    dtype = jnp.dtype(a.dtype)
    out = {}
    # Accumulate in float32, as the model's reduced-precision matmuls do (XLA:CPU runs
    # bfloat16 x bfloat16 -> float32 dots on AMX where the CPU has it).
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    for n in a.sizes:
        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (n, n), dtype)
        y = jax.random.normal(k2, (n, n), dtype)
        f(x, y).block_until_ready()
        med, _ = _median_time(lambda x=x, y=y: f(x, y).block_until_ready(), a.steps, 1)
        out[str(n)] = 2 * n ** 3 / med / 1e9
    return {'gflops_by_size': out, 'peak_gflops': max(out.values()), 'dtype': a.dtype,
            'backend': jax.default_backend(), 'device': str(jax.devices()[0])}


def _build_step(variant, depth, batch, mode, dtype='float32', gelu='exact', microbatches=1,
                dense_precision='float32', steps_per_call=1):
    """(jitted step, state, batch, rng) for a plain ViT or a TLEG Aux-Net of this shape;
    with `steps_per_call` > 1 the step is that many steps in one call, on that many copies
    of the batch stacked (as `trainer.fit` runs it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jlearngene import compiler
    from jlearngene.genes import tleg
    from jlearngene.models import vit
    from jlearngene.models.config import vit_config
    from jlearngene.train import optim, tasks
    from jlearngene.train.state import init_state
    from jlearngene.train.step import make_train_step

    cfg = vit_config(variant, depth=depth, image_size=32, patch_size=4, num_classes=100,
                     dtype=dtype, gelu=gelu, dense_precision=dense_precision)
    key = jax.random.key(0)
    if mode == 'plain':
        trainable = vit.init(cfg, key)
        loss_fn = tasks.classification_loss(cfg)
    elif mode == 'auxnet':
        trainable = tleg.init_gene(cfg, key)
        inner = tasks.classification_loss(cfg)

        def loss_fn(gene, b, rng):
            return inner(tleg.expand(gene, cfg.depth), b, rng)
    else:
        raise ValueError(f'unknown mode {mode!r}')
    # The torch reference: AdamW(lr=1e-3, weight_decay=0.05) on every parameter, no clipping.
    opt = optim.make_optimizer(dict(lr=1e-3, schedule='constant', weight_decay=0.05,
                                    decay=('.*',), clip_norm=0.0), trainable)
    # Fresh buffers for every leaf (init may share one array between leaves; donation needs
    # distinct buffers, as the trainer's jitted init_state gives).
    state = jax.tree.map(lambda x: jnp.array(x, copy=True), init_state(trainable, opt))
    rng = np.random.default_rng(0)
    data = {'image': rng.standard_normal((batch, 32, 32, 3), np.float32),
            'label': rng.integers(0, 100, (batch,)).astype(np.int32)}
    if steps_per_call > 1:
        data = {k: np.stack([v] * steps_per_call) for k, v in data.items()}
    data = {k: jnp.asarray(v) for k, v in data.items()}
    base = jax.random.key_data(jax.random.key(1))
    step = compiler.jit(make_train_step(loss_fn, opt, microbatches=microbatches,
                                        steps_per_call=steps_per_call),
                        donate_argnums=(0,))
    return step, state, data, base, cfg


def resolve_steps_per_call(value: str) -> int:
    """--steps-per-call: an integer, or 'auto' = what `trainer.fit` picks on this backend
    when no log/eval/checkpoint interval constrains it."""
    if value == 'auto':
        import jax
        from jlearngene.train.step import auto_steps_per_call
        return auto_steps_per_call(jax.default_backend())
    return int(value)


class WarmStep(NamedTuple):
    run: Callable[[], dict]   # one call of k steps on the carried state; waits for its metrics
    compiled: Any             # the compiled step
    k: int                    # optimiser steps per call
    compile_s: float          # seconds to lower and compile it


def warm_step(variant, depth, batch, mode='plain', *, steps_per_call='1', warmup=2,
              compiler_options=None, **build_kw) -> WarmStep:
    """`_build_step`'s step lowered and compiled (with extra `compiler_options`), then run
    for `warmup` calls: what the timing worker and the profiling tools record."""
    import jax
    k = resolve_steps_per_call(steps_per_call)
    step, state, data, base, _ = _build_step(variant, depth, batch, mode, steps_per_call=k,
                                             **build_kw)
    t = time.perf_counter()
    compiled = step.lower(state, data, base).compile(compiler_options=compiler_options or None)
    compile_s = time.perf_counter() - t
    carry = {'state': state}

    def run():
        carry['state'], metrics = compiled(carry['state'], data, base)
        return jax.block_until_ready(metrics)
    for _ in range(warmup):
        run()
    return WarmStep(run, compiled, k, compile_s)


def worker_step(a) -> dict:
    """Compile and time the training step of one shape (one or two modes, interleaved).
    Times are per optimiser step: a call of K steps counts as K steps."""
    import jax
    modes = a.mode.split(',')
    # Compile every mode first, then warm them up (below) after all compiles.
    steps = {m: warm_step(a.variant, a.depth, a.batch, m, steps_per_call=a.steps_per_call,
                          warmup=0, dtype=a.dtype, gelu=a.gelu, microbatches=a.microbatches,
                          dense_precision=a.dense_precision) for m in modes}
    k = steps[modes[0]].k
    res = {'variant': a.variant, 'depth': a.depth, 'batch': a.batch, 'dtype': a.dtype,
           'gelu': a.gelu, 'microbatches': a.microbatches, 'dense_precision': a.dense_precision,
           'steps_per_call': k, 'backend': jax.default_backend(), 'modes': {}}
    runners = {}
    for m, ws in steps.items():
        cost = ws.compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        runners[m] = ws.run
        res['modes'][m] = {'compile_s': ws.compile_s,
                           'xla_flops': float((cost or {}).get('flops', float('nan')))}
    if not a.compile_only:
        # --warmup and --steps count optimiser steps; calls of k steps cover them (at least
        # one warm-up call and two timed calls).
        calls = max(2, -(-a.steps // k))
        for run in runners.values():
            for _ in range(max(1, -(-a.warmup // k))):
                run()
        times = {m: [] for m in runners}
        last = {}
        for _ in range(calls):            # alternate the modes so they see the same load
            for m, run in runners.items():
                t = time.perf_counter()
                last[m] = run()
                times[m].append((time.perf_counter() - t) / k)
        for m in runners:
            med = statistics.median(times[m])
            res['modes'][m].update(step_s=med, step_s_all=times[m], img_per_s=a.batch / med,
                                   loss=float(last[m]['loss'].reshape(-1)[-1]))
    stats = jax.devices()[0].memory_stats() or {}
    if 'peak_bytes_in_use' in stats:   # accelerators: peak device memory of this process
        res['device_peak_mb'] = stats['peak_bytes_in_use'] / 2 ** 20
    return res


WORKERS = {'peak': worker_peak, 'step': worker_step}


def worker_main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument('--worker', choices=sorted(WORKERS), required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--variant', default='Ti')
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--mode', default='plain')
    p.add_argument('--dtype', default='float32')
    p.add_argument('--gelu', default='exact')
    p.add_argument('--microbatches', type=int, default=1)
    p.add_argument('--steps-per-call', default='1')
    p.add_argument('--dense-precision', default='float32')
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--sizes', type=int, nargs='*', default=[2048, 4096])
    p.add_argument('--compile-only', action='store_true')
    a = p.parse_args(argv)
    t = time.perf_counter()
    res = WORKERS[a.worker](a)
    res['wall_s'] = time.perf_counter() - t
    with open(a.out, 'w') as f:
        json.dump(res, f)
    return 0


# ----------------------------------------------------------------------------------------
# Driver.

class Runner:
    """Runs cases in subprocesses pinned to the chosen CPUs; records max RSS and load."""

    def __init__(self, args):
        self.args = args
        self.cpus = sorted(os.sched_getaffinity(0))[:args.threads] if args.threads else None

    def _preexec(self):
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)

    def run(self, cmd: list[str], timeout: float) -> tuple[int, str, dict]:
        load = os.getloadavg()[0]
        with tempfile.TemporaryFile('w+') as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                    preexec_fn=self._preexec)
            deadline = time.time() + timeout
            while True:
                pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.time() > deadline:
                    proc.kill()
                    _, status, ru = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.05)
            rc = os.waitstatus_to_exitcode(status)   # -9 after the kill on timeout
            log.seek(0)
            text = log.read()
        # ru_maxrss is KiB on Linux.
        return rc, text, {'max_rss_mb': ru.ru_maxrss / 1024, 'load_1m': load}

    def jax_case(self, name: str, extra: list[str], timeout: float = 1800) -> dict:
        with tempfile.NamedTemporaryFile(suffix='.json', delete=False) as f:
            out = f.name
        cmd = [sys.executable, os.path.abspath(__file__), '--worker'] + extra + ['--out', out]
        print(f'  [{time.strftime("%H:%M:%S")}] {name} ...', flush=True)
        rc, text, meta = self.run(cmd, timeout)
        if rc != 0:
            print(text[-3000:])
            raise RuntimeError(f'benchmark case {name} failed (exit {rc})')
        with open(out) as f:
            res = json.load(f)
        os.unlink(out)
        res.update(meta)
        return res

    def torch_case(self, name: str, variant: str, depth: int, batch: int) -> dict | None:
        from jlearngene.models.config import VARIANTS
        v = VARIANTS[variant]
        threads = len(self.cpus) if self.cpus else os.cpu_count()
        if self.args.torch_device == 'cpu':
            head = [sys.executable, self.args.torch_ref]
        else:   # the same reference model, moved to the accelerator by a wrapper
            head = [sys.executable, os.path.join(HERE, 'torch_on_device.py'), '--ref',
                    self.args.torch_ref, '--device', self.args.torch_device]
        cmd = head + ['--dim', str(v['width']), '--depth', str(depth),
                      '--heads', str(v['num_heads']), '--mlp-ratio', str(v['mlp_dim'] / v['width']),
                      '--image', '32', '--patch', '4', '--classes', '100', '--batch', str(batch),
                      '--steps', str(self.args.steps), '--warmup', str(self.args.warmup),
                      '--threads', str(threads)]
        print(f'  [{time.strftime("%H:%M:%S")}] {name} (torch) ...', flush=True)
        rc, text, meta = self.run(cmd, 1800)
        if rc != 0:
            print(text[-3000:])
            raise RuntimeError(f'torch reference for {name} failed (exit {rc})')
        line = [ln for ln in text.splitlines() if ln.startswith('{')][-1]
        res = json.loads(line)
        res.update(meta)
        return res


def _torch_available(path: str, device: str = 'cpu') -> tuple[bool, str]:
    if not os.path.exists(path):
        return False, f'reference script not found at {path}'
    check = 'import torch' + ('' if device == 'cpu' else
                              f'; torch.empty(1, device={device!r})')
    rc = subprocess.run([sys.executable, '-c', check], capture_output=True).returncode
    return (rc == 0), ('' if rc == 0 else f'torch is not importable or has no {device!r} device')


def extra_row(extra: str, dtype: str) -> tuple[list[str], str] | None:
    """The step's extra flags and the row label's suffix of an `--extra-rows` entry (None: unknown)."""
    if extra == 'single':
        return ['--steps-per-call', '1'], '1 step/call'
    if extra == 'tanh':
        return ['--gelu', 'tanh'], 'tanh-GELU'
    if extra == 'dtype':
        return ['--dtype', dtype], dtype
    if extra.startswith('accum') and extra[5:].isdigit() and int(extra[5:]) > 1:
        return ['--microbatches', extra[5:]], f'{extra[5:]} micro-batches'
    if extra == 'bf16dense':
        return ['--dense-precision', 'bfloat16'], 'bf16 dense'
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == '--worker':
        return worker_main(argv)
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true', help='fewer steps and rounds (a few minutes)')
    p.add_argument('--json', default=os.path.join(HERE, 'results.json'), help='results file')
    p.add_argument('--torch-ref', default=DEFAULT_TORCH_REF,
                   help='path of the PyTorch-eager reference script, relative to the repo root '
                        'or absolute (default %(default)s)')
    p.add_argument('--no-torch', action='store_true', help='skip the torch reference')
    p.add_argument('--torch-device', default='cpu',
                   help="device of the torch reference ('cuda' runs it through torch_on_device.py)")
    p.add_argument('--steps', type=int, default=None, help='timed steps per case (default 10, quick 4)')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--rounds', type=int, default=None,
                   help='jax/torch pairs per shape; the ratio is the median over rounds (default 2, quick 1)')
    p.add_argument('--threads', type=int, default=0, help='pin every case to the first N CPUs (0 = all)')
    p.add_argument('--dtype', default='float32', help="computation dtype of the extra rows ('bfloat16')")
    p.add_argument('--shapes', default='Ti-12,S-12', help='comma-separated subset of Ti-12,S-12')
    p.add_argument('--batch-scale', type=int, default=1,
                   help='multiply the batch sizes (GPU runs use larger batches)')
    p.add_argument('--steps-per-call', default='auto',
                   help="optimiser steps per compiled call of the jax step: an integer, or 'auto' "
                        "= what trainer.fit picks on this backend (8 on CPU, 1 elsewhere)")
    p.add_argument('--extra-rows', default='single',
                   help="comma-separated extra jax rows: 'single' (one step per call), "
                        "'tanh' (tanh GELU), 'dtype' (--dtype), "
                        "'accumN' (the step accumulating over N micro-batches, e.g. accum4), "
                        "'bf16dense' (dense layers with bfloat16 operands, ViTConfig.dense_precision)")
    p.add_argument('--compile-depths', default=','.join(map(str, COMPILE_DEPTHS)))
    p.add_argument('--compile-repeats', type=int, default=None,
                   help='compile processes per depth; the median is reported (default 3, quick 1)')
    p.add_argument('--skip', default='', help='comma-separated parts to skip: peak,step,torch,auxnet,compile')
    p.add_argument('--peak-sizes', default='2048,4096')
    args = p.parse_args(argv)
    args.steps = args.steps or (4 if args.quick else 10)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.compile_repeats = args.compile_repeats or (1 if args.quick else 3)
    if not os.path.isabs(args.torch_ref):
        args.torch_ref = os.path.normpath(os.path.join(REPO, args.torch_ref))
    skip = set(filter(None, args.skip.split(',')))
    extra_rows = {e: extra_row(e, args.dtype) for e in filter(None, args.extra_rows.split(','))}
    if None in extra_rows.values():
        p.error(f'--extra-rows {args.extra_rows!r}: unknown entry '
                f'{[e for e, v in extra_rows.items() if v is None]} '
                '(known: single, tanh, dtype, accumN with N > 1, bf16dense)')
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(',')]
    if not shapes:
        p.error(f'--shapes {args.shapes!r} selects nothing; known: {[s[0] for s in SHAPES]}')

    runner = Runner(args)
    common = ['--steps', str(args.steps), '--warmup', str(args.warmup),
              '--steps-per-call', args.steps_per_call]
    results = {'machine': {'platform': platform.platform(), 'cpu': _cpu_model(),
                           'cpu_count': os.cpu_count(),
                           'python': sys.version.split()[0], 'threads': args.threads or os.cpu_count(),
                           'started': time.strftime('%Y-%m-%d %H:%M:%S')},
               'args': vars(args), 'flop_count': 'matmul FLOPs (2/MAC) of the forward pass x 3'}
    if args.no_torch or 'torch' in skip:
        torch_ok, why = False, 'skipped'
    else:
        torch_ok, why = _torch_available(args.torch_ref, args.torch_device)
    results['torch_available'] = torch_ok
    if not torch_ok:
        print(f'torch reference not run: {why}')

    # (a) matmul peak
    peak = None
    if 'peak' not in skip:
        results['peak'] = runner.jax_case('matmul peak', ['peak', '--steps', '5', '--dtype', 'float32',
                                                          '--sizes', *args.peak_sizes.split(',')])
        peak = results['peak']['peak_gflops']
        low = {args.dtype} - {'float32'}
        if 'bf16dense' in extra_rows:
            low.add('bfloat16')
        for dtype in sorted(low):
            results['peak_' + dtype] = runner.jax_case(
                f'matmul peak {dtype}', ['peak', '--steps', '5', '--dtype', dtype,
                                         '--sizes', *args.peak_sizes.split(',')])

    # (b) + (c) training step vs torch, alternating jax / torch per round
    results['steps'] = {}
    if 'step' not in skip:
        for name, variant, depth, batch in shapes:
            batch *= args.batch_scale
            flops = model_flops(variant, depth, batch)
            rounds = []
            for r in range(args.rounds):
                row = {'jax': runner.jax_case(f'{name} jax step (round {r + 1})',
                                              ['step', '--variant', variant, '--depth', str(depth),
                                               '--batch', str(batch)] + common)}
                if torch_ok:
                    row['torch'] = runner.torch_case(f'{name} (round {r + 1})', variant, depth, batch)
                rounds.append(row)
            entry = {'batch': batch, 'flops_per_step': flops['train_step'], 'rounds': rounds}
            ips = [rd['jax']['modes']['plain']['img_per_s'] for rd in rounds]
            entry['jax_img_per_s'] = statistics.median(ips)
            entry['jax_tflops'] = entry['jax_img_per_s'] / batch * flops['train_step'] / 1e12
            if peak:
                entry['pct_of_peak'] = 100 * entry['jax_tflops'] * 1e3 / peak
            if torch_ok:
                tps = [rd['torch']['img_per_s'] for rd in rounds]
                entry['torch_img_per_s'] = statistics.median(tps)
                entry['ratio'] = statistics.median([j / t for j, t in zip(ips, tps)])
            results['steps'][name] = entry
            for extra, (flag, suffix) in extra_rows.items():
                if extra == 'single' and rounds[-1]['jax']['steps_per_call'] == 1:
                    continue        # the main row already runs one step per call
                label = f'{name} {suffix}'
                res = runner.jax_case(label, ['step', '--variant', variant, '--depth', str(depth),
                                              '--batch', str(batch)] + common + flag)
                ips_x = res['modes']['plain']['img_per_s']
                results['steps'][label] = {'batch': batch, 'flops_per_step': flops['train_step'],
                                           'rounds': [{'jax': res}], 'jax_img_per_s': ips_x,
                                           'jax_tflops': ips_x / batch * flops['train_step'] / 1e12}
                if torch_ok:   # against the torch median of the shape's rounds just before
                    results['steps'][label]['ratio'] = ips_x / entry['torch_img_per_s']
                # A reduced-precision row is read against that dtype's peak when measured.
                row_dtype = {'dtype': args.dtype, 'bf16dense': 'bfloat16'}.get(extra, 'float32')
                row_peak = results.get('peak_' + row_dtype, {}).get('peak_gflops', peak)
                if row_peak:
                    results['steps'][label]['pct_of_peak'] = \
                        100 * results['steps'][label]['jax_tflops'] * 1e3 / row_peak

    # (d) Aux-Net overhead: plain and Aux-Net steps of Ti-12 in one process, alternated.
    if 'auxnet' not in skip:
        name, variant, depth, batch = shapes[0]
        batch *= args.batch_scale
        res = runner.jax_case(f'{name} Aux-Net vs plain', ['step', '--variant', variant, '--depth',
                                                           str(depth), '--batch', str(batch),
                                                           '--mode', 'plain,auxnet'] + common)
        pl, ax = res['modes']['plain']['step_s'], res['modes']['auxnet']['step_s']
        pairs = [a_ / p_ for a_, p_ in zip(res['modes']['auxnet']['step_s_all'],
                                           res['modes']['plain']['step_s_all'])]
        res['overhead_pct'] = 100 * (ax / pl - 1)
        res['overhead_pct_paired'] = 100 * (statistics.median(pairs) - 1)
        res['shape'] = name
        results['auxnet'] = res

    # (e) compile time vs depth: the median of `--compile-repeats` processes per depth, the
    # depths alternating so that each repeat sees the same load.
    if 'compile' not in skip:
        samples: dict[str, list] = {}
        for r in range(args.compile_repeats):
            for depth in map(int, args.compile_depths.split(',')):
                samples.setdefault(str(depth), []).append(runner.jax_case(
                    f'compile Ti depth {depth} ({r + 1}/{args.compile_repeats})',
                    ['step', '--variant', 'Ti', '--depth', str(depth),
                     '--batch', str(128 * args.batch_scale), '--compile-only',
                     '--steps-per-call', args.steps_per_call]))
        results['compile'] = {}
        for depth, runs in samples.items():
            times = [res['modes']['plain']['compile_s'] for res in runs]
            res = dict(runs[-1], max_rss_mb=max(res['max_rss_mb'] for res in runs), compile_s_all=times)
            res['modes']['plain']['compile_s'] = statistics.median(times)
            results['compile'][depth] = res

    results['finished'] = time.strftime('%Y-%m-%d %H:%M:%S')
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, 'w') as f:
        json.dump(results, f, indent=1)
    print()
    print(format_table(results))
    print(f'\nresults written to {args.json}')
    return 0


def _cpu_model() -> str:
    """The CPU's model name (platform.processor() is often empty on Linux)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                name, sep, value = line.partition(':')
                if sep and name.strip() == 'model name':
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or 'unknown CPU'


def format_table(r: dict) -> str:
    lines = []
    m = r['machine']
    lines.append(f"machine: {m['platform']}, {m.get('cpu', 'unknown CPU')}, {m['cpu_count']} CPUs, "
                 f"threads {m['threads']}")
    if 'peak' in r:
        pk = r['peak']
        sizes = ', '.join(f'{n}: {g:.0f}' for n, g in pk['gflops_by_size'].items())
        lines.append(f"(a) matmul peak float32 ({pk['backend']}): {pk['peak_gflops']:.1f} GFLOP/s  "
                     f"[{sizes}]  load {pk['load_1m']:.2f}  rss {pk['max_rss_mb']:.0f} MB")
    for k in r:
        if k.startswith('peak_'):
            lines.append(f"    matmul peak {r[k]['dtype']}: {r[k]['peak_gflops']:.1f} GFLOP/s "
                         f"(the %peak of the {r[k]['dtype']} rows is read against this)")
    if r.get('steps'):
        per_call = sorted({rd['jax'].get('steps_per_call', 1) for e in r['steps'].values()
                           for rd in e['rounds']})
        lines.append('(b,c,f) training step (AdamW, CE, 32 px, patch 4, 100 classes); jax steps '
                     f"per call: {'/'.join(map(str, per_call))} (rows say when 1), torch eager")
        hdr = (f"  {'shape':22s} {'batch':>5s} {'jax img/s':>10s} {'GFLOP/s':>8s} {'%peak':>6s} "
               f"{'torch img/s':>11s} {'jax/torch':>9s} {'jax RSS MB':>10s} {'torch RSS MB':>12s} {'load':>5s}")
        lines.append(hdr)
        device_mem = any('device_peak_mb' in rd['jax'] for e in r['steps'].values()
                         for rd in e['rounds'])
        if device_mem:
            lines[-1] += f" {'dev MB':>7s}"
        for name, e in r['steps'].items():
            last = e['rounds'][-1]
            t = e.get('torch_img_per_s')
            ratio = f"{e['ratio']:9.2f}" if 'ratio' in e else f"{'-':>9s}"
            t_ips = f'{t:11.1f}' if t else f"{'-':>11s}"
            t_rss = (f"{max(rd['torch']['max_rss_mb'] for rd in e['rounds']):12.0f}" if t
                     else f"{'-':>12s}")
            lines.append(
                f"  {name:22s} {e['batch']:5d} {e['jax_img_per_s']:10.1f} {e['jax_tflops'] * 1e3:8.1f} "
                f"{e.get('pct_of_peak', float('nan')):6.1f} {t_ips} {ratio} "
                f"{max(rd['jax']['max_rss_mb'] for rd in e['rounds']):10.0f} {t_rss} "
                f"{last['jax']['load_1m']:5.2f}"
                + (f" {max(rd['jax'].get('device_peak_mb', 0) for rd in e['rounds']):7.0f}"
                   if device_mem else ''))
            if len(e['rounds']) > 1:
                per = '; '.join(
                    f"{rd['jax']['modes']['plain']['img_per_s']:.1f}"
                    + (f" vs {rd['torch']['img_per_s']:.1f}" if 'torch' in rd else '')
                    + f" (load {rd['jax']['load_1m']:.1f})" for rd in e['rounds'])
                lines.append(f"      rounds: {per}")
    if 'auxnet' in r:
        a = r['auxnet']
        lines.append(f"(d) TLEG Aux-Net step vs plain ({a['shape']}): "
                     f"{a['modes']['auxnet']['step_s'] * 1e3:.0f} vs {a['modes']['plain']['step_s'] * 1e3:.0f} ms, "
                     f"overhead {a['overhead_pct']:+.1f}% (paired median {a['overhead_pct_paired']:+.1f}%)  "
                     f"load {a['load_1m']:.2f}  rss {a['max_rss_mb']:.0f} MB")
    if r.get('compile'):
        c = r['compile']
        first = c[next(iter(c))]['modes']['plain']['compile_s']
        parts = [f"depth {d}: {v['modes']['plain']['compile_s']:.1f} s "
                 f"({v['modes']['plain']['compile_s'] / first:.2f}x, rss {v['max_rss_mb']:.0f} MB)"
                 for d, v in c.items()]
        lines.append('(e) compile time of the train step (Ti): ' + ', '.join(parts))
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
