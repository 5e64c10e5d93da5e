"""A study's tables and plot, from its results (`study.run`): pure functions of the dict
that `results.json` holds, so a recorded run can be re-rendered without training. Each
method family's recipe adds its own lines (`Recipe.report_lines`)."""
from __future__ import annotations

import os

import numpy as np

from jlearngene.experiments import recipes
from jlearngene.train import files
from jlearngene.experiments.results import (ALPHA, MIN_GAP, _mean_std, budget_kind, parse_key,
                                            shape_text, versus_scratch)


def gflops(x) -> str:
    """FLOPs in GFLOPs for tables ('–' for None)."""
    return '–' if x is None else f'{x / 1e9:.3g}'


def _break_even(s: dict) -> str:
    """'N* w/o / with source': the least number of descendants from which the method's
    total FLOPs to the target are below Scratch's; 'never' without a saving per descendant,
    '–' for Scratch and where a seed did not reach the target."""
    be = s.get('break_even')
    if not be:
        return '–'
    word = lambda n: 'never' if n is None else str(n)   # noqa: E731
    return f"{word(be['without_source'])} / {word(be['with_source'])}"


def _budget(s: dict) -> str:
    """A row's budget: Scratch's steps and lr, a separately trained width's steps, else the
    fraction of S and its steps (the mean taken where runs stopped at the target)."""
    if s['name'] == 'scratch':
        return f"{s['steps']} steps (lr {s['lr']:g})"
    if s['name'].startswith('separate'):
        return f"{s['steps']} steps"
    taken = s['steps_taken']
    stopped = f', {taken:.0f} taken' if taken < s['steps'] else ''
    if budget_kind(s) == 'equal':
        return f"Scratch's {s['steps']} steps ({s['fraction']:g}·S){stopped}"
    return f"{s['fraction']:g}·S = {s['steps']} steps{stopped}"


def _budget_over_shapes(rows: list[dict]) -> str:
    """`_budget` of one method's rows at one budget over its shapes: their range of steps
    where the shapes' S differ."""
    steps = sorted({s['steps'] for s in rows})
    if len(steps) == 1:
        return _budget(rows[0])
    span = f'{steps[0]}–{steps[-1]}'
    if budget_kind(rows[0]) == 'equal':
        return f"Scratch's {span} steps (by shape)"
    return f"{rows[0]['fraction']:g}·S = {span} steps (by shape)"


def doubling_text(b: dict) -> str:
    """A baseline's convergence by doubling in words: 'yes (2400: 0.902 → 4800: 0.905)' from
    its first seed's chain (held-out accuracy at n and at 2n); 'yes' for a record without
    chains, '**no** (...)' where a seed did not converge within the cap."""
    chains = [c for c in (b.get('doubling') or {}).values() if c]
    word = 'yes' if b['converged'] else '**no**'
    if not chains:
        return word
    chain, n = chains[0], b.get('steps')
    at = [i for i, (m, _, _) in enumerate(chain) if m == n]
    pair = chain[at[0]:at[0] + 2] if at else chain[-2:]
    return f"{word} ({' → '.join(f'{m}: {h:.3f}' for m, h, _ in pair)})"


def markdown(results: dict) -> str:
    """Scratch's baseline, the upstream runs, one row per (method, shape, budget) with mean ±
    std over the seeds and every FLOPs count, what cannot be made, and the verdicts (a
    transfer study: `transfer_markdown`)."""
    if 'budgets' in results:
        return transfer_markdown(results)
    cfg, ref = results['config'], results['reference']
    seeds = results['seeds']
    amortise = list(next(iter(results['summary']))['amortised']) if results['summary'] else []
    on_validation = any(b.get('chosen_on') == 'validation' for b in results['scratch'].values())
    sweep_head = 'lr × weight decay sweep (final validation acc.)' if on_validation else 'lr sweep (final acc.)'
    lines = [f"Seeds {seeds}; batch {cfg['batch_size']}; reference (teacher) shape "
             f"w{ref['width']} L{ref['depth']}, its Scratch plateau S = {ref['S']} steps. Target at "
             f"each shape: Scratch's mean final accuracy − {cfg['target_gap'] * 100:g} pt.", '',
             ('**Scratch** (lr × weight decay sweep on the first seed, chosen on the validation images, '
              'every seed at the chosen setting; S: the plateau step, first evaluation within '
              f"{cfg['scratch']['plateau'] * 100:g} pt of the final validation accuracy; acc.: final "
              'test accuracy):' if on_validation else
              '**Scratch** (lr sweep on the first seed, every seed at the chosen lr; S: the plateau '
              f"step, first evaluation within {cfg['scratch']['plateau'] * 100:g} pt of the final "
              'accuracy):'),
             *(['Converged: a run of n steps whose run of 2n steps ends less than '
                f"{cfg['scratch']['plateau'] * 100:g} pt higher on held-out accuracy (n: held-out "
                'accuracy → 2n: held-out accuracy, first seed).']
               if any(b.get('doubling') for b in results['scratch'].values()) else []), '',
             f"| shape | {sweep_head} | chosen {'setting' if on_validation else 'lr'} | steps | S | converged "
             '| acc. (mean ± std) | target |',
             '|---|---|---|---|---|---|---|---|']
    for key, b in results['scratch'].items():
        sweep = ', '.join(f'{lr}: {a:.3f}' for lr, a in b['sweep'].items())
        chosen = f"{b['lr']:g}" + (f", wd {b['weight_decay']:g}" if 'weight_decay' in b else '')
        lines.append(f"| {shape_text(parse_key(key))} | {sweep} | {chosen} | {b['steps']} | "
                     f"{b['S']} | {doubling_text(b)} | {b['acc']:.4f} ± {b['std']:.4f} | "
                     f"{b['acc'] - cfg['target_gap']:.4f} |")
    lines += ancestor_lines(results)
    edges = sweep_edges(results) if 'label_fraction' not in results else []   # a budget's: above
    lines += ['', edges[0]] if edges else []
    for recipe in recipes.REGISTRY.values():     # each family's own lines
        lines += recipe.report_lines(results)
    ups = results['upstream_flops']
    first = ups[str(seeds[0])] if str(seeds[0]) in ups else next(iter(ups.values()))
    lines += ['', 'Upstream runs per seed (training GFLOPs; the pretrained source: the teacher, the '
              "reference shape's Scratch run, and the small model the growth methods grow): "
              + ', '.join(f'{k} {gflops(v)}' for k, v in sorted(first.items())) + '.']
    # a label budget's seeds that borrow another source seed's upstream are not counted again
    borrowed = {k for k, v in results.get('upstream_seed', {}).items() if str(v) != k}
    accs = {}
    for seed, per_seed in results.get('info', {}).items():
        for k, v in per_seed.items():
            if k.endswith('_accuracy') and seed not in borrowed:
                accs.setdefault(k[:-len('_accuracy')], []).append(v)
    if accs:
        lines[-1] += (' Source-task test accuracy, per source seed: ' if 'upstream_seed' in results
                      else ' Test accuracy: ') + ', '.join(
            '{} {:.4f} ± {:.4f}'.format(k, *_mean_std(v)) for k, v in accs.items()) + '.'
    head = ['shape', 'method', 'budget', 'acc. at init', 'acc. (mean ± std)', 'target reached',
            'own GFLOPs', 'to target: own (GFLOPs)', 'upstream w/o / with source (GFLOPs)']
    head += [f'per descendant, N={n} (w/o / with source)' for n in amortise]
    head += ['beats Scratch from N = (w/o / with source)']
    lines += ['', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    order = {n: i for i, n in enumerate(['scratch'] + results['rows_spec'])}
    summary = sorted(results['summary'], key=lambda s: (results['shapes'].index(s['shape']),
                                                        order.get(s['name'], 99), s['fraction']))
    for s in summary:
        budget = _budget(s)
        init = '–' if s['acc_init'] is None else f"{s['acc_init']:.3f}"
        cells = [shape_text(s['shape']), s['label'], budget, init, f"**{s['acc']:.4f}** ± {s['std']:.4f}",
                 f"{s['reached']}/{s['seeds']}", gflops(s['own_flops']), gflops(s['reach_flops']),
                 f"{gflops(s['upstream_flops_without_source'])} / {gflops(s['upstream_flops'])}"]
        cells += [f"{gflops(a['without_source'])} / {gflops(a['with_source'])}" for a in s['amortised'].values()]
        cells.append(_break_even(s))
        lines.append('| ' + ' | '.join(cells) + ' |')
    lines += ['', *by_method(results)]
    cannot = [(results['labels'][n], k, why) for n, d in results['cannot'].items() for k, why in d.items()]
    if cannot:
        lines += ['', 'Shapes a method cannot make: ' + '; '.join(
            f"{lab} at {shape_text(parse_key(k))}: {why}" for lab, k, why in cannot) + '.']
    lines += ['', "Budgets are fractions of the shape's S (upstream: of the reference S). Own FLOPs: "
              "the descendant's fine-tuning plus any per-descendant operator; to target: own FLOPs "
              'until the first evaluation at the target (linear between evaluations; – where a '
              'seed never reaches it); per descendant for N descendants: upstream / N + own; '
              "N*: the least N with upstream + N × (FLOPs to target) below N × Scratch's FLOPs "
              'to the target. '
              'Costs: 3× forward FLOPs per training image (`costs`); distillation adds a teacher '
              f"forward. Wall time {results['seconds']:.0f} s{_reused_text(results)}."]
    if results.get('verdicts'):
        lines += ['', f"**Verdicts** (mean ± sample std over the seeds; a difference counts only where "
                      f"Welch's t-test gives p < {ALPHA:g} and, for accuracy, the gap is at least "
                      f"{MIN_GAP * 100:g} pt; p n/a: fewer than 2 seeds on a side or both constant):", '']
        lines += [f"* {v['claim']}: **{v['verdict']}**. {v['detail']}." for v in results['verdicts']]
    return '\n'.join(lines)


def _reused_text(results: dict) -> str:
    """The wall-time note of a run that read finished runs back (`harness.fit`)."""
    reused = results.get('reused') or []
    if not reused:
        return ''
    earlier = sum(results['timings'].get(n, 0.0) for n in reused)
    return (f' in this process; {len(reused)} of {len(results["timings"])} training runs had '
            f'finished in an earlier process in this workdir (same config, data and code: '
            f'{earlier:.0f} s of training then) and were read back')


def ancestor_lines(results: dict) -> list[str]:
    """Markdown lines for a study with two tasks: the ancestor's own baseline (its task, lr
    sweep, S, accuracy, convergence), then the other upstream models' (`upstream_model_lines`);
    nothing for a study on one task."""
    a = results.get('ancestor')
    if not a:
        return []
    sweep = ', '.join(f'{lr}: {acc:.3f}' for lr, acc in a['sweep'].items())
    steps = f"{a['steps']} steps; " if 'steps' in a else ''
    lines = ['', f"**Ancestor** (the teacher; classes {a['classes']}, relabelled; descendants on "
             f"classes {a['descendant_classes']}): lr sweep {sweep}; chosen {a['lr']:g}; {steps}S = {a['S']}; "
             f"test accuracy {a['acc']:.4f} ± {a['std']:.4f}"
             + (' (per seed: ' + ', '.join(f'{x:.4f}' for x in a['accs'].values()) + ')' if a.get('accs') else '')
             + f"; converged: {doubling_text(a)}."]
    return lines + upstream_model_lines(results)


def upstream_model_lines(results: dict) -> list[str]:
    """Markdown lines, one per upstream model trained to convergence besides the teacher
    (`upstream_models`: the ceiling's source models, the small model the growth methods
    grow): its lr, steps, test accuracy per seed and convergence by doubling."""
    made = results.get('upstream_models') or {}
    lines = []
    for name, b in made.items():
        tag, key = name.split(' ', 1)
        lines.append(f"**{tag.capitalize()} model {shape_text(parse_key(key))}** (source task): lr {b['lr']:g}"
                     + (f", weight decay {b['weight_decay']:g}" if 'weight_decay' in b else '')
                     + f"; {b['steps']} steps; test accuracy {b['acc']:.4f} ± {b['std']:.4f} (per seed: "
                     + ', '.join(f'{x:.4f}' for x in b['accs'].values()) + f"); converged: {doubling_text(b)}.")
    return [line for x in lines for line in ('', x)]


def by_method(results: dict) -> list[str]:
    """Markdown lines: per method at its largest budget, over the shapes it makes: the
    shapes, the runs that reached the target, the mean accuracy difference to Scratch at
    the same shapes, its FLOPs to the target against Scratch's (own + upstream without the
    source for one descendant; where every seed reached it) and the break-even N."""
    summary = [s for s in results['summary'] if s['name'] != 'scratch']
    scratch = {tuple(s['shape']): s for s in results['summary'] if s['name'] == 'scratch'}
    lines = ['**Per method** (its largest paper budget; Δ: accuracy minus Scratch\'s at the same shapes; '
             "FLOPs ratio: FLOPs to the target, upstream without the source counted for one "
             "descendant, over Scratch's, where every seed reached it):", '',
             '| method | budget | shapes made | runs at the target | Δ vs Scratch (mean) '
             '| FLOPs to target / Scratch\'s | beats Scratch from N (w/o source) |', '|---|---|---|---|---|---|---|']
    for name in results['rows_spec']:
        mine = [s for s in summary if s['name'] == name]
        mine = [s for s in mine if budget_kind(s) == 'paper'] or mine
        if not mine:
            continue
        top = max(s['fraction'] for s in mine)
        mine = [s for s in mine if s['fraction'] == top]
        delta = np.mean([s['acc'] - scratch[tuple(s['shape'])]['acc'] for s in mine])
        ratios = [(s['reach_flops'] + s['upstream_flops_without_source']) / scratch[tuple(s['shape'])]['reach_flops']
                  for s in mine if s['reach_flops'] is not None and scratch[tuple(s['shape'])]['reach_flops']]
        ratio = (f'{min(ratios):.2f}–{max(ratios):.2f}' if len(ratios) > 1 else f'{ratios[0]:.2f}') if ratios else '–'
        be = [s.get('break_even', {}).get('without_source') for s in mine if s.get('break_even')]
        be_text = ', '.join('never' if n is None else str(n) for n in be) if be else '–'
        lines.append(f"| {mine[0]['label']} | {_budget_over_shapes(mine)} | {len(mine)} | "
                     f"{sum(s['reached'] for s in mine)}/{sum(s['seeds'] for s in mine)} | "
                     f'{delta:+.4f} | {ratio} | {be_text} |')
    return lines


def mean_curve(rows: list[dict], start_key: str = 'upstream_flops_without_source'):
    """(total training FLOPs, mean accuracy) along runs of the same schedule, up to the
    shortest (a run stopped early at the target ends there): each run's upstream (without
    the pretrained source), its per-descendant extra and its fine-tuning so far."""
    pts = []
    for points in zip(*[r['curve'] for r in rows]):
        step = points[0][0]
        flops = np.mean([r[start_key] + r['extra_flops']
                         + step * r['step_flops']
                         for r in rows])
        pts.append((float(flops), float(np.mean([a for _, a in points]))))
    return pts


def plot(results: dict, workdir: str, filename: str = 'accuracy_vs_flops.png') -> list[str]:
    """accuracy_vs_flops.png: a panel per shape, test accuracy (mean over seeds) against total
    training FLOPs (upstream without the pretrained source for one descendant, plus its own), each
    method at Scratch's steps where it trained there, else at its largest budget, Scratch's
    target dashed; returns its path."""
    if 'budgets' in results:
        return transfer_plot(results, workdir)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    shapes = results['shapes']
    names = ['scratch'] + results['rows_spec']
    # at least two panels' width, so that one panel still has room for the legend below it
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.6 * max(2, len(shapes)), 3.4), squeeze=False,
                             sharey=True)
    for ax, shape in zip(axes[0], shapes):
        target = None
        for i, name in enumerate(names):
            rows = [r for r in results['rows'] if r['name'] == name and r['shape'] == shape]
            if not rows:
                continue
            # the run at Scratch's steps where there is one (evaluated most often), else the largest budget
            rows = [r for r in rows if budget_kind(r) == 'equal'] or rows
            top = max(r['fraction'] for r in rows)
            rows = [r for r in rows if r['fraction'] == top]
            target = rows[0]['target']
            pts = [(x / 1e9, y) for x, y in mean_curve(rows) if x > 0]
            if pts:
                ax.plot(*zip(*pts), marker='o', ms=2.5, color=f'C{i % 10}',
                        label=results['labels'].get(name, 'Scratch'))
        if target is not None:
            ax.axhline(target, color='grey', ls='--', lw=0.8)
        ax.set_xscale('log')
        low, high = ax.get_xlim()
        if high > 10 * low:          # decades labelled: the 2×, 3×, ... labels between them collide
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(shape_text(shape), fontsize=9)
        ax.set_xlabel('training GFLOPs (upstream w/o source + own)', fontsize=8)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('test accuracy (mean over seeds)')
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h), labels.append(lab)
    fig.legend(handles, labels, loc='lower center', ncol=min(6, max(1, len(labels))), fontsize=7)
    fig.tight_layout(rect=(0, 0.12 + 0.03 * (len(labels) // 7), 1, 1))
    path = os.path.join(workdir, filename)
    try:
        files.write_file(path, lambda tmp: fig.savefig(tmp, dpi=90))   # renamed into place whole
    finally:
        plt.close(fig)
    return [path]


# ----------------------------------------------------------------------------------------
# A transfer study: the source task, then one section per label budget.

def budget_title(sub: dict) -> str:
    """'1 % of the labels (300 images)' for a label budget's record."""
    return f"{sub['label_fraction'] * 100:g} % of the labels ({sub['labelled']} images)"


def transfer_markdown(results: dict) -> str:
    """The source task's baseline, then per label budget: the headline (each method against
    Scratch and the ceiling), the descendants' lr sweeps and the whole table of `markdown`."""
    first = next(iter(results['budgets'].values()))
    lines = ['## Source task', ''] + ancestor_lines(first)[1:]
    for sub in results['budgets'].values():
        borrowed = {k: v for k, v in sub['upstream_seed'].items() if str(v) != k}
        lines += ['', f'## {budget_title(sub)}', '',
                  f"Seeds {sub['seeds']}, each descending from the upstream of its own source seed"
                  + ''.join(f'; seed {k} from that of source seed {v}' for k, v in borrowed.items())
                  + '. Every lr, weight decay and plateau is chosen on the validation images '
                  '(held out of every labelled part); the test images give the numbers below. '
                  'Welch p: the method against converged Scratch; ceiling share: (method − '
                  'Scratch) / (ceiling − Scratch), where the ceiling is above Scratch.', '']
        lines += headline(sub) + [''] + ceiling_lines(sub)
        if sub.get('descend_sweeps'):
            lines += ['Descendant lr sweeps (first seed, final validation accuracy; "equal": at '
                      "Scratch's steps): "
                      + '; '.join(f"{k}: " + ', '.join(f'{lr} {a:.3f}' for lr, a in v.items())
                                  for k, v in sub['descend_sweeps'].items()) + '.', '']
        lines += sweep_edges(sub) + [markdown({**sub, 'ancestor': None})]
    return '\n'.join(lines)


def _sweeps(sub: dict) -> list[tuple[str, float, list[float], dict | None]]:
    """Every lr choice of a label budget's record: (who, chosen lr, the lrs swept, its
    extensions record or None where the record predates them)."""
    lrs = sorted(sub['config']['scratch']['lrs'])

    def last(b: dict):
        sw = (b.get('sweeps') or [None])[-1]
        return (sorted(float(x) for x in sw['scores']), sw) if sw else (lrs, None)

    picks = []
    if sub.get('ancestor'):
        picks.append(('the ancestor', sub['ancestor']['lr'], *last(sub['ancestor'])))
    picks += [(f'Scratch at {shape_text(parse_key(k))}', b['lr'], *last(b)) for k, b in sub['scratch'].items()]
    picks += [(f'the {name.split()[0]} model at {shape_text(parse_key(name.split()[1]))}', b['lr'], *last(b))
              for name, b in (sub.get('upstream_models') or {}).items()]
    ext = sub.get('descend_extensions') or {}
    picks += [(k, float(max(v, key=v.get)), sorted(float(x) for x in v), ext.get(k))
              for k, v in (sub.get('descend_sweeps') or {}).items()]
    return picks


def ceiling_lines(sub: dict) -> list[str]:
    """A line naming the shapes where the ceiling (the whole source model fine-tuned) does
    not end above converged Scratch: there no gene can pay off, a finding about the task
    pair rather than about a method; nothing where it is above everywhere or absent."""
    below = [(e['shape'], e['delta'], e['p']) for e in versus_scratch(sub)
             if e['name'] == 'ceiling' and e['delta'] <= 0]
    if not below:
        return []
    return ['The ceiling is not above converged Scratch at '
            + ', '.join(f"{shape_text(sh)} (Δ {d:+.4f}, {'p n/a' if p is None else f'p {p:.3g}'})"
                        for sh, d, p in below)
            + ': there fine-tuning the whole source model does not beat training from scratch, '
            'so no gene from it can.', '']


def sweep_edges(sub: dict) -> list[str]:
    """Lines on the lr choices of a label budget (the ancestor's, Scratch's, each descendant
    sweep's): which sweeps were extended past an edge, and which choices still sit at the
    largest or smallest lr tried (after the extensions: they hit the cap; in a record
    without extensions: a wider sweep could move the row); nothing when every choice is
    inside its sweep."""
    picks = _sweeps(sub)
    extended = [(who, e) for who, _, _, e in picks if e and e.get('extensions')]
    edges = {'largest': [], 'smallest': []}
    capped = []
    for who, lr, swept, e in picks:
        if len(swept) > 1 and lr in (swept[0], swept[-1]):
            (capped if e is not None else edges['largest' if lr == swept[-1] else 'smallest']).append(who)
    out = []
    if extended:
        out.append('Sweeps extended past an edge (a grid step at a time, at most twice): ' + '; '.join(
            f"{who}: " + ', '.join(f"{x['value']:g} ({x['side']})" for x in e['extensions'])
            for who, e in extended) + '.')
    if capped:
        out.append(f'Still at the edge after the extensions (hit the cap): {len(capped)} of {len(picks)} '
                   f'choices ({", ".join(capped)}).')
    if any(edges.values()):
        out.append('Chosen at the edge of its lr sweep (a wider sweep could move these): '
                   + '; '.join(f'the {edge} lr for {len(who)} of {len(picks)} choices ({", ".join(who)})'
                               for edge, who in edges.items() if who) + '.')
    return [line for x in out for line in (x, '')]


def headline(sub: dict) -> list[str]:
    """Per method and shape: final test accuracy against converged Scratch (Δ, Welch's p) at
    its paper's (largest) budget and at Scratch's own steps, and the ceiling share at
    Scratch's steps (`results.versus_scratch`)."""
    out = ["| shape | method | paper budget | acc. (mean ± std) | at the best validation step | Δ vs Scratch "
           "| Welch p | at Scratch's steps: acc. | Δ | Welch p | ceiling share |",
           '|---|---|---|---|---|---|---|---|---|---|---|']
    for e in versus_scratch(sub):
        best = '–' if e['acc_at_best_val'] is None else f"{e['acc_at_best_val']:.4f}"
        if e['name'] == 'scratch':
            out.append(f"| {shape_text(e['shape'])} | Scratch (converged) | {e['summary']['steps']} steps | "
                       f"{e['acc']:.4f} ± {e['std']:.4f} | {best} | – | – | – | – | – | 0 |")
            continue
        share = '–' if e['ceiling_share'] is None else f"{e['ceiling_share']:+.2f}"
        paper = budget_kind(e['summary']) == 'paper'
        p = 'n/a' if e['p'] is None else f"{e['p']:.3g}"
        q = e['equal']
        eq = ['–'] * 3 if q is None else [f"{q['acc']:.4f} ± {q['std']:.4f}", f"{q['delta']:+.4f}",
                                          'n/a' if q['p'] is None else f"{q['p']:.3g}"]
        cells = ([f"{e['fraction']:g}·S", f"{e['acc']:.4f} ± {e['std']:.4f}", best, f"{e['delta']:+.4f}", p]
                 if paper else ['–'] * 5)
        if not paper:      # a row at Scratch's steps only (the ceiling)
            eq = [f"{e['acc']:.4f} ± {e['std']:.4f}", f"{e['delta']:+.4f}", p]
        out.append(f"| {shape_text(e['shape'])} | {e['label']} | " + ' | '.join(cells + eq) + f' | {share} |')
    return out


def transfer_plot(results: dict, workdir: str) -> list[str]:
    """One `plot` per label budget: accuracy_vs_flops_l<fraction>.png."""
    return [path for key, sub in results['budgets'].items()
            for path in plot(sub, workdir, filename=f'accuracy_vs_flops_l{key}.png')]
