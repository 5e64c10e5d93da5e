"""Every registered method's `descend` output is checked against its target config
(`genes.common.Method` wraps it once): a method whose descendant does not fit is refused,
naming the method and the first mismatching leaf."""
import jax
import pytest

from jlearngene import genes
from jlearngene.genes import common
from jlearngene.models import ConfigError, init, vit_config

CFG = vit_config('Ti', width=32, depth=2, num_heads=2, mlp_dim=64, image_size=16, patch_size=4,
                 num_classes=10)


def _method(descend):
    return common.Method(name='broken', label='Broken', source='none', descend=descend,
                         gene_param_count=lambda gene, include_head=False: 0)


def test_a_descendant_that_does_not_fit_its_target_is_refused():
    wider = _method(lambda gene, target_cfg, *, key=None: init(target_cfg.replace(mlp_dim=96), key))
    with pytest.raises(ConfigError, match=r"broken descend output.*'blocks/mlp/fc1/kernel'.*\(2, 32, 96\)"):
        wider.descend(None, CFG, key=jax.random.key(0))
    with pytest.raises(ConfigError, match='broken descend output'):   # at trace time, under jit
        jax.jit(lambda k: wider.descend(None, CFG, key=k))(jax.random.key(0))
    with pytest.raises(ConfigError, match=r"'head/kernel'.*\(32, 3\)"):   # target_cfg by keyword
        _method(lambda gene, target_cfg, *, key=None: init(CFG.replace(num_classes=3), key)).descend(
            None, target_cfg=CFG, key=jax.random.key(0))


def test_a_registered_method_checks_its_output_and_keeps_its_signature():
    scratch = genes.get('scratch')
    assert scratch.descend._checks_output
    assert scratch.options() == _method(scratch.descend.__wrapped__).options()
    params = scratch.descend(None, CFG, key=jax.random.key(0))
    assert params['blocks']['mlp']['fc1']['kernel'].shape == (2, 32, 64)
    again = common.Method(**{f: getattr(scratch, f) for f in ('name', 'label', 'source', 'descend',
                                                              'gene_param_count')})
    assert again.descend is scratch.descend   # wrapped once
