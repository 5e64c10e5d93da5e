"""The method contract (`jlearngene.genes`): registry, the verbs of every method, the shared
helpers of `genes.common`, and invariants that hold across methods."""
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jlearngene import costs, genes, pytree
from jlearngene.genes import baselines, common, tleg
from jlearngene.models import init, unstack_blocks

import helpers
from helpers import perturbed, trained_model


NAMES = genes.names()
GENERIC = ('scratch', 'tleg', 'share_init', 'mini_init', 'he_lg', 'auto_lg', 'pre_fin', 'cluster')
CONTRACT = tuple(n for n in NAMES if n in GENERIC)
LABELS = {'scratch': 'Scratch', 'tleg': 'TLEG', 'share_init': 'Share-Init', 'mini_init': 'Mini-Init',
          'he_lg': 'He-LG',
          'auto_lg': 'Auto-LG', 'pre_fin': 'Pre-Fin', 'cluster': 'Cluster-LG', 'net2net': 'Net2Net',
          'stackbert': 'StackBERT', 'bert2bert': 'bert2BERT', 'ligo': 'LiGO', 'letra': 'LeTra',
          'mango': 'Mango', 'scala': 'Scala', 'us_net': 'US-Net', 'matformer': 'MatFormer',
          'imwlm': 'IMwLM'}


def cfg_(depth=4, **kw):
    """The tiny config (`helpers.cfg`) with 8 px patches."""
    return helpers.cfg(depth, **{'patch_size': 8, **kw})


def make_gene(method, cfg, seed=0):
    """A 'trained' gene of `method` for a source of config `cfg`."""
    if method.source == 'learned':
        gene = jax.jit(method.init_gene, static_argnums=0)(cfg, jax.random.key(seed))
        return perturbed(gene, seed + 1)
    if method.source == 'model':
        return method.gene_from_model(trained_model(cfg, seed), cfg)
    return None


def shapes(cfg):
    return jax.eval_shape(lambda: init(cfg, jax.random.key(0)))


def read_count(method, gene, tcfg, **options):
    """Gene entries that `descend` reads: those with a nonzero derivative of the sum of its
    output (every read entry enters the output with a positive coefficient)."""
    @jax.jit
    def grad(gene):
        out, vjp = jax.vjp(lambda g: method.descend(g, tcfg, key=jax.random.key(3), **options), gene)
        return vjp(jax.tree.map(jnp.ones_like, out))[0]

    return sum(int(np.count_nonzero(np.asarray(g))) for g in jax.tree.leaves(grad(gene)))


# ----------------------------------------------------------------------------------------
# Registry.

def test_registry_lists_every_method_with_its_verbs():
    assert set(NAMES) == set(LABELS)
    for name in NAMES:
        m = genes.get(name)
        assert m.name == name and m.label == LABELS[name]
        assert callable(m.descend) and callable(m.gene_param_count)
        assert (m.init_gene is not None) == (m.materialize is not None) == (m.source == 'learned')
        assert (m.gene_from_model is not None) == (m.source == 'model')
    assert {n for n in NAMES if genes.get(n).source == 'learned'} == {
        'tleg', 'share_init', 'mini_init', 'letra', 'scala', 'us_net', 'matformer'}
    assert {n for n in NAMES if genes.get(n).source == 'model'} == {
        'he_lg', 'auto_lg', 'pre_fin', 'cluster', 'net2net', 'stackbert', 'bert2bert', 'ligo',
        'mango', 'imwlm'}
    assert [n for n in NAMES if genes.get(n).gene_per_target] == ['pre_fin']
    assert genes.get('tleg') is tleg.METHOD and genes.get('he_lg') is baselines.HE_LG
    assert costs.METHODS == NAMES


def test_every_method_shares_the_head_defaults():
    """One API: S-Params count without the head, and descend inherits a gene's head (the
    slimmable methods slice theirs and take no `head`; Scratch has no gene)."""
    for name in NAMES:
        m = genes.get(name)
        assert inspect.signature(m.gene_param_count).parameters['include_head'].default is False, name
        head = inspect.signature(m.descend).parameters.get('head')
        want = {'scratch': 'new', 'scala': None, 'us_net': None, 'matformer': None}.get(name, 'inherit')
        assert (head and head.default) == want, name


def test_get_unknown_name_lists_the_known_ones():
    with pytest.raises(genes.GeneError) as e:
        genes.get('no_such_method')
    assert "'no_such_method'" in str(e.value)
    for name in NAMES:
        assert repr(name) in str(e.value)


def test_register_rejects_a_taken_name_and_incomplete_methods():
    m = genes.get('scratch')
    assert genes.register(m) is m                      # the same record again is a no-op
    with pytest.raises(genes.GeneError, match="'scratch'"):
        genes.register(genes.Method(name='scratch', label='X', source='none', descend=m.descend,
                                    gene_param_count=m.gene_param_count))
    with pytest.raises(genes.GeneError, match="source='learned'.*materialize"):
        genes.Method(name='x', label='X', source='learned', descend=m.descend,
                     gene_param_count=m.gene_param_count, init_gene=tleg.init_gene)
    with pytest.raises(genes.GeneError, match="source='none'.*gene_from_model"):
        genes.Method(name='x', label='X', source='none', descend=m.descend,
                     gene_param_count=m.gene_param_count, gene_from_model=baselines.pre_fin_gene)
    with pytest.raises(genes.GeneError, match='source=.trained.'):
        genes.Method(name='x', label='X', source='trained', descend=m.descend,
                     gene_param_count=m.gene_param_count)
    assert 'x' not in genes.names()


def test_one_gene_error_class():
    assert tleg.GeneError is baselines.GeneError is common.GeneError is genes.GeneError
    assert issubclass(genes.GeneError, ValueError)


# ----------------------------------------------------------------------------------------
# The contract's generic invariants, over the methods whose gene follows from a source of
# one config (`cfg_()`) and default options. The others' genes need more (a target pair
# for the growth operators, a learngene shape, a width grid); their own test files
# (test_letra, test_selection, test_scala, test_mango, test_growth) check these invariants.

@pytest.fixture(scope='module')
def made():
    return {n: make_gene(genes.get(n), cfg_()) for n in CONTRACT}


@pytest.mark.parametrize('name', CONTRACT)
@pytest.mark.parametrize('depth', [3, 5])
def test_descend_gives_exactly_init_structure(name, depth, made):
    m, tcfg = genes.get(name), cfg_(depth)
    des = m.descend(made[name], tcfg, key=jax.random.key(2))
    chex.assert_trees_all_equal_shapes_and_dtypes(des, shapes(tcfg))
    pytree.assert_same_structure(des, shapes(tcfg))


@pytest.mark.parametrize('name', CONTRACT)
def test_gene_param_count_is_what_descend_reads(name, made):
    m, gene, tcfg = genes.get(name), made[name], cfg_(5)
    if m.source == 'none':
        assert gene is None and m.gene_param_count(gene) == 0
        return
    # the head is counted exactly when it is inherited
    assert m.gene_param_count(gene, include_head=True) == read_count(m, gene, tcfg, head='inherit')
    assert m.gene_param_count(gene) == read_count(m, gene, tcfg, head='new')
    assert m.gene_param_count(gene, include_head=True) - m.gene_param_count(gene) == 32 * 10 + 10
    # embeddings='random' reads none of the gene's embeddings, wherever the gene keeps them
    emb = pytree.count_params(gene, groups=[(
        'emb', r'(.*/)?(patch_embed/.*|pos_embed|cls_token|dist_token|norm/.*)')])['emb']
    assert emb > 0                                   # every gene holds embeddings by default
    assert m.gene_param_count(gene) - emb == read_count(m, gene, tcfg, head='new', embeddings='random')


@pytest.mark.parametrize('name', CONTRACT)
def test_gene_shapes_and_s_params_count_the_real_gene(name, made):
    m, cfg = genes.get(name), cfg_()
    got = m.gene_shapes(cfg)
    if m.source == 'none':
        assert got is None and costs.s_params(name, [cfg_(3)]) == 0
        return
    chex.assert_trees_all_equal_shapes_and_dtypes(got, made[name])
    for head in (False, True):
        want = m.gene_param_count(made[name], include_head=head)
        assert m.gene_param_count(got, include_head=head) == want
        assert costs.s_params(name, [cfg_(3)], source=cfg, include_head=head) == want
        assert costs.s_params(m, [cfg_(3)], source=cfg, include_head=head) == want


@pytest.mark.parametrize('name', [n for n in CONTRACT if genes.get(n).source != 'none'])
def test_impossible_width_is_a_gene_error(name, made):
    with pytest.raises(genes.GeneError, match=r"width=64.*\(2, 32\)"):
        genes.get(name).descend(made[name], cfg_(4, width=64), key=jax.random.key(0))


class ContractJitTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*CONTRACT)
    def test_jit_and_eager_agree(self, name):
        m, tcfg = genes.get(name), cfg_(5, num_classes=3)
        gene = make_gene(m, cfg_(), seed=4)
        fn = self.variant(lambda g, k: m.descend(g, tcfg, key=k, head='new'))
        got = fn(gene, jax.random.key(6))
        want = m.descend(gene, tcfg, key=jax.random.key(6), head='new')
        chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)

    @parameterized.parameters(*CONTRACT)
    def test_descend_compiles_once_for_new_values(self, name):
        m, tcfg = genes.get(name), cfg_(5)
        chex.clear_trace_counter()

        @jax.jit
        @chex.assert_max_traces(n=1)
        def des(gene, key):
            return m.descend(gene, tcfg, key=key)

        outs = [des(make_gene(m, cfg_(), seed=s), jax.random.key(s)) for s in (0, 1)]
        assert not np.array_equal(outs[0]['blocks']['mlp']['fc1']['kernel'],
                                  outs[1]['blocks']['mlp']['fc1']['kernel'])


# ----------------------------------------------------------------------------------------
# Invariants across methods (DESIGN §6).

@pytest.mark.parametrize('name', [n for n in CONTRACT if genes.get(n).source == 'learned'])
def test_des_net_at_aux_depth_equals_the_aux_net(name, made):
    m, cfg = genes.get(name), cfg_()
    assert pytree.trees_equal(m.descend(made[name], cfg), m.materialize(made[name], None, cfg))


def test_materialize_merges_frozen_parts(made):
    gene, cfg = made['tleg'], cfg_()
    frozen = {'shared': {'pos_embed': gene['shared']['pos_embed']}}
    trainable = {**gene, 'shared': {k: v for k, v in gene['shared'].items() if k != 'pos_embed'}}
    assert pytree.trees_equal(tleg.materialize(trainable, frozen, cfg), tleg.expand(gene, cfg.depth))
    with pytest.raises(genes.GeneError, match="'shared/pos_embed'"):
        tleg.materialize(gene, frozen, cfg)


def test_model_genes_with_every_layer_rebuild_the_model():
    cfg = cfg_()
    model = trained_model(cfg)
    for name, options in [('he_lg', dict(k=4, embeddings='inherit')), ('auto_lg', dict(k=4)),
                          ('pre_fin', {})]:
        m = genes.get(name)
        gene = m.gene_from_model(model, cfg, **options)
        assert pytree.trees_equal(m.descend(gene, cfg, head='inherit'), model), name
        assert m.gene_param_count(gene, include_head=True) == costs.param_count(cfg)


@pytest.mark.parametrize('name,legacy', [
    ('he_lg', lambda a, t, k: baselines.he_lg(a, t, 2, k)),
    ('auto_lg', lambda a, t, k: baselines.auto_lg(a, t, 2, k)),
    ('pre_fin', lambda a, t, k: baselines.pre_fin(a, t, choice='middle', key=k)),
])
def test_model_taking_forms_equal_gene_then_descend(name, legacy):
    cfg, tcfg = cfg_(), cfg_(6)
    model = trained_model(cfg)
    m = genes.get(name)
    options = {} if name == 'pre_fin' else {'k': 2}
    via_gene = m.descend(m.gene_from_model(model, cfg, **options), tcfg, key=jax.random.key(1),
                         **({'choice': 'middle'} if name == 'pre_fin' else {}))
    assert pytree.trees_equal(via_gene, legacy(model, tcfg, jax.random.key(1)))


def test_embeddings_option_decides_what_he_lg_stores_and_reads():
    cfg = cfg_()
    model = trained_model(cfg)
    lean = baselines.HE_LG.gene_from_model(model, cfg, k=2, embeddings='random')
    full = baselines.HE_LG.gene_from_model(model, cfg, k=2)     # the official code's embeddings
    assert set(lean) == {'blocks', 'head'}
    assert set(full) == {'blocks', 'head', 'patch_embed', 'pos_embed', 'norm'}
    emb = sum(pytree.size(x) for k in ('patch_embed', 'pos_embed', 'norm')
              for x in jax.tree.leaves(model[k]))
    assert baselines.HE_LG.gene_param_count(full) - baselines.HE_LG.gene_param_count(lean) == emb
    key = jax.random.key(1)
    des = baselines.descend_he_lg(full, cfg, key=key)          # None: inherit what it holds
    chex.assert_trees_all_equal(des['pos_embed'], model['pos_embed'])
    fresh = baselines.descend_he_lg(full, cfg, key=key, embeddings='random')
    assert pytree.trees_equal(fresh['pos_embed'], baselines.descend_he_lg(lean, cfg, key=key)['pos_embed'])
    assert not np.array_equal(fresh['pos_embed'], model['pos_embed'])
    with pytest.raises(genes.GeneError, match="'patch_embed'"):
        baselines.descend_he_lg(lean, cfg, key=key, embeddings='inherit')


def test_tleg_random_embeddings_and_uncounted_free_blocks():
    cfg = cfg_()
    gene = perturbed(tleg.init_gene(cfg, jax.random.key(0), expand=('msa', 'mlp')))
    des = tleg.descend(gene, cfg_(3), key=jax.random.key(1), embeddings='random')
    assert not np.array_equal(des['pos_embed'], gene['shared']['pos_embed'])
    chex.assert_trees_all_equal(des['head'], gene['shared']['head'])
    # free per-layer LayerNorms belong to the Aux-Net, not to the stored learngene
    free = pytree.count_params(gene['shared']['blocks'], groups=None)['total']
    total = pytree.count_params(gene, groups=None)['total']
    assert tleg.gene_param_count(gene, include_head=True) == total - free
    assert tleg.METHOD.gene_param_count(gene) == read_count(tleg.METHOD, gene, cfg_(5), head='new')


def test_pre_fin_stores_one_model_per_distinct_target_shape():
    a, b = cfg_(2), cfg_(3)
    one = costs.s_params('pre_fin', [a])
    assert one == costs.param_count(a, include_head=False)
    assert costs.s_params('pre_fin', [a, b, a]) == one + costs.param_count(b, include_head=False)
    other_classes = a.replace(num_classes=5)
    assert costs.s_params('pre_fin', [a, other_classes]) == one              # same shape sans head
    assert (costs.s_params('pre_fin', [a, other_classes], include_head=True)
            == costs.param_count(a) + costs.param_count(other_classes))
    assert costs.s_params('pre_fin', [a, b], source=b) == costs.param_count(b, include_head=False)


def test_gene_options_and_errors_of_model_sources():
    cfg = cfg_()
    model = trained_model(cfg)
    with pytest.raises(genes.GeneError, match=r'k=5.*depth 4'):
        baselines.HE_LG.gene_from_model(model, cfg, k=5)
    with pytest.raises(genes.GeneError, match='4 layers.*depth=3'):
        baselines.PRE_FIN.gene_from_model(model, cfg_(3))
    with pytest.raises(genes.GeneError, match=r"'blocks/attn/k/bias'.*width=64"):
        baselines.PRE_FIN.gene_from_model(model, cfg_(4, width=64))
    gene = baselines.HE_LG.gene_from_model(model, cfg, k=3)
    with pytest.raises(genes.GeneError, match='3 layers.*depth 2'):
        baselines.descend_he_lg(gene, cfg_(2), key=jax.random.key(0))
    with pytest.raises(genes.GeneError, match=r'target layers \[0, 1\]'):
        baselines.descend_he_lg(gene, cfg_(5))
    with pytest.raises(genes.GeneError, match=r"auto_lg: .*\['theta_b'\]"):
        baselines.descend_auto_lg({'theta_b': {}}, cfg, key=jax.random.key(0))
    with pytest.raises(genes.GeneError, match=r'scratch .*\bdict\b'):
        baselines.SCRATCH.descend(gene, cfg, key=jax.random.key(0))
    with pytest.raises(genes.GeneError, match=r"scratch.*head='inherit'"):
        baselines.SCRATCH.descend(None, cfg, key=jax.random.key(0), head='inherit')
    with pytest.raises(genes.GeneError, match=r"scratch.*\['k'\]"):
        baselines.SCRATCH.gene_shapes(cfg, k=3)


# ----------------------------------------------------------------------------------------
# genes.common.

def test_check_fits_names_the_first_mismatch():
    cfg = cfg_()
    want = {'a': jax.ShapeDtypeStruct((2, 3), jnp.float32), 'b': jax.ShapeDtypeStruct((4,), jnp.float32)}
    common.check_fits({'a': np.zeros((2, 3))}, want, 'w', cfg)                 # a subset fits
    with pytest.raises(genes.GeneError, match=r"w: .*width=32.*'x/b'"):
        common.check_fits({'a': np.zeros((2, 3))}, want, 'w', cfg, complete=True, prefix='x/')
    with pytest.raises(genes.GeneError, match=r"w: .*'a'.*\(3, 2\).*\(2, 3\)!"):
        common.check_fits({'a': np.zeros((3, 2))}, want, 'w', cfg, source='model', hint='!')
    with pytest.raises(genes.GeneError, match=r"w: .*'c'"):
        common.check_fits({'c': np.zeros(1)}, want, 'w', cfg)


def test_embeddings_and_heads_inherits_or_draws():
    cfg = cfg_()
    src, fresh = trained_model(cfg), trained_model(cfg, seed=5)
    top = common.embeddings_and_heads(src, cfg, head='inherit', embeddings='inherit',
                                      fresh=None, what='t')
    assert set(top) == {'patch_embed', 'pos_embed', 'norm', 'head'}
    assert pytree.trees_equal(top, common.top_level(src))
    top = common.embeddings_and_heads(src, cfg, head='new', embeddings='inherit',
                                      fresh=lambda: fresh, what='t')
    assert top['head'] is fresh['head'] and top['norm'] is src['norm']
    top = common.embeddings_and_heads({'head': src['head']}, cfg, head='inherit', embeddings=None,
                                      fresh=lambda: fresh, what='t')
    assert top['pos_embed'] is fresh['pos_embed'] and top['head'] is src['head']
    with pytest.raises(genes.GeneError, match=r"t: .*\['head'\].*PRNG key"):
        common.embeddings_and_heads(src, cfg, head='new', embeddings='inherit', fresh=None, what='t')
    with pytest.raises(genes.GeneError, match=r"t: embeddings='copy'"):
        common.embeddings_and_heads(src, cfg, head='new', embeddings='copy', fresh=None, what='t')
    with pytest.raises(genes.GeneError, match=r"t\(head='inherit'\)"):
        common.embeddings_and_heads({}, cfg, head='inherit', embeddings='random', fresh=None, what='t')
    with pytest.raises(genes.GeneError, match=r"'cls_token'"):
        common.embeddings_and_heads(src, cfg.replace(pool='cls'), head='inherit',
                                    embeddings='inherit', fresh=None, what='t')


def test_layer_gathers():
    blocks = {'w': np.arange(5 * 3).reshape(5, 3).astype(np.float32), 'b': {'v': np.arange(5, dtype=np.float32)}}
    got = common.gather_layers(blocks, [4, 0, 2])
    np.testing.assert_array_equal(got['w'], blocks['w'][[4, 0, 2]])
    np.testing.assert_array_equal(got['b']['v'], [4.0, 0.0, 2.0])
    target = jax.tree.map(np.zeros_like, blocks)
    placed = common.place_layers(target, [1, 3], blocks, [0, 4])
    want = np.zeros((5, 3), np.float32)
    want[1], want[3] = blocks['w'][0], blocks['w'][4]
    np.testing.assert_array_equal(placed['w'], want)
    with pytest.raises(genes.GeneError, match='2 target layers.*1 source'):
        common.place_layers(target, [1, 3], blocks, [0])
    layers = [jax.tree.map(lambda x, i=i: x[i], blocks) for i in range(5)]
    chex.assert_trees_all_equal(common.stack_layers(layers), blocks)
    assert common.num_layers(blocks) == 5 and common.num_layers({}) == 0
    with pytest.raises(genes.GeneError, match='layer 1'):
        common.stack_layers([{'w': np.zeros(2)}, {'w': np.zeros(3)}])


def test_stacked_accepts_list_layout_and_names_differing_blocks():
    m = trained_model(cfg_(2))
    assert pytree.trees_equal(common.stacked(unstack_blocks(m), 'w'), m)
    mixed = unstack_blocks(m)
    mixed['blocks'][1] = jax.tree.map(lambda x: np.zeros(x.shape[1:], x.dtype),
                                      shapes(cfg_(1, mlp_dim=32))['blocks'])
    with pytest.raises(genes.GeneError, match='w: stack_blocks: block 1'):
        common.stacked(mixed, 'w')


def test_merge_disjoint():
    a, b = {'x': {'p': 1}, 'y': 2}, {'x': {'q': 3}, 'z': 4}
    assert common.merge_disjoint(a, b, 'm') == {'x': {'p': 1, 'q': 3}, 'y': 2, 'z': 4}
    with pytest.raises(genes.GeneError, match="m: 'x/p'"):
        common.merge_disjoint(a, {'x': {'p': 5}}, 'm')
