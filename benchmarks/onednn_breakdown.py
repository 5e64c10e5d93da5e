#!/usr/bin/env python3
"""Where the oneDNN time of one CPU training step goes: GEMM kernels vs operand reorders.

    python benchmarks/onednn_breakdown.py                        # Ti-12, batch 128
    python benchmarks/onednn_breakdown.py --variant S --batch 64 --top 20

On CPU the step's dots run in oneDNN (`jlearngene.compiler`, `jlearngene.ops.cpu.onednn`). oneDNN's matmul reads its
first operand (A, M×K) in place only when it is row-major; a transposed A is first copied
into row-major order, and the second operand (B, K×N) is always copied into oneDNN's blocked
layout, since XLA passes it as a fresh (non-constant) tensor on every call. For the forward and
input-gradient products B is a weight matrix and the copy is small, but the weight gradients
xᵀ·g contract over the 8320 tokens of the batch, so both operands are activations and both
are copied every step. This tool runs the step once with `ONEDNN_VERBOSE=1` (in a child
process, since oneDNN reads the variable when it loads) and sums oneDNN's own execution
times per primitive: the GEMM kernels, the reorders that transpose an operand, and those
that block B.

oneDNN times each primitive by its own wall clock. XLA:CPU runs independent operations
concurrently on the same cores, so the times of overlapping primitives add up to more than
the step's wall time. Read the table as shares of oneDNN's work, not as a wall-time split.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = '@@onednn_breakdown@@'
_PROBLEM = re.compile(r'^(\d+(?:x\d+)*):(\d+(?:x\d+)*)$')


def parse_verbose(lines) -> list[dict]:
    """The primitive executions of `ONEDNN_VERBOSE=1` output lines.

    Each record: {'kind': 'matmul' | 'gemm_api' | 'reorder: transpose' |
    'reorder: to blocked' | another oneDNN primitive kind, 'impl', 'problem', 'ms', 'flop'}.
    'flop' is 2·M·K·N times the batch size for a matmul or a call of oneDNN's sgemm
    interface (`gemm_api`, what XLA's Eigen dots use), and 0 otherwise. Graph-level lines,
    info lines and anything else are skipped.
    """
    records = []
    for line in lines:
        f = line.strip().split(',')
        if len(f) < 8 or f[0] != 'onednn_verbose' or f[2] != 'primitive' or f[3] != 'exec':
            continue
        kind, impl, problem = f[5], f[6], f[-2]
        try:
            ms = float(f[-1])
        except ValueError:
            continue
        flop = 0
        if kind == 'reorder':
            dst = re.search(r'dst:\S*?:blocked:(\w+)', line)
            kind = 'reorder: to blocked' if dst and re.search('[A-Z]', dst.group(1)) else \
                'reorder: transpose'
        elif kind in ('matmul', 'gemm_api'):
            m = _PROBLEM.match(problem)
            if m:
                a = [int(v) for v in m.group(1).split('x')]
                b = [int(v) for v in m.group(2).split('x')]
                flop = 2 * math.prod(a) * b[-1]
        records.append({'kind': kind, 'impl': impl, 'problem': problem, 'ms': ms, 'flop': flop})
    return records


def summarise(records: list[dict], calls: int = 1, steps_per_call: int = 1, top: int = 16) -> str:
    """A table of the records per optimiser step: totals per kind, then the largest problems."""
    per_step = 1.0 / (calls * steps_per_call)
    by_kind: collections.Counter = collections.Counter()
    by_problem: dict = collections.defaultdict(lambda: [0, 0.0, 0])
    for r in records:
        by_kind[r['kind']] += r['ms']
        entry = by_problem[(r['kind'], r['problem'])]
        entry[0] += 1
        entry[1] += r['ms']
        entry[2] += r['flop']
    total = sum(by_kind.values())
    out = [f"{'oneDNN primitive':22s} {'ms/step':>9s} {'share':>6s}"]
    for kind, ms in by_kind.most_common():
        out.append(f'{kind:22s} {ms * per_step:9.1f} {100 * ms / max(total, 1e-9):5.1f}%')
    out.append(f"{'all':22s} {total * per_step:9.1f}")
    out.append('')
    out.append(f"{'ms/step':>8s} {'n/step':>6s} {'GFLOP/s':>8s}  {'primitive':20s} problem")
    for (kind, problem), (n, ms, flop) in sorted(by_problem.items(), key=lambda kv: -kv[1][1])[:top]:
        rate = f'{flop / ms / 1e6:8.1f}' if flop else f"{'':8s}"
        out.append(f'{ms * per_step:8.1f} {n * per_step:6.1f} {rate}  {kind:20s} {problem}')
    return '\n'.join(out)


def _mark(*extra) -> None:
    """Print the marker after everything oneDNN has written (its C stdio buffer first)."""
    ctypes.CDLL(None).fflush(None)
    print(MARK, *extra, flush=True)


def _child(a) -> int:
    sys.path.insert(0, HERE)
    from run import warm_step

    run, _, k, _ = warm_step(a.variant, a.depth, a.batch, steps_per_call=a.steps_per_call,
                          warmup=a.warmup)
    _mark(k)
    for _ in range(a.calls):
        run()
    _mark()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--variant', default='Ti')
    p.add_argument('--depth', type=int, default=12)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--steps-per-call', default='1',
                   help="optimiser steps per compiled call, or 'auto' (as run.py)")
    p.add_argument('--calls', type=int, default=1, help='calls recorded (after the warm-up)')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--top', type=int, default=16)
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return _child(a)

    env = dict(os.environ, ONEDNN_VERBOSE='1')
    cmd = [sys.executable, os.path.abspath(__file__), '--child'] + (argv if argv is not None
                                                                       else sys.argv[1:])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f'onednn_breakdown: the step process failed (exit {proc.returncode})')
    parts = proc.stdout.split(MARK)
    if len(parts) != 3:
        raise SystemExit('onednn_breakdown: no marked step in the output of the step process')
    k = int(parts[1].split()[0])
    records = parse_verbose(parts[1].splitlines()[1:])
    if not records:
        raise SystemExit('onednn_breakdown: no oneDNN primitive ran; on CPU the step uses oneDNN '
                         'only with jlearngene.compiler.options() (see benchmarks/README.md)')
    print(f'{a.variant}-{a.depth} batch {a.batch}, {a.calls} call(s) of {k} step(s); oneDNN '
          'times per primitive (concurrent primitives overlap, see the docstring)\n')
    print(summarise(records, calls=a.calls, steps_per_call=k, top=a.top))
    return 0


if __name__ == '__main__':
    sys.exit(main())
