"""The headline table of the transfer studies (the top README's), from their records alone:
per study, label budget and shape, converged Scratch (the floor), then for each method (at
its first variant, its paper's default) the descendant's accuracy at its paper's budget
against converged Scratch (Δ and Welch's p), the share of the ceiling's gain it keeps at
Scratch's own steps, (method − Scratch) / (ceiling − Scratch), beside what it stores (its
gene's parameters over the source model's, heads left out), the training FLOPs until it
first reaches Scratch's converged accuracy − 0.5 pt (its own, read from its run at
Scratch's steps, plus its upstream amortised over N descendants, without and with the
pretrained source), and each study's verdict counts. A record without runs at Scratch's
steps (its ceiling fine-tuned at a fraction of S) gives all of these at the paper budgets;
the legend under the table (`legend`) says which budgets its records hold.

    jlearngene render --headline experiments/tleg/fashion experiments/letra/fashion ...
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

import jax
import numpy as np

from jlearngene import pytree
from jlearngene.experiments import harness, results, study
from jlearngene.experiments.report import gflops
from jlearngene.models import init
from jlearngene.experiments.results import shape_key, shape_text

AMORTISE = (1, 4, 10)
HEADS = ('head', 'pre_logits')    # a gene's size and the source's leave the task heads out


def load(workdir: str) -> dict:
    """A transfer study's finished record (results.json, summaries recomputed), or a one-line
    `results.ResultsError` naming the file and field for a record without label budgets, one
    whose fields do not fit together (`results.read`) or one whose config plans no study
    (what the headline stores is read from the plan)."""
    recorded = results.read(workdir, transfer=True)
    path = os.path.join(workdir, 'results.json')
    _plans(recorded['config'], path)
    return study.finish(recorded, results.claims(recorded, path))


def _plans(config: dict, where: str) -> None:
    """A ResultsError naming `where` unless the recorded `config` plans its study
    (`study.plan`, shapes only), as the headline's gene sizes need."""
    try:
        study.plan(config, len(config['tasks']['descendant']))
    except KeyError as e:
        raise results.ResultsError(f'{where}: config: no {e.args[0]!r}, which the study\'s plan '
                                   'reads') from None
    except (TypeError, ValueError, AttributeError) as e:
        raise results.ResultsError(f'{where}: config: plans no study ({e})') from None


@functools.cache
def _stored(config_json: str, num_classes: int, info_json: str) -> dict:
    """{(row name, shape key): gene parameters, heads left out, the mean over the recorded
    seeds} and the source model's ('source', ''), from the config's shapes (`study.plan`) and,
    where the data fixes a gene's shapes (Cluster-Learngene's centroid counts), each seed's
    upstream info (`info_json`: {seed: info})."""
    config, infos = json.loads(config_json), list(json.loads(info_json).values()) or [{}]
    ctx = harness.Context(config, num_classes=num_classes)
    ctx.rows = study.make_rows(config)
    plan = study._plan(ctx, ctx.rows)
    out = {}
    for row in ctx.rows:
        m = row.recipe.method(row)
        for shape, cfg in plan[row.name].items():
            if isinstance(cfg, str) or m.gene_param_count is None:
                continue
            genes_ = [row.recipe.recorded_gene_shapes(ctx, row, cfg, info) for info in infos]
            if all(g is not None for g in genes_):
                out[row.name, shape_key(shape)] = float(np.mean([m.gene_param_count(g) for g in genes_]))
    source = jax.eval_shape(functools.partial(init, ctx.ref), jax.random.key(0))
    out['source', ''] = sum(int(np.prod(x.shape)) for path, x in pytree.flatten(source).items()
                            if path.split('/')[0] not in HEADS)
    return out


def shown(rows_spec: Sequence[str]) -> set[str]:
    """The rows a headline shows: each method once, at its first variant ('letra/continuous',
    'cluster/clustered': its paper's default). The other variants are ablations and controls;
    their numbers are in the study's own record."""
    methods, out = set(), set()
    for name in rows_spec:
        if name.split('/')[0] not in methods:
            methods.add(name.split('/')[0])
            out.add(name)
    return out


def entries(recorded: dict, name: str) -> list[dict]:
    """One entry per (label budget, row `shown`, shape) of a transfer study's record
    `recorded`: `results.versus_scratch`'s (accuracy, Δ and p at the paper's budget, the
    ceiling share at Scratch's steps), the `budget_kind` and `steps` that accuracy was
    fine-tuned at, what the row stores and its FLOPs to the target, read from its run at
    Scratch's steps where it has one (evaluated at least 20 times), else from its paper's
    budget. Converged Scratch comes first at each shape: the floor, with its own FLOPs to the
    target."""
    config = recorded['config']
    out = []
    for key, sub in recorded['budgets'].items():
        stored = _stored(json.dumps(config, sort_keys=True), len(config['tasks']['descendant']),
                         json.dumps(sub.get('info', {}), sort_keys=True))
        rows = shown(sub['rows_spec']) | {'scratch'}
        for e in (e for e in results.versus_scratch(sub) if e['name'] in rows):
            s, genes_ = e.pop('summary'), stored.get((e['name'], shape_key(e['shape'])))
            at = dict(budget_kind=results.budget_kind(s), steps=s['steps'])
            if e['equal'] is not None:      # FLOPs to the target: the run at Scratch's steps
                s = e['equal'].pop('summary')
            reach = s['reach_flops']
            out.append(dict(
                e, **at, study=name, budget=key, labels=sub['label_fraction'],
                stored=None if genes_ is None else genes_ / stored['source', ''],
                flops={n: None if reach is None else dict(
                    without_source=reach + s['upstream_flops_without_source'] / n,
                    with_source=reach + s['upstream_flops'] / n) for n in AMORTISE}))
    return out


def verdict_counts(recorded: dict) -> dict[str, dict[str, int]]:
    """{label budget: {verdict: count}} of a transfer study's claims."""
    out = {}
    for key, sub in recorded['budgets'].items():
        counts = {}
        for v in sub['verdicts']:
            counts[v['verdict']] = counts.get(v['verdict'], 0) + 1
        out[key] = counts
    return out


def markdown(records: Sequence[tuple[str, dict]]) -> str:
    """The headline table of `records` [(study name, record)], one row per (study, label
    budget, method, shape), then each study's verdict counts."""
    rows = [e for name, recorded in records for e in entries(recorded, name)]
    column = 'ceiling share' + (" at Scratch's steps" if _ceiling_at_equal(rows) else '')
    head = ("| study | labels | shape | method | acc. at paper budget (mean ± std) | Δ vs Scratch | Welch p "
            f"| {column} | stores (of source) "
            '| GFLOPs to Scratch − 0.5 pt, N = 1 / 4 / 10: w/o source | with source |')
    lines = [head, '|' + '---|' * (head.count('|') - 1)]
    for e in rows:
        name = e['study']
        floor = e['name'] == 'scratch'      # Scratch has no upstream: both FLOPs columns agree
        label, delta, p, share, stored = (
            ('Scratch (converged, the floor)', '–', '–', '0', '–') if floor else (
                e['label'], f"{e['delta']:+.4f}", 'n/a' if e['p'] is None else f"{e['p']:.3g}",
                '–' if e['ceiling_share'] is None else f"{e['ceiling_share']:+.2f}",
                '–' if e['stored'] is None else f"{e['stored']:.2f}"))
        flops = [' / '.join(gflops(None if e['flops'][n] is None else e['flops'][n][k]) for n in AMORTISE)
                 for k in ('without_source', 'with_source')]
        lines.append(f"| {name} | {e['labels'] * 100:g} % | {shape_text(e['shape'])} | {label} | "
                     f"{e['acc']:.4f} ± {e['std']:.4f} | {delta} | {p} | {share} | {stored} | "
                     f"{flops[0]} | {flops[1]} |")
    lines += ['', legend(rows)]
    lines += ['', verdict_line(records)]
    return '\n'.join(lines)


def _range(xs) -> str:
    lo, hi = min(xs), max(xs)
    return f'{lo:,}' if lo == hi else f'{lo:,}–{hi:,}'


def _ceiling_at_equal(rows: Sequence[dict]) -> bool:
    """Whether every ceiling among `entries` `rows` was fine-tuned for Scratch's steps (so
    every ceiling share compares runs at Scratch's steps); True where there is no ceiling."""
    return all(e['budget_kind'] == 'equal' for e in rows if e['name'] == 'ceiling')


def legend(rows: Sequence[dict]) -> str:
    """The legend under `markdown`'s table of `entries` `rows`, saying what the records hold:
    the budget each study's ceiling was fine-tuned at (Scratch's steps, or a fraction of S
    with its steps against Scratch's), at which budgets a ceiling share compares, and which
    run the FLOPs to the target are read from."""
    studies = list(dict.fromkeys(e['study'] for e in rows))
    ceilings = {n: [e for e in rows if e['study'] == n and e['name'] == 'ceiling'] for n in studies}
    ceilings = {n: c for n, c in ceilings.items() if c}
    at_equal = {n: _ceiling_at_equal(c) for n, c in ceilings.items()}
    if not ceilings:
        ceiling = ''
    elif all(at_equal.values()):
        ceiling = " (the ceiling: at Scratch's steps, its only budget)"
    else:
        parts = []
        for n, c in ceilings.items():
            if at_equal[n]:
                parts.append(f"{n} at Scratch's steps")
                continue
            paper = [e for e in c if e['budget_kind'] != 'equal']
            fractions = '/'.join(f'{f:g}' for f in sorted({e['fraction'] for e in paper}))
            scratch = [e['steps'] for e in rows if e['study'] == n and e['name'] == 'scratch']
            parts.append(f"{n} {fractions}·S, {_range([e['steps'] for e in paper])} steps against "
                         f"Scratch's {_range(scratch)}"
                         + (" (at Scratch's steps elsewhere)" if len(paper) < len(c) else ''))
        ceiling = f" (the ceiling as its record fine-tuned it: {'; '.join(parts)})"
    if not ceilings:
        share = "– throughout: these records have no ceiling row"
    elif not any(at_equal.values()):
        share = ("the method at its paper budget and the ceiling at the budget above (these records "
                 "have no ceiling run at Scratch's steps), – where the ceiling is not above Scratch")
    elif all(at_equal.values()):
        share = "both fine-tuned for Scratch's own steps, – where the ceiling is not above Scratch"
    else:
        share = ("both fine-tuned for Scratch's own steps where the record has that budget (else at "
                 'the largest), – where the ceiling is not above Scratch')
    if any(e['equal'] is not None for e in rows if e['name'] != 'scratch'):
        flops = "in the run at Scratch's steps where there is one"
    else:
        flops = "in the run at the paper budget: these records have no run at Scratch's steps"
    return (f"Accuracy, Δ and Welch p: at the method's paper budget{ceiling}. Ceiling share: "
            f"(method − Scratch) / (ceiling − Scratch), {share}. Stores: the gene's parameters over "
            "the source model's, heads left out. "
            'GFLOPs: own training until the first evaluation at Scratch − 0.5 pt '
            f'({flops}) plus upstream / N, – where a seed never reaches it. A method with variants '
            "shows its first, its paper's default; the others are in its study's record.")


def verdict_line(records: Sequence[tuple[str, dict]]) -> str:
    """Each study's verdict counts per label budget; a study without paper claims (the
    comparison: label budgets, none with a verdict) says so instead of counting zeros, and
    one without label budgets says that."""
    parts = []
    for name, recorded in records:
        counts = verdict_counts(recorded)
        if not counts:
            parts.append(f'{name}: no label budgets')
            continue
        if not any(counts.values()):
            parts.append(f'{name}: no paper claims of its own')
            continue
        parts += [f"{name} at {float(key) * 100:g} %: {c.get('reproduced', 0)} / "
                  f"{c.get('not reproduced', 0)} / {c.get('not testable here', 0)}"
                  for key, c in counts.items()]
    return 'Verdicts (reproduced / not reproduced / not testable here): ' + '; '.join(parts) + '.'


def table(workdirs: Sequence[str]) -> str:
    """`markdown` of the transfer records in `workdirs`, each named by its experiment, and by
    its folder as well where several records are of one experiment ('letra
    (runs/letra_b)'); a folder given twice is a one-line ValueError (its rows would count
    twice)."""
    _once(workdirs)
    records = [load(w) for w in workdirs]
    experiments = [r['config']['experiment'] for r in records]
    return markdown([(e if experiments.count(e) == 1 else f'{e} ({os.path.normpath(w)})', r)
                     for e, w, r in zip(experiments, workdirs, records)])


def _once(workdirs: Sequence[str]) -> None:
    """A ValueError naming a folder that `workdirs` gives twice (the same folder by any
    path)."""
    seen: dict[str, str] = {}
    for w in workdirs:
        real = os.path.realpath(w)
        if real in seen:
            same = '' if seen[real] == w else f' (as {seen[real]!r} and {w!r})'
            raise ValueError(f'{w}: the same record given twice{same}; each study counts once')
        seen[real] = w


__all__ = ['entries', 'legend', 'load', 'markdown', 'shown', 'table', 'verdict_counts', 'verdict_line']


def readme_table(recorded: dict, labels: str = '0.01') -> str:
    """The README's short headline: one transfer study's record `recorded` (the comparison's,
    where every method descends from one teacher), at the label budget `labels` (a key of
    its `budgets`) and the shape with the most methods (the first such): one row per method
    `shown`, with what it stores, its ceiling share, Δ against converged Scratch and Welch's p,
    after one line naming the study, the budget, the shape and Scratch's accuracy, and
    saying what a ceiling share is.

    Args:
        recorded: a transfer study's record, as `load` returns it.
        labels: the label budget, as the record's `budgets` key (`'0.01'`: 1 %).

    Returns:
        Markdown: the caption line, a blank line, then the table.

    Raises:
        KeyError: the record has no label budget `labels`.
    """
    name = recorded['config']['experiment']
    if labels not in recorded['budgets']:
        raise KeyError(f'{name}: no label budget {labels!r} (it has {", ".join(recorded["budgets"])})')
    rows = [e for e in entries(recorded, name) if e['budget'] == labels]
    shapes = [tuple(e['shape']) for e in rows]
    shape = max(dict.fromkeys(shapes), key=shapes.count)
    rows = [e for e in rows if tuple(e['shape']) == shape]
    floor = next(e for e in rows if e['name'] == 'scratch')
    lines = [f"The `{name}` study, {float(labels) * 100:g} % of the new task's labels, shape "
             f"{shape_text(list(shape))}: converged Scratch {floor['acc']:.4f} ± {floor['std']:.4f} over "
             f"{floor['seeds']} seeds. Ceiling share: (method − Scratch) / (ceiling − Scratch), – where "
             'the ceiling is not above Scratch.', '',
             '| method | stores (of source) | ceiling share | Δ vs Scratch | Welch p |', '|---|---|---|---|---|']
    for e in rows:
        if e['name'] == 'scratch':
            continue
        lines.append('| {} | {} | {} | {:+.4f} | {} |'.format(
            e['label'], '–' if e['stored'] is None else f"{e['stored']:.2f}",
            '–' if e['ceiling_share'] is None else f"{e['ceiling_share']:+.2f}", e['delta'],
            'n/a' if e['p'] is None else f"{e['p']:.3g}"))
    return '\n'.join(lines)


__all__ += ['readme_table']
