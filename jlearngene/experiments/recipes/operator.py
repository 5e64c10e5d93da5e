"""Family 'operator': a growth operator from the small model to each descendant, trained
per descendant on the descendant's loss with the small model frozen (Mango, LiGO). Reads
the `operator` section (`fraction` of the descendant's S, `lr`, `weight_decay`) and, through
the grown family, the small model."""
from __future__ import annotations

import jax

from jlearngene import costs
from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.grown import Grown, small_config
from jlearngene.train import tasks


class Operator(Grown):
    family = 'operator'
    section = 'operator'

    def gene_shapes(self, ctx, row, target):
        m = self.method(row)
        init_options, _ = m.operator.split(self.gene_options(ctx, row, target))
        return m.gene_shapes(small_config(ctx), large_cfg=target, **init_options)

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        steps = harness.fraction_steps(float(ctx.config['operator']['fraction']), S)
        return self.train(ctx, f'{row.tag}_w{d_cfg.width}_d{d_cfg.depth}_s{seed}', row,
                          up.genes[row.name], d_cfg, steps, seed)

    def train(self, ctx, name, row, small, large_cfg, steps, seed):
        """Train the row's operator `steps` steps on the large model's loss (the small model
        frozen: in the trained tree, frozen by the optimiser and behind `stop_gradient`);
        returns (the grown large params, the operator's training FLOPs: the large model's
        step plus 3× the grow's FLOPs per step)."""
        oc, verbs, small_cfg = ctx.config['operator'], self.method(row).operator, small_config(ctx)
        init_options, grow_options = verbs.split(self.gene_options(ctx, row, large_cfg))
        inner = tasks.classification_loss(large_cfg)

        def grow(op, small):
            return verbs.grow(op, small, large_cfg, **grow_options)

        def loss_fn(trainable, batch, rng):
            return inner(grow(trainable['operator'], jax.lax.stop_gradient(trainable['small'])), batch, rng)

        operator = verbs.init(small_cfg, large_cfg, jax.random.key(seed + 3), **init_options)
        optim = dict(harness.plain(ctx.config['optim']), weight_decay=oc['weight_decay'],
                     decay=('operator/.*',), freeze=('small/.*',))
        trained, _ = ctx.fit(f'operator_{name}', loss_fn, {'operator': operator, 'small': small}, None,
                             steps=steps, lr=float(oc['lr']), seed=seed + 3, optim=optim)
        if verbs.grow_flops is not None:
            g_flops = float(verbs.grow_flops(small_cfg, large_cfg, **init_options))
        else:    # XLA's count of the lowered grow, multiply-accumulates as one
            g_flops = float(jax.jit(grow).lower(operator, small).cost_analysis()['flops']) / 2
        ctx.say(f'operator {name}: {steps} steps ({ctx.timings[f"operator_{name}"]:.0f}s)')
        extra = steps * (ctx.step_flops(large_cfg) + costs.TRAIN_FACTOR * g_flops)
        return jax.jit(grow)(trained['operator'], small), float(extra)


RECIPE = recipes.register(Operator())
