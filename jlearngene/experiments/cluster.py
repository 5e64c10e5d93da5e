"""The Cluster-Learngene experiment (config: `jlearngene/experiments/configs/cluster.py`).

Its stages differ from the harness's (an ancestor on one task, descendants on another, no
learned gene), so `PART.run` runs it from the harness's public pieces:

1. the ancestor trained on the classes `tasks.ancestor` of the dataset;
2. its mean attention distance (`genes.cluster.mean_attention_distance`) over the ancestor
   task's training images, correctly normalised and with the official bug, as tables and
   `attention_distance.png`; density clusters for every `cluster.eps_grid` radius;
3. descendants on the classes `tasks.descendant` (new head), fine-tuned at one budget:
   Cluster-Learngene's variants for every ω schedule and the baselines `methods`.

Writes `results.json`, `results.md` (the tables), `attention_distance.png`,
`accuracy_vs_steps.png`, `accuracy_vs_flops.png`, the ancestor as a model artefact (`ancestor/`) and one training
log per run under `runs/`.

Columns: T-Params (the descendant's parameters), I-Params (those initialised from the
ancestor: all but the new head for Cluster-Learngene, whose FFN-group layers count as
generated from the ancestor's; the gene's layers and embeddings for the baselines), S-Params
(what the gene stores), accuracy at initialisation and after fine-tuning, and training
FLOPs (fine-tuning, and upstream: the ancestor's training plus, for Cluster-Learngene, the
attention-distance pass), 3× forward FLOPs per training image from the actual per-layer
shapes.
"""
from __future__ import annotations

import os
import time
import jax
import numpy as np

from jlearngene import costs, data, genes
from jlearngene.experiments import harness
from jlearngene.genes import cluster
from jlearngene.models import init
from jlearngene.train import checkpoint, tasks

VARIANTS = ('correct', 'official', 'phi_trainable', 'kmeans')
LABELS = {'correct': 'C-LG', 'official': 'C-LG (official)', 'phi_trainable': 'C-LG (φ trained)',
          'kmeans': 'C-LG (k-means)'}


class TaskData:
    """`harness.Data` for a subset of the dataset's classes, relabelled 0..k−1 in the order
    given: the same `train(seed)` / `test()` / `num_classes` / `num_examples`."""

    def __init__(self, config, classes):
        self.config, self.classes = config, tuple(int(c) for c in classes)
        dc = harness.plain(config['data'])
        self.augment, self.mean, self.std = dc.get('augment'), dc.get('mean'), dc.get('std')
        self.sources = {split: self._subset(data.source_from_config(dc, split), split)
                        for split in ('train', 'test')}
        self.num_classes = len(self.classes)
        self.num_examples = len(self.sources['train'])
        info = self.sources['train'].info
        self.mean = info.mean if self.mean is None else tuple(self.mean)
        self.std = info.std if self.std is None else tuple(self.std)

    def _subset(self, source, split):
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f'task classes {self.classes} repeat a class')
        bad = [c for c in self.classes if not 0 <= c < source.info.num_classes]
        if bad:
            raise ValueError(f'task classes {bad} are not classes of {source.info.name} '
                             f'(0..{source.info.num_classes - 1})')
        rows = [source[i] for i in range(len(source))]
        relabel = {c: i for i, c in enumerate(self.classes)}
        keep = [r for r in rows if r['label'] in relabel]
        return data.array_source(np.stack([r['image'] for r in keep]),
                                 np.array([relabel[r['label']] for r in keep]),
                                 num_classes=len(self.classes), split=split,
                                 name=f'{source.info.name}{list(self.classes)}')

    def train(self, seed: int):
        return data.train_iterator(self.sources['train'], batch_size=self.config['batch_size'],
                                   seed=seed, augment=self.augment, mean=self.mean, std=self.std)

    def test(self):
        return data.eval_batches(self.sources['test'], batch_size=self.config['eval_batch_size'],
                                 mean=self.mean, std=self.std)

    def raw_batches(self, n: int, batch: int):
        """The first `n` training images in [0, 1], unaugmented, `batch` at a time."""
        images = self.sources['train'].images[:n]
        return [images[i:i + batch].astype(np.float32) / 255.0 for i in range(0, len(images), batch)]


def _schedule_name(omega) -> str:
    return omega if isinstance(omega, str) else f'ω={omega:g}'


def _run_descendant(name, params0, d_cfg, dset_b, config, workdir, *, trainable=None):
    """Fine-tune `params0` (or the trainable state `trainable`, materialised in each step)
    on the descendant task; returns (init accuracy, curve, seconds)."""
    dc, seed = config['descend'], config['seed']
    acc0 = harness.accuracy(params0, d_cfg, dset_b)
    if trainable is None:
        start, loss_fn, eval_fn = params0, tasks.classification_loss(d_cfg), harness.eval_fn(d_cfg)
    else:
        inner, inner_eval = tasks.classification_loss(d_cfg), harness.eval_fn(d_cfg)

        def loss_fn(state, batch, rng):
            return inner(cluster.materialize_descendant(state), batch, rng)

        def eval_fn(state, batch):
            return inner_eval(cluster.materialize_descendant(state), batch)
        start = trainable
    _, curve, secs = harness.fit(name, loss_fn, start, eval_fn, dset_b,
                                 steps=harness.budget(dc, dset_b.num_examples, config['batch_size'],
                                                      'descend'),
                                 lr=dc['lr'], config=config, workdir=workdir, seed=seed + 7,
                                 eval_every=harness.get(dc, 'eval_every', 0))
    return acc0, [(0, acc0)] + curve, secs


def _row(label, method, schedule, params0, d_cfg, s_params, i_params, acc0, curve, secs,
         steps, bs, upstream_flops):
    per_image = costs.flops_per_image(d_cfg, params0)
    heads = ([int(np.shape(b['attn']['q']['kernel'])[1]) for b in params0['blocks']]
             if isinstance(params0['blocks'], list)
             else [int(np.shape(params0['blocks']['attn']['q']['kernel'])[2])] * d_cfg.depth)
    return dict(label=label, method=method, schedule=schedule, heads=heads,
                t_params=costs.param_count(params0), i_params=int(i_params),
                s_params=int(s_params), acc_init=acc0, acc=curve[-1][1], curve=curve,
                flops=per_image, finetune_flops=costs.TRAIN_FACTOR * per_image * steps * bs,
                upstream_flops=upstream_flops, seconds=secs)


def run(config, workdir: str, quiet: bool = False) -> dict:
    """The experiment (see the module docstring); returns the results with the tables."""
    t_start = harness.prepare(config, workdir)
    variants = tuple(config['variants'])
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f'unknown Cluster-Learngene variant(s) {unknown}; known: {VARIANTS}')
    methods = [genes.get(name) for name in config['methods']]
    tasks_cfg, seed, bs = config['tasks'], config['seed'], config['batch_size']
    dset_a, dset_b = TaskData(config, tasks_cfg['ancestor']), TaskData(config, tasks_cfg['descendant'])

    # 1. The ancestor on task A.
    ac = config['ancestor']
    a_cfg = harness.model_config(config, ac['depth'], dset_a.num_classes)
    a_steps = harness.budget(ac, dset_a.num_examples, bs, 'ancestor')
    ancestor, a_curve, a_secs = harness.fit(
        'ancestor', tasks.classification_loss(a_cfg), init(a_cfg, jax.random.key(seed)),
        harness.eval_fn(a_cfg), dset_a, steps=a_steps, lr=config['optim']['lr'], config=config,
        workdir=workdir, seed=seed, eval_every=None)
    checkpoint.save_model(os.path.join(workdir, 'ancestor'), ancestor, a_cfg, overwrite=True,
                          extra={'test_accuracy': a_curve[-1][1], 'classes': list(dset_a.classes)})
    a_cost = costs.training_cost([costs.Run('ancestor', a_cfg, a_steps * bs / dset_a.num_examples,
                                            dset_a.num_examples)])['flops']
    harness.say(f'ancestor depth {a_cfg.depth}, {a_cfg.num_heads} heads: test accuracy '
                f'{a_curve[-1][1]:.4f} on classes {list(dset_a.classes)} ({a_secs:.0f}s)', quiet)

    # 2. Mean attention distance and clusters.
    cc = config['cluster']
    n_mad = min(int(cc['images']), dset_a.num_examples)
    batches = dset_a.raw_batches(n_mad, config['eval_batch_size'])
    mad = {name: cluster.mean_attention_distance(ancestor, a_cfg, batches, mean=dset_a.mean,
                                                 std=dset_a.std, **kw)
           for name, kw in (('correct', {}), ('official', dict(official_normalisation=True)),
                            ('renormalised', dict(renormalise=True)))}
    mad_flops = costs.flops_per_image(a_cfg) * n_mad
    grid = {f'{eps:g}': {name: cluster.centroid_lists(cluster.cluster_heads(
        mad[name], eps, cc['min_heads'])) for name in ('correct', 'official')}
        for eps in cc['eps_grid']}
    chosen = {name: cluster.cluster_heads(mad[name], cc['eps'], cc['min_heads'])
              for name in ('correct', 'official')}
    counts = [len(c.centroids) for c in chosen['correct']]
    k = int(cc['kmeans_clusters']) or max(1, int(round(float(np.mean(counts)))))
    chosen['kmeans'] = cluster.cluster_heads(mad['correct'], algorithm='kmeans', num_clusters=k,
                                             seed=seed)
    harness.say('centroid counts at eps=' + f"{cc['eps']:g}: correct {counts}, official "
                f"{[len(c.centroids) for c in chosen['official']]}", quiet)

    # 3. Descendants on task B.
    dc = config['descend']
    d_steps = harness.budget(dc, dset_b.num_examples, bs, 'descend')
    key = jax.random.key(seed + 100)
    h_a, depth = a_cfg.num_heads, a_cfg.depth
    rows = []
    ffn = cc['ffn'] if isinstance(cc['ffn'], str) else [tuple(g) for g in cc['ffn']]
    c_upstream = a_cost + mad_flops

    for variant in variants:
        official = variant == 'official'
        clusters = chosen['kmeans' if variant == 'kmeans' else 'official' if official else 'correct']
        gene = cluster.gene_from_model(ancestor, a_cfg, clusters=clusters, ffn=ffn, official=official)
        omegas = dc['omegas'] if variant in ('correct', 'official') else (1.0,)
        for omega in omegas:
            heads = cluster.head_schedule(h_a, depth, omega=omega)
            d_cfg = cluster.descendant_config(a_cfg, heads, num_classes=dset_b.num_classes,
                                              official=official)
            name = f'{variant}_{_schedule_name(omega)}'.replace('=', '')
            state = cluster.descendant_state(gene, d_cfg, key=key, heads=heads)
            params0 = cluster.materialize_descendant(state)
            acc0, curve, secs = _run_descendant(
                name, params0, d_cfg, dset_b, config, workdir,
                trainable=state if variant == 'phi_trainable' else None)
            rows.append(_row(LABELS[variant], variant, _schedule_name(omega), params0, d_cfg,
                             cluster.gene_param_count(gene), costs.param_count(params0, include_head=False),
                             acc0, curve, secs, d_steps, bs, c_upstream))
            harness.say(f'{LABELS[variant]:<17} {_schedule_name(omega):<13} heads {heads}: init '
                        f'{acc0:.4f} -> {curve[-1][1]:.4f} ({secs:.0f}s)', quiet)

    uniform = sorted({h for o in dc['omegas'] if not isinstance(o, str)
                      for h in [cluster.head_schedule(h_a, depth, omega=o)[0]]}, reverse=True)
    for method in methods:
        shapes = uniform if method.name == 'scratch' else [h_a]
        for h in shapes:
            d_cfg = cluster.descendant_config(a_cfg, [h] * depth, num_classes=dset_b.num_classes)
            opts = {'k': max(1, depth // 2)} if method.name in ('he_lg', 'auto_lg') else {}
            gene = (None if method.source == 'none'
                    else method.gene_from_model(ancestor, a_cfg, **opts))
            params0 = method.descend(gene, d_cfg, key=key, head='new')
            s_params = 0 if gene is None else method.gene_param_count(gene)
            label = method.label + (f" (k={opts['k']})" if opts else '')
            acc0, curve, secs = _run_descendant(f'{method.name}_h{h}', params0, d_cfg, dset_b,
                                                config, workdir)
            rows.append(_row(label, method.name, f'{h} heads', params0, d_cfg, s_params, s_params,
                             acc0, curve, secs, d_steps, bs, 0.0 if gene is None else a_cost))
            harness.say(f'{label:<17} {h} heads: init {acc0:.4f} -> {curve[-1][1]:.4f} '
                        f'({secs:.0f}s)', quiet)

    results = dict(config=harness.plain(config),
                   ancestor=dict(depth=depth, heads=h_a, accuracy=a_curve[-1][1],
                                 classes=list(dset_a.classes), flops=a_cost, steps=a_steps),
                   descendant_classes=list(dset_b.classes), finetune_steps=d_steps,
                   batch_size=bs, mad_images=n_mad, mad_flops=mad_flops,
                   attention_distance={k: v.tolist() for k, v in mad.items()},
                   clusters_by_eps=grid, eps=cc['eps'], kmeans_clusters=k,
                   clusters={k: [dict(members=c.members, centroids=c.centroids) for c in v]
                             for k, v in chosen.items()},
                   rows=rows, seconds=time.perf_counter() - t_start)
    return harness.write_results(results, workdir, markdown(results), plot)


# ----------------------------------------------------------------------------------------
# Reporting.

def _matrix(values, fmt='{:.2f}') -> list[str]:
    v = np.asarray(values)
    lines = ['| layer | ' + ' | '.join(f'h{h}' for h in range(v.shape[1])) + ' |',
             '|---' * (v.shape[1] + 1) + '|']
    lines += [f'| {l} | ' + ' | '.join(fmt.format(x) for x in v[l]) + ' |' for l in range(v.shape[0])]
    return lines


def markdown(results: dict) -> str:
    """The experiment's tables (Markdown)."""
    a = results['ancestor']
    lines = [f"Ancestor: depth {a['depth']}, {a['heads']} heads, trained {a['steps']} steps on "
             f"classes {a['classes']}: test accuracy {a['accuracy']:.4f}.", '',
             f"Mean attention distance (pixels) over {results['mad_images']} training images, "
             'correct normalisation:', '']
    lines += _matrix(results['attention_distance']['correct'])
    lines += ['', 'With the official normalisation bug (mean·255, std·255 on [0, 1] images):', '']
    lines += _matrix(results['attention_distance']['official'])
    lines += ['', 'Rows renormalised after dropping the class token (correct normalisation):', '']
    lines += _matrix(results['attention_distance']['renormalised'])
    lines += ['', 'Density clusters (DBSCAN, MinHds = '
              f"{results['config']['cluster']['min_heads']}): centroid heads per layer in priority "
              'order.', '', '| eps | distances | centroids per layer | counts |', '|---|---|---|---|']
    for eps, by in results['clusters_by_eps'].items():
        for name, cents in by.items():
            lines.append(f"| {eps} | {name} | {' '.join(str(list(c)) for c in cents)} | "
                         f"{[len(c) for c in cents]} |")
    lines += ['', f"Descendants: eps = {results['eps']:g}; k-means with "
              f"{results['kmeans_clusters']} clusters per layer; fine-tuned "
              f"{results['finetune_steps']} steps (batch {results['batch_size']}) on classes "
              f"{results['descendant_classes']} with a new head.", '',
              '| method | schedule | heads per layer | T-Params (K) | I-Params (K) | S-Params (K) '
              '| acc. at init | acc. after fine-tuning | MFLOPs/img | fine-tune (GFLOPs) '
              '| upstream (GFLOPs) |', '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in results['rows']:
        lines.append(f"| {r['label']} | {r['schedule']} | {r['heads']} | {r['t_params'] / 1e3:.1f} "
                     f"| {r['i_params'] / 1e3:.1f} | {r['s_params'] / 1e3:.1f} | {r['acc_init']:.4f} "
                     f"| **{r['acc']:.4f}** | {r['flops'] / 1e6:.2f} | {r['finetune_flops'] / 1e9:.1f} "
                     f"| {r['upstream_flops'] / 1e9:.1f} |")
    lines += ['', f"Wall time {results['seconds']:.0f}s. T-Params: the descendant's parameters; "
              'I-Params: those initialised from the ancestor (Cluster-Learngene: all but the new '
              "head); S-Params: the gene's. Upstream: the ancestor's training (all but Scratch) "
              'plus the attention-distance pass (Cluster-Learngene); 3x forward FLOPs per '
              'training image.']
    return '\n'.join(lines)


def plot(results: dict, workdir: str) -> list[str]:
    """attention_distance.png (heatmaps: correct and official normalisation),
    accuracy_vs_steps.png and accuracy_vs_flops.png (one curve per descendant; FLOPs:
    upstream plus fine-tuning so far, log axis); returns their paths."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    paths = []
    mads = {k: np.asarray(v) for k, v in results['attention_distance'].items()
            if k in ('correct', 'official')}
    vmin = min(float(v.min()) for v in mads.values())
    vmax = max(float(v.max()) for v in mads.values())
    fig, axes = plt.subplots(1, len(mads), figsize=(4.2 * len(mads), 3.2), squeeze=False)
    for ax, (name, v) in zip(axes[0], mads.items()):
        im = ax.imshow(v, vmin=vmin, vmax=vmax, cmap='viridis', aspect='auto')
        ax.set_title(f'{name} normalisation')
        ax.set_xlabel('head')
        ax.set_ylabel('layer')
        ax.set_xticks(range(v.shape[1]))
        ax.set_yticks(range(v.shape[0]))
    fig.colorbar(im, ax=axes[0].tolist(), label='mean attention distance (px)')
    paths.append(os.path.join(workdir, 'attention_distance.png'))
    fig.savefig(paths[-1], dpi=110, bbox_inches='tight')
    plt.close(fig)

    per_step = {id(r): r['finetune_flops'] / results['finetune_steps'] for r in results['rows']}
    for kind in ('steps', 'flops'):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for r in results['rows']:
            pts = r['curve']
            if kind == 'flops':   # upstream + fine-tuning so far; log axis, no zero point
                pts = [((r['upstream_flops'] + s * per_step[id(r)]) / 1e9, a) for s, a in pts]
                pts = [p for p in pts if p[0] > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', ms=3,
                    label=f"{r['label']} {r['schedule']}")
        if kind == 'flops':
            ax.set_xscale('log')
        ax.set_xlabel('fine-tuning steps' if kind == 'steps'
                      else 'training GFLOPs (upstream + fine-tuning)')
        ax.set_ylabel('test accuracy')
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc='lower right', fontsize=6, ncol=2)
        fig.tight_layout()
        paths.append(os.path.join(workdir, f'accuracy_vs_{kind}.png'))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


PART = harness.Part(run=run)
