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


# ---------------------------------------------------------------- config files (configs.validate)

def _file_config(tmp_path, body: str, arg: str = 'smoke'):
    """Loads a config file that edits the bundled tleg config `arg` (`body`: lines on `c`)."""
    from jlearngene.experiments import configs
    path = tmp_path / 'mine.py'
    path.write_text('from jlearngene.experiments.configs import tleg\n\n'
                    'def get_config(arg=None):\n'
                    '    c = tleg.get_config(arg)\n'
                    + ''.join(f'    {line}\n' for line in body.splitlines()) + '    return c\n')
    return configs.load(f'{path}:{arg}')


@pytest.mark.parametrize('body, message', [
    ('c.aux.fracton = 2.0', r"unknown config key 'aux\.fracton' \(did you mean 'fraction'\?\)"),
    ('c.descend = dict(fractions=(0.35,), lr=1e-3, evals="five", official_pool_order=False)',
     r"descend\.evals must be an integer \(the template has 5\), got 'five'"),
    ('c.descend = dict(fractions=(0.35,), lr=1e-3, evals=5, official_pool_order=1)',
     r'descend\.official_pool_order must be true or false'),
    ('c.aux = 3', r"field 'aux'.*3.*ConfigDict"),     # ml_collections' type safety in the file
    ('c.batch_size = 0', r'batch_size must be a positive integer, got 0'),
    ('c.scratch.steps = 0\nc.scratch.epochs = 0.0', r'scratch has steps = 0 and epochs = 0'),
    ('c.model.widht = 3', r"unknown config key 'model\.widht' \(did you mean 'width'\?\)"),
    ('c.optim.lr = -1.0', r'lr must be a positive number'),
])
def test_config_file_errors_are_one_line_and_name_the_field(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message) as e:
        _file_config(tmp_path, 'c.unlock()\n' + body)
    assert '\n' not in str(e.value) and 'mine.py' in str(e.value)


def test_config_file_values_of_the_template_types_and_open_sections_load(tmp_path):
    c = _file_config(tmp_path, 'c.unlock()\nc.descend.lr = 1\nc.seeds = [4, 5]\n'
                     'c.method_options.cluster = dict(gene=dict(eps=0.2))')
    assert c.descend.lr == 1.0 and tuple(c.seeds) == (4, 5) and c.method_options.cluster.gene.eps == 0.2
