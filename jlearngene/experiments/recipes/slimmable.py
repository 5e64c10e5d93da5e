"""Family 'slimmable': one slimmable network of the reference shape per row, its
sub-networks the descendants (Scala, US-Net, MatFormer); and 'separate', the networks
trained separately at the widths the slimmable network is trained at (Scratch on the
slimmable network's budget). Both read the `slim` section: the grid (`smallest`,
`granularity`), the slicing `rule`, the warm-up (`warmup_fraction` of the reference S at
`warmup_lr_factor` × lr), the main run (`fraction`) and the loss options
(`ce_weight`, `transfer`, `isolated`)."""
from __future__ import annotations

import jax

from jlearngene import genes
from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.base import Recipe, Upstream
from jlearngene.experiments.recipes.teacher import source_classes
from jlearngene.models import init


def _slim(ctx):
    return ctx.config['slim']


class Slimmable(Recipe):
    """The 'slimmable' family's recipe (Scala, US-Net, MatFormer): per seed, one slimmable
    network of the reference shape per row (`train`), whose sub-networks are the descendants;
    a row's cost bills its own network."""
    family = 'slimmable'
    section = 'slim'
    new_task_head = False    # the sub-networks are the network trained on this task

    def resolve(self, config, method, gene, descend, variant):
        """No gene options; descend's `rule` (default `slim.rule`) and `smallest` where the
        method's descend takes them."""
        del gene, variant
        takes = genes.get(method).options() or ()
        sc = config['slim']
        out = {'rule': sc['rule']} if 'rule' in takes else {}
        out.update(descend)
        if 'smallest' in takes:
            out['smallest'] = float(sc['smallest'])
        return {}, out

    def billed(self, row):
        return (row.name,)

    def check(self, ctx, rows):
        """The sub-networks keep the slimmable network's head, which trains on the source
        task: a study with two tasks needs them of one class count."""
        if source_classes(ctx) != ctx.K:
            raise ValueError(f"study: {rows[0].name}'s descendants are sub-networks of one slimmable "
                             f'network, trained on the source task ({source_classes(ctx)} classes), '
                             f"and keep its head; the descendants' task has {ctx.K}: give tasks of "
                             'one class count, or run it on one task')

    @staticmethod
    def rule(row) -> str:
        """The row's slicing rule: its descend option `rule` ('clean' where it has none)."""
        return row.descend.get('rule', 'clean')

    def candidates(self, ctx, row, shape):
        """The sub-network config of `shape` under the row's rule, or why there is none (a
        depth other than the network's, a width above it or not in whole heads, heads given)."""
        ref, width, depth = ctx.ref, shape[0], shape[1]
        why = (f"{row.method}: its sub-networks have the slimmable network's depth {ref.depth} "
               f'and a width of at most {ref.width} in whole heads')
        if depth != ref.depth or width > ref.width or len(shape) == 3:
            return why
        try:
            return (self.method(row).slimmable.subnet_config(ref, width / ref.width, rule=self.rule(row)),)
        except genes.GeneError:
            return why

    def gene_shapes(self, ctx, row, target):
        """The whole slimmable network's shapes (the reference config), whatever `target`."""
        return self.method(row).gene_shapes(ctx.ref)

    def upstream(self, ctx, rows, seed):
        """One slimmable network per row (`train`); info: each row's total steps."""
        up = Upstream()
        for row in rows:
            up.genes[row.name], up.flops[row.name], up.info[f'{row.name}_steps'] = self.train(ctx, row, seed)
        return up

    def train(self, ctx, row, seed):
        """The row's slimmable network: `warmup_fraction`·S full-width steps at
        `warmup_lr_factor` × lr, then `fraction`·S steps of the method's loss; returns
        (params, training FLOPs, total steps)."""
        sc, ref, lr = _slim(ctx), ctx.ref, float(ctx.config['optim']['lr'])
        slim, rule = self.method(row).slimmable, self.rule(row)
        grid = slim.grid(float(sc['smallest']), sc['granularity'])
        warm = harness.fraction_steps(float(sc['warmup_fraction']), ctx.S_ref)
        main = harness.fraction_steps(float(sc['fraction']), ctx.S_ref)
        params, full_eval = init(ref, jax.random.key(seed + 3)), harness.eval_fn(ref)
        if warm:
            params, _ = ctx.fit(f'{row.tag}_warmup_s{seed}', slim.warmup_loss(ref, rule=rule), params,
                                full_eval, steps=warm, lr=lr * float(sc['warmup_lr_factor']), seed=seed + 3,
                                dset=ctx.ancestor_dset)
        loss = slim.loss(ref, grid, rule=rule, **{k: sc[k] for k in slim.loss_options})
        params, curve = ctx.fit(f'{row.tag}_s{seed}', loss, params, full_eval, steps=main, lr=lr,
                                seed=seed + 3, dset=ctx.ancestor_dset)
        ctx.say(f'{row.name:<8} seed {seed}: {warm} + {main} steps, full width {curve[-1][1]:.4f}')
        flops = sum(ctx.run_flops(slim.subnet_config(ref, r, rule=rule), s)
                    for r, s in slim.plan(grid, warm, main) if s)
        return params, flops, warm + main


class Separate(Recipe):
    """The 'separate' row's recipe: a network trained from scratch at each width of the
    slimmable grid, on the budget of the study's first slimmable row (its steps at every
    width, or its FLOPs shared over the widths: `budget`)."""
    family = 'separate'
    section = 'slim'
    own_methods = ('separate',)
    new_task_head = False
    BUDGETS = ('steps', 'flops')

    def method(self, row):
        """Scratch (no gene): 'separate' is no registered method."""
        return genes.get('scratch')

    def resolve(self, config, method, gene, descend, variant):
        """No gene options; descend's without the variant's `budget`, which must be one of
        `BUDGETS` (a one-line ValueError otherwise)."""
        del gene
        budget = (variant.get('descend') or {}).get('budget', 'steps')
        if budget not in self.BUDGETS:
            raise ValueError(f"study: separate budget {budget!r}; expected 'steps' or 'flops'")
        return {}, {k: v for k, v in descend.items() if k != 'budget'}

    @staticmethod
    def budget(row) -> str:
        """'steps' (the slimmable network's steps at every width, as Scala's paper trains
        them) or 'flops' (its training FLOPs shared over the widths)."""
        return (row.variant.get('descend') or {}).get('budget', 'steps')

    def label(self, row):
        return f"Separate (Scala's {row.name.partition('/')[2] or 'steps'})"

    @staticmethod
    def slimmable_row(ctx):
        """The study's first slimmable row, whose budget separate training shares."""
        return next((r for r in ctx.rows if r.method in genes.names()
                     and genes.get(r.method).slimmable is not None), None)

    def check(self, ctx, rows):
        """Refuses a study with no slimmable row to take the budget from."""
        if self.slimmable_row(ctx) is None:
            takers = [n for n in genes.names() if genes.get(n).slimmable is not None]
            raise ValueError("study: 'separate' takes its budget from a slimmable method "
                             f"({', '.join(takers)}); add one to methods")

    def candidates(self, ctx, row, shape):
        """`shape`'s configs where its width is on the slimmable row's grid, else why not (any
        width without a `slim` section or a slimmable row)."""
        sc, ref = harness.get(ctx.config, 'slim', None), ctx.ref
        slim = self.slimmable_row(ctx)
        if sc is None or slim is None:
            return ctx.shape_configs(shape)
        verbs = genes.get(slim.method).slimmable
        grid = [verbs.subnet_config(ref, r, rule=Slimmable.rule(slim)).width
                for r in verbs.grid(float(sc['smallest']), sc['granularity'])]
        if shape[0] in grid:
            return ctx.shape_configs(shape)
        return (f'separate: width {shape[0]} is off the slimmable grid {grid}; separate training '
                'serves the widths the slimmable network is trained at')

    def gene_shapes(self, ctx, row, target):
        """None: separate training has no gene."""
        return None

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        """A fresh network of `d_cfg`, initialised from `key`."""
        return init(d_cfg, key), 0.0

    def budgets(self, ctx, row, shape, S, up):
        """One budget, the slimmable network's, at the lr Scratch's sweep chose for the width."""
        slim = self.slimmable_row(ctx).name
        if self.budget(row) == 'steps':
            steps = int(up.info[f'{slim}_steps'])
        else:
            made = ctx.plan[row.name]
            per = sum(ctx.step_flops(c) for c in (made[s] for s in ctx.shapes) if not isinstance(c, str))
            steps = max(1, int(round(up.flops[slim] / per)))
        return [(1.0, steps, ctx.base[tuple(shape)]['lr'])]


RECIPE = recipes.register(Slimmable())
SEPARATE = recipes.register(Separate())
