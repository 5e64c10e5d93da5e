"""Family 'operator': a growth operator from the small model to each descendant, trained
per descendant on the descendant's loss with the small model frozen (Mango, LiGO); where the
descendants' task is not the small model's (a row with head='new'), the grown model keeps the
small model's class count and a fresh head for the descendants' task trains with the
operator. Reads the `operator` section (`fraction` of the descendant's S, `lr`,
`weight_decay`) and, through the grown family, the small model."""
from __future__ import annotations

import jax

from jlearngene import costs
from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.grown import Grown, small_config
from jlearngene.models import vit
from jlearngene.train import tasks

# the large model's heads over its task's classes (the growth methods take no pre_logits)
CLASS_HEADS = ('head', 'head_dist')


class Operator(Grown):
    """The 'operator' family's recipe (Mango, LiGO): the grown family's small model, grown
    into each descendant by an operator trained for that descendant (`train`), whose FLOPs
    are the descendant's own."""
    family = 'operator'
    section = 'operator'

    def gene_shapes(self, ctx, row, target):
        """The small model's and the operator's shapes for growing into `target` (on the
        small model's classes)."""
        m, small_cfg = self.method(row), small_config(ctx)
        init_options, _ = m.operator.split(self.gene_options(ctx, row, target))
        return m.gene_shapes(small_cfg, large_cfg=target.replace(num_classes=small_cfg.num_classes),
                             **init_options)

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        """The operator trained `operator.fraction` of the descendant's S (`train`); its
        FLOPs are the descendant's own. `key` is unused: the operator is seeded by `seed`."""
        steps = harness.fraction_steps(float(ctx.config['operator']['fraction']), S)
        return self.train(ctx, f'{row.tag}_w{d_cfg.width}_d{d_cfg.depth}_s{seed}', row,
                          up.genes[row.name], d_cfg, steps, seed)

    def train(self, ctx, name, row, small, large_cfg, steps, seed):
        """Train the row's operator `steps` steps on the large model's loss (the small model
        frozen: in the trained tree, frozen by the optimiser and behind `stop_gradient`; a
        fresh head for the large model's task trains beside the operator where the row's
        descend option head is 'new'); returns (the large params, the operator's training
        FLOPs: the large model's step plus 3× the grow's FLOPs per step)."""
        oc, verbs, small_cfg = ctx.config['operator'], self.method(row).operator, small_config(ctx)
        init_options, grow_options = verbs.split(self.gene_options(ctx, row, large_cfg))
        inner = tasks.classification_loss(large_cfg)
        grow_cfg = large_cfg.replace(num_classes=small_cfg.num_classes)   # the small model's classes
        new_head = row.descend.get('head') == 'new'

        def grow(op, small):
            return verbs.grow(op, small, grow_cfg, **grow_options)

        def large(trainable):
            grown = grow(trainable['operator'], jax.lax.stop_gradient(trainable['small']))
            return {**grown, **trainable['head']} if new_head else grown

        def loss_fn(trainable, batch, rng):
            return inner(large(trainable), batch, rng)

        operator = verbs.init(small_cfg, grow_cfg, jax.random.key(seed + 3), **init_options)
        trainable = {'operator': operator, 'small': small}
        if new_head:
            fresh = vit.init_embeddings(large_cfg, jax.random.key(seed + 4))
            trainable['head'] = {k: v for k, v in fresh.items() if k in CLASS_HEADS}
        optim = dict(harness.plain(ctx.config['optim']), weight_decay=oc['weight_decay'],
                     decay=('operator/.*',), freeze=('small/.*',))
        trained, _ = ctx.fit(f'operator_{name}', loss_fn, trainable, None,
                             steps=steps, lr=float(oc['lr']), seed=seed + 3, optim=optim)
        if verbs.grow_flops is not None:
            g_flops = float(verbs.grow_flops(small_cfg, grow_cfg, **init_options))
        else:    # XLA's count of the lowered grow, multiply-accumulates as one
            g_flops = float(jax.jit(grow).lower(operator, small).cost_analysis()['flops']) / 2
        ctx.say(f'operator {name}: {steps} steps ({ctx.timings[f"operator_{name}"]:.0f}s)')
        extra = steps * (ctx.step_flops(large_cfg) + costs.TRAIN_FACTOR * g_flops)
        return jax.jit(large)(trained), float(extra)


RECIPE = recipes.register(Operator())
