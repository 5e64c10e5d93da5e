r"""TLEG end to end: teacher -> learngene through an Aux-Net -> descendants of several depths,
compared with Scratch, Share-Init and He-LG at the same fine-tuning budget.

    jlearngene demo                                          # = the next line
    jlearngene train --config tleg:digits --workdir workdirs/demo
    jlearngene train --config tleg:digits,quick --workdir DIR   # half the step budgets
    jlearngene train --config tleg:smoke --workdir DIR          # seconds: the tests' miniature
    jlearngene train --config tleg:paper --workdir DIR \
        --config.data.data_dir=~/tensorflow_datasets --config.teacher.checkpoint=CKPT

Arguments: 'digits' (default; 5.5 CPU-minutes, ~3-7 min wall on 2 cores), 'smoke' or 'paper',
optionally followed by ',quick' (teacher, Aux-Net and descendant budgets halved).

1. Ancestor/teacher: a 6-layer ViT (width 64) trained with cross-entropy on the digits.
2. Learngene: a 6-layer Aux-Net θ_l = θ_B + (l/6)·θ_A trained by soft distillation from the
   teacher (τ = 1, α = 1: pure KD, the official recipe); only the gene trains. A Share-Init
   gene (θ_A ≡ 0, one shared layer) is trained the same way.
3. Descendants of depth 2, 3, 4, 6: TLEG (linear expansion with their own L_d), Share-Init,
   He-LG (the ancestor's last k = ⌈L_d/2⌉ layers over random ones; `method_options.he_lg.k`
   fixes k) and Scratch, each fine-tuned for the same number of steps with the same optimiser.

'paper' selects the paper's shapes (DeiT-S width, `--config.model.variant=Ti|B` for the
others; 12-layer Aux-Net, 224 px, descendants of depth 3/6/9/12, epoch budgets of TLEG
Table 1, official fc_norm pooling order for descendants) on a tfds dataset prepared in
`data.data_dir` (nothing is downloaded): for accelerators, not for a CPU.
Budgets: `steps` (> 0) or else `epochs`, per stage.
"""

from jlearngene.experiments.configs import experiment_base, imagenet_data, parse_arg, section as _d

ARGS = ('digits', 'smoke', 'paper')


def get_config(arg=None):
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = experiment_base('tleg', scale)
    c.model = _d(variant='Ti', width=64, num_heads=4, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    # teacher.checkpoint: a jlearngene model artefact to distil from instead of training one
    c.teacher = _d(depth=6, steps=400, epochs=0.0, checkpoint='')
    # the Aux-Net through which every learned gene trains, by soft KD from the teacher
    c.aux = _d(depth=6, steps=500, epochs=0.0, tau=1.0, alpha=1.0)
    c.descend = _d(depths=(2, 3, 4, 6), steps=100, epochs=0.0, eval_every=25, lr=1e-3,
                   official_pool_order=False)
    c.methods = ('tleg', 'share_init', 'he_lg', 'scratch')
    # per-method options; he_lg.k = 0: k follows the descendant's depth, ⌈L_d / 2⌉
    c.method_options = _d(tleg=_d(expand=('msa', 'mlp', 'ln'), from_layer=0),
                          he_lg=_d(k=0))

    if scale == 'smoke':
        c.batch_size = 32
        c.model.update(width=32, num_heads=2, mlp_dim=64, patch_size=8)
        # identical step programs for teacher and depth-2 descendants (compile cache hits)
        c.teacher.update(depth=2, steps=4)
        c.aux.update(depth=2, steps=4)
        c.descend.update(depths=(1, 2), steps=4, eval_every=2, lr=c.optim.lr)
        c.optim.warmup_steps = 0
    elif scale == 'paper':
        c.batch_size = c.eval_batch_size = 512
        c.data = imagenet_data()
        # official Aux-Net: avg pooling of LN(x) with eps 1e-5; descendants get the official
        # fc_norm order and eps 1e-6 through descend.official_pool_order
        c.model = _d(variant='S', patch_size=16, image_size=224, channels=3, pool='avg',
                     ln_eps=1e-5, drop_path=0.1)
        c.optim = _d(lr=5e-4, warmup_steps=0, weight_decay=0.05, clip_norm=0.0, min_lr_ratio=0.02)
        c.teacher.update(depth=12, steps=0, epochs=100.0)
        c.aux.update(depth=12, steps=0, epochs=150.0)
        c.descend.update(depths=(3, 6, 9, 12), steps=0, epochs=35.0, eval_every=0, lr=5e-4,
                         official_pool_order=True)

    if 'quick' in flags:
        for section in (c.teacher, c.aux, c.descend):
            section.steps = max(1, section.steps // 2) if section.steps else 0
            section.epochs = section.epochs / 2
        if c.descend.eval_every:
            c.descend.eval_every = max(1, c.descend.eval_every // 2)
    return c
