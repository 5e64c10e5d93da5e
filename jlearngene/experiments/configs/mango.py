r"""Mango end to end: a small ViT trained on the digits, grown into a large one by Scratch,
Net2Net, StackBERT, bert2BERT, LiGO and Mango (R = 1 and R = 4), every large model then
trained for the same budget; test accuracy against training FLOPs, growth cost included.

    jlearngene train --config mango:digits --workdir DIR     # see experiments/mango/README.md
    jlearngene train --config mango:smoke --workdir DIR      # seconds: the tests' miniature
    jlearngene train --config mango:digits --workdir DIR --config.mango_ranks='(1,2,4)'

Arguments: 'digits' (default) or 'smoke'. The recorded 'digits' run took 1718 s wall on two
CPU cores shared with other jobs (load average 10-19); 2,400 large-model steps (seven runs
of 300, three operators of 100) and 400 small-model steps.

1. Small model: width 32, 2 heads, MLP 64, depth 3 (4 px patches on 16 px digits, avg
   pooling), cross-entropy for 400 steps.
2. Large model: width 64, 4 heads (the same head size), MLP 128, depth 6. Initialised by
   each method of `methods`: Scratch, Net2Net (function-preserving width and identity
   layers), StackBERT (stacking, with Net2Net's width growth since the width changes),
   bert2BERT (FPI + AKI, stacking), LiGO and Mango at every rank of `mango_ranks`, whose
   operators train `operator.steps` = 100 steps on the large model's loss with the small
   model frozen.
3. Every large model trains `large.steps` = 300 steps, evaluated every 25.
Budgets: `steps` (> 0) or else `epochs`, per stage.
"""

from jlearngene.experiments.configs import experiment_base, parse_arg, section as _d

ARGS = ('digits', 'smoke')


def get_config(arg=None):
    scale, _ = parse_arg(arg, ARGS)
    c = experiment_base('mango', scale)
    # geometry shared by both models; each section below sets its own shape
    c.model = _d(variant='Ti', patch_size=4, image_size=16, channels=1, pool='avg')
    c.small = _d(width=32, num_heads=2, mlp_dim=64, depth=3, steps=400, epochs=0.0)
    c.large = _d(width=64, num_heads=4, mlp_dim=128, depth=6, steps=300, epochs=0.0,
                 eval_every=25, lr=1e-3)
    # the learned operators (LiGO, Mango): steps on the large model's loss, small model frozen
    c.operator = _d(steps=100, epochs=0.0, lr=1e-3, weight_decay=0.0)
    c.methods = ('scratch', 'net2net', 'stackbert', 'bert2bert', 'ligo', 'mango')
    c.mango_ranks = (1, 4)
    c.method_options = _d(stackbert=_d(width='net2net'), bert2bert=_d(aki=True),
                          mango=_d(noise=1e-2, remat=False))

    if scale == 'smoke':
        c.batch_size = 16
        c.model.update(patch_size=8)
        c.small.update(width=16, num_heads=2, mlp_dim=32, depth=1, steps=3)
        c.large.update(width=32, num_heads=4, mlp_dim=64, depth=2, steps=4, eval_every=2)
        c.operator.steps = 2
        c.methods = ('scratch', 'mango')
        c.mango_ranks = (2,)
        c.optim.warmup_steps = 0
    return c
