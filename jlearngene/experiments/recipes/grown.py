"""Family 'grown': the small model grown into each descendant by a fixed rule (Net2Net,
StackBERT, bert2BERT). The small model is read from the `small` section: its shape, and
either the converged Scratch run of that shape (`converged`, a study on one task) or
`fraction` of the reference S at the study's lr on the source task (with its class count,
`teacher.source_classes`); it is trained once per seed and shared with the operator family."""
from __future__ import annotations

import jax

from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.base import Recipe, Upstream
from jlearngene.experiments.recipes.teacher import on_source_task
from jlearngene.models import ViTConfig, init
from jlearngene.train import tasks


def small_config(ctx) -> ViTConfig:
    """The small model's config: the reference config at `small`'s shape, on the source
    task."""
    s = ctx.config['small']
    return on_source_task(ctx, ctx.ref).replace(width=s['width'], num_heads=s['num_heads'],
                                                mlp_dim=s['mlp_dim'], depth=s['depth'])


def small_model(ctx, seed: int):
    """(params, steps, test accuracy) of the small model for `seed`, made once per study."""
    if ('small', seed) in ctx.memo:
        return ctx.memo['small', seed]
    cfg = small_config(ctx)
    shape = (cfg.width, cfg.depth)
    if shape in ctx.base and not ctx.two_tasks:      # the converged Scratch run of the small shape
        run = ctx.base[shape]['runs'][seed]
        made = ctx.base[shape]['params'][seed], run['steps'], run['acc']
    else:
        steps = harness.fraction_steps(float(ctx.config['small']['fraction']), ctx.S_ref)
        params, curve = ctx.fit(f'small_s{seed}', tasks.classification_loss(cfg),
                                init(cfg, jax.random.key(seed + 2)), harness.eval_fn(cfg), steps=steps,
                                lr=float(ctx.config['optim']['lr']), seed=seed + 2,
                                dset=ctx.ancestor_dset)
        made = params, steps, curve[-1][1]
    ctx.say(f'small    seed {seed}: {made[1]} steps, test accuracy {made[2]:.4f}')
    ctx.memo['small', seed] = made
    return made


class Grown(Recipe):
    """The 'grown' family's recipe (Net2Net, StackBERT, bert2BERT): per seed, the small model
    (`small_model`) is every row's gene, grown into each descendant; a row's cost bills it."""
    family = 'grown'
    section = 'small'

    def billed(self, row):
        return ('small',)

    def check(self, ctx, rows):
        """Refuses `small.converged` in a study of two tasks, and a trained small model
        (not `converged`) of no steps (`small.fraction` <= 0)."""
        converged = harness.get(ctx.config['small'], 'converged', False)
        if ctx.two_tasks and converged:
            raise ValueError('study: small.converged takes the small model from Scratch\'s runs on the '
                             "descendants' task, but with two tasks (tasks) it is a model of the "
                             'source task: set small.converged=False and small.fraction > 0')
        if not converged and float(ctx.config['small']['fraction']) <= 0:
            raise ValueError(f"study: small.fraction={ctx.config['small']['fraction']} trains the small "
                             'model for no steps: set small.fraction > 0 (or small.converged=True in a '
                             'study on one task)')

    def scratch_shapes(self, ctx) -> dict:
        """With `small.converged`, the small model is Scratch's converged run of its shape."""
        if not harness.get(ctx.config['small'], 'converged', False):
            return {}
        cfg = small_config(ctx)
        return {(cfg.width, cfg.depth): cfg}

    def gene_shapes(self, ctx, row, target):
        """The small model's shapes (`small_config`), whatever the descendant."""
        return self.method(row).gene_shapes(small_config(ctx))

    def upstream(self, ctx, rows, seed):
        """The seed's small model (`small_model`, made once per study and shared with the
        operator family), every row's gene."""
        params, steps, acc = small_model(ctx, seed)
        return Upstream(genes={r.name: params for r in rows},
                        flops={'small': ctx.run_flops(small_config(ctx), steps)},
                        info={'small_accuracy': acc})


RECIPE = recipes.register(Grown())
