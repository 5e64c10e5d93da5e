"""Mango's operator-training step (grow the large model from the frozen small one by the
staged ring contraction, then its training step) against the plain training step of the
large model, at the same shape.

Default: DeiT-Ti (width 192, 3 heads, 12 layers) at 32 px, patch 4, batch 64, 100 classes,
grown from width 96 (3 heads, MLP 384) and 6 layers at ring rank 4 (`remat=False`: the
contraction's intermediates are kept for the backward pass, the faster choice at this size).
quick: a width-64, 4-layer model from width 32, 2 layers, batch 8 at 16 px.
"""


def case(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jlearngene.genes import mango
    from jlearngene.models import vit
    from jlearngene.models.config import vit_config
    from jlearngene.train import optim, tasks, trainer

    if quick:
        large = vit_config('Ti', width=64, num_heads=2, mlp_dim=256, depth=4, image_size=16,
                           patch_size=4, num_classes=10)
        small, batch, rank = large.replace(width=32, num_heads=1, mlp_dim=128, depth=2), 8, 2
    else:
        large = vit_config('Ti', depth=12, image_size=32, patch_size=4, num_classes=100)
        small, batch, rank = large.replace(width=96, num_heads=3, mlp_dim=384, depth=6), 64, 4
    key = jax.random.key(0)
    rng = np.random.default_rng(0)
    data = {'image': jnp.asarray(rng.standard_normal((batch, large.image_size, large.image_size, 3)),
                                 jnp.float32),
            'label': jnp.asarray(rng.integers(0, large.num_classes, (batch,)), jnp.int32)}
    base = jax.random.key_data(jax.random.key(1))
    opt_cfg = dict(lr=1e-3, schedule='constant', weight_decay=0.05, decay=('.*',), clip_norm=0.0)
    inner = tasks.classification_loss(large)

    def build(trainable, loss_fn, **extra):
        opt = optim.make_optimizer(dict(opt_cfg, **extra), trainable)
        state = jax.tree.map(lambda x: jnp.array(x, copy=True), trainer.init_state(trainable, opt))
        return jax.jit(trainer.make_train_step(loss_fn, opt)), (state, data, base)

    def operator_loss(trainable, b, r):
        grown = mango.grow(trainable['operator'], jax.lax.stop_gradient(trainable['small']),
                           large, remat=False)
        return inner(grown, b, r)

    operator = mango.init_operator(small, large, rank, key)
    return {
        'name': 'mango',
        'shape': (f'{"quick" if quick else "Ti-12"} (width {large.width}, depth {large.depth}) '
                  f'batch {batch} at {large.image_size} px, grown from width {small.width} '
                  f'depth {small.depth} at R={rank}'),
        'plain': build(vit.init(large, key), inner),
        'method': build({'operator': operator, 'small': vit.init(small, key)}, operator_loss,
                        freeze=('small/.*',)),
    }
