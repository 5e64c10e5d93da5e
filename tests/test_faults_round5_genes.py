"""Faults, round five (genes): each test names the fault it guards against. A slimmable gene
of another class count descended unchecked, a traced width ratio's side never checked, the
slimmable losses' and TLEG's plain ValueErrors, uniform selection of no indices, Mix'n'Match
without granularities, a US-Net plan of a grid without interior, the baselines'
`gene_from_model` docstrings naming arguments they do not take, layer windows and unit
mappings of impossible sizes, and a cluster descendant of depth 0."""
import inspect
import re

import jax
import jax.numpy as jnp
import pytest

from jlearngene.genes import baselines, cluster, growth, scala, selection, tleg
from jlearngene.genes.common import GeneError
from jlearngene.models import init

import helpers

SLIM = dict(width=32, num_heads=2, mlp_dim=64, depth=2, image_size=8, num_classes=5, pool='cls')


@pytest.fixture(scope='module')
def slimmable():
    cfg = helpers.cfg(**SLIM)
    return cfg, init(cfg, jax.random.key(0))


# ----------------------------------------------------------------------------------------
# Fault 1: scala.descend / descend_matformer compared the target's class count with itself.

def test_scala_descend_refuses_a_gene_of_another_class_count(slimmable):
    cfg, gene = slimmable
    half = cfg.replace(width=16, head_dim=8, mlp_dim=32)
    assert scala.descend(gene, half)['head']['bias'].shape == (5,)          # the same classes pass
    with pytest.raises(GeneError, match=r"scala\.descend: the gene's head has 5 classes .*num_classes=7"):
        scala.descend(gene, half.replace(num_classes=7))
    with pytest.raises(GeneError, match=r"matformer\.descend: the gene's head has 5 classes"):
        scala.descend_matformer(gene, cfg.replace(mlp_dim=32, num_classes=7))
    headless = {k: v for k, v in gene.items() if k != 'head'}
    with pytest.raises(GeneError, match=r'the gene has no head .*num_classes=5'):
        scala.descend(headless, half)
    assert 'head' not in scala.descend(headless, half.replace(num_classes=0))


# ----------------------------------------------------------------------------------------
# Fault 2: unit_masks with a traced ratio took any `side` for 'right'.

def test_unit_masks_checks_side_for_a_traced_ratio(slimmable):
    cfg, _ = slimmable
    with pytest.raises(GeneError, match=r"side='middle'"):
        jax.jit(lambda r: scala.unit_masks(cfg, r, side='middle'))(jnp.float32(0.5))
    with pytest.raises(GeneError, match=r"side='middle'"):
        scala.unit_masks(cfg, jnp.float32(0.5), side='middle')
    left = jax.jit(lambda r: scala.unit_masks(cfg, r, side='left'))(jnp.float32(0.5))
    assert float(left['embed'][0]) == 1.0 and float(left['embed'][-1]) == 0.0


# ----------------------------------------------------------------------------------------
# Fault 3: the slimmable loss builders raised plain ValueError for a bad choice.

@pytest.mark.parametrize('build', [
    lambda cfg: scala.full_loss(cfg, rule='sideways'),
    lambda cfg: scala.scala_loss(cfg, scala.width_grid(0.25, 0.125), rule='sideways'),
    lambda cfg: scala.scala_loss(cfg, scala.width_grid(0.25, 0.125), transfer='sideways'),
    lambda cfg: scala.scala_loss(cfg, scala.width_grid(0.25, 0.125), distill='sideways'),
])
def test_slimmable_losses_raise_gene_error_for_a_bad_choice(slimmable, build):
    with pytest.raises(GeneError, match="='sideways'; expected one of"):
        build(slimmable[0])


# ----------------------------------------------------------------------------------------
# Fault 4: tleg.check_gene raised plain ValueError for theta_a / theta_b that differ.

def test_tleg_check_gene_raises_gene_error_for_mismatched_thetas():
    gene = tleg.init_gene(helpers.cfg(2), jax.random.key(0))
    bad = dict(gene, theta_a={k: v for k, v in gene['theta_a'].items() if k != 'mlp'})
    with pytest.raises(GeneError, match='theta_b and theta_a differ'):
        tleg.check_gene(bad)


# ----------------------------------------------------------------------------------------
# Fault 5: uniform_indices(n, 0) divided by zero.

def test_uniform_indices_refuses_no_indices():
    with pytest.raises(GeneError, match=r'uniform_indices: m=0 indices of an axis of size n=8; .*at least 1'):
        selection.uniform_indices(8, 0)
    with pytest.raises(GeneError, match=r'uniform_indices: m=2 indices of an axis of size n=0; .*at least 1'):
        selection.uniform_indices(0, 2)


# ----------------------------------------------------------------------------------------
# Fault 6: mix_n_match without granularities raised IndexError.

def test_mix_n_match_refuses_no_granularities():
    with pytest.raises(GeneError, match='mix_n_match: no trained granularities'):
        scala.mix_n_match(0.5, (), 4)


# ----------------------------------------------------------------------------------------
# Fault 7: usnet_plan took a grid without interior that usnet_loss refuses when traced.

def test_usnet_plan_refuses_a_grid_without_interior():
    with pytest.raises(GeneError, match='no width strictly between its ends'):
        scala.usnet_plan((0.5, 1.0), 1, 10)
    with pytest.raises(GeneError, match='no width strictly between its ends'):
        scala.sample_interior(jax.random.key(0), (0.5, 1.0))     # what usnet_loss runs
    assert scala.usnet_plan((0.25, 0.5, 1.0), 1, 10) == ((1.0, 11), (0.25, 10), (0.5, 20.0))


# ----------------------------------------------------------------------------------------
# Fault 8: He-LG / Auto-LG / Pre-Fin gene_from_model carried make's docstring.

@pytest.mark.parametrize('method', [baselines.HE_LG, baselines.AUTO_LG, baselines.PRE_FIN])
def test_gene_from_model_docstrings_name_their_own_arguments(method):
    read = method.gene_from_model
    doc = inspect.getdoc(read)
    names = [p for p in inspect.signature(read).parameters]
    args = doc.split('Args:')[1].split('Returns:')[0]
    named = re.findall(r'^\s{4}(\w+)\b[^:\n]*:', args, re.M)
    assert named == names, (named, names)
    assert 'Returns:' in doc and 'common.check_model' in doc.split('Raises:')[1]


# ----------------------------------------------------------------------------------------
# Fault 9: layer_window and unit_mapping took impossible sizes.

def test_layer_window_refuses_a_window_longer_than_its_layers():
    with pytest.raises(GeneError, match=r'layer_window: a window of 5 layers .* 3 layers'):
        baselines.layer_window(5, 3, 'last')
    with pytest.raises(GeneError, match=r'layer_window: a window of -1 layers'):
        baselines.layer_window(-1, 3, 'first')


@pytest.mark.parametrize('n1, n2', [(4, 2), (0, 3), (0, 0)])
def test_unit_mapping_refuses_a_shrinking_or_empty_axis(n1, n2):
    with pytest.raises(GeneError, match=rf'unit_mapping: .*{n1} to {n2} units'):
        growth.unit_mapping(n1, n2, jax.random.key(0), balanced=True)


# ----------------------------------------------------------------------------------------
# Fault 10: cluster.descendant_config turned depth=0 into len(heads).

def test_cluster_descendant_config_refuses_depth_below_one():
    cfg = helpers.cfg(4)
    assert cluster.descendant_config(cfg, (2, 2, 2)).depth == 3
    with pytest.raises(GeneError, match=r'descendant_config: depth=0'):
        cluster.descendant_config(cfg, (2, 2, 2), depth=0)
