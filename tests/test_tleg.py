"""TLEG gene, expansion, Aux-Net materialisation and descendants."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jlearngene import pytree
from jlearngene.genes import tleg
from jlearngene.models import apply, init

from helpers import cfg as aux_cfg, images, perturbed


@pytest.fixture(scope='module')
def fresh_gene():
    return tleg.init_gene(aux_cfg(), jax.random.key(0))


@pytest.fixture(scope='module')
def gene4(fresh_gene):
    """A 'trained' fully expanded gene for the 4-layer aux_cfg()."""
    return perturbed(fresh_gene)


def test_init_gene_structure_and_official_init(fresh_gene):
    cfg = aux_cfg()
    gene = fresh_gene
    assert set(gene) == {'theta_a', 'theta_b', 'shared'}
    assert set(gene['theta_b']) == {'attn', 'mlp', 'norm1', 'norm2'}
    assert 'blocks' not in gene['shared'] and 'prefix' not in gene['shared']
    assert set(gene['shared']) == {'patch_embed', 'pos_embed', 'norm', 'head'}
    # shapes: the canonical block without the layers axis
    want = jax.tree.map(lambda x: x.shape[1:], jax.eval_shape(lambda: init(cfg, jax.random.key(0)))['blocks'])
    assert jax.tree.map(jnp.shape, gene['theta_b']) == want
    a, b = gene['theta_a'], gene['theta_b']
    for path, x in pytree.flatten(jax.device_get(a)).items():
        if path.endswith('kernel'):
            assert 0.01 < float(np.std(x)) < 0.03, path          # trunc-normal 0.02
            assert not np.allclose(x, pytree.flatten(b)[path])    # independent of θ_B
        else:
            assert not np.any(x), path                            # biases, γ_A, β_A = 0
    np.testing.assert_array_equal(b['norm1']['scale'], 1.0)
    np.testing.assert_array_equal(b['norm2']['bias'], 0.0)
    np.testing.assert_array_equal(b['mlp']['fc1']['bias'], 0.0)


def test_expand_formula_and_layer0_is_theta_b(gene4):
    cfg, gene = aux_cfg(), gene4
    params = tleg.expand(gene, 4)
    chex.assert_trees_all_equal_shapes_and_dtypes(params, jax.eval_shape(lambda: init(cfg, jax.random.key(0))))
    for path, x in pytree.flatten(jax.device_get(params['blocks'])).items():
        a = pytree.flatten(gene['theta_a'])[path]
        b = pytree.flatten(gene['theta_b'])[path]
        for l in range(4):
            np.testing.assert_allclose(x[l], np.asarray(b) + np.float32(l / 4) * np.asarray(a), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(x[0], b)
    chex.assert_trees_all_equal(params['pos_embed'], gene['shared']['pos_embed'])


def test_expand_gradient_is_the_coefficient_weighted_sum_over_layers(gene4):
    """The gene's gradient through `expand`: dθ_B = Σ_l G_l, dθ_A = Σ_l (l/L)·G_l."""
    g = jax.tree.map(lambda x: jax.random.normal(jax.random.key(x.size), x.shape),
                     tleg.expand(gene4, 4)['blocks'])
    _, vjp = jax.vjp(lambda gene: tleg.expand(gene, 4)['blocks'], gene4)
    (d_gene,) = jax.jit(vjp)(g)
    c = np.arange(4, dtype=np.float32) / 4
    for path, gl in pytree.flatten(jax.device_get(g)).items():
        np.testing.assert_allclose(pytree.flatten(d_gene['theta_b'])[path], gl.sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pytree.flatten(d_gene['theta_a'])[path],
                                   np.tensordot(c, gl, axes=1), rtol=1e-5, atol=1e-5)


def test_expand_module_choices_table4():
    cfg = aux_cfg()
    for expand, keys in [(('msa',), {'attn'}), (('mlp',), {'mlp'}), (('msa', 'mlp'), {'attn', 'mlp'})]:
        gene = tleg.init_gene(cfg, jax.random.key(0), expand=expand)
        assert set(gene['theta_a']) == keys
        assert tleg.expanded_modules(gene) == expand
        free = gene['shared']['blocks']
        assert set(free) | keys == {'attn', 'mlp', 'norm1', 'norm2'}
        chex.assert_tree_shape_prefix(free, (4,))
        params = tleg.expand(gene, 4)
        pytree.assert_same_structure(params, jax.eval_shape(lambda: init(cfg, jax.random.key(0))))
        chex.assert_trees_all_equal({k: params['blocks'][k] for k in free}, free)
        with pytest.raises(tleg.GeneError, match='depth=4'):
            tleg.expand(gene, 6)


def test_partial_expansion_table6():
    cfg = aux_cfg()
    gene = perturbed(tleg.init_gene(cfg, jax.random.key(0), from_layer=2))
    assert tleg.from_layer_of(gene) == 2
    params = tleg.expand(gene, 4)
    prefix, q = gene['shared']['prefix'], np.asarray(params['blocks']['attn']['q']['kernel'])
    np.testing.assert_array_equal(q[:2], prefix['attn']['q']['kernel'])
    a, b = gene['theta_a']['attn']['q']['kernel'], gene['theta_b']['attn']['q']['kernel']
    for l in range(2, 4):   # absolute layer index in the coefficient
        np.testing.assert_allclose(q[l], np.asarray(b) + np.float32(l / 4) * np.asarray(a), rtol=1e-6, atol=1e-7)
    deeper = tleg.descend(gene, cfg.replace(depth=6))
    np.testing.assert_array_equal(np.asarray(deeper['blocks']['attn']['q']['kernel'])[:2],
                                  prefix['attn']['q']['kernel'])
    with pytest.raises(tleg.GeneError, match='2 layers.*depth=2'):
        tleg.descend(gene, cfg.replace(depth=2))


def test_share_init_gene_gives_identical_layers(gene4):
    gene = {'theta_b': gene4['theta_b'], 'shared': gene4['shared']}
    blocks = tleg.expand(gene, 6)['blocks']
    for x in jax.tree.leaves(jax.device_get(blocks)):
        for l in range(1, 6):
            np.testing.assert_array_equal(x[l], x[0])


@pytest.mark.parametrize('pool_norm', ['before', 'after'])
def test_descendant_at_aux_depth_reproduces_aux_net(pool_norm, gene4):
    cfg, gene = aux_cfg(pool_norm=pool_norm), gene4
    aux_params = tleg.materialize(gene, None, cfg)
    des = tleg.descend(gene, tleg.descendant_config(cfg, cfg.depth))
    assert pytree.trees_equal(des, aux_params)          # bitwise: same blocks, embeddings, head
    x = images(size=16)
    chex.assert_trees_all_close(apply(des, x, cfg)[0], apply(aux_params, x, cfg)[0])


def test_official_pool_order_changes_only_the_pooling(gene4):
    cfg, gene = aux_cfg(), gene4
    des_cfg = tleg.descendant_config(cfg, cfg.depth, official_pool_order=True)
    assert des_cfg.pool_norm == 'after' and des_cfg.ln_eps == 1e-6
    des = tleg.descend(gene, des_cfg)
    aux = tleg.expand(gene, cfg.depth)
    assert pytree.trees_equal(des, aux)
    x = images(size=16)
    same = apply(des, x, des_cfg)[1]['pre_logits']
    assert not np.allclose(same, apply(aux, x, cfg)[1]['pre_logits'], atol=1e-4)


@pytest.mark.parametrize('depth', [1, 2, 6])
def test_descend_any_depth_uses_own_depth(depth, gene4):
    cfg, gene = aux_cfg(), gene4
    tcfg = tleg.descendant_config(cfg, depth, num_classes=3)
    des = tleg.descend(gene, tcfg, head='new', key=jax.random.key(5))
    pytree.assert_same_structure(des, jax.eval_shape(lambda: init(tcfg, jax.random.key(0))))
    fc1 = np.asarray(des['blocks']['mlp']['fc1']['kernel'])
    a, b = gene['theta_a']['mlp']['fc1']['kernel'], gene['theta_b']['mlp']['fc1']['kernel']
    for i in range(depth):
        np.testing.assert_allclose(fc1[i], np.asarray(b) + np.float32(i / depth) * np.asarray(a), rtol=1e-6, atol=1e-7)
    for k in ('patch_embed', 'pos_embed', 'norm'):
        chex.assert_trees_all_equal(des[k], gene['shared'][k])
    assert des['head']['kernel'].shape == (32, 3)
    assert np.all(np.isfinite(apply(des, images(size=16), tcfg)[0]))


def test_descend_non_expanded_modules_random_or_inherited():
    cfg = aux_cfg()
    gene = perturbed(tleg.init_gene(cfg, jax.random.key(0), expand=('msa',)))
    with pytest.raises(tleg.GeneError, match='PRNG key'):
        tleg.descend(gene, cfg.replace(depth=3))
    des = tleg.descend(gene, cfg.replace(depth=3), key=jax.random.key(1))
    np.testing.assert_array_equal(des['blocks']['norm1']['scale'], 1.0)   # fresh init
    same = tleg.descend(gene, cfg, others='inherit')
    assert pytree.trees_equal(same, tleg.expand(gene, cfg.depth))
    with pytest.raises(tleg.GeneError, match="others='inherit'"):
        tleg.descend(gene, cfg.replace(depth=3), others='inherit')


def test_descend_errors(fresh_gene):
    cfg, gene = aux_cfg(), fresh_gene
    with pytest.raises(tleg.GeneError, match=r"attn/k/bias'.*\(2, 16\).*width=64.*\(2, 32\)"):
        tleg.descend(gene, cfg.replace(width=64))
    with pytest.raises(tleg.GeneError, match=r'\(2, 16\).*num_heads=4.*\(4, 8\)'):
        tleg.descend(gene, cfg.replace(num_heads=4))
    with pytest.raises(tleg.GeneError, match='mlp_dim=128'):
        tleg.descend(gene, cfg.replace(mlp_dim=128))
    with pytest.raises(tleg.GeneError, match=r"'head/bias'.*\(10,\).*num_classes=7.*head='new'"):
        tleg.descend(gene, cfg.replace(num_classes=7))
    with pytest.raises(tleg.GeneError, match='needs a PRNG key'):
        tleg.descend(gene, cfg.replace(num_classes=7), head='new')
    with pytest.raises(tleg.GeneError, match='cls_token'):
        tleg.descend(gene, cfg.replace(pool='cls'))
    with pytest.raises(tleg.GeneError, match='pos_embed'):
        tleg.descend(gene, cfg.replace(image_size=32))
    with pytest.raises(tleg.GeneError, match="head='copy'"):
        tleg.descend(gene, cfg, head='copy')
    with pytest.raises(tleg.GeneError, match='depth=0'):
        tleg.expand(gene, 0)
    with pytest.raises(tleg.GeneError, match=r"TLEG.*\['theta_a'\]"):
        tleg.expand({'theta_a': gene['theta_a']}, 3)
    with pytest.raises(tleg.GeneError, match=r"\['attn'\]"):
        tleg.init_gene(cfg, jax.random.key(0), expand=('attn',))
    with pytest.raises(tleg.GeneError, match="'ls'.*layer_scale=False"):
        tleg.init_gene(cfg, jax.random.key(0), expand=('msa', 'ls'))
    with pytest.raises(tleg.GeneError, match='from_layer=4'):
        tleg.init_gene(cfg, jax.random.key(0), from_layer=4)
    with pytest.raises(tleg.GeneError, match="'shared/pos_embed'"):
        tleg.materialize(gene, {'shared': {'pos_embed': gene['shared']['pos_embed']}}, cfg)


def test_layer_scale_expansion_option():
    cfg = aux_cfg(layer_scale=True)
    gene = tleg.init_gene(cfg, jax.random.key(0))
    assert set(gene['shared']['blocks']) == {'ls1', 'ls2'}      # free per layer by default
    gene = tleg.init_gene(cfg, jax.random.key(0), expand=('msa', 'mlp', 'ln', 'ls'))
    np.testing.assert_array_equal(gene['theta_a']['ls1']['scale'], 0.0)
    pytree.assert_same_structure(tleg.descend(gene, cfg.replace(depth=2)),
                                 jax.eval_shape(lambda: init(cfg.replace(depth=2), jax.random.key(0))))


def test_aux_loss_gradients_only_on_gene_and_every_leaf(fresh_gene):
    cfg, gene = aux_cfg(), fresh_gene
    teacher = init(cfg.replace(depth=2), jax.random.key(7))
    x = images(4, size=16)

    def loss(gene, teacher):
        t = jax.lax.stop_gradient(apply(teacher, x, cfg.replace(depth=2))[0])
        s = apply(tleg.materialize(gene, None, cfg), x, cfg)[0]
        return jnp.mean(jnp.sum(jax.nn.softmax(t) * (jax.nn.log_softmax(t) - jax.nn.log_softmax(s)), -1))

    g_gene, g_teacher = jax.jit(jax.grad(loss, argnums=(0, 1)))(gene, teacher)
    chex.assert_trees_all_equal_shapes(g_gene, gene)
    for path, g in pytree.flatten(g_gene).items():
        assert np.abs(np.asarray(g)).max() > 0, f'zero gradient on gene leaf {path}'
    assert all(not np.any(g) for g in jax.tree.leaves(g_teacher))
    # ∂L/∂θ_A = Σ_l (l/L)·g_l and ∂L/∂θ_B = Σ_l g_l for any per-layer cotangent g_l
    rng = np.random.default_rng(0)
    g_p = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32),
                       jax.eval_shape(lambda: tleg.expand(gene, 4)['blocks']))
    _, vjp = jax.vjp(lambda g: tleg.expand(g, 4)['blocks'], gene)
    (g_back,) = vjp(g_p)
    c = np.arange(4) / 4
    chex.assert_trees_all_close(g_back['theta_a'], jax.tree.map(lambda g: np.tensordot(c, g, axes=1), g_p),
                                atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(g_back['theta_b'], jax.tree.map(lambda g: g.sum(0), g_p), atol=1e-5, rtol=1e-5)
    assert all(not np.any(x) for x in jax.tree.leaves(g_back['shared']))


class JitTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_expand_jit_matches(self):
        gene = perturbed(tleg.init_gene(aux_cfg(), jax.random.key(0)), seed=2)
        fn = self.variant(tleg.expand, static_argnums=1)
        chex.assert_trees_all_close(fn(gene, 5), tleg.expand(gene, 5), rtol=1e-6, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_descend_jit_matches(self):
        cfg = aux_cfg()
        gene = perturbed(tleg.init_gene(cfg, jax.random.key(0), expand=('msa', 'mlp')), seed=3)
        tcfg = cfg.replace(depth=6, num_classes=4)
        fn = self.variant(lambda g, k: tleg.descend(g, tcfg, head='new', key=k))
        chex.assert_trees_all_close(fn(gene, jax.random.key(3)),
                                    tleg.descend(gene, tcfg, head='new', key=jax.random.key(3)),
                                    rtol=1e-6, atol=1e-7)

    def test_expand_traces_once_for_new_values(self):
        cfg = aux_cfg()

        @jax.jit
        @chex.assert_max_traces(n=1)
        def aux_forward(gene, x):
            return apply(tleg.expand(gene, cfg.depth), x, cfg)[0]

        for seed in range(3):
            aux_forward(tleg.init_gene(cfg, jax.random.key(seed)), images(seed=seed, size=16))


def test_gene_param_count(fresh_gene):
    gene = fresh_gene
    block = pytree.count_params(gene['theta_b'], groups=None)['total']
    shared = pytree.count_params(gene['shared'], groups=None)['total']
    assert tleg.gene_param_count(gene, include_head=True) == 2 * block + shared
    assert tleg.gene_param_count(gene) == 2 * block + shared - (32 * 10 + 10)
