"""Family 'aux': the gene trains inside an Aux-Net of the reference shape by soft
distillation from the teacher (TLEG, Share-Init, Mini-Init, LeTra), on the teacher's task and
with its class count (the source task's, `teacher.source_classes`). Reads the `aux` section:
`fraction` of the reference S (or `fractions.<method>`), `tau`, `alpha`."""
from __future__ import annotations

import os

import jax

from jlearngene import genes
from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.base import Recipe, Upstream
from jlearngene.experiments.recipes.teacher import FromSource, on_source_task
from jlearngene.train import checkpoint


class Aux(FromSource, Recipe):
    """The 'aux' family's recipe: per seed, one gene per method trained inside an Aux-Net of
    the reference shape by distillation from the teacher, shared by all of the method's rows;
    a row's cost bills the teacher and that Aux-Net."""
    family = 'aux'
    section = 'aux'

    def billed(self, row):
        return ('teacher', f'aux_{row.method}')

    def check(self, ctx, rows):
        """Refuses variants of a gene option: a method's rows share its one Aux-Net."""
        for row in rows:
            if row.variant.get('gene'):
                raise ValueError(f'study: variants.{row.method} varies a gene option, but the rows '
                                 f'of {row.method} share one Aux-Net; vary a descend option')

    def upstream(self, ctx, rows, seed):
        ac, ref, t_cfg = ctx.config['aux'], on_source_task(ctx, ctx.ref), ctx.t_cfg
        teacher = ctx.teacher(seed)
        own = harness.plain(harness.get(ac, 'fractions', {})) or {}
        up = Upstream()
        for method in sorted({r.method for r in rows}):
            m = genes.get(method)
            row = next(r for r in rows if r.method == method)
            steps = harness.fraction_steps(float(own.get(method, ac['fraction'])), ctx.S_ref)
            gene0 = m.init_gene(ref, jax.random.key(seed + 1), **self.gene_options(ctx, row, ref))
            gene, acc, secs = harness.distil(
                f'aux_{method}_s{seed}', lambda g, m=m: m.materialize(g, None, ref), gene0, teacher,
                t_cfg, ref, ctx.ancestor_dset, steps=steps, tau=float(ac['tau']), alpha=float(ac['alpha']),
                optim=ctx.config['optim'], seed=seed + 1, workdir=ctx.workdir, identity=ctx.identity,
                decay=m.trainable_decay, reused=ctx.reused)
            up.genes.update({r.name: gene for r in rows if r.method == method})
            up.info[f'aux_{method}_accuracy'] = acc
            checkpoint.save_model(os.path.join(ctx.workdir, 'genes', method, f'seed_{seed}'), gene, ref,
                                  overwrite=True, extra={'kind': f'{method}_gene', 'method': method,
                                                         'seed': seed, 'aux_test_accuracy': acc})
            ctx.timings[f'aux_{method}_s{seed}'] = secs
            up.flops[f'aux_{method}'] = ctx.run_flops(ref, steps, teacher=t_cfg)
            ctx.say(f'aux-net  {method:<10} seed {seed}: {steps} steps, test accuracy {acc:.4f} ({secs:.0f}s)')
        return up


RECIPE = recipes.register(Aux())
