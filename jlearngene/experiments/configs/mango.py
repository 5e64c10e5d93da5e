r"""The Mango study: a small ViT trained to convergence, grown into a large one by Net2Net,
StackBERT, bert2BERT, LiGO and Mango (R = 1, 2, 4), every grown model trained until it first
reaches the target, against a converged Scratch, under the fair protocol
(`jlearngene.experiments.study`).

    jlearngene train --config mango:digits --workdir DIR        # 3 seeds
    jlearngene train --config mango:digits,quick --workdir DIR  # one seed
    jlearngene train --config mango:smoke --workdir DIR         # seconds: the tests' miniature

1. Scratch at the large shape (width 64, 4 heads of 16, MLP 128, depth 6) and at the small
   one (width 32, 2 heads, MLP 64, depth 3): lr sweep, plateau step S. The small model each
   growth method grows is the small shape's Scratch run of the seed (`small.converged`).
2. LiGO's and Mango's operators train 0.05·S steps on the large model's loss, the small
   model frozen (a per-descendant cost); Net2Net, StackBERT (with Net2Net's width growth)
   and bert2BERT (AKI) grow in one shot.
3. Every grown model trains up to S at lr 1e-3 with 20 evaluations and stops at the first
   that reaches the target (Scratch's converged mean − 0.5 pt): the headline is the training
   FLOPs until then, the operator's included.
"""

from jlearngene.experiments.configs import parse_arg, section as _d, source_task, study_base

ARGS = ('digits', 'smoke', 'fashion')


def get_config(arg=None):
    """The study's config for `arg`, 'VARIANT[,quick]' (the variants: the module docstring).

    Args:
        arg: one of `ARGS`: 'digits' (the default, also for None or ''), 'smoke' or 'fashion'
            (Fashion-MNIST's source classes, `configs.source_task`: a same-task study);
            ',quick' keeps the first seed only.

    Returns:
        The study's ml_collections.ConfigDict (task 'experiment').

    Raises:
        ValueError: an unknown variant or flag (`configs.parse_arg`).
    """
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = study_base('mango', scale)
    # the large model's shape; the small one is `small`
    c.model = _d(variant='Ti', width=64, num_heads=4, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    c.depth = 6
    c.shapes = ((64, 6),)
    c.mlp_ratio = 2
    c.small = _d(width=32, num_heads=2, mlp_dim=64, depth=3, converged=True, fraction=0.0)
    c.operator = _d(fraction=0.05, lr=1e-3, weight_decay=0.0)
    c.descend = _d(fractions=(1.0,), lr=1e-3, evals=20, stop_at_target=True)
    c.methods = ('mango', 'ligo', 'bert2bert', 'net2net', 'stackbert')
    c.variants = _d(mango=_d(gene=_d(rank=(1, 2, 4))))
    c.method_options = _d(stackbert=_d(descend=_d(width='net2net')),
                          bert2bert=_d(descend=_d(aki=True)),
                          mango=_d(gene=_d(noise=1e-2, remat=False)))

    if scale == 'smoke':
        c.seeds = (0,)
        c.batch_size = 16
        c.model.update(width=32, num_heads=4, mlp_dim=64, patch_size=8)
        c.depth = 2
        c.shapes = ((32, 2),)
        c.small.update(width=16, num_heads=2, mlp_dim=32, depth=1)
        c.scratch.update(steps=12, eval_every=4, patience=1, max_steps=0)
        c.operator.fraction = 0.25
        c.descend.evals = 3
        c.methods = ('mango', 'bert2bert')
        c.variants.mango.gene.rank = (2,)
        c.optim.warmup_steps = 0
    elif scale == 'fashion':
        source_task(c)       # same-task, as in the paper: Fashion-MNIST's source classes

    if 'quick' in flags:
        c.seeds = c.seeds[:1]
    return c
