"""Trace-time checks of `models.apply` / `models.axes` / `models.init` inputs: a config that
does not match the parameters, non-NHWC images, and a dict where a ViTConfig belongs."""
import jax
import jax.numpy as jnp
import pytest

from jlearngene.models import ConfigError, apply, axes, init, init_block, unstack_blocks, vit_config
from jlearngene.models import vit


@pytest.fixture(scope='module')
def cfg():
    return vit_config('Ti', width=32, depth=3, num_heads=2, mlp_dim=64, image_size=16,
                      patch_size=4, num_classes=10)


@pytest.fixture(scope='module')
def params(cfg):
    return init(cfg, jax.random.key(0))


@pytest.fixture(scope='module')
def shapes(cfg):
    return jax.eval_shape(lambda: init(cfg, jax.random.key(0)))


def _x(cfg, batch=2):
    return jnp.ones((batch, cfg.image_size, cfg.image_size, cfg.channels))


@pytest.mark.parametrize('change,leaf,expected,actual', [
    (dict(width=64), 'blocks/attn/k/kernel', (3, 64, 2, 32), (3, 32, 2, 16)),
    (dict(depth=5), 'blocks/attn/k/kernel', (5, 32, 2, 16), (3, 32, 2, 16)),
    (dict(num_heads=4), 'blocks/attn/k/kernel', (3, 32, 4, 8), (3, 32, 2, 16)),
    (dict(mlp_dim=128), 'blocks/mlp/fc1/kernel', (3, 32, 128), (3, 32, 64)),
    (dict(num_classes=7), 'head/kernel', (32, 7), (32, 10)),
])
def test_apply_and_axes_reject_a_config_of_other_shapes(cfg, params, shapes, change, leaf,
                                                        expected, actual):
    other = cfg.replace(**change)
    calls = {'apply': lambda: apply(params, _x(cfg), other),
             'jit': lambda: jax.jit(lambda p, x: apply(p, x, other))(params, _x(cfg)),
             'eval_shape': lambda: jax.eval_shape(lambda p, x: apply(p, x, other), shapes, _x(cfg)),
             'axes': lambda: axes(other, shapes)}
    for name, call in calls.items():
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert f"'{leaf}'" in msg and str(expected) in msg and str(actual) in msg, (name, msg)
        assert '\n' not in msg


def test_missing_and_unexpected_leaves_are_named(cfg, params):
    no_norm = {k: v for k, v in params.items() if k != 'norm'}
    with pytest.raises(ConfigError, match=r"'norm/bias' is missing.*\(32,\)"):
        apply(no_norm, _x(cfg), cfg)
    with pytest.raises(ConfigError, match=r"'head/(bias|kernel)'.*num_classes=0"):
        apply(params, _x(cfg), cfg.replace(num_classes=0))
    with pytest.raises(ConfigError, match=r"'blocks/ls1/scale' is missing.*layer_scale=True"):
        axes(cfg.replace(layer_scale=True), params)


def test_list_layout_is_checked_per_block(cfg, params):
    listed = unstack_blocks(params)
    with pytest.raises(ConfigError, match=r"'blocks/0/attn/k/kernel'.*\(64, 2, 32\)"):
        apply(listed, _x(cfg), cfg.replace(width=64))
    with pytest.raises(ConfigError, match=r"'blocks' holds 3 blocks.*depth=5"):
        axes(cfg.replace(depth=5), listed)
    with pytest.raises(ConfigError, match=r"'blocks/0/attn/k/kernel'.*\(32, 2, 16\).*expects \(32, 2, 8\)"):
        apply(listed, _x(cfg), cfg.replace(head_dim=8))
    with pytest.raises(ConfigError, match=r"'pos_embed'.*\(1, 17, 32\).*expects \(1, 65, 32\)"):
        apply(listed, _x(cfg), cfg.replace(image_size=32))


def test_list_layout_blocks_may_differ_in_heads_and_mlp(cfg, params):
    """Per-block head counts (Cluster-Learngene) and MLP sizes (Mix'n'Match) are what the
    list layout is for: `apply` reads them from the parameters."""
    listed = unstack_blocks(params)
    listed['blocks'][1] = init_block(cfg, jax.random.key(1), num_heads=3, mlp_dim=48)
    logits, aux = apply(listed, _x(cfg), cfg, capture=('attn',))
    assert logits.shape == (2, 10) and aux['attn'][1].shape[1] == 3
    assert axes(cfg, listed)['blocks'][1]['attn']['q']['kernel'] == ('embed', 'heads', 'head_dim')
    # Within a block the leaves must agree with its own head count.
    bad = dict(listed, blocks=list(listed['blocks']))
    bad['blocks'][2] = dict(bad['blocks'][2], attn=dict(bad['blocks'][2]['attn'],
                                                       out=bad['blocks'][1]['attn']['out']))
    with pytest.raises(ConfigError, match=r"'blocks/2/attn/out/kernel'.*\(3, 16, 32\).*\(2, 16, 32\)"):
        apply(bad, _x(cfg), cfg)
    # differing blocks still need the config's width and head size
    with pytest.raises(ConfigError, match=r"'blocks/0/attn/k/kernel'"):
        apply(listed, _x(cfg), cfg.replace(head_dim=8))


@pytest.mark.parametrize('change,leaf,expected,actual', [
    (dict(num_heads=4), 'blocks/0/attn/k/kernel', (32, 4, 8), (32, 2, 16)),
    (dict(mlp_dim=128), 'blocks/0/mlp/fc1/kernel', (32, 128), (32, 64)),
    (dict(num_heads=4, head_dim=16), 'blocks/0/attn/k/kernel', (32, 4, 16), (32, 2, 16)),
], ids=['num_heads', 'mlp_dim', 'num_heads_same_head_dim'])
def test_uniform_list_blocks_must_have_the_configs_sizes(cfg, params, change, leaf, expected, actual):
    """Blocks that share one head count and MLP size must have the config's, so a config that
    differs only in `num_heads` or `mlp_dim` is refused."""
    listed, other, x = unstack_blocks(params), cfg.replace(**change), _x(cfg)
    shapes = jax.eval_shape(lambda: listed)
    for call in (lambda: apply(listed, x, other), lambda: axes(other, shapes),
                 lambda: jax.jit(lambda p: apply(p, x, other))(listed)):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert f"'{leaf}'" in msg and str(expected) in msg and str(actual) in msg, msg
    apply(listed, x, cfg)   # the config they were built for
    axes(cfg, shapes)


def test_the_check_costs_nothing_in_the_compiled_program(cfg, params):
    jaxpr = str(jax.make_jaxpr(lambda p, x: apply(p, x, cfg)[0])(params, _x(cfg)))
    assert 'ConfigError' not in jaxpr
    assert vit.param_shapes(cfg) is vit.param_shapes(cfg.replace())   # cached per config


@pytest.mark.parametrize('shape,hint', [
    ((16, 16, 3), 'images[None]'),
    ((2, 3, 16, 16), 'NCHW'),
    ((2, 16, 16, 1), ''),
    ((2, 16, 16), ''),
])
def test_images_must_be_nhwc_with_the_configs_channels(cfg, params, shape, hint):
    with pytest.raises(ValueError) as e:
        apply(params, jnp.ones(shape), cfg)
    msg = str(e.value)
    assert 'NHWC' in msg and '(batch, 16, 16, 3)' in msg and str(shape) in msg and hint in msg
    assert '\n' not in msg
    with pytest.raises(ValueError, match='NHWC'):
        jax.jit(lambda p, x: apply(p, x, cfg))(params, jnp.ones(shape))


def test_a_dict_config_is_a_type_error_that_says_how_to_make_one(cfg, params):
    for call in (lambda: apply(params, _x(cfg), cfg.to_dict()),
                 lambda: init(cfg.to_dict(), jax.random.key(0)),
                 lambda: init_block(cfg.to_dict(), jax.random.key(0)),
                 lambda: axes(cfg.to_dict(), params)):
        with pytest.raises(TypeError, match=r'expected a ViTConfig, got dict.*ViTConfig\.from_dict') as e:
            call()
        assert isinstance(e.value, ConfigError) and 'vit_config' in str(e.value)
