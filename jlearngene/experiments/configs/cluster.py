r"""Cluster-Learngene end to end: an 8-head ancestor trained on digits 0–4, its heads'
mean attention distances and clusters, descendants with other head counts fine-tuned on
digits 5–9 against Pre-Fin, Scratch, He-LG and Auto-LG at the same budget.

    jlearngene train --config cluster:digits --workdir DIR   # ~5 CPU-minutes on 2 cores
    jlearngene train --config cluster:smoke --workdir DIR    # seconds: the tests' miniature

1. Ancestor: a 4-layer ViT (width 64, 8 heads of 8, class token) trained with cross-entropy
   on the digits 0–4.
2. Mean attention distance of every head over `cluster.images` training images, with the
   correct input normalisation and with the official code's bug; heatmaps; density clusters
   for every `cluster.eps_grid` radius (and k-means for comparison).
3. Descendants of the ancestor's depth for every `descend.omegas` schedule (ω = 2, 1, 0.5 and
   the paper's 'decrementing' 2/1.5/1), a new head, fine-tuned on the digits 5–9: the
   correct variant (true q/k/v heads with biases and their output-projection rows, correct
   normalisation) and the official one (row-chunk "heads", no q/k/v bias, first output
   columns, mis-normalised distances); at ω = 1 also φ trained and k-means clusters.
   Baselines at the ancestor's shape: Pre-Fin (the whole ancestor), He-LG (its last
   depth/2 layers), Auto-LG (its first depth/2 layers and embeddings), and Scratch at every
   uniform head count.

Budgets: `steps` (> 0) or else `epochs`, per stage.
"""

from jlearngene.experiments.configs import experiment_base, parse_arg, section as _d

ARGS = ('digits', 'smoke')


def get_config(arg=None):
    scale, _ = parse_arg(arg, ARGS)
    c = experiment_base('cluster', scale)
    # the two tasks: class subsets of the dataset, relabelled 0..k-1
    c.tasks = _d(ancestor=(0, 1, 2, 3, 4), descendant=(5, 6, 7, 8, 9))
    c.model = _d(variant='Ti', width=64, num_heads=8, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='cls')
    c.ancestor = _d(depth=4, steps=400, epochs=0.0)
    # mean attention distance over the first `images` ancestor-task training images;
    # density clusters (DBSCAN, min_heads = MinHds) for every radius of `eps_grid`, the
    # descendants from radius `eps`; k-means with `kmeans_clusters` per layer (0: the
    # density clusters' mean count, rounded)
    c.cluster = _d(images=512, eps=0.1, eps_grid=(0.0, 0.05, 0.1, 0.2, 0.5), min_heads=1,
                   ffn='paper', kmeans_clusters=0)
    # ω schedules: numbers (H_l = floor(H_a / ω)) or 'decrementing' / 'incrementing'
    c.descend = _d(omegas=(2.0, 1.0, 0.5, 'decrementing'), steps=120, epochs=0.0,
                   eval_every=40, lr=1e-3)
    # variants of Cluster-Learngene; 'phi_trainable' and 'kmeans' run at ω = 1
    c.variants = ('correct', 'official', 'phi_trainable', 'kmeans')
    c.methods = ('pre_fin', 'he_lg', 'auto_lg', 'scratch')

    if scale == 'smoke':
        c.batch_size = 16
        c.eval_batch_size = 64
        c.model.update(width=16, num_heads=4, mlp_dim=32, patch_size=8)
        c.optim.warmup_steps = 0
        # the ancestor's train step is the ω = 1 descendants' (compile cache hits)
        c.ancestor.update(depth=1, steps=2)
        c.cluster.update(images=32, eps_grid=(0.0, 0.5))
        c.descend.update(omegas=(1.0,), steps=2, eval_every=0)
        c.variants = ('correct',)
        c.methods = ('scratch',)
    return c
