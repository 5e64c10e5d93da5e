"""'ceiling': the reference row of a transfer study. At every descendant shape a whole model
of that shape is trained on the source task (the teacher itself at the teacher's shape),
then fine-tuned on the descendants' task with a new head, as Pre-Fin fine-tunes a model
pretrained at the target shape. It is the most a gene can pass on: a method's ceiling share
is (method − Scratch) / (ceiling − Scratch). Its source models are the pretrained source
(`results.pretrained`), so costs without the source leave them out. Reads no section; the
source models train at the teacher's chosen lr for the teacher's steps of that seed."""
from __future__ import annotations

import jax

from jlearngene import genes
from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.base import Recipe, Upstream
from jlearngene.models import init
from jlearngene.train import tasks


def source_name(shape) -> str:
    """The upstream run of the source model at `shape` ('source_w64_d3')."""
    return 'source_' + '_'.join(f'{k}{v}' for k, v in zip('wdh', shape))


class Ceiling(Recipe):
    family = 'ceiling'
    own_methods = ('ceiling',)

    def method(self, row):
        return genes.get('pre_fin')

    def label(self, row):
        return 'Ceiling (source model fine-tuned)'

    def check(self, ctx, rows):
        if not ctx.two_tasks:
            raise ValueError("study: 'ceiling' fine-tunes a source-task model on another task; "
                             'it needs tasks (ancestor and descendant classes)')

    def source_config(self, ctx, target):
        """The source model's config at the descendant config `target`: the source task's
        class count."""
        return target.replace(num_classes=len(ctx.config['tasks']['ancestor']))

    def gene_options(self, ctx, row, target):
        return {}

    def candidates(self, ctx, row, shape):
        return ctx.shape_configs(shape)[:1]

    def gene_shapes(self, ctx, row, target):
        return self.method(row).gene_shapes(self.source_config(ctx, target))

    def billed_at(self, row, shape):
        return (source_name(shape),)

    def upstream(self, ctx, rows, seed):
        up = Upstream()
        run = ctx.source['runs'][seed]
        for shape in ctx.shapes:
            target = ctx.plan[rows[0].name][shape]
            if isinstance(target, str):
                continue
            cfg = self.source_config(ctx, target)
            if cfg == ctx.t_cfg:
                params, steps = ctx.teacher(seed), run['steps']
            else:
                steps = run['steps']
                params, curve = ctx.fit(f'{source_name(shape)}_s{seed}', tasks.classification_loss(cfg),
                                        init(cfg, jax.random.key(seed)), harness.eval_fn(cfg), steps=steps,
                                        lr=float(ctx.source['lr']), seed=seed, dset=ctx.ancestor_dset)
                ctx.say(f'source   {source_name(shape)} seed {seed}: {steps} steps, test accuracy '
                        f'{curve[-1][1]:.4f}')
                up.info[f'{source_name(shape)}_accuracy'] = curve[-1][1]
            up.genes[source_name(shape)] = params
            up.flops[source_name(shape)] = ctx.run_flops(cfg, steps)
        return up

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        shape = next(s for s in ctx.shapes if ctx.plan[row.name][s] == d_cfg)
        m = self.method(row)
        gene = m.gene_from_model(up.genes[source_name(shape)], self.source_config(ctx, d_cfg))
        return ctx.jit_descend(m.name, d_cfg, row.descend)(gene, key), 0.0


RECIPE = recipes.register(Ceiling())
