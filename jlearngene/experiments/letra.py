"""The LeTra experiment's method part (config: `jlearngene/experiments/configs/letra.py`).

Its descendants differ in width *and* depth, so it runs its own stages from the harness's
pieces (`PART = harness.Part(run=run)`):

1. the teacher (cross-entropy; IMwLM's larger model too);
2. a LeTra gene and a TLEG gene, each trained through an Aux-Net of the model section's shape
   by soft distillation from the teacher (`harness.distil`: only the gene trains; LeTra
   with `letra.DECAY`);
3. every descendant `(width, depth)` of `config.descendants`, initialised by LeTra with each
   of `config.selections` (a strategy whose initial weights equal an earlier one's shares its
   run), Scratch, IMwLM and, at the Aux-Net's width, TLEG; all fine-tuned for the same steps;
4. the headline: total training FLOPs until every descendant first reaches
   `headline.target` accuracy, LeTra (teacher + Aux-Net + tuning) against Scratch.

Writes `results.json` and `results.md` (the table) in the workdir, the teacher and genes as
model artefacts, one training log per run under `runs/`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax

from jlearngene import compiler, costs, pytree
from jlearngene.experiments import harness
from jlearngene.genes import letra, selection, tleg
from jlearngene.models import ViTConfig, init, vit
from jlearngene.train import checkpoint, tasks

LABELS = {'scratch': 'Scratch', 'tleg': 'TLEG', 'imwlm': 'IMwLM'}
# one compiled program per descendant shape and strategy (run eagerly, every operation of
# the selection would compile on its own), compiled quickly (`compiler.run_once_jit`)
_size = lambda gene, target_cfg, **_: vit.block_elements(target_cfg)   # noqa: E731
letra_descend = compiler.run_once_jit(letra.descend, _size, static_argnames=('target_cfg', 'selection'))
imwlm_descend = compiler.run_once_jit(selection.descend, _size, static_argnames=('target_cfg',))
tleg_descend = compiler.run_once_jit(tleg.descend, _size, static_argnames=('target_cfg', 'head'))


def descendant_config(config, width: int, depth: int, num_classes: int) -> ViTConfig:
    """The model section at (`width`, `depth`): heads of the section's head_dim, MLP
    `config.mlp_ratio` × width."""
    base = harness.model_config(config, depth, num_classes)
    if width % base.head_dim:
        raise ValueError(f'descendant width {width} is not whole heads of {base.head_dim}')
    return base.replace(width=width, num_heads=width // base.head_dim, head_dim=base.head_dim,
                        mlp_dim=int(config['mlp_ratio']) * width)


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first step of `curve` [(step, accuracy)] at which accuracy reaches `target`."""
    return next((s for s, a in curve if a >= target), None)


def run(config, workdir: str, quiet: bool = False) -> dict:
    t_start = harness.prepare(config, workdir)
    dset = harness.Data(config)
    K, bs, seed, n = dset.num_classes, config['batch_size'], config['seed'], dset.num_examples
    say = lambda msg: harness.say(msg, quiet)   # noqa: E731
    timings: dict[str, float] = {}

    # 1. Teacher.
    tc = config['teacher']
    t_cfg = harness.model_config(config, tc['depth'], K)
    upstream: list[costs.Run] = []
    if harness.get(tc, 'checkpoint', ''):
        teacher, stored_cfg, _ = checkpoint.load_model(tc['checkpoint'])
        t_cfg = stored_cfg or t_cfg
        t_acc, timings['teacher'] = harness.accuracy(teacher, t_cfg, dset), 0.0
    else:
        steps = harness.budget(tc, n, bs, 'teacher')
        teacher, curve, timings['teacher'] = harness.fit(
            'teacher', tasks.classification_loss(t_cfg), init(t_cfg, jax.random.key(seed)),
            harness.eval_fn(t_cfg), dset, steps=steps, lr=config['optim']['lr'], config=config,
            workdir=workdir, seed=seed, eval_every=None)
        t_acc = curve[-1][1]
        upstream.append(costs.Run('teacher', t_cfg, steps * bs / n, n))
        checkpoint.save_model(os.path.join(workdir, 'teacher'), teacher, t_cfg, overwrite=True,
                              extra={'test_accuracy': t_acc})
    say(f'teacher  width {t_cfg.width} depth {t_cfg.depth}: test accuracy {t_acc:.4f} '
        f'({timings["teacher"]:.0f}s)')

    # 2. LeTra and TLEG genes through Aux-Nets of the model section's shape.
    ac = config['aux']
    aux_cfg = harness.model_config(config, ac['depth'], K)
    lg_options = dict(learngene_heads=ac['learngene_heads'], learngene_depth=ac['learngene_depth'])
    genes, aux_acc = {}, {}
    makers = {'letra': (lambda g: letra.materialize(g, None, aux_cfg),
                        letra.init_gene(aux_cfg, jax.random.key(seed + 1), **lg_options), letra.DECAY)}
    if 'tleg' in config['baselines']:
        makers['tleg'] = (lambda g: tleg.materialize(g, None, aux_cfg),
                          tleg.init_gene(aux_cfg, jax.random.key(seed + 1)), None)
    for name, (materialize, gene0, decay) in makers.items():
        genes[name], aux_acc[name], secs, steps = harness.distil(
            f'aux_{name}', materialize, gene0, teacher, t_cfg, aux_cfg, dset, config, workdir,
            decay=decay)
        timings[f'aux_{name}'] = secs
        upstream.append(costs.Run(f'aux_{name}', aux_cfg, steps * bs / n, n, teacher=t_cfg))
        checkpoint.save_model(os.path.join(workdir, 'genes', name), genes[name], aux_cfg,
                              overwrite=True, extra={'kind': f'{name}_gene', 'method': name,
                                                     'aux_test_accuracy': aux_acc[name]})
        say(f'aux-net  {name:<6} width {aux_cfg.width} depth {aux_cfg.depth}: test accuracy '
            f'{aux_acc[name]:.4f} ({secs:.0f}s)')
    up_flops = {r['name']: r['flops'] for r in costs.training_cost(upstream)['runs']}
    needs = {'letra': ['teacher', 'aux_letra'], 'tleg': ['teacher', 'aux_tleg'],
             'imwlm': ['teacher'], 'scratch': []}
    s_params = {'letra': letra.gene_param_count(genes['letra'], include_head=True),
                'tleg': tleg.gene_param_count(genes['tleg'], include_head=True) if 'tleg' in genes else 0,
                'imwlm': selection.gene_param_count(teacher, include_head=True), 'scratch': 0}

    # 3. Descendants at the same fine-tuning budget.
    dc = config['descend']
    d_steps = harness.budget(dc, n, bs, 'descend')
    imwlm_gene = selection.gene_from_model(teacher, t_cfg)
    rows, curves = [], {}

    def tune(name, d_cfg, params0, steps, eval_every):
        _, curve, secs = harness.fit(name, tasks.classification_loss(d_cfg), params0,
                                     harness.eval_fn(d_cfg), dset, steps=steps, lr=dc['lr'],
                                     config=config, workdir=workdir, seed=seed + 7,
                                     eval_every=eval_every)
        timings[name] = secs
        return curve

    for width, depth in config['descendants']:
        d_cfg = descendant_config(config, width, depth, K)
        key = jax.random.key(seed + 100 + 10 * width + depth)
        inits: list[tuple[str, str, Any]] = []
        for strategy in config['selections']:
            inits.append(('letra', strategy, letra_descend(genes['letra'], d_cfg, selection=strategy,
                                                          key=key)))
        for name in config['baselines']:
            if name == 'scratch':
                inits.append((name, '', init(d_cfg, key)))
            elif name == 'tleg' and width == aux_cfg.width:
                inits.append((name, '', tleg_descend(genes['tleg'], d_cfg, head='inherit')))
            elif name == 'imwlm':
                inits.append((name, '', imwlm_descend(imwlm_gene, d_cfg, key=key)))
        done: list[tuple[Any, dict]] = []
        for method, strategy, params0 in inits:
            label = f'LeTra ({strategy})' if method == 'letra' else LABELS[method]
            same = next((r for p, r in done if r['method'] == method and pytree.trees_equal(p, params0)), None)
            if same is not None:
                rows.append({**same, 'label': label, 'strategy': strategy, 'same_as': same['label']})
                continue
            tag = f'des_w{width}_d{depth}_{method}' + (f'_{strategy}' if strategy else '')
            acc0 = harness.accuracy(params0, d_cfg, dset)
            curve = [(0, acc0)] + tune(tag, d_cfg, params0, d_steps, harness.get(dc, 'eval_every', 0))
            curves[tag] = curve
            ft = costs.training_cost([costs.Run(tag, d_cfg, d_steps * bs / n, n)])['flops']
            row = dict(width=width, depth=depth, method=method, strategy=strategy, label=label,
                       run=tag, acc_init=acc0, acc=curve[-1][1], params=costs.param_count(d_cfg),
                       s_params=s_params[method], flops=costs.flops_per_image(d_cfg),
                       finetune_flops=ft, upstream_flops=sum(up_flops.get(u, 0.0) for u in needs[method]),
                       same_as='')
            rows.append(row)
            done.append((params0, row))
            say(f'des w{width} L{depth} {label:<22}: init {acc0:.4f} -> {curve[-1][1]:.4f} '
                f'after {d_steps} steps ({timings[tag]:.0f}s)')

    results = dict(config=harness.plain(config), teacher=dict(width=t_cfg.width, depth=t_cfg.depth,
                                                             accuracy=t_acc),
                   aux=aux_acc, aux_config=aux_cfg.to_dict(), finetune_steps=d_steps,
                   batch_size=bs, rows=rows, curves=curves,
                   upstream=costs.training_cost(upstream), timings=timings,
                   gene_params={k: v for k, v in s_params.items() if v})
    results['headline'] = headline(config, results, genes['letra'], dset, tune, say)
    results['seconds'] = time.perf_counter() - t_start
    return harness.write_results(results, workdir, markdown(results))


def headline(config, results: dict, gene, dset, tune, say) -> dict:
    """Training FLOPs until every descendant first reaches `headline.target`: LeTra
    (continuous; teacher, Aux-Net and each descendant's tuning) against Scratch (each
    descendant trained from random init, at most `headline.steps`/`epochs`). A LeTra
    descendant whose short tuning did not reach the target is tuned with Scratch's budget."""
    hc = config['headline']
    target, bs, n = float(hc['target']), config['batch_size'], dset.num_examples
    max_steps = harness.budget(hc, n, bs, 'headline')
    every = int(harness.get(hc, 'eval_every', 0)) or max_steps
    per_descendant = []
    for width, depth in config['descendants']:
        d_cfg = descendant_config(config, width, depth, dset.num_classes)
        step_flops = costs.training_cost([costs.Run('step', d_cfg, bs / n, n)])['flops']
        row = next(r for r in results['rows'] if (r['width'], r['depth'], r['method'], r['strategy'])
                   == (width, depth, 'letra', 'continuous'))
        letra_steps = steps_to(results['curves'][row['run']], target)
        if letra_steps is None:
            params0 = letra_descend(gene, d_cfg)
            acc0 = harness.accuracy(params0, d_cfg, dset)
            curve = [(0, acc0)] + tune(f'target_w{width}_d{depth}_letra', d_cfg, params0, max_steps, every)
            letra_steps = steps_to(curve, target)
        key = jax.random.key(config['seed'] + 100 + 10 * width + depth)
        curve = [(0, harness.accuracy(init(d_cfg, key), d_cfg, dset))] + tune(
            f'target_w{width}_d{depth}_scratch', d_cfg, init(d_cfg, key), max_steps, every)
        scratch_steps = steps_to(curve, target)
        per_descendant.append(dict(width=width, depth=depth, letra_steps=letra_steps,
                                   scratch_steps=scratch_steps, step_flops=step_flops))
        say(f'target {target:.2f} w{width} L{depth}: LeTra after {letra_steps} tuning steps, '
            f'Scratch after {scratch_steps} steps (of at most {max_steps})')
    up = {r['name']: r['flops'] for r in results['upstream']['runs']}
    reached = all(d['letra_steps'] is not None for d in per_descendant)
    scratch_reached = all(d['scratch_steps'] is not None for d in per_descendant)
    tuning = sum((d['letra_steps'] or max_steps) * d['step_flops'] for d in per_descendant)
    scratch = sum((d['scratch_steps'] or max_steps) * d['step_flops'] for d in per_descendant)
    letra_total = up.get('teacher', 0.0) + up['aux_letra'] + tuning
    return dict(target=target, max_steps=max_steps, descendants=per_descendant,
                letra_flops=letra_total, letra_flops_without_teacher=letra_total - up.get('teacher', 0.0),
                letra_tuning_flops=tuning, scratch_flops=scratch, letra_reached=reached,
                scratch_reached=scratch_reached, ratio=scratch / letra_total)


def _m(x: float) -> str:
    return f'{x / 1e6:.3f}'


def markdown(results: dict) -> str:
    """The result table and the headline (Markdown)."""
    t, aux = results['teacher'], results['aux']
    lines = [f"Descendants fine-tuned {results['finetune_steps']} steps each (batch "
             f"{results['batch_size']}); teacher width {t['width']} depth {t['depth']}: "
             f"{t['accuracy']:.4f}; Aux-Nets: " + ', '.join(f'{k} {v:.4f}' for k, v in aux.items()) + '.',
             '',
             '| width | depth | method | acc. at init | acc. after fine-tuning | Params (M) '
             '| S-Params (M) | MFLOPs/img | fine-tune (GFLOPs) | upstream (GFLOPs) |',
             '|---|---|---|---|---|---|---|---|---|---|']
    for r in results['rows']:
        acc = f"**{r['acc']:.4f}**" + (f" (= {r['same_as']})" if r['same_as'] else '')
        lines.append(f"| {r['width']} | {r['depth']} | {r['label']} | {r['acc_init']:.4f} | {acc} | "
                     f"{_m(r['params'])} | {_m(r['s_params'])} | {r['flops'] / 1e6:.2f} | "
                     f"{r['finetune_flops'] / 1e9:.1f} | {r['upstream_flops'] / 1e9:.1f} |")
    h = results['headline']
    steps = '; '.join(f"w{d['width']} L{d['depth']}: {d['letra_steps']} vs {d['scratch_steps']}"
                      for d in h['descendants'])
    flag = lambda ok: '' if ok else ' (not every descendant reached it: its cap counted)'   # noqa: E731
    lines += ['', f"**Headline** (all {len(h['descendants'])} descendants to test accuracy "
              f"{h['target']:.2f}): LeTra {h['letra_flops'] / 1e12:.3f} TFLOPs (teacher + Aux-Net "
              f"+ tuning; {h['letra_flops_without_teacher'] / 1e12:.3f} without the teacher)"
              f"{flag(h['letra_reached'])} against Scratch {h['scratch_flops'] / 1e12:.3f} TFLOPs"
              f"{flag(h['scratch_reached'])}: Scratch / LeTra = {h['ratio']:.2f}. Steps to the "
              f"target, LeTra tuning vs Scratch (cap {h['max_steps']}): {steps}.",
              '', 'Upstream runs: ' + ', '.join(
                  f"{r['name']} {r['epochs']:.1f} epochs = {r['flops'] / 1e9:.1f} GFLOPs"
                  for r in results['upstream']['runs']) + '.',
              f"Wall time {results['seconds']:.0f}s.",
              'S-Params: parameters stored to initialise the descendant (head included: every '
              'descendant inherits it). "(= X)": the strategy gives the same initial weights as X '
              '(shared run). Costs: 3x forward FLOPs per training image; Aux-Nets add one '
              'teacher forward.']
    return '\n'.join(lines)


PART = harness.Part(run=run)
