"""Studies as recipes: every studiable method declares its family, one recipe per family runs
it, and a new method of an existing family is studied without touching any study module."""
import pytest

from jlearngene import genes
from jlearngene.experiments import configs, harness, recipes, study
from jlearngene.experiments.recipes import aux, base, cluster, grown, operator, slimmable, teacher
from jlearngene.genes import common, tleg


@pytest.fixture
def toy_method():
    """A method registered from this file alone: TLEG's verbs under another name, in the
    Aux-Net family (removed from the registry afterwards)."""
    method = common.register(common.Method(
        name='toy_aux', label='Toy', source='learned', init_gene=tleg.init_gene,
        materialize=tleg.materialize, descend=tleg.descend, gene_param_count=tleg.gene_param_count,
        gene_parts=tleg.GENE_PARTS, family='aux'))
    yield method
    del common._REGISTRY['toy_aux']


def _with_toy(name='tleg:smoke'):
    config = harness.plain(configs.load(name))
    config['methods'] = ('tleg', 'toy_aux')
    config['method_options']['toy_aux'] = config['method_options']['tleg']
    return config


def test_every_studiable_method_has_a_family_and_its_recipe():
    for name in genes.names():
        m = genes.get(name)
        if m.family is None:
            assert m.source == 'none'                   # Scratch: the protocol's own baseline
            continue
        assert recipes.for_method(name).family == m.family
        assert (m.operator is not None) == (m.family == 'operator')
        assert (m.slimmable is not None) == (m.family == 'slimmable')
        assert (m.clustering is not None) == (m.family == 'cluster')
    assert recipes.for_method('separate').family == 'separate'
    assert recipes.for_method('ceiling').family == 'ceiling'
    assert list(recipes.REGISTRY) == ['teacher', 'aux', 'slimmable', 'separate', 'cluster', 'grown',
                                      'operator', 'ceiling']


def test_each_recipe_bills_its_upstream_and_reads_one_section():
    rows = {r.name: r for name in ('tleg', 'letra', 'scala', 'mango', 'cluster')
            for r in study.make_rows(configs.load(f'{name}:smoke'))}
    assert isinstance(rows['he_lg'].recipe, teacher.Teacher) and rows['he_lg'].recipe.section is None
    assert isinstance(rows['tleg'].recipe, aux.Aux) and aux.RECIPE.section == 'aux'
    assert isinstance(rows['scala/clean'].recipe, slimmable.Slimmable)
    assert slimmable.SEPARATE.budget(rows['separate/flops']) == 'flops'
    assert isinstance(rows['bert2bert'].recipe, grown.Grown) and grown.RECIPE.section == 'small'
    assert isinstance(rows['mango/2'].recipe, operator.Operator) and operator.RECIPE.section == 'operator'
    assert isinstance(rows['cluster/random'].recipe, cluster.Cluster) and cluster.RECIPE.section == 'cluster'
    assert {r.recipe.billed(r) for r in rows.values()} >= {
        ('teacher',), ('teacher', 'aux_tleg'), ('scala/clean',), ('small',), ('teacher', 'attention_distance')}
    assert base.Upstream().genes == {} and cluster.RECIPE.report_lines({'info': {}}) == []
    # the small model joins Scratch's shapes where the study reuses its converged run
    ctx = harness.Context(configs.load('mango:smoke'), num_classes=10)
    assert list(grown.RECIPE.scratch_shapes(ctx)) == [(16, 1)]


def test_a_family_needs_its_verbs():
    with pytest.raises(genes.GeneError, match="family 'operator' needs operator verbs"):
        common.Method(name='x', label='X', source='model', gene_from_model=lambda p, c: p,
                      descend=lambda g, c, key=None: g, gene_param_count=lambda g: 0,
                      gene_parts=common.model_parts(), family='operator')
    with pytest.raises(genes.GeneError, match="family='nosuch'"):
        common.Method(name='x', label='X', source='model', gene_from_model=lambda p, c: p,
                      descend=lambda g, c, key=None: g, gene_param_count=lambda g: 0,
                      gene_parts=common.model_parts(), family='nosuch')


def test_a_toy_method_of_an_existing_family_is_planned_like_its_twin(toy_method):
    config = _with_toy()
    rows = {r.name: r for r in study.make_rows(config)}
    assert rows['toy_aux'].recipe is rows['tleg'].recipe and rows['toy_aux'].gene == rows['tleg'].gene
    assert study.label(rows['toy_aux']) == 'Toy'
    assert rows['toy_aux'].recipe.billed(rows['toy_aux']) == ('teacher', 'aux_toy_aux')
    plan = study.plan(config, 10, harness.module('tleg').STUDY)
    assert plan['toy_aux'] == plan['tleg']


def test_matformer_is_a_row_of_the_scala_study():
    config = configs.load('scala')
    assert 'matformer' in config.methods
    rows = {r.name: r for r in study.make_rows(config)}
    assert rows['matformer'].recipe.family == 'slimmable'
    plan = study.plan(config, 10, harness.module('scala').STUDY)
    # its sub-networks keep the width and heads and nest the FFN: width ratio r -> r·M MLP units
    sub = plan['matformer'][(16, 4)]
    assert (sub.width, sub.num_heads, sub.mlp_dim) == (64, 4, 32)


@pytest.mark.slow
def test_a_toy_method_runs_in_a_study_and_matches_its_twin(toy_method, tmp_path):
    """Registered in this file only, the toy method runs through the Aux-Net recipe; with
    TLEG's verbs, options and seeds its rows are TLEG's, number for number."""
    results = study.run_experiment(_with_toy(), str(tmp_path), quiet=True)
    rows = {(r['name'], tuple(r['shape']), r['fraction']): r for r in results['rows']}
    twins = [(rows[k], rows[('tleg',) + k[1:]]) for k in rows if k[0] == 'toy_aux']
    assert len(twins) == 2
    for toy, twin in twins:
        assert toy['acc'] == twin['acc'] and toy['curve'] == twin['curve']
    assert (tmp_path / 'genes' / 'toy_aux' / 'seed_0').is_dir()
    assert results['upstream_flops']['0']['aux_toy_aux'] == results['upstream_flops']['0']['aux_tleg']


def test_a_row_that_makes_no_shape_is_refused_before_anything_runs(tmp_path):
    """LeTra in the TLEG study: its family's section (aux) is there, so it is planned, but its
    default learngene (half the Aux-Net's 2 layers) cannot be made: one line naming why."""
    config = configs.load('tleg:smoke', {'methods': ('tleg', 'letra')})
    study.check(config)
    with pytest.raises(ValueError, match=r'letra makes none of the shapes .*learngene depth=1 must be even'):
        study.run_experiment(config, str(tmp_path / 'w'), quiet=True)
    assert not (tmp_path / 'w').exists()
