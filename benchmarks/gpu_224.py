#!/usr/bin/env python3
"""ViT-S/16 and ViT-B/16 at 224 px on one CUDA GPU: jlearngene against PyTorch, in one run.

    python benchmarks/gpu_224.py                     # everything, within --budget-s (450 s)
    python benchmarks/gpu_224.py --budget-s 300      # shorter: the lower-priority parts skip
    python benchmarks/gpu_224.py --parts parity,peak,jax,torch   # a subset (also: methods)

Needs a CUDA build of jax (`pip install "jax[cuda12]==<the pinned jax version>"` or cuda13)
and, for the torch rows, a CUDA build of torch and the reference script at --torch-ref
(default ../shared/bench/torch_vit_reference.py). Run from anywhere; it sets PYTHONPATH to
the checkout. Without a CUDA GPU visible to jax it exits with status 2 and one line.

Shapes: ViT-S/16 and ViT-B/16 (depth 12), 224 px, 1000 classes, batch 256, AdamW (lr 1e-3,
weight decay 0.05, no clipping), cross-entropy. Precisions: 'bf16' = mixed precision
(`ViTConfig.dtype='bfloat16'`: float32 parameters and AdamW state, bfloat16 activations
and matmuls, LayerNorm statistics and softmax in float32) and 'fp32' (float32, XLA's and
torch's default TF32 matmuls). Parts, in the order they run; each runs in its own process
and is skipped (and listed as such) when the time left is below its estimate:

  parity   ViT-S/16 at batch 4, before any timing (benchmarks/gpu_parity.py): logits, loss
           and gradients on the GPU against the host CPU in strict float32 (max difference
           over the largest value <= 1e-4), and the bfloat16 step with the GPU backend
           (cuDNN attention) against the same step through the reference ops (<= 5e-2;
           where that fails, the later parts run with JLEARNGENE_GPU_CUDNN_ATTENTION=0);
  peak     the chip's matmul peak: the best of square bfloat16 (and float32) matmuls of
           4096, 8192 and 16384, run back to back;
  jax      the training step as `trainer.fit` runs it (`compiler.jit`, state donated, no
           host sync in the timed loop): compile time, images/s, model FLOP/s, MFU against
           the measured bfloat16 peak, peak device memory, the cuDNN attention calls in the
           program;
  torch    the same step through the PyTorch reference (benchmarks/torch_on_device.py:
           eager and torch.compile, SDPA attention, autocast bfloat16 or float32, fused
           AdamW, one synchronisation after the timed loop) and jlearngene / torch;
  methods  TLEG's and LeTra's Aux-Net steps, Scala's four-width step and Mango's operator
           step against the plain step of the same target shape (benchmarks/overhead/,
           shape set by JLEARNGENE_OVERHEAD_SHAPE): overhead %.

FLOPs per step: `run.model_flops` (2 per multiply-accumulate of every matmul of the
forward pass, x3 for the training step; the nominal count, the same for both frameworks).
Writes `--out`.json (every number, after every part, so a run cut short keeps what it
measured) and `--out`.md (the table). Exit status: 0, 1 when the parity check or a part
failed, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE, REPO]      # benchmarks/ and the checkout, without installing it

DEFAULT_TORCH_REF = os.path.join(REPO, '..', 'shared', 'bench', 'torch_vit_reference.py')
IMAGE, PATCH, CLASSES, DEPTH = 224, 16, 1000, 12
SHAPES = {'S/16': 'S', 'B/16': 'B'}
PRECISIONS = {'bf16': 'bfloat16', 'fp32': 'float32'}
METHODS = ('tleg', 'letra', 'scala', 'mango')
OPTIMIZER = dict(lr=1e-3, schedule='constant', weight_decay=0.05, decay=('.*',), clip_norm=0.0)
AIM = {'shape': 'B/16', 'precision': 'bf16', 'mfu_pct': 45.0, 'vs_torch_compile': 1.3}

# (part, arguments, estimated seconds), in priority order: the bfloat16 rows and the aim,
# then the methods, then the float32 rows.
PLAN = (
    ('parity', 'S/16', 60),
    ('peak', None, 20),
    ('jax', ('B/16', 'bf16'), 35),
    ('torch', ('B/16', 'bf16-eager,bf16-compile'), 90),
    ('jax', ('S/16', 'bf16'), 30),
    ('torch', ('S/16', 'bf16-eager,bf16-compile'), 80),
    ('methods', ('S/16', 'bf16'), 150),
    ('jax', ('B/16', 'fp32'), 35),
    ('jax', ('S/16', 'fp32'), 30),
    ('torch', ('B/16', 'fp32-eager'), 25),
    ('torch', ('S/16', 'fp32-eager'), 20),
    ('torch', ('B/16', 'fp32-compile'), 70),
    ('torch', ('S/16', 'fp32-compile'), 60),
    ('methods', ('B/16', 'bf16'), 150),
)


def selected(part: str, arg, shapes: set, precisions: set) -> bool:
    """Whether a plan entry is within the --shapes and --precisions filters."""
    if part not in ('jax', 'torch', 'methods'):
        return True
    shape, rest = arg
    kinds = {v.split('-')[0] for v in rest.split(',')}    # 'bf16' or 'bf16-eager,bf16-compile'
    return shape in shapes and bool(kinds & precisions)


# ----------------------------------------------------------------------------------------
# Pure helpers (tested on CPU).

def config(shape: str, precision: str, **changes):
    """The ViTConfig of a shape ('S/16', 'B/16') at 224 px in a precision ('bf16', 'fp32')."""
    from jlearngene.models.config import vit_config
    if shape not in SHAPES or precision not in PRECISIONS:
        raise ValueError(f'unknown shape {shape!r} or precision {precision!r}; expected one of '
                         f'{sorted(SHAPES)} and {sorted(PRECISIONS)}')
    return vit_config(SHAPES[shape], depth=DEPTH, image_size=IMAGE, patch_size=PATCH,
                      num_classes=CLASSES, dtype=PRECISIONS[precision]).replace(**changes)


def step_flops(shape: str, batch: int) -> float:
    """Model FLOPs of one training step of `shape` at `batch` (see the module docstring)."""
    from run import model_flops
    return model_flops(SHAPES[shape], DEPTH, batch, image=IMAGE, patch=PATCH,
                       classes=CLASSES)['train_step']


def derive(row: dict, peak_flops: float | None) -> dict:
    """A timed row's model TFLOP/s and MFU (% of `peak_flops`, FLOP/s) from its step time."""
    flops = step_flops(row['shape'], row['batch'])
    out = dict(row, flops_per_step=flops, tflops=flops / row['step_s'] / 1e12)
    if peak_flops:
        out['mfu_pct'] = 100 * flops / row['step_s'] / peak_flops
    return out


def case_at_shape(case: dict, batch: int, image: int, channels: int = 3) -> bool:
    """Whether an overhead case's plain step reads images of (batch, image, image, channels)."""
    import jax
    want = (batch, image, image, channels)
    return any(tuple(getattr(x, 'shape', ())) == want for x in jax.tree.leaves(case['plain'][1]))


def _num(x, fmt='.1f', none='-'):
    return none if x is None else format(x, fmt)


def format_table(r: dict) -> str:
    """The markdown table of a results dict (what `Driver.save` writes)."""
    m, a = r.get('machine', {}), r.get('args', {})
    lines = [f"# ViT-S/16 and ViT-B/16 at 224 px on {m.get('device', '?')}: jlearngene and PyTorch",
             '', f"{r.get('started', '')}; jax {m.get('jax', '?')}, torch {m.get('torch', '-')}, "
             f"cuDNN {m.get('cudnn', '-')} (attention {m.get('cudnn_attention', '?')}); "
             f"AdamW, cross-entropy, 1000 classes; "
             f"{a.get('steps', '?')} timed steps per row, one synchronisation after them", '']
    peak = r.get('peak')
    if peak:
        lines.append('matmul peak: ' + ', '.join(
            f"{d} {v['peak_tflops']:.0f} TFLOP/s (n={v['best_size']})"
            for d, v in peak['by_dtype'].items()) + '; MFU is against the bfloat16 peak')
    par = r.get('parity')
    if par and 'float32_highest' in par:
        def w(part):
            return max(v['max_rel_to_scale'] for v in par[part].values())
        lines.append(f"parity (ViT-S/16, batch {par['batch']}, vs CPU): strict float32 "
                     f"{w('float32_highest'):.1e} (tol {par['tol']}), bfloat16 {w('bfloat16'):.1e}, "
                     f"bfloat16 cuDNN vs reference ops {w('bfloat16_backends_vs_reference'):.1e} "
                     f"(tol {par['bf16_tol']}); cuDNN calls {par['cudnn_attention_calls']['bfloat16']}; "
                     f"{'ok' if par['ok'] else 'FAILED'}")
    elif par:
        lines.append(f"parity: {par.get('error', 'not run')}")
    lines += ['', '| model | precision | framework | batch | img/s | TFLOP/s | MFU % | compile s '
              '| peak GB | cuDNN attn | jlearngene / this |', '|' + '---|' * 11]
    for key in sorted(r.get('rows', {})):
        shape, precision = key.split(' ')
        group = r['rows'][key]
        jax_row = group.get('jlearngene')
        for fw in ('jlearngene', 'torch-eager', 'torch-compile'):
            row = group.get(fw)
            if row is None:
                continue
            if 'error' in row:
                lines.append(f"| {shape} | {precision} | {fw} | - | {row['error'][:60]} |"
                             + ' |' * 6)
                continue
            ratio = (jax_row['img_per_s'] / row['img_per_s']
                     if jax_row and 'img_per_s' in jax_row and fw != 'jlearngene' else None)
            gb = row.get('device_peak_mb')
            lines.append(
                f"| {shape} | {precision} | {fw} | {row['batch']} | {row['img_per_s']:.0f} | "
                f"{row['tflops']:.1f} | {_num(row.get('mfu_pct'))} | {_num(row.get('compile_s'))} | "
                f"{_num(gb and gb / 1024)} | {row.get('cudnn_attention_calls', '-')} | "
                f"{_num(ratio, '.2f')} |")
    aim = r.get('aim')
    if aim:
        lines += ['', f"aim ({AIM['shape']} {AIM['precision']}): MFU {_num(aim.get('mfu_pct'))} % "
                  f"(aim >= {AIM['mfu_pct']:.0f} %), {_num(aim.get('vs_torch_compile'), '.2f')}x "
                  f"torch.compile (aim >= {AIM['vs_torch_compile']}x)"]
    methods = r.get('methods', {})
    if methods:
        lines += ['', '| method | shape | plain ms | method ms | overhead |', '|---|---|---|---|---|']
        for shape, rows in methods.items():
            for row in rows:
                if 'overhead' in row:
                    lines.append(f"| {row['name']} | {row['shape']} | {row['plain_s'] * 1e3:.1f} | "
                                 f"{row['method_s'] * 1e3:.1f} | {100 * row['overhead']:+.1f} % |")
                else:
                    lines.append(f"| {row.get('name', '?')} | {shape} | - | - | "
                                 f"{row.get('error', row.get('skipped', '?'))[:80]} |")
    for what, items in (('skipped', r.get('skipped', [])), ('failed', r.get('failed', []))):
        if items:
            lines += ['', f'{what}: ' + '; '.join(items)]
    return '\n'.join(lines) + '\n'


# ----------------------------------------------------------------------------------------
# Workers (each in its own process; one JSON line per result on stdout).

def _emit(obj):
    print(json.dumps(obj), flush=True)


def build_step(cfg, batch: int, donate: bool = True):
    """(jitted step, state, batch, rng): the trainer's step with AdamW on a fresh ViT."""
    import jax
    import jax.numpy as jnp
    from jlearngene import compiler
    from jlearngene.models import vit
    from jlearngene.train import optim, tasks
    from jlearngene.train.state import init_state
    from jlearngene.train.step import make_train_step
    params = vit.init(cfg, jax.random.key(0))
    opt = optim.make_optimizer(OPTIMIZER, params)
    state = jax.tree.map(lambda x: jnp.array(x, copy=True), init_state(params, opt))
    k1, k2 = jax.random.split(jax.random.key(1))
    data = {'image': jax.random.normal(k1, (batch, cfg.image_size, cfg.image_size, cfg.channels)),
            'label': jax.random.randint(k2, (batch,), 0, cfg.num_classes)}
    step = compiler.jit(make_train_step(tasks.classification_loss(cfg), opt),
                        donate_argnums=(0,) if donate else ())
    return step, state, data, jax.random.key_data(jax.random.key(2))


def worker_jax(a) -> None:
    """Compile and time one shape and precision; `a.steps` steps back to back, one sync."""
    import jax
    import numpy as np
    from gpu_parity import cudnn_calls
    cfg = config(a.shape, a.precision)
    step, state, data, base = build_step(cfg, a.batch)
    t = time.perf_counter()
    lowered = step.lower(state, data, base)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    for _ in range(a.warmup):
        state, metrics = compiled(state, data, base)
    jax.block_until_ready((state, metrics))
    t = time.perf_counter()
    for _ in range(a.steps):
        state, metrics = compiled(state, data, base)
    jax.block_until_ready((state, metrics))
    step_s = (time.perf_counter() - t) / a.steps
    loss = float(metrics['loss'])
    stats = jax.devices()[0].memory_stats() or {}
    _emit({'framework': 'jlearngene', 'shape': a.shape, 'precision': a.precision,
           'batch': a.batch, 'steps': a.steps, 'step_s': step_s, 'img_per_s': a.batch / step_s,
           'compile_s': compile_s, 'loss': loss, 'loss_finite': bool(np.isfinite(loss)),
           'cudnn_attention_calls': cudnn_calls(lowered.as_text()),
           'xla_flops': float((cost or {}).get('flops', float('nan'))),
           'device_peak_mb': stats.get('peak_bytes_in_use', 0) / 2 ** 20 or None,
           'program_temp_mb': getattr(mem, 'temp_size_in_bytes', 0) / 2 ** 20,
           'program_args_mb': getattr(mem, 'argument_size_in_bytes', 0) / 2 ** 20})


def worker_peak(a) -> None:
    """The best TFLOP/s of square matmuls per dtype, `reps` calls back to back per size."""
    import jax
    import jax.numpy as jnp
    out = {}
    for dtype in ('bfloat16', 'float32'):
        by_size = {}
        for n in (4096, 8192, 16384):
            k1, k2 = jax.random.split(jax.random.key(0))
            x = jax.random.normal(k1, (n, n), dtype)
            y = jax.random.normal(k2, (n, n), dtype)
            f = jax.jit(jnp.matmul)
            jax.block_until_ready(f(x, y))
            reps = 50 if n <= 8192 else 20
            t = time.perf_counter()
            for _ in range(reps):
                z = f(x, y)
            jax.block_until_ready(z)
            by_size[n] = 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e12
            del x, y, z
        best = max(by_size, key=by_size.get)
        out[dtype] = {'tflops_by_size': by_size, 'best_size': best, 'peak_tflops': by_size[best]}
    _emit({'by_dtype': out, 'device': str(jax.devices()[0])})


def worker_parity(a) -> None:
    import jax
    import gpu_parity
    report = gpu_parity.parity(config(a.shape, 'fp32'), a.batch, jax.devices()[0],
                               jax.devices('cpu')[0], with_default=False)
    _emit(dict(report, shape=a.shape))


def worker_methods(a) -> None:
    """The method cases at `a.shape` in `a.precision`, batch `a.batch`; one line per case."""
    import jax
    os.environ['JLEARNGENE_OVERHEAD_SHAPE'] = \
        f"{SHAPES[a.shape]}/{PATCH} {IMAGE} {a.batch} {PRECISIONS[a.precision]}"
    import tempfile
    import method_overhead
    # The plain steps of cases at one shape are the same program: compile it once (a cache
    # this jax does not offer only costs the repeated compile).
    try:
        jax.config.update('jax_compilation_cache_dir', tempfile.mkdtemp(prefix='gpu_224_cache'))
        jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
    except (AttributeError, ValueError):
        pass
    for name in METHODS:
        t = time.perf_counter()
        try:
            case = importlib.import_module(f'overhead.{name}').case(False)
            if not case_at_shape(case, a.batch, IMAGE):
                _emit({'name': name, 'skipped': f'benchmarks/overhead/{name}.py does not build its '
                                                 'shape from overhead.config (it ignores '
                                                 'JLEARNGENE_OVERHEAD_SHAPE)'})
                continue
            res = method_overhead.measure(case, a.rounds, warmup=1)
            _emit(dict(res, wall_s=time.perf_counter() - t))
        except Exception as e:   # one case's failure keeps the others
            _emit({'name': name, 'error': f'{type(e).__name__}: {e}'[:500]})
        jax.clear_caches()


WORKERS = {'jax': worker_jax, 'peak': worker_peak, 'parity': worker_parity,
           'methods': worker_methods}


def worker_main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument('--worker', choices=sorted(WORKERS), required=True)
    p.add_argument('--shape', default='S/16')
    p.add_argument('--precision', default='bf16')
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--rounds', type=int, default=5)
    a = p.parse_args(argv)
    WORKERS[a.worker](a)
    return 0


# ----------------------------------------------------------------------------------------
# Driver.

def gpu_problem() -> str | None:
    """None when jax sees a CUDA GPU, else the one-line reason."""
    import jax
    try:
        devices = jax.devices('gpu')
    except RuntimeError:
        devices = []
    if not devices:
        return (f'gpu_224: jax sees no GPU (default backend {jax.default_backend()!r}); run it '
                'on a machine with an NVIDIA GPU and a CUDA build of jax')
    from jlearngene.ops import gpu
    if not gpu.cuda_available():
        return f'gpu_224: the GPU ({devices[0].device_kind}) is not a CUDA device'
    return None


class Driver:
    """Runs the plan's parts in subprocesses within the time budget; saves after each."""

    def __init__(self, args):
        self.args = args
        self.start = time.time()
        self.last_err = ''
        self.env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false',
                        PYTHONPATH=os.pathsep.join(
                            [REPO, HERE] + ([os.environ['PYTHONPATH']]
                                            if os.environ.get('PYTHONPATH') else [])))
        self.r = {'started': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
                  'args': {k: sorted(v) if isinstance(v, set) else v
                           for k, v in vars(args).items()},
                  'rows': {}, 'methods': {}, 'skipped': [], 'failed': []}

    def left(self) -> float:
        return self.args.budget_s - (time.time() - self.start)

    def save(self):
        self.r['elapsed_s'] = time.time() - self.start
        with open(self.args.out + '.json', 'w', encoding='utf-8') as f:
            json.dump(self.r, f, indent=1)
        with open(self.args.out + '.md', 'w', encoding='utf-8') as f:
            f.write(format_table(self.r))

    def call(self, cmd: list[str], label: str) -> list[dict]:
        """Run `cmd` (killed when the budget runs out); its JSON lines, also after a kill."""
        print(f'[{time.strftime("%H:%M:%S")}] {label} ({self.left():.0f} s left)', flush=True)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=REPO,
                               timeout=max(self.left(), 1))
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or '')
            err, rc = 'killed: the time budget ran out', -9
        lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith('{')]
        self.last_err = err or ''
        if rc != 0:
            tail = (err or '').strip().splitlines()[-1:] or ['']
            self.r['failed'].append(f'{label}: exit {rc} {tail[0][:300]}')
            print((err or '')[-3000:], file=sys.stderr)
        return lines

    def worker(self, name, *flags) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), '--worker', name, *flags]

    def run(self) -> int:
        a = self.args
        import jax
        m = {'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
             'python': sys.version.split()[0]}
        try:
            from jax._src.lib import cuda_versions
            m['cudnn'] = cuda_versions.cudnn_get_version() if cuda_versions else None
        except Exception:   # the version is informative only
            m['cudnn'] = None
        torch_ok, why = self.torch_available()
        if torch_ok:
            m['torch'] = subprocess.run([sys.executable, '-c', 'import torch; print(torch.__version__)'],
                                        capture_output=True, text=True).stdout.strip()
        else:
            self.r['skipped'].append(f'torch rows: {why}')
        self.r['machine'] = m
        peak = None
        for part, arg, estimate in PLAN:
            if part not in a.parts or (part == 'torch' and not torch_ok) \
                    or not selected(part, arg, a.shapes, a.precisions):
                continue
            label = f'{part} {arg if isinstance(arg, str) else " ".join(arg or ())}'.strip()
            if self.left() < estimate:
                self.r['skipped'].append(f'{label}: {self.left():.0f} s left, needs ~{estimate} s')
                continue
            if part == 'parity':
                lines = self.call(self.worker('parity', '--shape', arg, '--batch', '4'), label)
                self.r['parity'] = lines[-1] if lines else {'error': 'no result'}
                if not self.r['parity'].get('ok'):
                    self.r['failed'].append('parity: outside the tolerances or not run')
                self.cudnn_check(self.r['parity'])
            elif part == 'peak':
                lines = self.call(self.worker('peak'), label)
                if lines:
                    self.r['peak'] = lines[-1]
                    peak = lines[-1]['by_dtype']['bfloat16']['peak_tflops'] * 1e12
            elif part == 'jax':
                shape, precision = arg
                lines = self.call(self.worker('jax', '--shape', shape, '--precision', precision,
                                              '--batch', str(a.batch), '--steps', str(a.steps),
                                              '--warmup', str(a.warmup)), label)
                group = self.r['rows'].setdefault(f'{shape} {precision}', {})
                group['jlearngene'] = derive(lines[-1], peak) if lines else {'error': 'no result'}
            elif part == 'torch':
                shape, variants = arg
                variants = ','.join(v for v in variants.split(',') if v.split('-')[0] in a.precisions)
                lines = self.call(self.torch_cmd(shape, variants), label)
                for line in lines:
                    precision, mode = line['variant'].split('-')
                    group = self.r['rows'].setdefault(f'{shape} {precision}', {})
                    row = dict(line, torch_shape=line.get('shape'), shape=shape, batch=a.batch)
                    if 'error' not in line:
                        row = derive(dict(row, step_s=line['step_ms'] / 1e3), peak)
                    group[f'torch-{mode}'] = row
            elif part == 'methods':
                shape, precision = arg
                lines = self.call(self.worker('methods', '--shape', shape, '--precision', precision,
                                              '--batch', str(a.batch), '--rounds', str(a.rounds)),
                                  label)
                self.r['methods'][f'{shape} {precision}'] = lines
                self.r['failed'] += [f"{label} {ln['name']}: {ln['error']}"
                                     for ln in lines if 'error' in ln]
            self.r['aim'] = self.aim()
            self.save()
        self.save()
        print(format_table(self.r))
        print(f'results written to {a.out}.json and {a.out}.md')
        return 1 if self.r['failed'] else 0

    def cudnn_check(self, parity: dict) -> None:
        """Turn the cuDNN attention off for the later parts (and say so) when the parity
        check's bfloat16 step with it failed or disagreed with the reference ops."""
        from gpu_parity import worst
        if 'bfloat16_backends_vs_reference' in parity:
            bad = worst(parity['bfloat16_backends_vs_reference']) > parity['bf16_tol']
        else:
            bad = 'cudnn' in self.last_err.lower()
        self.r['machine']['cudnn_attention'] = 'off: the parity check failed with it' if bad else 'on'
        if bad:
            self.env['JLEARNGENE_GPU_CUDNN_ATTENTION'] = '0'

    def aim(self) -> dict:
        group = self.r['rows'].get(f"{AIM['shape']} {AIM['precision']}", {})
        j, c = group.get('jlearngene', {}), group.get('torch-compile', {})
        out = {'mfu_pct': j.get('mfu_pct')}
        if 'img_per_s' in j and 'img_per_s' in c:
            out['vs_torch_compile'] = j['img_per_s'] / c['img_per_s']
        out['met'] = bool(out['mfu_pct'] and out['mfu_pct'] >= AIM['mfu_pct']
                          and out.get('vs_torch_compile', 0) >= AIM['vs_torch_compile'])
        return out

    def torch_available(self) -> tuple[bool, str]:
        if self.args.no_torch:
            return False, 'skipped (--no-torch)'
        if not os.path.exists(self.args.torch_ref):
            return False, f'reference script not found at {self.args.torch_ref}'
        rc = subprocess.run([sys.executable, '-c', 'import torch, sys; '
                             'sys.exit(0 if torch.cuda.is_available() else 1)'],
                            capture_output=True).returncode
        return rc == 0, '' if rc == 0 else 'torch is not importable or sees no CUDA device'

    def torch_cmd(self, shape: str, variants: str) -> list[str]:
        from jlearngene.models.config import VARIANTS
        v = VARIANTS[SHAPES[shape]]
        a = self.args
        return [sys.executable, os.path.join(HERE, 'torch_on_device.py'), '--ref', a.torch_ref,
                '--device', 'cuda', '--dim', str(v['width']), '--depth', str(DEPTH),
                '--heads', str(v['num_heads']), '--mlp-ratio', str(v['mlp_dim'] / v['width']),
                '--image', str(IMAGE), '--patch', str(PATCH), '--classes', str(CLASSES),
                '--batch', str(a.batch), '--steps', str(a.steps), '--warmup', str(a.warmup),
                '--variants', variants, '--sync', 'end', '--fused-adamw']


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == '--worker':
        return worker_main(argv)
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--budget-s', type=float, default=450,
                   help='wall-time budget; parts that would not fit are skipped (default %(default)s)')
    p.add_argument('--parts', default='parity,peak,jax,torch,methods')
    p.add_argument('--shapes', default='S/16,B/16', help='rows and methods of these shapes')
    p.add_argument('--precisions', default='bf16,fp32', help='rows of these precisions')
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--steps', type=int, default=10, help='timed steps per row')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--rounds', type=int, default=5, help='timed rounds per method case')
    p.add_argument('--torch-ref', default=DEFAULT_TORCH_REF)
    p.add_argument('--no-torch', action='store_true')
    p.add_argument('--out', default=os.path.join(HERE, 'results_gpu_224'),
                   help='path prefix of the .json and .md results (default %(default)s)')
    a = p.parse_args(argv)
    a.parts = set(a.parts.split(','))
    a.shapes, a.precisions = set(a.shapes.split(',')), set(a.precisions.split(','))
    for flag, value, known in (('--parts', a.parts, {part for part, _, _ in PLAN}),
                               ('--shapes', a.shapes, set(SHAPES)),
                               ('--precisions', a.precisions, set(PRECISIONS))):
        if value - known:
            p.error(f'{flag}: unknown {sorted(value - known)}, expected some of {sorted(known)}')
    a.torch_ref = os.path.abspath(a.torch_ref)
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')   # before jax starts
    if problem := gpu_problem():
        print(problem, file=sys.stderr)
        return 2
    return Driver(a).run()


if __name__ == '__main__':
    sys.exit(main())
