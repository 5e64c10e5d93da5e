"""LeTra: gene, Aux-Net materialisation, row selection, depth maps, descendants, the official
state dict, and the experiment's smoke run."""
import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jlearngene import costs, interop, pytree
from jlearngene.genes import letra
from jlearngene.interop import lets
from jlearngene.interop.state_dict import StateDictError
from jlearngene.models import apply, init, vit_config

import helpers
from helpers import images, perturbed


def aux_cfg(**kw):
    """The Aux-Net: width 16, 4 heads, 4 layers, 8 px images, 5 classes (`helpers.cfg`)."""
    return helpers.cfg(**{'width': 16, 'num_heads': 4, 'mlp_dim': 32, 'image_size': 8,
                          'num_classes': 5, **kw})


AUX = aux_cfg()                                       # learngene: width 8, 2 heads of 4, 2 layers


@pytest.fixture(scope='module')
def fresh():
    return jax.jit(letra.init_gene, static_argnums=0)(AUX, jax.random.key(0))


@pytest.fixture(scope='module')
def gene(fresh):
    return perturbed(fresh)


def np_tree(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope='module')
def aux(gene):
    """The Aux-Net of `gene` (numpy)."""
    return np_tree(letra.materialize(gene, None, AUX))


_forward = jax.jit(apply, static_argnums=2)


# ----------------------------------------------------------------------------------------
# The gene.

def test_init_gene_is_the_official_init(fresh):
    g, s = np_tree(fresh), letra.sizes(fresh)
    assert (s.width, s.heads, s.head_dim, s.mlp, s.depth) == (8, 2, 4, 16, 2)
    assert (s.aux_width, s.aux_heads, s.aux_mlp, s.aux_depth, s.sets) == (16, 4, 32, 4, 2)
    assert set(g['learngene']) == {'patch_embed', 'norm', 'head', 'blocks'}   # no pos_embed
    assert g['pos_embed'].shape == (1, 4, 16)
    assert {n: f.shape for n, f in g['width'].items()} == {
        'embed': (8, 8), 'head': (8, 8), 'q': (2, 8, 8), 'k': (2, 8, 8), 'v': (2, 8, 8),
        'mlp': (2, 16, 16)}
    for f in g['width'].values():                 # 'rand': U[0,1) rows normalised to sum 1
        assert f.min() >= 0
        np.testing.assert_allclose(f.sum(-1), 1.0, rtol=1e-5)
    assert set(g['depth']) == set(letra.MODULES)
    for module in g['depth'].values():            # 'stackbert_noisy': (1, u)/(1+u), u < 0.03
        for c in module.values():
            u = c[:, 1] / c[:, 0]
            assert c.shape == (2, 2) and np.all((u >= 0) & (u < 0.03))
            np.testing.assert_allclose(c.sum(1), 1.0, rtol=1e-6)
        assert not np.array_equal(module['weight'], module['bias'])


def test_parameter_count_of_the_official_shapes():
    """S-L8 → B-L16: 37,735,784 in all, the learngene 14,876,776 (spec §2.4)."""
    cfg = vit_config('B', depth=16, num_classes=1000, pool='avg', patch_size=16)
    shapes = letra.METHOD.gene_shapes(cfg, learngene_heads=6, learngene_depth=8)
    total = letra.gene_param_count(shapes, include_head=True)
    assert total == 37_735_784 == costs.s_params('letra', source=cfg, include_head=True,
                                                 learngene_heads=6, learngene_depth=8)
    assert pytree.count_params(shapes['learngene'], groups=None)['total'] == 14_876_776
    assert pytree.count_params(shapes['width'], groups=None)['total'] == 22_708_224
    assert pytree.count_params(shapes['depth'], groups=None)['total'] == 256
    assert letra.METHOD.gene_param_count(shapes) == total - (384 * 1000 + 1000) - 384 * 384


# ----------------------------------------------------------------------------------------
# The Aux-Net.

def _wide_layer(g, j):
    """Learngene layer j widened by every whole matrix (numpy, torch-free formulas)."""
    b = {k: np.asarray(v)[j] for k, v in pytree.flatten(g['learngene']['blocks']).items()}
    w = {k: np.asarray(v) for k, v in g['width'].items()}
    e = w['embed']

    def rows(x, f):                               # [x; F x] along axis 0
        return np.concatenate([x, np.tensordot(f, x, axes=(1, 0))], 0)

    def cols(x, f):                               # [x, x Fᵀ] along the last axis
        return np.concatenate([x, x @ f.T], -1)

    q = b['attn/q/kernel'].reshape(8, 8)
    out = b['attn/out/kernel'].reshape(8, 8)
    return {'norm1/scale': rows(b['norm1/scale'], e),
            'attn/q/kernel': cols(rows(q, e), w['q'][j]).reshape(16, 4, 4),
            'attn/q/bias': rows(b['attn/q/bias'].reshape(8), w['q'][j]).reshape(4, 4),
            'attn/out/kernel': cols(rows(out, w['v'][j]), e).reshape(4, 4, 16),
            'mlp/fc1/kernel': cols(rows(b['mlp/fc1/kernel'], e), w['mlp'][j]),
            'mlp/fc2/kernel': cols(rows(b['mlp/fc2/kernel'], w['mlp'][j]), e)}


def test_materialize_follows_the_official_formulas(gene, aux):
    g = np_tree(gene)
    chex.assert_trees_all_equal_shapes(aux, jax.eval_shape(lambda: init(AUX, jax.random.key(0))))
    wide = [_wide_layer(g, j) for j in range(2)]
    flat = pytree.flatten(aux['blocks'])
    for path, (module, kind) in [('norm1/scale', ('norm1', 'weight')), ('attn/q/kernel', ('q', 'weight')),
                                 ('attn/q/bias', ('q', 'bias')), ('attn/out/kernel', ('out', 'weight')),
                                 ('mlp/fc1/kernel', ('fc1', 'weight')), ('mlp/fc2/kernel', ('fc2', 'weight'))]:
        coef = g['depth'][module][kind]
        for i in range(4):                        # 2 sets over the one learngene pair {0, 1}
            want = coef[i // 2, 0] * wide[0][path] + coef[i // 2, 1] * wide[1][path]
            np.testing.assert_allclose(flat[path][i], want, rtol=1e-5, atol=1e-6, err_msg=f'{path} {i}')
        np.testing.assert_array_equal(flat[path][0], flat[path][1])      # layers 2k, 2k+1 identical
    lg = g['learngene']
    np.testing.assert_array_equal(aux['pos_embed'], g['pos_embed'])
    np.testing.assert_allclose(aux['head']['kernel'], np.concatenate(
        [lg['head']['kernel'], g['width']['head'] @ lg['head']['kernel']]), rtol=1e-5)
    np.testing.assert_array_equal(aux['head']['bias'], lg['head']['bias'])
    pk = lg['patch_embed']['kernel']
    np.testing.assert_allclose(aux['patch_embed']['kernel'],
                               np.concatenate([pk, pk @ g['width']['embed'].T], -1), rtol=1e-5)


def test_aux_loss_gradient_reaches_every_gene_leaf(gene):
    x = images(4)

    def loss(g):
        return jnp.mean(jax.nn.log_softmax(apply(letra.materialize(g, None, AUX), x, AUX)[0])[:, 0])

    grads = jax.jit(jax.grad(loss))(gene)
    for path, gr in pytree.flatten(grads).items():
        assert np.abs(np.asarray(gr)).max() > 0, f'zero gradient on {path}'


def test_descendant_at_aux_sizes_is_the_aux_net_bit_for_bit(gene, aux):
    des = letra.descend(gene, AUX)
    assert pytree.trees_equal(np_tree(des), aux)
    np.testing.assert_array_equal(_forward(des, images(), AUX)[0], _forward(aux, images(), AUX)[0])


def test_learngene_width_gives_coefficient_combinations_of_learngene_layers(gene):
    tcfg = aux_cfg(width=8, num_heads=2, mlp_dim=16, depth=3)
    des, g = np_tree(letra.descend(gene, tcfg)), np_tree(gene)
    lg = g['learngene']
    pairs, sets = letra.depth_map(letra.sizes(gene), 3)
    for path, (module, kind) in letra.LEAF_MODULES.items():
        x = pytree.flatten(lg['blocks'])[path]
        c = g['depth'][module][kind]
        for i in range(3):
            want = c[sets[i], 0] * x[2 * pairs[i]] + c[sets[i], 1] * x[2 * pairs[i] + 1]
            np.testing.assert_allclose(pytree.flatten(des['blocks'])[path][i], want, rtol=1e-5, atol=1e-7)
    for k in ('patch_embed', 'norm', 'head'):
        chex.assert_trees_all_equal(des[k], lg[k])
    np.testing.assert_array_equal(des['pos_embed'], g['pos_embed'][..., :8])


# ----------------------------------------------------------------------------------------
# Row selection.

def _selected(gene, selection, **kw):
    request = letra.Request(embed=4, heads=1, mlp=8)        # width 12, 3 heads, MLP 24
    return np_tree(letra.select_rows(gene, request, selection=selection, key=jax.random.key(3), **kw))


def test_selection_strategies_index_sets(gene):
    cont = _selected(gene, 'continuous')
    np.testing.assert_array_equal(cont['embed'], np.arange(4))
    np.testing.assert_array_equal(cont['q'], np.arange(4))        # the first new head: rows 0..3
    np.testing.assert_array_equal(cont['mlp'], np.arange(8))
    # the authors' step ⌊D_aux/D_des⌋ = 1 strictly between learngene and Aux-Net: continuous
    chex.assert_trees_all_equal(_selected(gene, 'step'), cont)
    spread = _selected(gene, 'step', step_rule='spread')          # ⌊8/4⌋ = 2 rows, ⌊2/1⌋ heads
    np.testing.assert_array_equal(spread['embed'], [0, 2, 4, 6])
    np.testing.assert_array_equal(spread['mlp'], np.arange(8) * 2)
    shared = _selected(gene, 'random')                            # one set per kind, everywhere
    for n in ('head', 'embed'):
        np.testing.assert_array_equal(shared[n], shared['embed'])
    assert shared['q'].shape == (4,) and np.array_equal(shared['q'], shared['v'])
    for sel in ('random_wo', 'rank'):
        s = _selected(gene, sel)
        assert s['q'].shape == (2, 4) and s['mlp'].shape == (2, 8)
        np.testing.assert_array_equal(s['k'], s['q'])               # one head set for q and k
        np.testing.assert_array_equal(s['head'], s['embed'])
        assert np.all(s['q'] % 4 == np.arange(4))                  # whole heads
        literal = _selected(gene, sel, per_matrix=True)
        assert not np.array_equal(literal['q'], literal['k'])      # the literal, scrambling option
    w = np_tree(gene['width'])
    rank = _selected(gene, 'rank')
    np.testing.assert_array_equal(rank['embed'], np.sort(np.argsort(-np.square(w['embed']).sum(1))[:4]))
    qk = np.square(w['q'].reshape(2, 2, -1)).sum(-1) + np.square(w['k'].reshape(2, 2, -1)).sum(-1)
    np.testing.assert_array_equal(rank['q'] // 4, np.argmax(qk, 1)[:, None].repeat(4, 1))
    smallest = _selected(gene, 'rank', rank_order='smallest', rank_norm='l1')
    np.testing.assert_array_equal(smallest['mlp'], np.sort(np.argsort(np.abs(w['mlp']).sum(-1), 1)[:, :8], 1))


@pytest.mark.parametrize('selection', ['random_wo', 'rank'])
def test_tied_index_sets_make_each_layer_a_sub_network(selection, gene):
    """With coefficients (1, 0) a layer is one widened learngene layer; every descendant layer
    is then that Aux layer sliced at the selected neurons: v-out / out-in share V_j's rows,
    fc1-out / fc2-in M_j's, q and k one head set, every residual use E's."""
    g = dict(gene, depth=jax.tree.map(lambda c: jnp.tile(jnp.asarray([1.0, 0.0]), (c.shape[0], 1)),
                                      gene['depth']))
    tcfg = aux_cfg(width=12, num_heads=3, mlp_dim=24, depth=2)
    key = jax.random.key(5)
    des = np_tree(letra.descend(g, tcfg, selection=selection, key=key, layers=(0, 2)))
    rows = np_tree(letra.select_rows(g, letra.Request(4, 1, 8), selection=selection,
                                     key=jax.random.split(key)[0]))
    aux = np_tree(letra.materialize(g, None, AUX))
    s = letra.sizes(g)
    e = np.concatenate([np.arange(s.width), s.width + rows['embed']])
    close = lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)  # noqa: E731
    for i, aux_layer in enumerate((0, 2)):        # both widen learngene layer 0 (coefficients (1, 0))
        qh, vh, m = (np.concatenate([np.arange(n), n + rows[k][0]])
                     for k, n in (('q', 8), ('v', 8), ('mlp', 16)))
        a = {k: v[aux_layer] for k, v in pytree.flatten(aux['blocks']).items()}
        d = {k: v[i] for k, v in pytree.flatten(des['blocks']).items()}
        close(d['attn/q/kernel'].reshape(12, 12), a['attn/q/kernel'].reshape(16, 16)[np.ix_(e, qh)])
        close(d['attn/k/kernel'].reshape(12, 12), a['attn/k/kernel'].reshape(16, 16)[np.ix_(e, qh)])
        close(d['attn/out/kernel'].reshape(12, 12), a['attn/out/kernel'].reshape(16, 16)[np.ix_(vh, e)])
        close(d['attn/v/bias'].reshape(12), a['attn/v/bias'].reshape(16)[vh])
        close(d['mlp/fc1/kernel'], a['mlp/fc1/kernel'][np.ix_(e, m)])
        close(d['mlp/fc2/kernel'], a['mlp/fc2/kernel'][np.ix_(m, e)])
        close(d['norm2/bias'], a['norm2/bias'][e])
    close(des['pos_embed'], aux['pos_embed'][..., e])
    close(des['head']['kernel'], aux['head']['kernel'][e])
    close(des['patch_embed']['kernel'], aux['patch_embed']['kernel'][..., e])


# ----------------------------------------------------------------------------------------
# Depth maps.

def test_depth_maps():
    official = letra.Sizes(384, 6, 64, 1536, 8, 768, 12, 3072, 8)
    pairs, sets = letra.depth_map(official, 16)                      # the Aux-Net itself
    np.testing.assert_array_equal(pairs, np.arange(16) // 4)
    np.testing.assert_array_equal(sets, np.arange(16) // 2)
    m = [0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]                      # the README's Des-L12
    c = [0, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 14]
    pairs, sets = letra.depth_map(official, 12, m, c)
    np.testing.assert_array_equal(sets * 2, [0, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 14])
    np.testing.assert_array_equal(pairs, [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3])
    pairs, sets = letra.depth_map(official, 12)                      # spread: every set kept
    assert set(sets.tolist()) == set(range(8)) and np.all(np.diff(sets) >= 0)
    assert letra.depth_map(official, 32)[1].tolist() == np.repeat(np.arange(8), 4).tolist()
    with pytest.raises(letra.GeneError, match='Aux layer 4.*pair 1.*Aux layer 0.*pair 0'):
        letra.depth_map(official, 2, [0, 1], [4, 0])
    with pytest.raises(letra.GeneError, match=r'layers=\[0, 16\].*\[0, 16\)'):
        letra.depth_map(official, 2, [0, 16])
    with pytest.raises(letra.GeneError, match=r'layers=\[0, 1\].*3'):
        letra.depth_map(official, 3, [0, 1])
    with pytest.raises(letra.GeneError, match='coefficient_layers needs layers'):
        letra.depth_map(official, 3, None, [0, 1, 2])


# ----------------------------------------------------------------------------------------
# Errors.

def test_errors_name_the_values(gene, fresh):
    with pytest.raises(letra.GeneError, match=r'head_dim=4.*num_heads=2.*head_dim=6'):
        letra.descend(gene, aux_cfg(width=12, num_heads=2, mlp_dim=24))
    with pytest.raises(letra.GeneError, match='width=20.*16'):
        letra.descend(gene, aux_cfg(width=20, num_heads=5, mlp_dim=32))
    with pytest.raises(letra.GeneError, match='width=4.*8'):
        letra.descend(gene, aux_cfg(width=4, num_heads=1, mlp_dim=16))
    with pytest.raises(letra.GeneError, match='mlp_dim=40'):
        letra.descend(gene, aux_cfg(mlp_dim=40))
    with pytest.raises(letra.GeneError, match="selection='random'.*PRNG key"):
        letra.descend(gene, aux_cfg(width=12, num_heads=3, mlp_dim=24), selection='random')
    with pytest.raises(letra.GeneError, match="selection='slice'"):
        letra.descend(gene, AUX, selection='slice')
    with pytest.raises(letra.GeneError, match=r"'head/bias'.*\(5,\).*head='new'"):
        letra.descend(gene, aux_cfg(num_classes=3))
    with pytest.raises(letra.GeneError, match='cls_token'):
        letra.descend(gene, aux_cfg(pool='cls'))
    with pytest.raises(letra.GeneError, match='pos_embed'):
        letra.descend(gene, aux_cfg(image_size=16))
    with pytest.raises(letra.GeneError, match=r'\(16, 4, 4, 32, 4\).*\(16, 4, 4, 32, 6\)'):
        letra.materialize(gene, None, aux_cfg(depth=6))
    with pytest.raises(letra.GeneError, match="'pos_embed'"):
        letra.materialize(gene, {'pos_embed': gene['pos_embed']}, AUX)
    with pytest.raises(letra.GeneError, match=r"LeTra.*\['learngene'\]"):
        letra.descend({'learngene': gene['learngene']}, AUX)
    with pytest.raises(letra.GeneError, match=r"'q'.*\(1, 8, 8\)"):
        letra.sizes(dict(gene, width=dict(gene['width'], q=gene['width']['q'][:1])))
    with pytest.raises(letra.GeneError, match='depth=5'):
        letra.init_gene(aux_cfg(depth=5), jax.random.key(0))
    with pytest.raises(letra.GeneError, match='learngene depth=3'):
        letra.init_gene(AUX, jax.random.key(0), learngene_depth=3)
    with pytest.raises(letra.GeneError, match='mlp_dim=32.*2/5'):
        letra.init_gene(aux_cfg(width=20, num_heads=5), jax.random.key(0), learngene_heads=2)
    with pytest.raises(letra.GeneError, match='LayerScale'):
        letra.init_gene(aux_cfg(layer_scale=True), jax.random.key(0))


# ----------------------------------------------------------------------------------------
# jit, tracing, options and interop.

class JitTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(('random_wo',))   # traced per-layer row sets
    def test_descend_jit_matches_eager(self, selection):
        gene = perturbed(letra.init_gene(AUX, jax.random.key(1)), seed=2)
        tcfg = aux_cfg(width=12, num_heads=3, mlp_dim=24, depth=3)
        fn = self.variant(lambda g, k: letra.descend(g, tcfg, selection=selection, key=k))
        chex.assert_trees_all_close(fn(gene, jax.random.key(4)),
                                    letra.descend(gene, tcfg, selection=selection, key=jax.random.key(4)),
                                    rtol=1e-6, atol=1e-7)

    def test_materialize_traces_once_for_new_values(self):
        chex.clear_trace_counter()

        @jax.jit
        @chex.assert_max_traces(n=1)
        def aux_forward(gene, x):
            return apply(letra.materialize(gene, None, AUX), x, AUX)[0]

        for seed in range(3):
            aux_forward(letra.init_gene(AUX, jax.random.key(seed)), images(seed=seed))


class TruncatedHeadTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_truncate_takes_the_first_classes_of_the_widened_head(self):
        gene = perturbed(letra.init_gene(AUX, jax.random.key(1)), seed=2)
        whole = aux_cfg(width=12, num_heads=3, mlp_dim=24, depth=2)
        inherited = np_tree(letra.descend(gene, whole))                # 5 classes
        fn = self.variant(lambda g: letra.descend(g, whole.replace(num_classes=3), head='truncate'))
        des = np_tree(fn(gene))
        # the same widening products; under jit XLA may fuse them differently (an ulp apart)
        close = functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-8)
        close(des['head']['kernel'], inherited['head']['kernel'][:, :3])
        close(des['head']['bias'], inherited['head']['bias'][:3])
        chex.assert_trees_all_close({k: v for k, v in des.items() if k != 'head'},
                                    {k: v for k, v in inherited.items() if k != 'head'}, rtol=1e-6, atol=1e-8)
        same = np_tree(letra.descend(gene, whole, head='truncate'))   # all classes: 'inherit'
        chex.assert_trees_all_equal(same, inherited)


def test_truncate_errors(gene):
    with pytest.raises(letra.GeneError, match=r"head='truncate'.*5 classes.*num_classes=7.*head='new'"):
        letra.descend(gene, aux_cfg(num_classes=7), head='truncate')
    headless = dict(gene, learngene={k: v for k, v in gene['learngene'].items() if k != 'head'},
                    width={k: v for k, v in gene['width'].items() if k != 'head'})
    with pytest.raises(letra.GeneError, match=r"head='truncate'.*no head"):
        letra.descend(headless, AUX, head='truncate')
    with pytest.raises(letra.GeneError, match=r"head='cut'.*'truncate'"):
        letra.descend(gene, AUX, head='cut')


def test_head_and_embedding_options_and_timm_export(gene):
    tcfg = aux_cfg(width=12, num_heads=3, mlp_dim=24, depth=2, num_classes=3)
    des = letra.descend(gene, tcfg, head='new', embeddings='random', key=jax.random.key(1))
    assert des['head']['kernel'].shape == (12, 3)
    assert not np.allclose(des['pos_embed'], np.asarray(gene['pos_embed'])[..., :12])
    _, back = interop.from_timm(interop.to_timm(des, tcfg), num_heads=3)
    assert pytree.trees_equal(back, des)


# ----------------------------------------------------------------------------------------
# The official state dict.

def test_official_state_dict_names_shapes_and_round_trip(gene):
    sd = lets.to_lets(gene)
    assert sd['__sm_patch_embed_proj_weight'].shape == (8, 3, 4, 4)      # torch (D, C, p, p)
    assert sd['__sm_1_attn_q_weight'].shape == (8, 8) and sd['__sm_0_mlp_fc1_weight'].shape == (16, 8)
    assert sd['__sm_head_weight'].shape == (5, 8) and sd['__sm_fc_norm_bias'].shape == (8,)
    assert sd['patch_embed.trans_width_emb.trans_weight'].shape == (8, 8)
    assert sd['blocks.1.trans_width_ffn.trans_weight'].shape == (16, 16)
    assert sd['trans_width_cls.trans_weight'].shape == (8, 8)
    assert sd['blocks.2.attn.proj.trans_depth_weight.trans_bias'].shape == (2,)
    assert 'blocks.1.norm1.trans_depth_weight.trans_weight' not in sd    # layers 2k+1 share 2k's
    assert sd['pos_embed'].shape == (1, 4, 16)
    assert len(sd) == 6 + 2 * 16 + 1 + 1 + 2 * 4 + 2 * 8 * 2 + 1
    back = lets.from_lets(sd, head_dim=4)
    assert pytree.trees_equal(back, np_tree(gene))
    again = lets.to_lets(back)
    assert sd.keys() == again.keys() and all(np.array_equal(sd[k], again[k]) for k in sd)
    np.testing.assert_array_equal(sd['__sm_0_attn_q_weight'],
                                  np.asarray(gene['learngene']['blocks']['attn']['q']['kernel'][0]).reshape(8, 8).T)
    np.testing.assert_array_equal(sd['__sm_1_attn_proj_weight'],
                                  np.asarray(gene['learngene']['blocks']['attn']['out']['kernel'][1]).reshape(8, 8).T)
    assert sd['blocks.0.mlp.fc2.trans_depth_weight.trans_weight'].shape == (2,)
    with pytest.raises(StateDictError, match="'extra'"):
        lets.from_lets({**sd, 'extra': np.zeros(1)}, head_dim=4)
    with pytest.raises(StateDictError, match="'__sm_0_norm1_bias'"):
        lets.from_lets({k: v for k, v in sd.items() if k != '__sm_0_norm1_bias'}, head_dim=4)
    with pytest.raises(StateDictError, match=r'Aux layers \[0, 4\]'):
        lets.from_lets({k.replace('blocks.2.', 'blocks.4.'): v for k, v in sd.items()}, head_dim=4)
    with pytest.raises(StateDictError, match=r"trans_width_q.*\(8, 8\), \(8, 4\)"):
        lets.from_lets({**sd, 'blocks.1.trans_width_q.trans_weight': np.zeros((8, 4))}, head_dim=4)
    with pytest.raises(letra.GeneError, match='Q, K, V add 4, 8, 8 rows'):   # names right, sizes not
        lets.from_lets({**sd, **{f'blocks.{j}.trans_width_q.trans_weight': np.zeros((4, 8))
                                 for j in range(2)}}, head_dim=4)
    # without q/k/v biases and head (qkv_bias=False, a headless learngene) it still round-trips
    lean = {k: v for k, v in sd.items() if not re.search(r'attn_[qkv]_bias|__sm_head|trans_width_cls', k)}
    assert lets.to_lets(lets.from_lets(lean, head_dim=4)).keys() == lean.keys()
