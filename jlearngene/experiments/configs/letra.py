r"""The LeTra study: a learngene inside a wider, deeper Aux-Net, descendants of eight (width,
depth) shapes at 0 and 0.05·S against a converged Scratch and IMwLM, under the fair protocol
(`jlearngene.experiments.study`; recorded result: experiments/letra/README.md).

    jlearngene train --config letra:digits --workdir DIR        # the recorded study, 3 seeds
    jlearngene train --config letra:digits,quick --workdir DIR  # one seed
    jlearngene train --config letra:smoke --workdir DIR         # seconds: the tests' miniature
    jlearngene train --config letra:paper --workdir DIR --config.data.data_dir=~/tensorflow_datasets

1. Scratch at every shape: lr sweep 1e-3 / 2e-3 / 4e-3, 1,200 steps, the plateau step S.
   The teacher (width 64, 8 heads of 8, 8 layers: the Aux-Net's shape) is the (64, 8)
   Scratch run of each seed; IMwLM selects its weights from it.
2. Learngene: width 32 (4 heads), 4 layers, inside an Aux-Net of width 64, 8 layers,
   trained 3.2·S by soft distillation from the teacher (τ = 1, α = 1: the official recipe);
   weight decay on the learngene's kernels and the width matrices only.
3. Eight descendants (MLP 2 × width), each selection strategy of LeTra (`variants.letra`)
   and IMwLM, evaluated at initialisation (0·S) and tuned 0.05·S at lr 1e-3.

'paper' has the official shapes (learngene DeiT-S width, 8 layers, 6 heads; Aux-Net DeiT-B
width, 16 layers, 320 epochs = 3.2·S; Scratch 100 epochs at lr 5e-4, DeiT's recipe; Des-Nets
at 0 and 5 epochs = 0.05·S at lr 1e-5; official fc_norm pooling) on a tfds dataset in
`data.data_dir` (nothing is downloaded): for accelerators.
"""

from jlearngene.experiments.configs import (fashion_transfer, imagenet_data, parse_arg, section as _d,
                                            study_base)

ARGS = ('digits', 'smoke', 'paper', 'fashion')


def get_config(arg=None):
    """The study's config for `arg`, 'VARIANT[,quick]' (the variants: the module docstring).

    Args:
        arg: one of `ARGS`: 'digits' (the default, also for None or ''), 'smoke', 'paper' or
            'fashion' (Fashion-MNIST's transfer setting, `configs.fashion_transfer`, at four
            shapes, with the ceiling); ',quick' keeps the first seed only.

    Returns:
        The study's ml_collections.ConfigDict (task 'experiment').

    Raises:
        ValueError: an unknown variant or flag (`configs.parse_arg`).
    """
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = study_base('letra', scale)
    # the Aux-Net's (and teacher's) shape; descendants change width, heads, MLP and depth
    c.model = _d(variant='Ti', width=64, num_heads=8, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    c.depth = 8
    c.shapes = ((32, 4), (40, 3), (40, 6), (48, 4), (48, 8), (56, 5), (64, 4), (64, 8))
    c.mlp_ratio = 2
    c.aux = _d(fraction=3.2, tau=1.0, alpha=1.0)
    # the learngene's size inside the Aux-Net
    c.method_options = _d(letra=_d(gene=_d(learngene_heads=4, learngene_depth=4)))
    c.descend = _d(fractions=(0.0, 0.05), lr=1e-3, evals=4)
    c.methods = ('letra', 'imwlm')
    c.variants = _d(letra=_d(descend=_d(selection=('continuous', 'step', 'random', 'random_wo', 'rank'))))

    if scale == 'smoke':
        c.seeds = (0,)
        c.batch_size = 32
        c.model.update(width=16, num_heads=4, mlp_dim=32, patch_size=8)
        c.depth = 4
        c.method_options.letra.gene.update(learngene_heads=2, learngene_depth=2)
        c.shapes = ((12, 2), (16, 4))
        c.scratch.update(steps=12, eval_every=4, patience=1, max_steps=0)
        c.descend.update(evals=2)
        c.variants.letra.descend.selection = ('continuous', 'random')
        c.optim.warmup_steps = 0
    elif scale == 'paper':
        c.seeds = (0,)
        c.batch_size = c.eval_batch_size = 512
        c.data = imagenet_data()
        # official Aux-Net and Des-Nets: timm avg pooling with fc_norm, LayerNorm eps 1e-6
        c.model = _d(variant='B', patch_size=16, image_size=224, channels=3, pool='avg',
                     pool_norm='after', ln_eps=1e-6, drop_path=0.1)
        c.depth = 16
        c.aux.update(fraction=3.2)   # 320 epochs: stage 1 in LeTra's rebuttal, not the README's 300
        c.method_options.letra.gene.update(learngene_heads=6, learngene_depth=8)
        c.shapes = ((384, 8), (384, 12), (576, 10), (576, 12), (768, 6), (768, 9),
                    (768, 12), (768, 16))
        c.mlp_ratio = 4
        c.optim = _d(lr=5e-4, warmup_steps=0, weight_decay=0.05, clip_norm=0.0, min_lr_ratio=0.02)
        # Scratch: 100 epochs at DeiT's lr (the comparison of LeTra's Table 1), not the
        # Des-Nets' fine-tuning lr 1e-5
        c.scratch.update(lrs=(5e-4,), steps=0, epochs=100.0, eval_every=0, patience=0)
        c.descend.update(lr=1e-5, evals=1)
    elif scale == 'fashion':
        fashion_transfer(c)
        c.shapes = ((32, 4), (48, 4), (48, 8), (64, 8))
        c.methods = ('letra', 'imwlm', 'ceiling')
        c.variants.letra.descend.selection = ('continuous', 'step', 'random')

    if 'quick' in flags:
        c.seeds = c.seeds[:1]
    return c
