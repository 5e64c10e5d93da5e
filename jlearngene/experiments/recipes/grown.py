"""Family 'grown': the small model grown into each descendant by a fixed rule (Net2Net,
StackBERT, bert2BERT). The small model is read from the `small` section: its shape, and
either a model of that shape trained to convergence (`converged`: in a study on one task
the converged Scratch run of that shape; with two tasks a model of the source task, trained
as the teacher is, with its own sweep and converged by doubling) or `fraction` of the
reference S at the study's lr on the source task (with its class count,
`teacher.source_classes`); it is trained once per seed and shared with the operator family."""
from __future__ import annotations

import jax

from jlearngene.experiments import harness, recipes, scratch
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
    """(params, steps, test accuracy) of the small model for `seed`, made once per study
    (the module docstring says how)."""
    if ('small', seed) in ctx.memo:
        return ctx.memo['small', seed]
    cfg = small_config(ctx)
    shape = (cfg.width, cfg.depth)
    converged = harness.get(ctx.config['small'], 'converged', False)
    if shape in ctx.base and not ctx.two_tasks:      # the converged Scratch run of the small shape
        run = ctx.base[shape]['runs'][seed]
        made = ctx.base[shape]['params'][seed], run['steps'], run['acc']
    elif converged:         # two tasks: its own sweep and doubling on the source task
        small = _small_baseline(ctx, cfg)
        made = small['params'][seed], small['runs'][seed]['steps'], small['runs'][seed]['acc']
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


def _small_baseline(ctx, cfg: ViTConfig) -> dict:
    """The small model's baseline on the source task (`scratch.baseline`, tag 'small': its
    own sweep, converged by doubling), every seed's, made once per study."""
    if 'small baseline' not in ctx.memo:
        shape, seeds = (cfg.width, cfg.depth), [int(s) for s in ctx.config['seeds']]
        ctx.memo['small baseline'] = scratch.baseline(ctx, {shape: cfg}, seeds, dset=ctx.ancestor_dset,
                                                      tag='small')[shape]
    return ctx.memo['small baseline']


class Grown(Recipe):
    """The 'grown' family's recipe (Net2Net, StackBERT, bert2BERT): per seed, the small model
    (`small_model`) is every row's gene, grown into each descendant; a row's cost bills it."""
    family = 'grown'
    section = 'small'

    def billed(self, row):
        return ('small',)

    def check(self, ctx, rows):
        """Refuses a trained small model (not `converged`) of no steps (`small.fraction`
        <= 0)."""
        converged = harness.get(ctx.config['small'], 'converged', False)
        if not converged and float(ctx.config['small']['fraction']) <= 0:
            raise ValueError(f"study: small.fraction={ctx.config['small']['fraction']} trains the small "
                             'model for no steps: set small.fraction > 0 or small.converged=True')

    def scratch_shapes(self, ctx) -> dict:
        """With `small.converged` in a study on one task, the small model is Scratch's
        converged run of its shape."""
        if ctx.two_tasks or not harness.get(ctx.config['small'], 'converged', False):
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
