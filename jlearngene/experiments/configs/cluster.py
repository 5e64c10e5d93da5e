r"""The Cluster-Learngene study: an ancestor converged on the digits 0–4, its heads' mean
attention distances and density clusters, descendants on the digits 5–9 at ω = 2, 1 and 0.5
against Pre-Fin, He-LG, Auto-LG, a random-head control and a converged Scratch, under the
fair protocol (`jlearngene.experiments.study`; recorded result: experiments/cluster/README.md).

    jlearngene train --config cluster:digits --workdir DIR         # 3 seeds
    jlearngene train --config cluster:digits,quick --workdir DIR   # one seed
    jlearngene train --config cluster:smoke --workdir DIR          # seconds: the tests' miniature

1. Scratch on the digits 5–9 at every shape (width 32, depth 6, 4 / 8 / 16 heads of 4, MLP
   64, class token; 16 px images in 2 px patches: an 8×8 grid, where attention distance
   varies): lr sweep, plateau step S. The ancestor (8 heads) is trained the same way on the
   digits 0–4, its own lr sweep and plateau rule; its S is the reference S.
2. Mean attention distance of every ancestor head over 512 of its training images, density
   clusters at ε = 0.7 px (the paper's 10 px on a 224 px image, scaled to 16 px; recorded
   beside it: `--config.cluster.eps=0.07`, the paper's smallest ablation, 1 px, scaled), FFN
   groups by the paper's rule (`genes.cluster.ffn_groups`), φ the identity at the start.
3. Descendants with a new head, evaluated as initialised (0·S) and fine-tuned 0.5·S of their
   shape's S (the paper's 50 against Scratch's 100 epochs) at lr 1e-3: Cluster-Learngene
   from the centroid heads and from as many heads drawn at random per layer (the control),
   at ω = 2, 1, 0.5 (heads ⌊8/ω⌋); Pre-Fin (the whole ancestor), He-LG (its last 3 layers
   and embeddings), Auto-LG (its first 3 layers and embeddings) at ω = 1.
"""

from jlearngene.experiments.configs import fashion_transfer, parse_arg, section as _d, study_base

ARGS = ('digits', 'smoke', 'fashion')


def get_config(arg=None):
    """The study's config for `arg`, 'VARIANT[,quick]' (the variants: the module docstring).

    Args:
        arg: one of `ARGS`: 'digits' (the default, also for None or ''), 'smoke' or 'fashion'
            (Fashion-MNIST's transfer setting, `configs.fashion_transfer`, at ω = 2 and 1, with
            the ceiling); ',quick' keeps the first seed only.

    Returns:
        The study's ml_collections.ConfigDict (task 'experiment').

    Raises:
        ValueError: an unknown variant or flag (`configs.parse_arg`).
    """
    scale, flags = parse_arg(arg, ARGS, ('quick',))
    c = study_base('cluster', scale)
    # the two tasks: class subsets of the dataset, relabelled 0..k-1
    c.tasks = _d(ancestor=(0, 1, 2, 3, 4), descendant=(5, 6, 7, 8, 9))
    c.model = _d(variant='Ti', width=32, num_heads=8, mlp_dim=64, patch_size=2,
                 image_size=16, channels=1, pool='cls')
    c.batch_size = 32              # 65 tokens a image: half the studies' batch keeps it ~1 CPU-min a run
    c.depth = 6                    # the ancestor's
    c.mlp_ratio = 2
    c.shapes = ((32, 6, 4), (32, 6, 8), (32, 6, 16))   # ω = 2, 1, 0.5
    # mean attention distance over the first `images` ancestor-task training images;
    # DBSCAN(eps, min_samples=min_heads) per layer; ffn: 'paper' | 'same_count' | 'none'
    c.cluster = _d(images=512, eps=0.7, min_heads=1, ffn='paper')
    c.descend = _d(fractions=(0.0, 0.5), lr=1e-3, evals=5)
    c.methods = ('cluster', 'pre_fin', 'he_lg', 'auto_lg')
    c.variants = _d(cluster=_d(gene=_d(centroids=('clustered', 'random'))))
    # He-LG inherits the embeddings, as the official code does
    c.method_options = _d(he_lg=_d(gene=_d(k=3, embeddings='inherit')), auto_lg=_d(gene=_d(k=3)))

    if scale == 'smoke':
        c.seeds = (0,)
        c.batch_size = 16
        c.eval_batch_size = 64
        c.model.update(width=16, num_heads=4, mlp_dim=32, patch_size=4)
        c.depth = 2
        c.shapes = ((16, 2, 2), (16, 2, 4))
        c.cluster.update(images=32)
        c.scratch.update(steps=8, eval_every=4, patience=1, max_steps=0)
        c.descend.update(evals=2)
        c.optim.warmup_steps = 0
        c.method_options = _d(he_lg=_d(gene=_d(k=1)), auto_lg=_d(gene=_d(k=1)))
    elif scale == 'fashion':
        # patches of 4: a 7×7 grid, where attention distances spread
        fashion_transfer(c, patch_size=4)
        c.cluster.eps = 1.2          # the digits' 0.7 px scaled with the image, 28 / 16
        # ω = 2 and 1 (16 heads of 2 at ω = 0.5 are the slowest shape): every claim stays testable
        c.shapes = ((32, 6, 4), (32, 6, 8))
        c.methods = ('cluster', 'pre_fin', 'he_lg', 'auto_lg', 'ceiling')

    if 'quick' in flags:
        c.seeds = c.seeds[:1]
    return c
