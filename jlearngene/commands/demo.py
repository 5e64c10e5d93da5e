"""`jlearngene demo [--workdir DIR] [--steps K]`: what a learngene is for, in a few minutes.

One small learned component, trained once and shipped with the package (the gene
`letra_digits`: `jlearngene info letra_digits`), becomes ViTs of four sizes that start far
ahead of random initialisation. Each descendant is evaluated at step 0 and fine-tuned K
steps (the recorded study's budget, 0.05·S of its shape, at the study's lr); Scratch of
the same shape trains the same K steps at its own tuned lr; beside them stands Scratch
converged, as the study's results.json records it (three seeds, to their plateau). One seed: the
table shows the effect, the verdicts are the study's. Curves go to DIR/demo_curves.png.

    jlearngene demo                          # about 1.5 minutes on 2 CPU cores, in workdirs/demo
    jlearngene demo --steps 200              # a longer fine-tuning for both

Why LeTra: the demo needs one small learned component that makes models of several widths
and depths, and on the fair records (digits, three seeds, the target Scratch's converged mean
− 0.5 pt) LeTra is the method that does: its descendants reached the target in 9 of 9 runs
in the comparison (experiments/compare: 0.35·S, +0.6 pt over Scratch) and in 17 of 24 runs
at 0.05·S in its own study (experiments/letra: 6 of 8 shapes, widths 32–64, depths 3–8;
IMwLM's weights selected from the whole teacher, 5 of 24). TLEG reached it in 4 of 12 runs
(experiments/tleg), and TLEG, Mini-Init (10 of 12) and Cluster-Learngene (6 of 6) make
other depths at the teacher's width only.
"""
from __future__ import annotations

import os
import sys
import time

HELP = 'a shipped gene grows ViTs of four sizes, beside Scratch at the same steps (~1.5 minutes)'
GENE = 'letra_digits'
SHAPES = ((32, 4), (40, 6), (48, 8), (64, 4))    # (width, depth): shapes the LeTra study recorded
DESCEND = {'selection': 'continuous'}            # the study's first variant
WORKDIR = 'workdirs/demo'
PNG = 'demo_curves.png'


def _parser():
    from jlearngene.commands.config_args import Parser
    p = Parser('jlearngene demo', __doc__)
    p.add_argument('--workdir', default=WORKDIR, help='where runs and the plot go (default: %(default)s)')
    p.add_argument('--steps', type=int, metavar='K',
                   help="fine-tuning steps for every shape (default: the study's 0.05·S of each shape)")
    return p


def grow(workdir: str, *, steps: int | None = None, shapes=SHAPES, say=None) -> dict:
    """Descendants of the shipped gene at `shapes`, each evaluated at step 0 and fine-tuned
    `steps` (default: the recorded study's budget for its shape), and Scratch trained as many
    steps at its tuned lr. Returns {'meta', 'record', 'rows': [{shape, params, K, gene:
    [(step, acc)], scratch: [(step, acc)], converged: {...}}]}."""
    import jax

    from jlearngene import artefacts, compiler, costs, zoo
    from jlearngene.experiments import configs, harness
    from jlearngene.experiments.results import shape_key, shape_text
    from jlearngene.models import init, vit
    from jlearngene.train import tasks
    method, gene, meta = artefacts.load_gene(zoo.path(GENE))   # checksums verified
    prov = meta['provenance']
    record, seed = prov['record'], int(prov['seed'])
    config = harness.plain(configs.load(prov['study']))
    dset = harness.Data(config)
    os.makedirs(workdir, exist_ok=True)
    rows = []
    for shape in shapes:
        t0 = time.perf_counter()
        key, sc = shape_key(shape), record['scratch'][shape_key(shape)]
        cfg = harness.shape_configs(config, shape, dset.num_classes)[0]
        K = steps or harness.fraction_steps(float(record['descend']['fraction']), int(sc['S']))
        every = max(1, K // int(record['descend']['evals']))
        descend = compiler.run_once_jit(
            lambda g, k, c=cfg: method.descend(g, c, key=k, **DESCEND),
            lambda g, k, c=cfg: vit.block_elements(c))
        loss, ev = tasks.classification_loss(cfg), harness.eval_fn(cfg)
        curves = {}
        for name, params, lr, run_seed in (
                ('gene', descend(gene, jax.random.key(seed + 100 + 10 * shape[0] + shape[1])),
                 float(record['descend']['lr']), seed + 7),
                ('scratch', init(cfg, jax.random.key(seed)), float(sc['lr']), seed)):
            acc0 = harness.accuracy(params, cfg, dset)
            _, curve, _ = harness.fit(f'{name}_{key}_k{K}_s{seed}', loss, params, ev, dset, steps=K,
                                      lr=lr, optim=config['optim'], workdir=workdir, seed=run_seed,
                                      eval_every=every, identity=config)
            curves[name] = [(0, acc0)] + [tuple(p) for p in curve]
        rows.append(dict(shape=shape, width=cfg.width, depth=cfg.depth, params=costs.param_count(cfg),
                         K=K, gene=curves['gene'], scratch=curves['scratch'], converged=sc,
                         scratch_lr=float(sc['lr'])))
        if say:
            say(f"{shape_text(shape)}: from the gene {curves['gene'][0][1]:.3f} -> "
                f"{curves['gene'][-1][1]:.3f}, Scratch -> {curves['scratch'][-1][1]:.3f} after {K} "
                f'steps ({time.perf_counter() - t0:.0f} s)')
    return dict(meta=meta, record=record, rows=rows)


def table(result: dict) -> str:
    """The demo's table: shape, parameters, K, the descendant at 0 and K steps, Scratch at K
    steps, Scratch converged (the record)."""
    lines = ['| width | depth | params | K | gene, step 0 | gene, step K | Scratch, step K (lr) '
             '| Scratch converged (steps) |',
             '|---|---|---|---|---|---|---|---|']
    for r in result['rows']:
        c = r['converged']
        lines.append(f"| {r['width']} | {r['depth']} | {r['params'] / 1e3:.0f}k | {r['K']} | "
                     f"{r['gene'][0][1]:.3f} | **{r['gene'][-1][1]:.3f}** | "
                     f"{r['scratch'][-1][1]:.3f} ({r['scratch_lr']:g}) | "
                     f"{c['acc']:.3f} ± {c['std']:.3f} ({c['steps']}) |")
    return '\n'.join(lines)


def plot(result: dict, out: str) -> str:
    """Accuracy against fine-tuning step, one panel per shape: the descendant, Scratch and
    Scratch's converged accuracy (dashed)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = result['rows']
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 3.4), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], rows):
        for name, label in (('gene', 'from the gene'), ('scratch', 'Scratch')):
            xs, ys = zip(*r[name])
            ax.plot(xs, ys, marker='o', label=label)
        ax.axhline(r['converged']['acc'], ls='--', color='gray', label='Scratch converged (recorded)')
        ax.set(title=f"width {r['width']}, depth {r['depth']} ({r['params'] / 1e3:.0f}k)",
               xlabel='fine-tuning step', ylim=(0, 1))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('test accuracy')
    axes[0][0].legend(loc='lower right', fontsize=8)
    fig.tight_layout()
    from jlearngene.train import files
    try:
        files.write_file(out, lambda tmp: fig.savefig(tmp, dpi=100))   # renamed into place whole
    finally:
        plt.close(fig)
    return out


def _wrap(text: str) -> str:
    import textwrap
    return textwrap.fill(text, 100)


def main(argv: list[str]) -> int:
    """The command: grows the shipped gene's descendants of `SHAPES` and Scratch beside them
    in --workdir, held for the run (`grow`), prints the table against Scratch's recorded
    converged accuracy and writes the curves (`plot`); exit status 0.

    Raises:
        UsageError: --steps below 1.
    """
    args = _parser().parse_args(argv)
    if args.steps is not None and args.steps < 1:
        from jlearngene.commands.config_args import UsageError
        raise UsageError(f'--steps {args.steps}: give at least 1 fine-tuning step')
    t0 = time.perf_counter()
    from jlearngene import zoo
    from jlearngene.artefacts import read_meta
    meta = read_meta(zoo.path(GENE))
    prov, p = meta['provenance'], meta['params']
    src = meta['configs']['source']
    print(_wrap(f"One {meta['label']} learngene of {p['s_params'] / 1e3:.0f}k parameters ({GENE}, "
                f"shipped with jlearngene), trained once inside a width-{src['width']}, "
                f"depth-{src['depth']} Aux-Net on the digits (its test accuracy "
                f"{prov['aux_test_accuracy']:.3f}), initialises ViTs of {len(SHAPES)} sizes; each "
                'is fine-tuned K steps, beside Scratch trained K steps at its own tuned lr '
                f"(seed {prov['seed']}, the digits' test split).") + '\n', flush=True)
    from jlearngene.train.workdir_lock import hold_workdir
    with hold_workdir(args.workdir):           # one run per workdir
        result = grow(args.workdir, steps=args.steps, shapes=SHAPES,
                      say=lambda line: print('  ' + line, file=sys.stderr, flush=True))
        png = plot(result, os.path.join(os.path.abspath(args.workdir), PNG))
    rec = result['record']
    print(table(result))
    seeds = ', '.join(str(s) for s in rec['seeds'])
    print('\n' + _wrap(
        f"Scratch converged: mean ± std over seeds {seeds}, trained to its plateau at each shape's "
        f"tuned lr, from {rec['file']} (commit {(rec.get('file_commit') or '?')[:7]}; the code of "
        f"{rec.get('code_commit') or '?'}). One seed here, so no verdicts: the study's (3 seeds, "
        f"8 shapes) are in {os.path.dirname(rec['file'])}/README.md of the source tree; run it with "
        f"`jlearngene train --config {prov['study']} --workdir DIR` (about 30 minutes on 2 CPU "
        'cores), every method against Scratch with `jlearngene compare` (about 40 minutes).'))
    print(f'curves: {png}')
    print(f'done in {time.perf_counter() - t0:.0f} s')
    return 0
