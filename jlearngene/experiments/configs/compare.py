r"""Every method and baseline on one task, one descendant budget and one cost account:
TLEG, LeTra, Cluster-Learngene, Scala, Mango against Scratch, He-LG, IMwLM and bert2BERT
(Pre-Fin, Auto-LG, Share-Init, Net2Net, StackBERT, LiGO on request), on descendants of
three (width, depth) shapes.

    jlearngene compare --config compare --workdir DIR           # = jlearngene train --config compare ...
    jlearngene compare --config compare:smoke --workdir DIR     # seconds: the tests' miniature
    jlearngene compare --config compare:paper --workdir DIR \
        --config.data.data_dir=~/tensorflow_datasets            # accelerator shapes (DeiT-B)
    jlearngene compare --config compare --workdir DIR --config.methods="('scratch','tleg','ligo')"
    jlearngene compare --config compare --workdir DIR --config.shapes="((64,6),(48,6))"

Arguments: 'digits' (default; results in experiments/compare/README.md), 'smoke' or 'paper'.

1. Teacher: a 6-layer ViT (width 64, 8 heads of 8, MLP 128, 4 px patches on 16 px digits,
   avg pooling), cross-entropy. TLEG's and LeTra's genes (LeTra: a 4-head, 4-layer
   learngene) train through Aux-Nets of its shape by soft KD from it; Cluster-Learngene
   (mean attention distance, density clusters), He-LG, Pre-Fin and IMwLM take their genes
   from it. Scala trains one slimmable network of the same shape (ratios 0.25 … 1, 1/8
   grid). A small ViT (width 32, 4 heads, depth 3) is what bert2BERT grows and Mango's
   tensor-ring operator (rank `method_options.mango.gene.rank`) maps, one operator per
   descendant shape, trained `operator.steps` on the descendant's loss.
2. Descendants of `shapes` (MLP 2 × width) from every method that can make them, all
   fine-tuned `descend.steps` with the same optimiser; the table says which shapes a method
   cannot make and why.
3. Costs: every upstream run in training FLOPs (`costs.training_cost`) for each method that
   needs it, amortised over its descendants; break-even N against Scratch
   (`experiments.compare.break_even`).

`on_missing='error'` makes a shape that a listed method cannot make an error instead of a
table entry. Budgets: `steps` (> 0) or else `epochs`, per stage.
"""

from jlearngene.experiments.configs import experiment_base, imagenet_data, parse_arg, section as _d

ARGS = ('digits', 'smoke', 'paper')


def get_config(arg=None):
    scale, _ = parse_arg(arg, ARGS)
    c = experiment_base('compare', scale)
    # the teacher's shape; Aux-Nets and Scala's slimmable network share it
    c.model = _d(variant='Ti', width=64, num_heads=8, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    c.depth = 6
    # descendants: (width, depth), MLP mlp_ratio × width; heads of the model's head_dim, or
    # (Scala) the model's head count
    c.shapes = ((64, 6), (64, 4), (32, 6))
    c.mlp_ratio = 2
    # Pre-Fin ('pre_fin') is the teacher itself at its shape, as IMwLM is: not run by default
    c.methods = ('scratch', 'tleg', 'letra', 'cluster', 'scala', 'mango', 'he_lg', 'imwlm',
                 'bert2bert')
    c.on_missing = 'mark'          # 'mark': a table entry; 'error': stop before training
    c.teacher = _d(steps=300, epochs=0.0)
    c.aux = _d(steps=250, epochs=0.0, tau=1.0, alpha=1.0, learngene_heads=4, learngene_depth=4)
    c.slim = _d(smallest=0.25, granularity=0.125, rule='clean', ce_weight=1.0,
                transfer='progressive', isolated=True, warmup_steps=25, warmup_lr_factor=0.5,
                steps=225)
    c.cluster = _d(images=512, eps=0.1, min_heads=1, ffn='paper')
    c.small = _d(width=32, num_heads=4, mlp_dim=64, depth=3, steps=300, epochs=0.0)
    # Mango / LiGO operators: per descendant shape, on its loss, the small model frozen
    c.operator = _d(steps=50, epochs=0.0, lr=1e-3, weight_decay=0.0)
    c.descend = _d(steps=60, epochs=0.0, eval_every=20, lr=1e-3)
    # per method: 'gene' options (he_lg/auto_lg k: 0 = ⌈depth/2⌉; mango: the operator's)
    # and 'descend' options
    c.method_options = _d(he_lg=_d(gene=_d(k=0)), auto_lg=_d(gene=_d(k=0)),
                          letra=_d(descend=_d(selection='continuous')),
                          mango=_d(gene=_d(rank=1, noise=1e-2, remat=False)),
                          bert2bert=_d(descend=_d(aki=True)))
    c.break_even = _d(max_descendants=20)

    if scale == 'smoke':
        c.batch_size = 16
        c.eval_batch_size = 64
        c.model.update(width=16, num_heads=4, mlp_dim=32, patch_size=8)
        c.optim.warmup_steps = 0
        c.depth = 2
        c.shapes = ((16, 2), (12, 2))
        # Pre-Fin cannot make width 12; only the teacher is trained upstream
        c.methods = ('scratch', 'pre_fin', 'imwlm')
        # identical step programs for the teacher and the (16, 2) descendants
        c.teacher.steps = 4
        c.aux.update(steps=3, learngene_heads=2, learngene_depth=2)
        c.slim.update(warmup_steps=1, steps=2, granularity=0.25)
        c.cluster.images = 32
        c.small.update(width=8, num_heads=2, mlp_dim=16, depth=1, steps=2)
        c.operator.steps = 2
        c.descend.update(steps=4, eval_every=0, lr=c.optim.lr)
        c.break_even.max_descendants = 5
    elif scale == 'paper':
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
        # TLEG Table 1 (teacher 100, Aux-Net 150 epochs), LeTra's 6-head 6-layer learngene,
        # Scala's 300 epochs, Mango's ~100 operator steps, descendants 35 epochs (TLEG)
        c.teacher.update(steps=0, epochs=100.0)
        c.aux.update(steps=0, epochs=150.0, learngene_heads=6, learngene_depth=6)
        c.slim.update(granularity=1 / 16, warmup_steps=0, steps=0)
        c.slim.steps = 300 * 1_281_167 // 512
        c.cluster.update(images=50_000, eps=10.0)
        c.small.update(width=384, num_heads=6, mlp_dim=1536, depth=12, steps=0, epochs=300.0)
        c.operator.update(steps=100, lr=1e-4)
        c.descend.update(steps=0, epochs=35.0, eval_every=0, lr=5e-4)
    return c
