r"""Scala end to end: one slimmable ViT on the digits with width ratios 0.25 … 1 (granularity
1/8, X = 7), against US-Net, MatFormer and separately trained networks at equal training
FLOPs, evaluated at every grid width and at the unseen widths between them.

    jlearngene train --config scala:digits --workdir DIR    # ≈ 10 CPU-minutes
    jlearngene train --config scala:smoke --workdir DIR     # seconds: the tests' miniature

Arguments: 'digits' (default) or 'smoke' (granularity 1/4, X = 4: upper half {0.75}, lower
{0.5}). Override anything, e.g. `--config.slim.rule=official`, `--config.slim.granularity=0.0625`,
`--config.teacher.steps=300` (a full-size teacher for DeiT hard distillation of the full
network), `--config.methods="('scala','separate')"`.

Scala: `train.warmup_steps` full-only steps at `warmup_lr_factor` × lr, then `train.steps`
four-width steps. The other methods get the steps of equal training FLOPs.
"""

from jlearngene.experiments.configs import experiment_base, parse_arg, section as _d

ARGS = ('digits', 'smoke')


def get_config(arg=None):
    scale, _ = parse_arg(arg, ARGS, ())
    c = experiment_base('scala', scale, eval_batch_size=256)
    c.model = _d(variant='Ti', width=64, num_heads=4, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='cls')
    c.depth = 4
    # rule: 'clean' | 'official' (genes/scala.py); isolated=False slices every width on the left
    c.slim = _d(smallest=0.25, granularity=0.125, rule='clean', ce_weight=1.0,
                transfer='progressive', isolated=True, matformer=(0.25, 0.5, 0.75, 1.0))
    c.train = _d(warmup_steps=60, warmup_lr_factor=0.5, steps=540)
    c.teacher = _d(steps=0)        # > 0: train a full-size teacher first (DeiT hard distillation)
    c.methods = ('scala', 'us_net', 'matformer', 'separate')

    if scale == 'smoke':
        c.batch_size = 16
        c.model.update(width=32, num_heads=4, mlp_dim=64, patch_size=8)
        c.depth = 1
        c.slim.granularity = 0.25
        c.train.update(warmup_steps=2, steps=4)
        c.optim.warmup_steps = 0
    return c
