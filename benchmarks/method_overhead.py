#!/usr/bin/env python3
"""Each method's training-step overhead against the plain ViT step it stands in for.

    python benchmarks/method_overhead.py            # every case of benchmarks/overhead/
    python benchmarks/method_overhead.py --quick    # smaller shapes, fewer steps
    python benchmarks/method_overhead.py --only tleg,letra

A case (`benchmarks/overhead/<method>.py`, `case(quick) -> dict`) gives the method's own
step (e.g. materialise the Aux-Net from the gene, then the loss) and the plain step of the
same shape, both compiled. They run alternately, one call each per round, so both see the
same load; the overhead is the median over rounds of method/plain - 1. Prints a table and
writes every number to `benchmarks/method_overhead.json` (`--json PATH`).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _call(fn_args):
    import jax
    fn, args = fn_args
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def measure(case: dict, rounds: int, warmup: int) -> dict:
    """Alternate plain and method calls; per-round times and the median ratio."""
    for _ in range(warmup):
        _call(case['plain'])
        _call(case['method'])
    plain, method = [], []
    for _ in range(rounds):
        plain.append(_call(case['plain']))
        method.append(_call(case['method']))
    ratios = [m / p for m, p in zip(method, plain)]
    return dict(name=case['name'], shape=case['shape'], plain_s=statistics.median(plain),
                method_s=statistics.median(method), overhead=statistics.median(ratios) - 1,
                plain_all=plain, method_all=method)


def case_names() -> list[str]:
    import overhead
    return sorted(m.name for m in pkgutil.iter_modules(overhead.__path__))


def format_table(rows: list[dict]) -> str:
    lines = ['| method | shape | plain step ms | method step ms | overhead |',
             '|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['name']} | {r['shape']} | {r['plain_s'] * 1e3:.1f} | "
                     f"{r['method_s'] * 1e3:.1f} | {100 * r['overhead']:+.1f} % |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--quick', action='store_true', help='small shapes, 3 rounds')
    p.add_argument('--only', default='', help='comma-separated case names')
    p.add_argument('--rounds', type=int, default=0, help='timed rounds (default 10, quick 3)')
    p.add_argument('--json', default=os.path.join(HERE, 'method_overhead.json'))
    a = p.parse_args(argv)
    names = [n for n in case_names() if not a.only or n in a.only.split(',')]
    rounds = a.rounds or (3 if a.quick else 10)
    rows = []
    for name in names:
        case = importlib.import_module(f'overhead.{name}').case(a.quick)
        rows.append(measure(case, rounds, warmup=1 if a.quick else 2))
        print(f"{name}: {100 * rows[-1]['overhead']:+.1f} %", flush=True)
    import jax
    from run import _cpu_model      # benchmarks/run.py, beside this script
    meta = dict(backend=jax.default_backend(), cpu=_cpu_model(), quick=a.quick, rounds=rounds,
                load=os.getloadavg()[0], date=time.strftime('%Y-%m-%d'))
    with open(a.json, 'w', encoding='utf-8') as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(format_table(rows))
    print(f"{meta['backend']} ({meta['cpu']}), load {meta['load']:.1f}, {rounds} rounds")
    return 0


if __name__ == '__main__':
    sys.exit(main())
