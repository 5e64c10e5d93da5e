"""The config-vs-params check on list-layout parameters: blocks that share one head count
and MLP size must have the config's, so a config that differs only in `num_heads` or
`mlp_dim` is refused; blocks that differ among themselves keep their own sizes."""
import jax
import jax.numpy as jnp
import pytest

from jlearngene.models import ConfigError, apply, axes, init, init_block, unstack_blocks, vit_config


@pytest.fixture(scope='module')
def cfg():
    return vit_config('Ti', width=32, depth=2, num_heads=2, mlp_dim=64, image_size=16,
                      patch_size=4, num_classes=10)


@pytest.fixture(scope='module')
def listed(cfg):
    return unstack_blocks(init(cfg, jax.random.key(0)))


@pytest.mark.parametrize('change,leaf,expected,actual', [
    (dict(num_heads=4), 'blocks/0/attn/k/kernel', (32, 4, 8), (32, 2, 16)),
    (dict(mlp_dim=128), 'blocks/0/mlp/fc1/kernel', (32, 128), (32, 64)),
    (dict(num_heads=4, head_dim=16), 'blocks/0/attn/k/kernel', (32, 4, 16), (32, 2, 16)),
], ids=['num_heads', 'mlp_dim', 'num_heads_same_head_dim'])
def test_uniform_list_blocks_must_have_the_configs_sizes(cfg, listed, change, leaf, expected, actual):
    other = cfg.replace(**change)
    x = jnp.ones((2, 16, 16, 3))
    shapes = jax.eval_shape(lambda: listed)
    for call in (lambda: apply(listed, x, other), lambda: axes(other, shapes),
                 lambda: jax.jit(lambda p: apply(p, x, other))(listed)):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert f"'{leaf}'" in msg and str(expected) in msg and str(actual) in msg, msg
    apply(listed, x, cfg)   # the config they were built for
    axes(cfg, shapes)


def test_differing_list_blocks_keep_their_own_sizes(cfg, listed):
    mixed = dict(listed, blocks=[listed['blocks'][0],
                                 init_block(cfg, jax.random.key(1), num_heads=1, mlp_dim=48)])
    logits, _ = apply(mixed, jnp.ones((2, 16, 16, 3)), cfg)
    assert logits.shape == (2, 10)
    # the blocks still need the config's width and head size
    with pytest.raises(ConfigError, match=r"'blocks/0/attn/k/kernel'"):
        apply(mixed, jnp.ones((2, 16, 16, 3)), cfg.replace(head_dim=8))
