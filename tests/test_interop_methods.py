"""Every registered method's ancestor and descendant through the timm and big_vision formats:
the arrays come back bit for bit and compute the same logits; a descendant that a format
cannot hold (Cluster-Learngene's per-layer head counts) is refused with an error naming why.

One tiny config for every ancestor (width 16, depth 2, 8 px images in 4 px patches) and one
descendant per method. Genes and 'trained' models come from `helpers`.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import genes, pytree
from jlearngene.genes import cluster, scala
from jlearngene.interop import big_vision as BV
from jlearngene.interop import timm as T
from jlearngene.interop.state_dict import StateDictError
from jlearngene.genes.common import GeneError
from jlearngene.models import ConfigError, apply, init, layout, vit_config

from helpers import perturbed, trained_model


ANCESTOR = vit_config('Ti', width=16, num_heads=4, mlp_dim=32, depth=2, image_size=8, patch_size=4,
                      num_classes=5, pool='avg')
LARGE = ANCESTOR.replace(width=32, num_heads=8, mlp_dim=64, depth=3)     # head_dim 4 kept
PER_LAYER_HEADS = (2, 4)

# name -> (gene options, descendant config, descend options). A method registered without a
# recipe here fails `test_every_registered_method_has_a_recipe`.
RECIPES = {
    'tleg': ({}, ANCESTOR.replace(depth=3), {}),
    'scratch': ({}, ANCESTOR.replace(depth=3), {}),
    'share_init': ({}, ANCESTOR.replace(depth=3), {}),
    'mini_init': ({}, ANCESTOR.replace(depth=3), {}),
    'he_lg': ({'k': 1}, ANCESTOR.replace(depth=3), {}),
    'auto_lg': ({'k': 1}, ANCESTOR.replace(depth=3), {}),
    'pre_fin': ({}, ANCESTOR.replace(num_classes=3), {'head': 'new'}),
    'cluster': ({}, cluster.descendant_config(ANCESTOR, PER_LAYER_HEADS), {'heads': PER_LAYER_HEADS}),
    'net2net': ({}, LARGE, {}),
    'stackbert': ({}, LARGE, {'width': 'net2net'}),
    'bert2bert': ({}, LARGE, {}),
    'ligo': ({'large_cfg': LARGE}, LARGE, {}),
    'letra': ({'learngene_depth': 2}, ANCESTOR.replace(width=12, num_heads=3, mlp_dim=24, depth=3), {}),
    'mango': ({'large_cfg': LARGE}, LARGE, {}),
    'scala': ({}, scala.subnet_config(ANCESTOR, 0.5), {}),
    'us_net': ({}, scala.subnet_config(ANCESTOR, 0.5), {}),
    'matformer': ({}, ANCESTOR.replace(mlp_dim=8), {}),
    'imwlm': ({}, ANCESTOR.replace(width=8, num_heads=2, mlp_dim=16, depth=1), {}),
}

run = jax.jit(apply, static_argnums=2)


@pytest.fixture(scope='module')
def source():
    """The 'trained' ancestor of the methods whose gene is taken from a model."""
    return trained_model(ANCESTOR)


def images():
    return jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)), jnp.float32)


def family(name, source):
    """{'ancestor': (params, cfg), 'descendant': (params, cfg)} of method `name`: the ancestor
    is the learned Aux-Net (source 'learned'), `source` (source 'model', the same model for
    all of them) or absent (source 'none')."""
    m = genes.get(name)
    gene_options, target, descend_options = RECIPES[name]
    out = {}
    if m.source == 'learned':
        gene = perturbed(jax.jit(lambda k: m.init_gene(ANCESTOR, k, **gene_options))(jax.random.key(0)))
        out['ancestor'] = (m.materialize(gene, None, ANCESTOR), ANCESTOR)
    elif m.source == 'model':
        gene = m.gene_from_model(source, ANCESTOR, **gene_options)
        out['ancestor'] = (source, ANCESTOR)
    else:
        gene = None
    out['descendant'] = (m.descend(gene, target, key=jax.random.key(1), **descend_options), target)
    return {k: (jax.device_get(p), c) for k, (p, c) in out.items()}


def assert_bits_equal(a, b, what):
    """Same paths, shapes, dtypes and bytes (so -0.0 and NaN payloads count too)."""
    fa, fb = pytree.flatten(a), pytree.flatten(b)
    assert list(fa) == list(fb), what
    for k in fa:
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        assert x.dtype == y.dtype and x.shape == y.shape, (what, k)
        assert x.tobytes() == y.tobytes(), (what, k)


def round_trips(params, cfg, what):
    """timm and every big_vision layout, out and back: the same arrays, the same logits, and
    the list layout exports the same file as the stacked one."""
    x = images()
    want = np.asarray(run(params, x, cfg)[0])
    assert np.isfinite(want).all() and np.abs(want).max() > 0, what
    listed = layout.unstack_blocks(params)

    sd = T.to_timm(params, cfg)
    assert_bits_equal(sd, T.to_timm(listed, cfg), f'{what}: timm from the list layout')
    cfg_t, back = T.from_timm(sd, num_heads=cfg.num_heads)
    assert cfg_t == cfg, (what, cfg.diff(cfg_t))
    back = jax.device_get(back)
    assert_bits_equal(params, back, f'{what}: timm')
    assert_bits_equal(sd, T.to_timm(back, cfg_t), f'{what}: timm again')
    np.testing.assert_array_equal(np.asarray(run(back, x, cfg_t)[0]), want, err_msg=f'{what}: timm')

    for bv_layout in BV.LAYOUTS:
        where = f'{what}: big_vision {bv_layout}'
        ck = BV.to_big_vision(params, cfg, layout=bv_layout)
        assert_bits_equal(ck, BV.to_big_vision(listed, cfg, layout=bv_layout), f'{where} (list layout)')
        back, cfg_b = BV.from_big_vision(ck)
        assert cfg_b == cfg.replace(gelu='tanh'), (where, cfg.diff(cfg_b))   # Flax's nn.gelu
        back = jax.device_get(back)
        assert_bits_equal(params, back, where)
        assert_bits_equal(ck, BV.to_big_vision(back, cfg, layout=bv_layout), f'{where} again')
        np.testing.assert_array_equal(np.asarray(run(back, x, cfg)[0]), want, err_msg=where)


def test_every_registered_method_has_a_recipe():
    assert set(RECIPES) == set(genes.names())


def test_the_model_methods_ancestor_round_trips_through_timm_and_big_vision(source):
    round_trips(jax.device_get(source), ANCESTOR, 'ancestor of the source-model methods')


@pytest.mark.parametrize('name', genes.names())
def test_ancestor_and_descendant_round_trip_through_timm_and_big_vision(name, source):
    models = family(name, source)
    assert ('ancestor' in models) == (genes.get(name).source != 'none')
    if genes.get(name).source == 'model':   # `source`: its own test above
        assert pytree.trees_equal(models.pop('ancestor')[0], jax.device_get(source))
    for what, (params, cfg) in models.items():
        if name == 'cluster' and what == 'descendant':
            # Per-layer head counts: list layout, which neither format can hold.
            assert not layout.is_stacked(params)
            assert [b['attn']['q']['kernel'].shape[1] for b in params['blocks']] == list(PER_LAYER_HEADS)
            heads = r'heads per block \[2, 4\], MLP sizes \[32, 32\]'
            with pytest.raises(StateDictError, match=f"timm.*{heads}"):
                T.to_timm(params, cfg)
            for bv_layout in BV.LAYOUTS:
                with pytest.raises(StateDictError, match=f"big_vision.*{heads}"):
                    BV.to_big_vision(params, cfg, layout=bv_layout)
            continue
        assert layout.is_stacked(params), (name, what)
        round_trips(params, cfg, f'{name} {what}')


# ----------------------------------------------------------------------------------------
# A pre-logits layer (representation_size) goes with the head.

REP = 6


@pytest.mark.parametrize('name', ['tleg', 'he_lg', 'pre_fin'])
def test_pre_logits_layer_is_inherited_with_the_head_and_exports_to_big_vision_only(name):
    m, options = genes.get(name), RECIPES[name][0]
    anc_cfg = ANCESTOR.replace(representation_size=REP)
    if m.source == 'learned':
        gene = perturbed(jax.jit(lambda k: m.init_gene(anc_cfg, k, **options))(jax.random.key(0)))
        ancestor = m.materialize(gene, None, anc_cfg)
    else:
        ancestor = trained_model(anc_cfg)
        gene = m.gene_from_model(ancestor, anc_cfg, **options)
    ancestor = jax.device_get(ancestor)
    target = anc_cfg.replace(depth=3) if name != 'pre_fin' else anc_cfg
    des = jax.device_get(m.descend(gene, target, key=jax.random.key(1), head='inherit'))
    assert_bits_equal({k: des[k] for k in ('pre_logits', 'head')},
                      {k: ancestor[k] for k in ('pre_logits', 'head')}, name)
    fresh = m.descend(gene, target, key=jax.random.key(1), head='new')
    assert fresh['pre_logits']['kernel'].shape == (16, REP) and fresh['head']['kernel'].shape == (REP, 5)
    assert not np.array_equal(fresh['pre_logits']['kernel'], ancestor['pre_logits']['kernel'])
    # The head reads the layer's R outputs: it cannot be inherited without it, nor it without the head.
    with pytest.raises(genes.GeneError, match=f"pre-logits.*{REP}.*representation_size={REP}.*head='new'"):
        m.descend(gene, target.replace(representation_size=None), key=jax.random.key(1), head='inherit')
    # big_vision holds it (pre_logits/kernel, bias), timm 1.x has no representation layer.
    for params, cfg in ((ancestor, anc_cfg), (des, target)):
        ck = BV.to_big_vision(params, cfg, layout='vit')
        assert ck['pre_logits/kernel'].shape == (16, REP) and ck['head/kernel'].shape == (REP, 5)
        back, cfg_b = BV.from_big_vision(ck)
        assert cfg_b.representation_size == REP
        assert_bits_equal(params, jax.device_get(back), f'{name} big_vision')
        with pytest.raises(ConfigError, match=f'representation_size={REP}'):
            T.to_timm(params, cfg)


def test_a_target_with_pre_logits_needs_a_source_with_one(source):
    gene = genes.get('pre_fin').gene_from_model(source, ANCESTOR)
    target = ANCESTOR.replace(representation_size=REP)
    with pytest.raises(genes.GeneError, match="'pre_logits'.*head='new'"):
        genes.get('pre_fin').descend(gene, target, head='inherit')
    des = genes.get('pre_fin').descend(gene, target, head='new', key=jax.random.key(2))
    assert des['pre_logits']['kernel'].shape == (16, REP) and des['head']['kernel'].shape == (REP, 5)


def test_width_changing_methods_refuse_a_pre_logits_layer():
    """Their head resizing follows 'embed'; a pre_logits layer's 'repr' axis is not resized,
    so they refuse such models in one GeneError instead of slicing the head wrongly."""
    from jlearngene.genes import growth, letra, mango, scala, selection
    rep = ANCESTOR.replace(representation_size=REP)
    small = jax.eval_shape(lambda: init(rep, jax.random.key(0)))
    calls = {
        'scala.subnet': lambda: scala.subnet(small, rep, 0.5),
        'letra': lambda: letra.init_gene(LARGE.replace(representation_size=REP), jax.random.key(0)),
        'mango': lambda: mango.init_operator(ANCESTOR, LARGE.replace(representation_size=REP), 1,
                                             jax.random.key(0)),
        'net2net': lambda: growth.net2net(small, LARGE),
        'imwlm': lambda: selection.descend(jax.eval_shape(lambda: init(
            LARGE.replace(representation_size=REP), jax.random.key(0))), ANCESTOR),
    }
    for call in calls.values():
        with pytest.raises(GeneError, match='pre_logits'):
            call()
