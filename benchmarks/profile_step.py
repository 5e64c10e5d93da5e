#!/usr/bin/env python3
"""Where the time of one training step goes, per XLA operation.

    python benchmarks/profile_step.py                       # Ti-12, batch 128 (the benchmark shape)
    python benchmarks/profile_step.py --variant S --batch 64 --top 40

Compiles the same step as `run.py` (b), runs a few warm-up steps, records one step with
`jax.profiler.trace(create_perfetto_trace=True)` and reads the trace back. Each moment of
the step's wall time is shared equally among the XLA operations running at that moment
(XLA:CPU runs independent operations concurrently), so the per-operation times add up to
the step's wall time. Operations are grouped by what their HLO does:

  matmul        fusions and ops that contain a dot or a convolution (YNNPACK, Eigen,
                cuBLAS ...)
  zero-fill     broadcasts of a constant: the buffers of the layer scan's saved residuals
  scan stacks   dynamic-update-slice / dynamic-slice: residuals copied into / out of them
  transpose     transposes and copies (layout changes)
  elementwise   the rest: LayerNorm, softmax, GELU, residual adds, optimiser update ...

and the top operations are listed with their output shape and the jax operation they come
from. `--steps-per-call K` profiles a call of K steps (as `trainer.fit` runs them) and
divides every time by K. The step compiles as the trainer's does (`jlearngene.compiler.jit`,
XLA's default options); `--compiler-option k=v` (repeatable) adds XLA debug options to this
compilation only.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

from jlearngene.commands.config_args import parse_override

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

_RUNTIME_EVENTS = ('Thunk', 'Slinky', 'PjRt', 'TfrtCpu', 'Execute')
_CONTROL_FLOW = ('while', 'call', 'conditional')


def hlo_ops(compiled) -> dict[str, dict]:
    """Op name -> {'shape', 'source', 'category'} for the instructions of a compiled program
    (a `jax.stages.Compiled`, read through its optimised HLO text)."""
    computations: dict[str, str] = {}
    name, body = None, []
    for line in compiled.as_text().splitlines():
        m = re.match(r'^(?:ENTRY )?%(\S+) ', line)
        if m and line.rstrip().endswith('{'):
            name, body = m.group(1), []
        elif line.startswith('}') and name:
            computations[name] = '\n'.join(body)
            name = None
        elif name:
            body.append(line)
    ops = {}
    for text in computations.values():
        # The shape is one array type or a tuple of them (multi-output fusions, loops).
        for m in re.finditer(r'^\s*(?:ROOT )?%(\S+) = (\([^=]*?\)|\S+) (\S+?)\((.*)$', text, re.M):
            op, shape, kind, rest = m.groups()
            if kind in _CONTROL_FLOW:   # containers: their bodies' operations are counted
                continue
            called = re.search(r'calls=%([\w.\-]+)', rest)
            inner = computations.get(called.group(1), '') if called else ''
            source = re.search(r'op_name="([^"]*)"', rest)
            if kind in ('dot', 'convolution') or ' dot(' in inner or ' convolution(' in inner:
                cat = 'matmul'
            elif 'dynamic-update-slice' in op or 'dynamic-slice' in op:
                cat = 'scan stacks'
            elif kind == 'broadcast' or op.startswith('wrapped_broadcast'):
                cat = 'zero-fill'
            elif 'transpose' in op or op.startswith('copy'):
                cat = 'transpose'
            else:
                cat = 'elementwise'
            ops[op] = {'shape': shape, 'source': source.group(1) if source else '', 'category': cat}
    return ops


def wall_shares(events: list[dict]) -> dict[str, float]:
    """Per event name, its share of the wall time (concurrent events split each moment),
    in the events' time unit (microseconds for perfetto traces)."""
    points = []
    for e in events:
        points.append((e['ts'], 1, e['name']))
        points.append((e['ts'] + e['dur'], -1, e['name']))
    points.sort(key=lambda p: (p[0], p[1]))
    active: collections.Counter = collections.Counter()
    share: collections.Counter = collections.Counter()
    last = None
    for t, delta, name in points:
        if last is not None and active:
            n = sum(active.values())
            for a, c in active.items():
                share[a] += (t - last) * c / n
        last = t
        active[name] += delta
        if active[name] <= 0:
            del active[name]
    return dict(share)


def op_events(trace_file: str, known_ops: dict) -> list[dict]:
    with gzip.open(trace_file) as f:
        trace = json.load(f)
    events = trace['traceEvents'] if isinstance(trace, dict) else trace
    return [e for e in events if e.get('ph') == 'X' and e['name'] in known_ops
            and not any(r in e['name'] for r in _RUNTIME_EVENTS)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--variant', default='Ti')
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--mode', default='plain', choices=('plain', 'auxnet'))
    p.add_argument('--microbatches', type=int, default=1,
                   help='accumulate the gradient over this many parts of the batch')
    p.add_argument('--steps-per-call', default='1',
                   help="optimiser steps per compiled call, or 'auto' (as run.py); the times "
                        'printed are per step')
    p.add_argument('--dtype', default='float32', help="computation dtype ('bfloat16')")
    p.add_argument('--dense-precision', default='float32',
                   help="operands of the dense layers' matmuls ('bfloat16')")
    p.add_argument('--top', type=int, default=25)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--compiler-option', action='append', type=parse_override, default=[],
                   metavar='KEY=VALUE')
    p.add_argument('--trace-dir', default=None, help='keep the trace here (default: a temp dir)')
    a = p.parse_args(argv)

    import jax
    from run import model_flops, warm_step

    run, compiled, k, _ = warm_step(a.variant, a.depth, a.batch, a.mode,
                                 steps_per_call=a.steps_per_call, warmup=a.warmup,
                                 compiler_options=dict(a.compiler_option), dtype=a.dtype,
                                 microbatches=a.microbatches, dense_precision=a.dense_precision)
    ops = hlo_ops(compiled)
    trace_dir = a.trace_dir or tempfile.mkdtemp(prefix='jlearngene_trace_')
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        run()
    files = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True)
    if not files:
        raise SystemExit(f'profile_step: no perfetto trace written under {trace_dir}')
    events = op_events(max(files, key=os.path.getmtime), ops)
    if not events:
        raise SystemExit('profile_step: the trace holds no XLA operation events')
    # Per optimiser step: a call of k steps is k steps.
    span = (max(e['ts'] + e['dur'] for e in events) - min(e['ts'] for e in events)) / k
    shares = {name: us / k for name, us in wall_shares(events).items()}
    total = sum(shares.values())
    by_cat: collections.Counter = collections.Counter()
    for name, us in shares.items():
        by_cat[ops[name]['category']] += us
    flops = model_flops(a.variant, a.depth, a.batch)['train_step']
    # Trace times are in microseconds.
    print(f'{a.variant}-{a.depth} batch {a.batch} ({a.mode}, {k} step(s) per call) on '
          f'{jax.default_backend()}: {span / 1e3:.0f} ms per step from the first to the last XLA '
          f'operation (profiler on); operations run during {total / 1e3:.0f} ms, none during '
          f'{(span - total) / 1e3:.0f} ms '
          f'(gaps, and any operation the runtime does not trace, e.g. Eigen dots)')
    mm = by_cat.get('matmul', 0.0)
    print(f'matmul work {flops / 1e9:.1f} GFLOP in {mm / 1e3:.0f} ms of traced matmuls = '
          f'{flops / max(mm, 1e-9) / 1e3:.0f} GFLOP/s')
    print(f"\n{'category':14s} {'ms':>8s} {'share':>6s}")
    for cat, us in by_cat.most_common():
        print(f'{cat:14s} {us / 1e3:8.1f} {100 * us / total:5.1f}%')
    print(f"\n{'ms':>8s}  {'op':38s} {'category':12s} {'output':34s} source")
    for name, us in sorted(shares.items(), key=lambda kv: -kv[1])[:a.top]:
        o = ops[name]
        print(f"{us / 1e3:8.1f}  {name:38s} {o['category']:12s} {o['shape'][:34]:34s} "
              f"{o['source'][-60:]}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
