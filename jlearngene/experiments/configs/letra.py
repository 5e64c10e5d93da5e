r"""LeTra end to end: teacher -> learngene inside a wider, deeper Aux-Net -> descendants that
vary in width and depth, compared with Scratch, TLEG and IMwLM at the same fine-tuning budget.

    jlearngene train --config letra:digits --workdir DIR        # default: ~9.5 minutes on 2 cores
    jlearngene train --config letra:smoke --workdir DIR         # seconds: the tests' miniature
    jlearngene train --config letra:paper --workdir DIR \
        --config.data.data_dir=~/tensorflow_datasets --config.teacher.checkpoint=CKPT

1. Teacher: a ViT of the Aux-Net's shape (width 64, 8 heads of 8, 8 layers) trained with
   cross-entropy on the digits; also IMwLM's larger model.
2. Learngene: width 32 (4 heads), 4 layers, inside an Aux-Net of width 64, 8 layers
   (Aux layers 2k, 2k+1 share coefficients and learngene pair), trained by soft distillation
   from the teacher (τ = 1, α = 1: the official recipe); weight decay on the learngene's
   kernels and the width matrices only. A TLEG gene (θ_A, θ_B at the Aux-Net's width) is
   trained through the same Aux-Net shape.
3. Eight descendants of different (width, depth), MLP `mlp_ratio` × width: LeTra with each
   selection strategy (strategies that give the same initial weights share one run), Scratch,
   IMwLM (uniform element selection from the teacher) and, at the Aux-Net's width, TLEG;
   each fine-tuned `descend.steps` steps.
4. Headline: the training FLOPs to bring every descendant to `headline.target` test
   accuracy: LeTra = teacher + Aux-Net + each descendant's tuning until it first reaches the
   target; Scratch = each descendant trained until it first reaches it (at most
   `headline.steps` or `epochs`, Scratch's 100 epochs in the paper).

'paper' has the official shapes (learngene DeiT-S width, 8 layers, 6 heads of 64; Aux-Net
DeiT-B width, 16 layers; LeViT-style teacher from `teacher.checkpoint`; ImageNet at 224 px,
Stage 1 300 epochs, Des-Nets 5 epochs at lr 1e-5, official fc_norm pooling) on a tfds dataset
prepared in `data.data_dir` (nothing is downloaded): for accelerators, not for a CPU.
Budgets: `steps` (> 0) or else `epochs`, per stage.
"""

from jlearngene.experiments.configs import experiment_base, imagenet_data, parse_arg, section as _d

ARGS = ('digits', 'smoke', 'paper')


def get_config(arg=None):
    scale, _ = parse_arg(arg, ARGS)
    c = experiment_base('letra', scale)
    # the Aux-Net's (and teacher's) shape; descendants change width, heads, MLP and depth
    c.model = _d(variant='Ti', width=64, num_heads=8, mlp_dim=128, patch_size=4,
                 image_size=16, channels=1, pool='avg')
    c.teacher = _d(depth=8, steps=250, epochs=0.0, checkpoint='')
    c.aux = _d(depth=8, steps=300, epochs=0.0, tau=1.0, alpha=1.0,
               learngene_heads=4, learngene_depth=4)
    # (width, depth) of every descendant; heads = width / head_dim, MLP = mlp_ratio × width
    c.descendants = ((32, 4), (40, 3), (40, 6), (48, 4), (48, 8), (56, 5), (64, 4), (64, 8))
    c.mlp_ratio = 2
    c.descend = _d(steps=40, epochs=0.0, eval_every=20, lr=1e-3)
    c.selections = ('continuous', 'step', 'random', 'random_wo', 'rank')
    c.baselines = ('scratch', 'tleg', 'imwlm')
    c.headline = _d(target=0.6, steps=250, epochs=0.0, eval_every=25)

    if scale == 'smoke':
        c.batch_size = 32
        c.model.update(width=16, num_heads=4, mlp_dim=32, patch_size=8)
        # identical step programs for teacher, descendants and headline runs of one shape
        c.teacher.update(depth=4, steps=4)
        c.aux.update(depth=4, steps=4, learngene_heads=2, learngene_depth=2)
        c.descendants = ((12, 2), (16, 4))
        c.descend.update(steps=4, eval_every=2, lr=c.optim.lr)
        c.headline.update(target=0.2, steps=4, eval_every=2)
        c.optim.warmup_steps = 0
    elif scale == 'paper':
        c.batch_size = c.eval_batch_size = 512
        c.data = imagenet_data()
        # official Aux-Net and Des-Nets: timm avg pooling with fc_norm, LayerNorm eps 1e-6
        c.model = _d(variant='B', patch_size=16, image_size=224, channels=3, pool='avg',
                     pool_norm='after', ln_eps=1e-6, drop_path=0.1)
        c.optim = _d(lr=5e-4, warmup_steps=0, weight_decay=0.05, clip_norm=0.0, min_lr_ratio=0.02)
        c.teacher.update(depth=12, steps=0, epochs=100.0)
        c.aux.update(depth=16, steps=0, epochs=300.0, learngene_heads=6, learngene_depth=8)
        c.descendants = ((384, 8), (384, 12), (576, 10), (576, 12), (768, 6), (768, 9),
                         (768, 12), (768, 16))
        c.mlp_ratio = 4
        c.descend.update(steps=0, epochs=5.0, eval_every=0, lr=1e-5)
        c.headline.update(target=0.78, steps=0, epochs=100.0, eval_every=2500)
    return c
