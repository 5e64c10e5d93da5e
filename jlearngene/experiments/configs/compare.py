r"""Every method and baseline on one task under the fair protocol: TLEG, LeTra,
Cluster-Learngene, Scala and Mango against a converged Scratch, He-LG, IMwLM and bert2BERT
(Pre-Fin, Auto-LG, Share-Init, Net2Net, StackBERT, LiGO on request), on descendants of three
(width, depth) shapes (`jlearngene.experiments.study`; recorded: experiments/compare/README.md).

    jlearngene compare --workdir DIR                     # = jlearngene train --config compare ...
    jlearngene compare smoke --workdir DIR               # about a minute: the tests' miniature
    jlearngene compare paper --workdir DIR \
        --config.data.data_dir=~/tensorflow_datasets     # accelerator shapes (DeiT-B)
    jlearngene compare --workdir DIR --config.methods="('tleg','ligo')"

Arguments: 'digits' (default), 'smoke', 'paper' or 'fashion' (the transfer setting),
optionally followed by ',quick' (one seed).

1. Scratch at every shape (lr sweep, plateau step S); the teacher (width 64, 8 heads of 8,
   MLP 128, depth 6) is the (64, 6) Scratch run of each seed. TLEG's gene (1.5·S) and LeTra's
   (4-head, 4-layer learngene, 3.2·S) train through Aux-Nets of its shape by soft KD from it;
   Cluster-Learngene, He-LG and IMwLM take their genes from it; Scala trains one slimmable
   network of its shape for S (after a 0.05·S full-width warm-up); a small ViT (width 32, 4
   heads, depth 3, S steps) is what bert2BERT grows and Mango's operators (5 % of the
   descendant's S each) map.
2. Descendants of `shapes` (MLP 2 × width) from every method that can make them, tuned 0.35·S
   at lr 1e-3; the table says which shapes a method cannot make and why.
3. Costs: every upstream run in training FLOPs, with and without the teacher, amortised over
   N descendants, FLOPs to the target and the break-even N against Scratch.
"""

from jlearngene.experiments.configs import (fashion_transfer, imagenet_data, parse_arg, section as _d,
                                            study_base)

ARGS = ('digits', 'smoke', 'paper', 'fashion')


def get_config(arg=None):
    """The comparison's config for `arg`, 'VARIANT[,quick]' (the variants: the module
    docstring).

    Args:
        arg: one of `ARGS`: 'digits' (the default, also for None or ''), 'smoke', 'paper' or
            'fashion' (Fashion-MNIST's transfer setting, `configs.fashion_transfer`, at half
            the width, with the ceiling and without the same-task Scala and Mango; the small
            model bert2BERT grows trained on the source task to convergence, with its own
            sweep and doubling, as the teacher is: `small.converged`); ',quick'
            keeps the first seed only.

    Returns:
        The comparison's ml_collections.ConfigDict (task 'experiment').

    Raises:
        ValueError: an unknown variant or flag (`configs.parse_arg`).
    """
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = study_base('compare', scale)
    # the teacher's shape; Aux-Nets and Scala's slimmable network share it
    c.model = _d(variant='Ti', width=64, num_heads=8, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    c.depth = 6
    # descendants: (width, depth), MLP mlp_ratio × width; heads of the model's head_dim, or
    # (Scala) the model's head count
    c.shapes = ((64, 6), (64, 4), (32, 6))
    c.mlp_ratio = 2
    c.methods = ('tleg', 'letra', 'cluster', 'scala', 'mango', 'he_lg', 'imwlm', 'bert2bert')
    # budgets as fractions of S: the Aux-Nets of the reference S (LeTra's own), descendants
    # and Mango's / LiGO's operators of the shape's S
    c.aux = _d(fraction=1.5, fractions=_d(letra=3.2), tau=1.0, alpha=1.0)
    c.slim = _d(smallest=0.25, granularity=0.125, rule='clean', ce_weight=1.0,
                transfer='progressive', isolated=True, warmup_fraction=0.05, warmup_lr_factor=0.5,
                fraction=1.0)
    c.cluster = _d(images=512, eps=0.1, min_heads=1, ffn='paper')
    c.small = _d(width=32, num_heads=4, mlp_dim=64, depth=3, converged=False, fraction=1.0)
    c.operator = _d(fraction=0.05, lr=1e-3, weight_decay=0.0)
    c.descend = _d(fractions=(0.35,), lr=1e-3, evals=5)
    # per method: 'gene' options (he_lg/auto_lg k: 0 = ⌈depth/2⌉; He-LG's embeddings drawn
    # fresh, as the recorded run; mango: the operator's)
    # and 'descend' options
    c.method_options = _d(he_lg=_d(gene=_d(k=0, embeddings='random')), auto_lg=_d(gene=_d(k=0)),
                          letra=_d(gene=_d(learngene_heads=4, learngene_depth=4),
                                   descend=_d(selection='continuous')),
                          mango=_d(gene=_d(rank=1, noise=1e-2, remat=False)),
                          bert2bert=_d(descend=_d(aki=True)))

    if scale == 'smoke':
        c.seeds = (0,)
        c.batch_size = 16
        c.eval_batch_size = 64
        c.model.update(width=16, num_heads=4, mlp_dim=32, patch_size=8)
        c.optim.warmup_steps = 0
        c.depth = 2
        c.shapes = ((16, 2), (12, 2))
        # Pre-Fin cannot make width 12
        c.methods = ('pre_fin', 'imwlm')
        c.scratch.update(steps=8, eval_every=4, patience=1, max_steps=0)
        c.method_options.letra.gene.update(learngene_heads=2, learngene_depth=2)
        c.slim.granularity = 0.25
        c.cluster.images = 32
        c.small.update(width=8, num_heads=2, mlp_dim=16, depth=1)
        c.descend.evals = 2
    elif scale == 'paper':
        c.seeds = (0,)
        c.batch_size = c.eval_batch_size = 512
        c.data = imagenet_data()
        # DeiT-B teacher / Aux-Net / slimmable network; DeiT-S as the small model to grow
        c.model = _d(variant='B', patch_size=16, image_size=224, channels=3, pool='avg',
                     ln_eps=1e-6, drop_path=0.1)
        c.depth = 12
        c.mlp_ratio = 4
        # DeiT-B, a 6-layer DeiT-B (TLEG's Des-B), Scala's 0.75 width, DeiT-S width
        c.shapes = ((768, 12), (768, 6), (576, 12), (384, 12))
        c.optim = _d(lr=5e-4, warmup_steps=0, weight_decay=0.05, clip_norm=0.0, min_lr_ratio=0.02)
        # Scratch 100 epochs at DeiT's lr (TLEG's Table 1); Aux-Nets 150 epochs (TLEG) and
        # 320 (LeTra, its rebuttal), Scala's 300 epochs, the small model 300, descendants 35 (TLEG)
        c.scratch.update(lrs=(5e-4,), steps=0, epochs=100.0, eval_every=0, patience=0)
        c.aux.update(fractions=_d(letra=3.2))
        c.method_options.letra.gene.update(learngene_heads=6, learngene_depth=6)
        c.slim.update(granularity=1 / 16, warmup_fraction=0.0, fraction=3.0)
        c.cluster.update(images=50_000, eps=10.0)
        c.small.update(width=384, num_heads=6, mlp_dim=1536, depth=12, fraction=3.0)
        c.operator.update(fraction=0.004, lr=1e-4)   # ~100 steps of 25,000 (Mango)
        c.descend.update(lr=5e-4, evals=1)
    elif scale == 'fashion':
        # patches of 4 (Cluster-Learngene is a row); half the width keeps a 7×7 grid affordable
        fashion_transfer(c, patch_size=4)
        c.model.update(width=32, num_heads=4, mlp_dim=64)
        c.method_options.letra.gene.learngene_heads = 2   # half the teacher's heads, as in digits
        c.shapes = ((32, 6), (32, 4), (16, 6))
        c.small.update(width=16, num_heads=2, mlp_dim=32, depth=3, converged=True)
        c.cluster.eps = 1.2          # the digits' 0.7 px scaled with the image, 28 / 16
        # Scala and Mango are same-task methods: scala:fashion and mango:fashion
        c.methods = ('tleg', 'letra', 'cluster', 'he_lg', 'imwlm', 'bert2bert', 'ceiling')

    if 'quick' in flags:
        c.seeds = c.seeds[:1]
    return c
