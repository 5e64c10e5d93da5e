r"""The TLEG study: a teacher, TLEG, Share-Init and Mini-Init genes through an Aux-Net,
descendants of four depths against a converged Scratch, He-LG and Pre-Fin, under the fair protocol
(`jlearngene.experiments.study`; recorded result: experiments/tleg/README.md).

    jlearngene train --config tleg:digits --workdir DIR        # the recorded study, 3 seeds
    jlearngene train --config tleg:digits,quick --workdir DIR  # one seed: a pipeline check
    jlearngene train --config tleg:smoke --workdir DIR         # seconds: the tests' miniature
    jlearngene train --config tleg:paper --workdir DIR --config.data.data_dir=~/tensorflow_datasets

Arguments: 'digits' (default), 'smoke' or 'paper', optionally followed by ',quick' (one seed).

1. Scratch at every shape: lr sweep 1e-3 / 2e-3 / 4e-3, 1,200 steps, the plateau step S.
   The teacher (width 64, 4 heads, depth 6) is the depth-6 Scratch run of each seed.
2. Aux-Net θ_l = θ_B + (l/6)·θ_A trained 1.5·S by soft distillation from the teacher (τ = 1,
   α = 1: pure KD, the official recipe); only the gene trains. Share-Init (θ_A ≡ 0) and
   Mini-Init (3 shared parts, each run by 2 consecutive layers: the paper's 6 of 12) the same.
3. Descendants of depth 2, 3, 4, 6, tuned 0.35·S of their own shape's S at lr 1e-3: TLEG,
   Share-Init, Mini-Init, He-LG (the teacher's last ⌈L_d/2⌉ layers and its embeddings over
   random layers) and Pre-Fin (its first L_d layers).

'paper' has TLEG's Table 1 schedule (DeiT-S width, 12-layer Aux-Net, 224 px; Scratch 100
epochs at lr 5e-4, the Aux-Net 150 epochs = 1.5·S, descendants 35 epochs = 0.35·S, official
fc_norm pooling) on a tfds dataset in `data.data_dir` (nothing is downloaded): for accelerators.
"""

from jlearngene.experiments.configs import (fashion_transfer, imagenet_data, parse_arg, section as _d,
                                            study_base)

ARGS = ('digits', 'smoke', 'paper', 'fashion')


def get_config(arg=None):
    """The study's config for `arg`, 'VARIANT[,quick]' (the variants: the module docstring).

    Args:
        arg: one of `ARGS`: 'digits' (the default, also for None or ''), 'smoke', 'paper' or
            'fashion' (Fashion-MNIST's transfer setting, `configs.fashion_transfer`, at depths
            3 and 6, with the ceiling); ',quick' keeps the first seed only.

    Returns:
        The study's ml_collections.ConfigDict (task 'experiment').

    Raises:
        ValueError: an unknown variant or flag (`configs.parse_arg`).
    """
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = study_base('tleg', scale)
    c.model = _d(variant='Ti', width=64, num_heads=4, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    c.depth = 6                      # the teacher's and the Aux-Net's depth
    c.shapes = ((64, 2), (64, 3), (64, 4), (64, 6))
    c.mlp_ratio = 2
    c.aux = _d(fraction=1.5, tau=1.0, alpha=1.0)
    c.descend = _d(fractions=(0.35,), lr=1e-3, evals=5, official_pool_order=False)
    c.methods = ('tleg', 'share_init', 'mini_init', 'he_lg', 'pre_fin')
    # he_lg.k = 0: k follows the descendant's depth, ⌈L_d / 2⌉; its embeddings inherited (the
    # default, as its official code); Mini-Init keeps its default ⌈depth / 2⌉ shared parts
    c.method_options = _d(tleg=_d(gene=_d(expand=('msa', 'mlp', 'ln'), from_layer=0)),
                          he_lg=_d(gene=_d(k=0)))

    if scale == 'smoke':
        c.seeds = (0,)
        c.batch_size = 32
        c.model.update(width=32, num_heads=2, mlp_dim=64, patch_size=8)
        c.depth = 2
        c.shapes = ((32, 1), (32, 2))
        c.scratch.update(steps=12, eval_every=4, patience=1, max_steps=0)
        c.descend.update(evals=2)
        c.optim.warmup_steps = 0
    elif scale == 'paper':
        c.seeds = (0,)
        c.batch_size = c.eval_batch_size = 512
        c.data = imagenet_data()
        # official Aux-Net: avg pooling of LN(x) with eps 1e-5; descendants get the official
        # fc_norm order and eps 1e-6 through descend.official_pool_order
        c.model = _d(variant='S', patch_size=16, image_size=224, channels=3, pool='avg',
                     ln_eps=1e-5, drop_path=0.1)
        c.depth = 12
        c.shapes = ((384, 3), (384, 6), (384, 9), (384, 12))
        c.mlp_ratio = 4
        c.optim = _d(lr=5e-4, warmup_steps=0, weight_decay=0.05, clip_norm=0.0, min_lr_ratio=0.02)
        # TLEG Table 1: Scratch 100 epochs at the DeiT lr; Aux-Net 150, descendants 35 epochs
        c.scratch.update(lrs=(5e-4,), steps=0, epochs=100.0, eval_every=0, patience=0)
        c.descend.update(lr=5e-4, evals=1, official_pool_order=True)

    elif scale == 'fashion':
        fashion_transfer(c)
        c.shapes = ((64, 3), (64, 6))
        c.methods = ('tleg', 'share_init', 'mini_init', 'he_lg', 'pre_fin', 'ceiling')

    if 'quick' in flags:
        c.seeds = c.seeds[:1]
    return c
