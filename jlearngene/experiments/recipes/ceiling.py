"""'ceiling': the reference row of a transfer study. At every descendant shape a whole model
of that shape is trained on the source task (the teacher itself at the teacher's shape),
then fine-tuned on the descendants' task with a new head, as Pre-Fin fine-tunes a model
pretrained at the target shape. It is the most a gene can pass on: a method's ceiling share
is (method − Scratch) / (ceiling − Scratch). Its source models are the pretrained source
(`results.pretrained`), so costs without the source leave them out. Reads no section. The
source models are trained as the teacher is: their own sweep, converged by doubling
(`scratch.baseline` on the source task). The ceiling fine-tunes for as many steps as Scratch
trains at that shape, with its own learning-rate sweep (`equal_budget_only`); Pre-Fin stays
the papers' row at their budget."""
from __future__ import annotations

from jlearngene import genes
from jlearngene.experiments import recipes, scratch
from jlearngene.experiments.recipes.base import Recipe, Upstream


def source_name(shape) -> str:
    """The upstream run of the source model at `shape` ('source_w64_d3')."""
    return 'source_' + '_'.join(f'{k}{v}' for k, v in zip('wdh', shape))


class Ceiling(Recipe):
    """The 'ceiling' row's recipe: a source-task model of every descendant shape (the
    teacher at its own shape), fine-tuned with a new head on the descendants' task for
    Scratch's steps there (the module docstring)."""
    family = 'ceiling'
    own_methods = ('ceiling',)
    equal_budget_only = True

    def method(self, row):
        """Pre-Fin, whose gene is a whole model: the ceiling is no registered method."""
        return genes.get('pre_fin')

    def label(self, row):
        return 'Ceiling (source model fine-tuned)'

    def check(self, ctx, rows):
        """Refuses a study of one task: the ceiling needs `tasks` (ancestor, descendant)."""
        if not ctx.two_tasks:
            raise ValueError("study: 'ceiling' fine-tunes a source-task model on another task; "
                             'it needs tasks (ancestor and descendant classes)')

    def source_config(self, ctx, target):
        """The source model's config at the descendant config `target`: the source task's
        class count."""
        return target.replace(num_classes=len(ctx.config['tasks']['ancestor']))

    def gene_options(self, ctx, row, target):
        """None: the source model is taken whole."""
        return {}

    def candidates(self, ctx, row, shape):
        """Scratch's config of `shape` only: the source model is trained in it."""
        return ctx.shape_configs(shape)[:1]

    def gene_shapes(self, ctx, row, target):
        """The source model's shapes at `target` (not the reference config's)."""
        return self.method(row).gene_shapes(self.source_config(ctx, target))

    def billed_at(self, row, shape):
        """The source model of `shape` alone (`source_name`)."""
        return (source_name(shape),)

    def budgets(self, ctx, row, shape, S, up):
        """[]: the ceiling trains only at Scratch's own steps, which the protocol adds."""
        return []       # the ceiling trains for Scratch's own steps only (`equal_budget_only`)

    def sources(self, ctx, rows) -> dict:
        """{shape: the source models' baseline (`scratch.baseline` on the source task, its
        own sweep, converged by doubling)} at every descendant shape but the teacher's, made
        once per study."""
        if 'ceiling sources' not in ctx.memo:
            cfgs = {}
            for shape in ctx.shapes:
                target = ctx.plan[rows[0].name][shape]
                if not isinstance(target, str) and self.source_config(ctx, target) != ctx.t_cfg:
                    cfgs[shape] = self.source_config(ctx, target)
            seeds = [int(s) for s in ctx.config['seeds']]
            ctx.memo['ceiling sources'] = scratch.baseline(ctx, cfgs, seeds, dset=ctx.ancestor_dset,
                                                           tag='source')
        return ctx.memo['ceiling sources']

    def upstream(self, ctx, rows, seed):
        """The seed's source model at every shape the plan makes (`sources`; at the
        teacher's shape the teacher itself), with its training FLOPs."""
        up = Upstream()
        made = self.sources(ctx, rows)
        for shape in ctx.shapes:
            target = ctx.plan[rows[0].name][shape]
            if isinstance(target, str):
                continue
            cfg = self.source_config(ctx, target)
            if shape in made:
                run = made[shape]['runs'][seed]
                params, steps = made[shape]['params'][seed], run['steps']
                ctx.say(f'source   {source_name(shape)} seed {seed}: {steps} steps, test accuracy '
                        f'{run["acc"]:.4f}{"" if run["converged"] else " (NOT converged)"}')
                up.info[f'{source_name(shape)}_accuracy'] = run['acc']
                up.info[f'{source_name(shape)}_converged'] = run['converged']
            else:       # the teacher's shape: the teacher itself
                params, steps = ctx.teacher(seed), ctx.source['runs'][seed]['steps']
            up.genes[source_name(shape)] = params
            up.flops[source_name(shape)] = ctx.run_flops(cfg, steps)
        return up

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        """Pre-Fin's descendant of the source model of `d_cfg`'s own shape."""
        shape = next(s for s in ctx.shapes if ctx.plan[row.name][s] == d_cfg)
        m = self.method(row)
        gene = m.gene_from_model(up.genes[source_name(shape)], self.source_config(ctx, d_cfg))
        return ctx.jit_descend(m.name, d_cfg, row.descend)(gene, key), 0.0


RECIPE = recipes.register(Ceiling())
