r"""The Scala study: one slimmable ViT (width ratios 0.25 … 1, granularity 1/8, X = 7) with
both slicing rules, US-Net and MatFormer with the same warm-up, separate training at Scala's
steps and at its FLOPs, and a converged Scratch, at every grid width and at the widths between them, under
the fair protocol (`jlearngene.experiments.study`).

    jlearngene train --config scala:digits --workdir DIR         # 3 seeds
    jlearngene train --config scala:digits,quick --workdir DIR   # one seed
    jlearngene train --config scala:smoke --workdir DIR          # seconds: the tests' miniature

1. Scratch at every width (4 heads, MLP 2 × width, depth 4, class token): lr sweep, plateau
   step S; the reference S is the full width's.
2. Scala (`slim.rule` per variant: 'clean' or 'official'): 0.1·S full-width warm-up at half
   the lr, then 2·S steps of the four-width loss; US-Net (sandwich rule, in-place
   distillation) and MatFormer (the nested FFN at every grid ratio each step, width and
   heads whole: its row at width w is the sub-network with w/64 of the MLP units) with the
   same warm-up and steps.
3. Sub-networks evaluated as they are (0·S) at the grid widths 16 … 64 and the off-grid
   widths 20 … 60 (never trained); separate networks trained at each grid width for Scala's
   total steps (`separate/steps`) and for its FLOPs shared over the grid widths
   (`separate/flops`), each at the lr Scratch's sweep chose for its width; the off-grid
   widths are compared with Scratch.
"""

from jlearngene.experiments.configs import parse_arg, section as _d, source_task, study_base

ARGS = ('digits', 'smoke', 'fashion')


def get_config(arg=None):
    """The study's config for `arg`, 'VARIANT[,quick]' (the variants: the module docstring).

    Args:
        arg: one of `ARGS`: 'digits' (the default, also for None or ''), 'smoke' or 'fashion'
            (Fashion-MNIST's source classes, `configs.source_task`: a same-task study, at the
            grid widths 16, 32, 48, 64 only); ',quick' keeps the first seed only.

    Returns:
        The study's ml_collections.ConfigDict (task 'experiment').

    Raises:
        ValueError: an unknown variant or flag (`configs.parse_arg`).
    """
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = study_base('scala', scale)
    c.eval_batch_size = 256
    c.model = _d(variant='Ti', width=64, num_heads=4, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='cls')
    c.depth = 4
    c.keep_heads = True            # every width keeps the 4 heads, as the sub-networks do
    c.shapes = tuple((w, 4) for w in range(16, 65, 4))   # grid (every 8) and the widths between
    c.mlp_ratio = 2
    # rule: 'clean' | 'official' (genes/scala.py); isolated=False slices every width on the left
    c.slim = _d(smallest=0.25, granularity=0.125, rule='clean', ce_weight=1.0,
                transfer='progressive', isolated=True, warmup_fraction=0.1, warmup_lr_factor=0.5,
                fraction=2.0)
    c.descend = _d(fractions=(0.0,), lr=1e-3, evals=5)
    c.methods = ('scala', 'us_net', 'matformer', 'separate')
    c.variants = _d(scala=_d(descend=_d(rule=('clean', 'official'))),
                    separate=_d(descend=_d(budget=('steps', 'flops'))))

    if scale == 'smoke':
        c.seeds = (0,)
        c.batch_size = 16
        c.model.update(width=32, num_heads=4, mlp_dim=64, patch_size=8)
        c.depth = 1
        c.shapes = ((8, 1), (32, 1))
        c.slim.granularity = 0.25
        c.scratch.update(steps=8, eval_every=4, patience=1, max_steps=0)
        c.descend.evals = 2
        c.optim.warmup_steps = 0
    elif scale == 'fashion':
        source_task(c)       # same-task, as in the paper: Fashion-MNIST's source classes
        # r = 0.25, 0.5, 0.75, 1: every claim's widths, a third of the digits' 13 on 33× the images
        c.shapes = ((16, 4), (32, 4), (48, 4), (64, 4))

    if 'quick' in flags:
        c.seeds = c.seeds[:1]
    return c
