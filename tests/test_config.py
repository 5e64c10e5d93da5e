"""ViTConfig: head_dim as an optional field and its derivation."""
import pytest

from jlearngene.models import ConfigError, ViTConfig, vit_config


def test_head_dim_defaults_to_width_over_heads():
    cfg = vit_config('S')
    assert (cfg.head_dim, cfg.attn_width) == (64, 384)
    assert cfg.replace(num_heads=12).head_dim == 32       # derived again
    assert cfg.replace(width=192, num_heads=3).head_dim == 64


def test_explicit_head_dim_is_kept():
    cfg = vit_config('Ti', num_heads=6, head_dim=64)      # heads × head_dim = 384 != width 192
    assert (cfg.width, cfg.attn_width) == (192, 384)
    assert cfg.replace(num_heads=2).head_dim == 64        # set to another value: kept
    assert cfg.replace(depth=4, head_dim=None).head_dim == 32
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg


def test_head_dim_errors():
    with pytest.raises(ConfigError, match=r'width=100.*num_heads=3'):
        vit_config('Ti', width=100)
    assert vit_config('Ti', width=100, head_dim=32).attn_width == 96
    with pytest.raises(ConfigError, match='head_dim=0'):
        vit_config('Ti', head_dim=0)


def test_checkpoint_configs_without_head_dim_still_load():
    d = vit_config('Ti').to_dict()
    del d['head_dim']
    assert ViTConfig.from_dict(d).head_dim == 64


def test_attn_scale_overrides_the_head_size_default():
    import jax
    import jax.numpy as jnp
    from jlearngene.models import vit
    cfg = vit_config('Ti', image_size=16, patch_size=8, width=32, num_heads=2, depth=1,
                     mlp_dim=64, num_classes=3)
    params = jax.jit(vit.init, static_argnums=0)(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
    logits = jax.jit(lambda p, x, c: vit.apply(p, x, c)[0], static_argnums=2)
    default = logits(params, x, cfg)
    same = logits(params, x, cfg.replace(attn_scale=16 ** -0.5))
    other = logits(params, x, cfg.replace(attn_scale=0.01))
    assert jnp.allclose(default, same, atol=1e-6) and not jnp.allclose(default, other, atol=1e-4)
    with pytest.raises(ConfigError, match='attn_scale'):
        cfg.replace(attn_scale=-1.0)
