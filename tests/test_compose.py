"""Chains of methods (`jlearngene.genes.compose`): TLEG depth expansion of LeTra descendants,
Cluster-Learngene head sharing on TLEG descendants, Scala sub-networks of Mango-grown models,
and the gene readers `linear_gene` / `whole_model`."""
import chex
import jax
import numpy as np
import pytest

from jlearngene import genes, pytree
from jlearngene.genes import cluster, compose, scala, tleg
from jlearngene.models import apply, init, vit_config

from helpers import images


AUX = vit_config('Ti', width=16, num_heads=4, mlp_dim=32, depth=4, image_size=8, patch_size=4,
                 num_classes=5, pool='avg')        # LeTra learngene: width 8, 2 heads of 4, 2 layers
SMALL = AUX.replace(width=8, num_heads=2, mlp_dim=16, depth=2)
LARGE = AUX.replace(depth=3)                       # Mango: SMALL -> LARGE (head_dim 4 both)
TOL = dict(rtol=1e-5, atol=1e-5)


def random_like(shapes, seed):
    """Random values of `shapes` (a 'trained' gene or model; nothing is compiled)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: (0.1 * rng.standard_normal(x.shape)).astype(x.dtype), shapes)


def common_shapes(cfg):
    return jax.eval_shape(lambda: init(cfg, jax.random.key(0)))


_logits = jax.jit(lambda params, x, cfg: apply(params, x, cfg)[0], static_argnums=2)


def logits(params, cfg):
    return np.asarray(_logits(params, images(), cfg))


def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def layer(params, l):
    return jax.tree.map(lambda x: np.asarray(x)[l], params['blocks'])


@pytest.fixture(scope='module')
def letra_gene():
    return random_like(genes.get('letra').gene_shapes(AUX), 1)


@pytest.fixture(scope='module')
def tleg_gene():
    return random_like(genes.get('tleg').gene_shapes(AUX), 3)


# ----------------------------------------------------------------------------------------
# The gene readers.

@pytest.mark.parametrize('depth', [3, 5])
def test_linear_gene_recovers_a_tleg_gene_from_its_expansion(tleg_gene, depth):
    cfg = AUX.replace(depth=depth)

    @jax.jit
    def run(gene):
        fitted = compose.linear_gene(tleg.expand(gene, depth), cfg)
        deep = AUX.replace(depth=7)
        return fitted, tleg.descend(fitted, deep), tleg.descend(gene, deep)

    fitted, got, want = run(tleg_gene)
    chex.assert_trees_all_close(fitted, tleg_gene, **TOL)
    # any descendant depth follows: the fitted gene descends like the original
    chex.assert_trees_all_close(got, want, **TOL)


def test_linear_gene_is_a_least_squares_line():
    cfg = AUX.replace(depth=4)
    params = random_like(common_shapes(cfg), 5)
    fit = jax.jit(compose.linear_gene, static_argnums=1)
    line = host(jax.jit(tleg.expand, static_argnums=1)(fit(params, cfg), 4)['blocks'])
    c = np.arange(4) / 4
    for path, w in pytree.flatten(host(params['blocks'])).items():
        residual = w.reshape(4, -1) - pytree.flatten(line)[path].reshape(4, -1)
        # the normal equations: residuals orthogonal to 1 and to l/L
        np.testing.assert_allclose(residual.sum(0), 0, atol=1e-5)
        np.testing.assert_allclose(c @ residual, 0, atol=1e-5)
        assert np.abs(residual).max() > 1e-3      # four random layers are not on a line
    one = fit(layer_model(params, 1), cfg.replace(depth=1))
    chex.assert_trees_all_equal(one['theta_a'], jax.tree.map(np.zeros_like, host(one['theta_a'])))
    chex.assert_trees_all_equal(one['theta_b'], layer(params, 0))


def layer_model(params, n):
    return {**params, 'blocks': jax.tree.map(lambda x: x[:n], params['blocks'])}


def test_whole_model_checks_the_config_and_learned_methods_need_a_reader():
    params = random_like(common_shapes(SMALL), 0)
    assert compose.whole_model(params, SMALL) is params
    with pytest.raises(genes.GeneError, match='depth=3'):
        compose.whole_model(params, SMALL.replace(depth=3))
    with pytest.raises(genes.GeneError, match="'tleg'.*gene_from="):
        compose.step('tleg', SMALL)
    with pytest.raises(genes.GeneError, match=r'\bint\b.*ViTConfig'):
        compose.step('scala', lambda c: c.width, gene_from=compose.whole_model)(params, SMALL)


# ----------------------------------------------------------------------------------------
# Chain 1: TLEG depth expansion of a LeTra width-transformed learngene.

def letra_target(width, depth):
    return AUX.replace(width=width, num_heads=width // 4, mlp_dim=2 * width, depth=depth)


@pytest.mark.parametrize('width,depth', [(12, 8), (8, 2)])
def test_tleg_expansion_of_a_letra_descendant(letra_gene, width, depth):
    """Any width (LeTra rows) and any depth (TLEG's line), deeper than the 4-layer Aux-Net
    too: the TLEG layers at the LeTra pair's coefficients 0 and 1/2 are the two LeTra
    layers, and every layer lies on their line."""
    link = compose.step('tleg', lambda c: c.replace(depth=depth), gene_from=compose.linear_gene)

    built = []

    @jax.jit
    def run(gene):
        two = compose.descendant('letra', gene, letra_target(width, 2))
        params, cfg = compose.chain(two, link)
        built.append(cfg)
        return two[0], params

    two, params = host(run(letra_gene))
    cfg = built[0]
    assert cfg == letra_target(width, depth)
    chex.assert_trees_all_equal_shapes(params, jax.eval_shape(lambda: init(cfg, jax.random.key(0))))
    w0, w1 = layer(two, 0), layer(two, 1)
    assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(w0), jax.tree.leaves(w1))) > 1e-2
    for l in range(depth):
        t = 2 * l / depth                         # TLEG coefficient l/L against the pair's 1/2
        want = jax.tree.map(lambda a, b, t=t: a + t * (b - a), w0, w1)
        chex.assert_trees_all_close(layer(params, l), want, **TOL)
    if depth % 2 == 0:
        chex.assert_trees_all_close(layer(params, depth // 2), w1, **TOL)
    for k in ('patch_embed', 'pos_embed', 'norm', 'head'):
        chex.assert_trees_all_equal(params[k], two[k])
    out = logits(params, cfg)
    assert np.isfinite(out).all()
    if depth == 2:                                # the TLEG descendant is the LeTra one
        np.testing.assert_allclose(out, logits(two, letra_target(width, 2)), **TOL)


# ----------------------------------------------------------------------------------------
# Chain 2: Cluster-Learngene head sharing on a TLEG descendant.

CENTROIDS = ((0, 2), (1,), (3, 0, 1), (2,), (1, 3), (0, 1, 2, 3))
HEADS = (4, 2, 3, 1, 4, 4)


def test_cluster_head_sharing_on_a_tleg_descendant(tleg_gene):
    """Every descendant head slot k of layer l is centroid k mod c_l of the TLEG descendant,
    i.e. θ_B + (l/6)·θ_A at that head; norms are inherited, the head drawn fresh."""
    link = compose.step('cluster', lambda c: cluster.descendant_config(c, HEADS),
                        gene_options={'clusters': CENTROIDS, 'ffn': 'none'},
                        key=jax.random.key(7), heads=HEADS, head='new')

    @jax.jit
    def run(gene):
        model = compose.descendant('tleg', gene, AUX.replace(depth=6))
        return model[0], compose.chain(model, link)[0]

    tleg_params, params = host(run(tleg_gene))
    cfg = cluster.descendant_config(AUX.replace(depth=6), HEADS)
    assert cfg.depth == 6 and cfg.num_heads == 4 and cfg.head_dim == 4
    blocks = params['blocks']                     # list layout: head counts differ
    assert [b['attn']['q']['kernel'].shape[1] for b in blocks] == list(HEADS)
    gene, c = host(tleg_gene), np.asarray(tleg.coefficients(6))
    for l, (cents, h) in enumerate(zip(CENTROIDS, HEADS)):
        idx = np.asarray(cents)[np.arange(h) % len(cents)]
        for n in 'qkv':
            line = gene['theta_b']['attn'][n]['kernel'] + c[l] * gene['theta_a']['attn'][n]['kernel']
            chex.assert_trees_all_close(blocks[l]['attn'][n]['kernel'], line[:, idx], **TOL)
        chex.assert_trees_all_equal(blocks[l]['attn']['out']['kernel'],
                                    tleg_params['blocks']['attn']['out']['kernel'][l][idx])
        chex.assert_trees_all_equal(blocks[l]['norm1'], layer(tleg_params, l)['norm1'])
    assert not np.allclose(params['head']['kernel'], tleg_params['head']['kernel'])
    assert np.isfinite(logits(params, cfg)).all()


def test_cluster_identity_on_a_tleg_descendant_is_that_descendant(tleg_gene):
    link = compose.step('cluster', lambda c: c, head='inherit')
    cfg = AUX.replace(depth=5)
    model, same = jax.jit(lambda g: (lambda m: (m[0], link(*m)[0]))(
        compose.descendant('tleg', g, cfg)))(tleg_gene)
    chex.assert_trees_all_equal(same, model)


# ----------------------------------------------------------------------------------------
# Chain 3: a Scala sub-network of a Mango-grown model.

@pytest.fixture(scope='module')
def grown():
    gene = random_like(genes.get('mango').gene_shapes(SMALL, large_cfg=LARGE, rank=2), 6)
    params = jax.jit(lambda g: compose.descendant('mango', g, LARGE, layer_loop=False)[0])(gene)
    return host(params), LARGE


@pytest.mark.parametrize('ratio', [0.25, 0.5])
def test_scala_subnetwork_of_a_mango_grown_model(grown, ratio):
    """The sub-network is the grown model with the other units zeroed (`masked_apply`), its
    tensors slices of the grown ones (left block at s = 0.25, right block in between)."""
    link = compose.step('scala', lambda c: scala.subnet_config(c, ratio),
                        gene_from=compose.whole_model)
    params = host(jax.jit(lambda p: link(p, LARGE)[0])(grown[0]))
    cfg = scala.subnet_config(LARGE, ratio)
    assert (cfg.width, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.depth) == (
        16 * ratio, 4, 4 * ratio, 32 * ratio, 3)
    chex.assert_trees_all_equal_shapes(params, jax.eval_shape(lambda: init(cfg, jax.random.key(0))))
    masked = jax.jit(lambda p, x: scala.masked_apply(p, x, LARGE, scala.unit_masks(LARGE, ratio))[0])
    chex.assert_trees_all_close(logits(params, cfg), masked(grown[0], images()), **TOL)
    d, dh = cfg.width, cfg.head_dim
    q = grown[0]['blocks']['attn']['q']['kernel']           # (L, D, H, Dh)
    want = q[:, :d, :, :dh] if ratio == 0.25 else q[:, -d:, :, -dh:]
    chex.assert_trees_all_equal(params['blocks']['attn']['q']['kernel'], want)


def test_scala_full_width_of_a_mango_grown_model_is_the_grown_model(grown):
    full = compose.chain(grown, compose.step('scala', lambda c: c, gene_from=compose.whole_model))
    chex.assert_trees_all_equal(host(full[0]), grown[0])


# ----------------------------------------------------------------------------------------
# Longer chains and the README snippet.

def test_three_methods_in_one_chain(letra_gene):
    """LeTra (width 12) -> TLEG (depth 6, deeper than the Aux-Net) -> Cluster (2 heads)."""
    steps = (compose.step('tleg', lambda c: c.replace(depth=6), gene_from=compose.linear_gene),
             compose.step('cluster', lambda c: cluster.descendant_config(c, [2] * 6),
                          gene_options={'clusters': [(0, 2)] * 6, 'ffn': 'none'}, heads=[2] * 6,
                          key=jax.random.key(1)))
    start = letra_target(12, 2)
    params = jax.jit(lambda g: compose.chain(compose.descendant('letra', g, start), *steps)[0])(
        letra_gene)
    cfg = cluster.descendant_config(start.replace(depth=6), [2] * 6)
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.head_dim) == (12, 6, 2, 4)
    assert params['blocks']['attn']['q']['kernel'].shape == (6, 12, 2, 4)
    assert np.isfinite(logits(params, cfg)).all()
