"""Cluster-Learngene: mean attention distance, head clustering, schedules, descendants (correct
and official forms, FFN expansion φ), the registered method and the experiment's smoke run."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jlearngene import costs, genes, pytree
from jlearngene import diagnostics as dg
from jlearngene.genes import cluster
from jlearngene.interop import timm
from jlearngene.models import apply, init

import helpers
from helpers import perturbed


# The notebook's DeiT-B distances (spec §3.2), which give the published head lists.
DEIT_B_MAD = np.array([
    [120.81, 117.08, 72.93, 109.22, 28.47, 1.39, 118.59, 1.21, 84.95, 6.84, 27.55, 114.17],
    [73.13, 100.13, 109.21, 111.59, 113.48, 103.82, 80.08, 81.12, 98.10, 112.13, 112.46, 48.29],
    [112.72, 101.49, 91.04, 31.15, 103.02, 54.71, 96.93, 20.80, 79.62, 82.83, 99.94, 98.79],
    [24.26, 102.59, 54.87, 15.98, 70.22, 90.46, 64.99, 69.14, 15.33, 43.79, 41.39, 90.17],
    [54.58, 113.64, 19.53, 61.21, 73.57, 63.24, 48.34, 64.85, 85.71, 73.41, 30.98, 18.83],
    [36.59, 89.04, 38.62, 46.24, 50.87, 103.77, 45.90, 95.40, 47.79, 35.32, 126.24, 69.71],
    [57.63, 86.26, 49.73, 35.26, 86.17, 106.91, 53.83, 110.86, 72.50, 65.09, 70.05, 52.21],
    [44.42, 107.15, 79.83, 88.62, 50.02, 106.28, 87.96, 91.96, 109.55, 59.17, 107.69, 25.42],
    [103.00, 111.71, 116.48, 39.97, 92.99, 105.34, 99.86, 63.05, 114.84, 126.73, 92.02, 96.47],
    [123.92, 121.92, 112.40, 118.31, 110.54, 102.40, 122.51, 121.30, 118.80, 120.44, 115.93, 120.69],
    [127.98, 125.99, 122.23, 125.32, 63.27, 124.84, 125.36, 125.48, 126.48, 125.36, 123.72, 124.03],
    [120.85, 125.55, 123.35, 126.16, 122.01, 123.71, 123.47, 122.27, 125.03, 124.09, 124.05, 124.79]])


def ancestor_cfg(**kw):
    """Width 32, 4 heads, 3 layers, 8 px images in 2 px patches, 5 classes, class token."""
    return helpers.cfg(**{'num_heads': 4, 'depth': 3, 'image_size': 8, 'patch_size': 2,
                          'num_classes': 5, 'pool': 'cls', **kw})


@pytest.fixture(scope='module')
def ancestor():
    cfg = ancestor_cfg()
    return perturbed(jax.jit(init, static_argnums=0)(cfg, jax.random.key(0))), cfg


def images(n=3, seed=0, size=8):
    return jax.random.uniform(jax.random.key(seed), (n, size, size, 3))


# ----------------------------------------------------------------------------------------
# Mean attention distance.

def test_attention_distance_matches_a_numpy_loop_streamed_and_masked(ancestor):
    params, cfg = ancestor
    x = np.asarray(images(5))
    mask = np.array([True, True, False])               # the last row is padding
    batches = [x[:2], {'image': np.concatenate([x[2:4], x[:1]]), 'mask': mask}]
    got = dg.mean_attention_distance(params, cfg, batches)
    got_renorm = dg.mean_attention_distance(params, cfg, batches, renormalise=True)
    _, aux = jax.jit(lambda p, im: apply(p, im, cfg, capture=('attn',)))(
        params, dg.normalise(x[:4]))
    attn = np.asarray(aux['attn'], np.float64)[..., 1:, 1:]    # (L, B, H, N, N), class token dropped
    g = cfg.image_size // cfg.patch_size
    want, want_renorm = np.zeros(got.shape), np.zeros(got.shape)
    for l in range(cfg.depth):
        for h in range(cfg.num_heads):
            for b in range(4):
                a = attn[l, b, h]
                r = a / a.sum(1, keepdims=True)
                for i in range(g * g):
                    for j in range(g * g):
                        d = cfg.patch_size * np.hypot(i // g - j // g, i % g - j % g)
                        want[l, h] += a[i, j] * d / (g * g) / 4
                        want_renorm[l, h] += r[i, j] * d / (g * g) / 4
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(got_renorm, want_renorm, rtol=1e-5)
    assert np.all(got_renorm > got)          # dropping the class token's column lost mass
    # The official normalisation bug: every pixel ≈ −mean/std, an almost constant image.
    bug = np.asarray(dg.normalise(x, official=True))
    assert bug.min() > -2.12 and bug.max() < -1.78
    official = dg.mean_attention_distance(params, cfg, [x], official_normalisation=True)
    assert official.shape == got.shape and not np.allclose(official, got, atol=1e-3)
    with pytest.raises(ValueError, match='no images'):
        dg.mean_attention_distance(params, cfg, [])
    with pytest.raises(ValueError, match=r'mean .*std .*\(3\)'):
        dg.normalise(x, (0.5, 0.5), (0.5, 0.5))


# ----------------------------------------------------------------------------------------
# Clustering and schedules.

def test_density_clusters_reproduce_the_official_deit_b_lists():
    clusters = cluster.cluster_heads(DEIT_B_MAD, eps=10, min_heads=1)
    assert cluster.centroid_lists(clusters) == cluster.OFFICIAL_CENTROIDS['B']
    assert [len(c.centroids) for c in clusters] == [5, 3, 4, 6, 5, 4, 4, 4, 4, 1, 2, 1]
    assert clusters[9].members == (tuple(range(12)),)
    # the paper's FFN rule (spec §3.4, the rebuttal): adjacent clustered layers, same count
    assert cluster.ffn_groups([5, 3, 4, 6, 5, 4, 4, 4, 4, 1, 2, 1], heads=12) == ((5, 6, 7, 8),)
    ti = [3, 2, 2, 3, 3, 2, 3, 2, 3, 2, 1, 1]
    assert cluster.ffn_groups(ti, heads=3) == ((1, 2), (10, 11))   # the official Ti groups
    assert cluster.ffn_groups(ti, 'same_count') == ((1, 2), (3, 4), (10, 11))
    assert cluster.ffn_groups([3, 3], 'none') == ()
    assert cluster.ffn_groups([4, 4, 4], heads=4) == ()             # every head its own centroid
    assert cluster.ffn_groups([1, 1, 1], heads=4) == ((0, 1, 2),)   # one centroid per layer
    with pytest.raises(genes.GeneError, match='heads='):
        cluster.ffn_groups(ti)


def test_centroid_ties_priority_order_eps_zero_noise_and_kmeans():
    # Clusters {0, 1} (tie: the lower head, even where float rounding splits it), {2, 3, 4}.
    d = np.array([[0.1, 0.3, 50.0, 51.0, 52.0, 100.0]])
    (c,) = cluster.cluster_heads(d, eps=2.5, min_heads=1)
    assert c.members == ((2, 3, 4), (0, 1), (5,)) and c.centroids == (3, 0, 5)
    # equal sizes keep DBSCAN's label order (each cluster's first head)
    (c,) = cluster.cluster_heads(np.array([[50.0, 1.0, 51.0, 2.0]]), eps=2.0)
    assert c.members == ((0, 2), (1, 3)) and c.centroids == (0, 1)
    # eps = 0 keeps every head (only equal distances join)
    (c,) = cluster.cluster_heads(np.array([[3.0, 1.0, 2.0, 1.0]]), eps=0)
    assert c.members == ((1, 3), (0,), (2,))
    (c,) = cluster.cluster_heads(np.array([[3.0, 1.0, 2.0, 4.0]]), eps=0)
    assert c.centroids == (0, 1, 2, 3)
    # MinHds > 1: DBSCAN's noise heads belong to no cluster
    (c,) = cluster.cluster_heads(np.array([[1.0, 1.5, 2.0, 40.0]]), eps=1.0, min_heads=2)
    assert c.members == ((0, 1, 2),)
    with pytest.raises(ValueError, match=r'layer 0 .*eps=1\.0'):
        cluster.cluster_heads(np.array([[1.0, 10.0]]), eps=1.0, min_heads=2)
    km = cluster.cluster_heads(DEIT_B_MAD, algorithm='kmeans', num_clusters=3)
    assert all(len(c.centroids) == 3 and sorted(h for m in c.members for h in m) == list(range(12))
               for c in km)
    assert all(c.centroids[i] in c.members[i] for c in km for i in range(3))
    for bad in (dict(eps=-1), dict(min_heads=0), dict(algorithm='optics'),
                dict(algorithm='kmeans'), dict(algorithm='kmeans', num_clusters=13)):
        with pytest.raises(ValueError):
            cluster.cluster_heads(DEIT_B_MAD, **bad)


def test_random_centroids_keep_the_counts_and_so_the_ffn_groups():
    clusters = cluster.cluster_heads(DEIT_B_MAD, eps=10, min_heads=1)
    rand = cluster.random_centroids(clusters, 12, seed=0)
    assert [len(c) for c in rand] == [len(c.centroids) for c in clusters]
    assert all(len(set(c)) == len(c) and 0 <= min(c) and max(c) < 12 for c in rand)
    assert rand == cluster.random_centroids(clusters, 12, seed=0)
    assert rand != cluster.random_centroids(clusters, 12, seed=1)
    assert rand != cluster.OFFICIAL_CENTROIDS['B']


def test_head_schedules():
    assert cluster.head_schedule(12, 3, omega=2) == (6, 6, 6)
    assert cluster.head_schedule(12, 2, omega=1.5) == (8, 8)
    assert cluster.head_schedule(8, 2, omega=0.5) == (16, 16)
    assert cluster.head_schedule(12, 12, omega='decrementing') == (6,) * 4 + (8,) * 4 + (12,) * 4
    assert cluster.head_schedule(12, 12, omega='incrementing') == (12,) * 4 + (8,) * 4 + (6,) * 4
    # by absolute layer index of the ancestor's thirds (a 6-layer descendant of 12 layers)
    assert cluster.head_schedule(12, 6, omega='decrementing', ancestor_depth=12) == (6,) * 4 + (8,) * 2
    assert cluster.head_schedule(4, 3, omega=[1, 2, 4]) == (4, 2, 1)
    assert cluster.head_schedule(4, 2, heads=[3, 5]) == (3, 5)
    for kw, msg in [(dict(omega=100), 'omega=100'), (dict(omega=-1), 'omega=-1'),
                    (dict(omega='halving'), "omega='halving'"), (dict(omega=[1, 2]), r'omega=\[1, 2\]'),
                    (dict(heads=[1, 2]), r'heads=\[1, 2\]'), ({}, 'heads=.*omega='),
                    (dict(heads=[1, 1, 1], omega=1), 'heads=.*omega=')]:
        with pytest.raises(genes.GeneError, match=msg):
            cluster.head_schedule(4, 3, **kw)


# ----------------------------------------------------------------------------------------
# Descendants.

def _np(tree):
    return jax.tree.map(np.asarray, tree)


def test_eps_zero_at_omega_one_is_the_ancestor_under_the_defaults(ancestor):
    params, cfg = ancestor
    distances = np.arange(cfg.depth * cfg.num_heads, dtype=float).reshape(cfg.depth, -1) * 7.0
    gene = cluster.gene_from_model(params, cfg, distances=distances, eps=0)
    assert cluster.gene_groups(gene) == ()          # no head clustered: no FFN clustered
    heads = cluster.head_schedule(cfg.num_heads, cfg.depth, omega=1)
    des = jax.jit(lambda g: cluster.descend(g, cfg, heads=heads))(gene)
    assert pytree.trees_equal(des, params)
    identity = jax.jit(lambda p: cluster.descend(cluster.gene_from_model(p, cfg), cfg))(params)
    assert pytree.trees_equal(identity, params)
    # the grouping of every equal-count run ('same_count') with the identity φ still starts
    # each grouped layer as its representative FFN; the official φ does not
    same = cluster.gene_from_model(params, cfg, distances=distances, eps=0, ffn='same_count')
    assert cluster.gene_groups(same) == ((0, 1, 2),)
    kept = cluster.descend(same, cfg)
    for t in range(cfg.depth):
        chex.assert_trees_all_equal(jax.tree.map(lambda x, t=t: x[t], kept['blocks']['mlp']),
                                    jax.tree.map(lambda x: x[0], params['blocks']['mlp']))
    official = cluster.descend(same, cfg, phi='official', key=jax.random.key(0))
    assert not np.allclose(official['blocks']['mlp']['fc1']['kernel'][0],
                           params['blocks']['mlp']['fc1']['kernel'][0], atol=1e-3)


def test_priority_weight_sharing_takes_true_heads_and_their_out_rows(ancestor):
    params, cfg = ancestor
    cents = ((2, 0), (1, 3, 0), (3,))
    heads = (5, 2, 3)
    tcfg = cluster.descendant_config(cfg, heads, num_classes=7)
    gene = cluster.gene_from_model(params, cfg, clusters=cents, ffn='none')
    assert cluster.centroid_counts(gene) == (2, 3, 1) and cluster.gene_groups(gene) == ()
    des = jax.jit(lambda g, k: cluster.descend(g, tcfg, key=k, heads=heads, head='new'))(
        gene, jax.random.key(1))
    assert isinstance(des['blocks'], list) and des['head']['kernel'].shape == (32, 7)
    anc = _np(params['blocks'])
    for l, (c, h) in enumerate(zip(cents, heads)):
        slot = [c[k % len(c)] for k in range(h)]   # ⌊h/c⌋ copies each, the rest by priority
        b = _np(des['blocks'][l])
        for n in 'qkv':
            np.testing.assert_array_equal(b['attn'][n]['kernel'], anc['attn'][n]['kernel'][l][:, slot])
            np.testing.assert_array_equal(b['attn'][n]['bias'], anc['attn'][n]['bias'][l][slot])
        np.testing.assert_array_equal(b['attn']['out']['kernel'], anc['attn']['out']['kernel'][l][slot])
        for k in ('norm1', 'norm2', 'mlp'):
            chex.assert_trees_all_equal(b[k], jax.tree.map(lambda x, l=l: x[l], anc[k]))
    for k in ('patch_embed', 'pos_embed', 'cls_token', 'norm'):
        chex.assert_trees_all_equal(des[k], params[k])
    d, dh = cfg.width, cfg.head_dim      # T-Params follow each layer's head count
    per_head = 4 * d * dh + 3 * dh
    fixed = costs.param_count(tcfg) - tcfg.depth * tcfg.num_heads * per_head
    assert costs.param_count(des) == fixed + sum(heads) * per_head
    assert np.all(np.isfinite(jax.jit(lambda p: apply(p, images(), tcfg)[0])(des)))


def _official_reference(params, cfg, l, cents, h):
    """The official construction in timm's orientation, with numpy: qkv.weight (3D, D)
    viewed as (H, 3·Dh, D) row chunks, gathered and read back as (q|k|v, head, dim)."""
    a = _np(params['blocks']['attn'])
    d, dh, h_a = cfg.width, cfg.head_dim, cfg.num_heads
    w = np.concatenate([a[n]['kernel'][l].reshape(d, h_a * dh).T for n in 'qkv'])   # (3D, D)
    chunks = w.reshape(h_a, 3 * dh, d)
    w_d = chunks[[cents[k % len(cents)] for k in range(h)]].reshape(3, h, dh, d)
    qkv = {n: w_d[i].transpose(2, 0, 1) for i, n in enumerate('qkv')}           # (D, h, Dh)
    proj = a['out']['kernel'][l].reshape(h_a * dh, d)                               # W_Oᵀ
    if h <= h_a:
        out = proj[:h * dh]
    else:
        out = np.repeat(proj, h // h_a, axis=0)       # torch repeat_interleave of W_O's columns
    return qkv, out.reshape(h, dh, d)


def test_official_indexing_row_chunks_no_bias_first_columns(ancestor):
    params, cfg = ancestor
    cents = ((2, 0), (1, 3, 0), (3,))
    heads = (2, 8, 3)
    tcfg = cluster.descendant_config(cfg, heads, official=True)
    gene = cluster.gene_from_model(params, cfg, clusters=cents, ffn='none', official=True)
    assert cluster.is_official(gene)
    des = jax.jit(lambda g: cluster.descend(g, tcfg, key=jax.random.key(1), heads=heads))(gene)
    for l, h in enumerate(heads):
        qkv, out = _official_reference(params, cfg, l, cents[l], h)
        b = _np(des['blocks'][l]['attn'])
        for n in 'qkv':
            assert set(b[n]) == {'kernel'}
            np.testing.assert_array_equal(b[n]['kernel'], qkv[n])
        np.testing.assert_array_equal(b['out']['kernel'], out)
    # the official rows differ from the true heads' (roles mixed across q/k/v)
    correct_gene = cluster.gene_from_model(params, cfg, clusters=cents, ffn='none')
    correct = jax.jit(lambda g: cluster.descend(g, cluster.descendant_config(cfg, heads),
                                                key=jax.random.key(1), heads=heads))(correct_gene)
    assert not np.allclose(correct['blocks'][0]['attn']['q']['kernel'], des['blocks'][0]['attn']['q']['kernel'])
    with pytest.raises(genes.GeneError, match='qkv_bias=False'):
        cluster.descend(gene, cluster.descendant_config(cfg, heads), key=jax.random.key(1), heads=heads)
    with pytest.raises(genes.GeneError, match='multiple of 4'):
        cluster.descend(gene, cluster.descendant_config(cfg, (6, 6, 6), official=True),
                        key=jax.random.key(1), heads=(6, 6, 6))


class DescendantJitTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_ffn_groups_phi_jit_and_trainable(self):
        cfg = ancestor_cfg()
        params = perturbed(init(cfg, jax.random.key(0)))
        cents = ((0, 1), (2, 3), (3,))      # counts 2, 2, 1: the paper groups layers {0, 1}
        gene = cluster.gene_from_model(params, cfg, clusters=cents)
        assert cluster.gene_groups(gene) == ((0, 1),) and 'mlp' not in gene['blocks'][1]
        tcfg = cluster.descendant_config(cfg, (4, 4, 4), num_classes=2)
        opts = dict(heads=(4, 4, 4), head='new', phi='official')
        fn = self.variant(lambda g, k: cluster.descend(g, tcfg, key=k, **opts))
        des = fn(gene, jax.random.key(2))
        eager = cluster.descend(gene, tcfg, key=jax.random.key(2), **opts)
        chex.assert_trees_all_close(des, eager, rtol=1e-6, atol=1e-7)
        chex.assert_trees_all_equal_shapes_and_dtypes(des, jax.eval_shape(lambda: init(tcfg, jax.random.key(0))))
        state = cluster.descendant_state(gene, tcfg, key=jax.random.key(2), **opts)
        phi = _np(state['ffn_groups'][0]['phi'])
        assert phi['fc2']['kernel'].shape == (2, 2)
        assert np.abs(phi['fc1']['kernel']).max() <= 1 and np.abs(phi['fc2']['bias']).max() <= 2 ** -0.5
        rep = _np(params['blocks']['mlp']['fc1']['kernel'][0])
        for t in range(2):     # φ(w)_t = Σ_j W₂[j, t]·ReLU(W₁[j]·w + b₁[j]) + b₂[t], per scalar
            want = (np.maximum(rep[..., None] * phi['fc1']['kernel'] + phi['fc1']['bias'], 0)
                    @ phi['fc2']['kernel'][:, t] + phi['fc2']['bias'][t])
            np.testing.assert_allclose(des['blocks']['mlp']['fc1']['kernel'][t], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(des['blocks']['mlp']['fc2']['bias'][2], params['blocks']['mlp']['fc2']['bias'][2])
        # trainable φ: the representative FFN and φ get the gradient through the generated FFNs
        x, y = images(2), jnp.array([0, 1])

        def loss(s):
            logits, _ = apply(cluster.materialize_descendant(s), x, tcfg)
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(2), y])
        g = jax.jit(jax.grad(loss))(state)
        assert all(np.abs(np.asarray(v)).max() > 0 for v in jax.tree.leaves(g['ffn_groups']))
        assert 'mlp' not in state['params']['blocks'][0] and 'mlp' in state['params']['blocks'][2]
        # the default φ is the identity on every output, and trains as well
        ident = cluster.descendant_state(gene, tcfg, key=jax.random.key(2), heads=(4, 4, 4),
                                         head='new')
        start = self.variant(cluster.materialize_descendant)(ident)
        for t in range(2):
            chex.assert_trees_all_equal(jax.tree.map(lambda x, t=t: x[t], start['blocks']['mlp']),
                                        jax.tree.map(lambda x: x[0], params['blocks']['mlp']))
        g = jax.jit(jax.grad(loss))(ident)
        assert all(np.abs(np.asarray(v)).max() > 0 for v in jax.tree.leaves(g['ffn_groups']))


def test_deeper_targets_registered_method_and_timm_export(ancestor):
    params, cfg = ancestor
    m = genes.get('cluster')
    assert m is cluster.METHOD and m.source == 'model' and 'cluster' in genes.names()
    gene = m.gene_from_model(params, cfg, distances=np.tile([1.0, 1.2, 9.0, 30.0], (3, 1)), eps=1.0)
    assert cluster.centroid_counts(gene) == (3, 3, 3) and cluster.gene_groups(gene) == ((0, 1, 2),)
    chex.assert_trees_all_equal_shapes_and_dtypes(m.gene_shapes(cfg), m.gene_from_model(params, cfg))
    assert m.gene_param_count(gene, include_head=True) - m.gene_param_count(gene) == 32 * 5 + 5
    deeper = jax.jit(lambda g, k: m.descend(g, cfg.replace(depth=5), key=k))(
        gene, jax.random.key(3))                                                # layers 3, 4 fresh
    np.testing.assert_array_equal(deeper['blocks']['norm1']['scale'][3:], 1.0)
    # ancestors from timm, descendants back to timm where the shapes allow (H·Dh = width)
    _, from_timm = timm.from_timm(timm.to_timm(params, cfg), num_heads=cfg.num_heads)
    ti_gene = cluster.gene_from_model(from_timm, cfg, clusters=cluster.OFFICIAL_CENTROIDS['Ti'][:3])
    des = jax.jit(lambda g, k: cluster.descend(g, cfg, key=k))(ti_gene, jax.random.key(0))
    sd = timm.to_timm(des, cfg)
    assert sd['blocks.0.attn.qkv.weight'].shape == (3 * 32, 32)


def test_errors_name_the_problem(ancestor):
    params, cfg = ancestor
    gene = cluster.gene_from_model(params, cfg, clusters=((0,), (1,), (2,)), ffn='none')
    tcfg = cluster.descendant_config(cfg, (2, 2, 2))
    cases = [
        (lambda: cluster.descend(gene, tcfg, heads=(2, 3, 2), key=jax.random.key(0)),
         'layer 1 .*3.*num_heads=2'),
        (lambda: cluster.descend(gene, tcfg, heads=(2, 2), key=jax.random.key(0)),
         r'heads=\(2, 2\)'),
        (lambda: cluster.descend(gene, ancestor_cfg(width=64, num_heads=2), key=jax.random.key(0)),
         r"blocks/0/attn/k/bias.*\(2, 8\).*width=64.*\(2, 32\)"),
        (lambda: cluster.descend(gene, tcfg.replace(mlp_dim=16), key=jax.random.key(0)),
         'mlp_dim=16'),
        (lambda: cluster.descend(gene, tcfg.replace(depth=4)), 'PRNG key'),
        (lambda: cluster.descend(gene, tcfg, head='new'), 'PRNG key'),
        (lambda: cluster.descend(gene, tcfg, phi='random'), "phi='random'"),
        (lambda: cluster.descend({'blocks': {}}, tcfg), 'Cluster-Learngene'),
        (lambda: cluster.gene_from_model(params, cfg.replace(num_heads=2)), 'num_heads=2'),
        (lambda: cluster.gene_from_model(params, cfg, clusters=((0,), (1,))), '2 layers.*depth 3'),
        (lambda: cluster.gene_from_model(params, cfg, clusters=((0,), (4,), (1,))),
         r'layer 1 centroids \[4\]'),
        (lambda: cluster.gene_from_model(params, cfg, distances=np.zeros((3, 2))), r'\(3, 4\)'),
        (lambda: cluster.gene_from_model(params, cfg, clusters=((0,),) * 3, ffn=[(0, 2)]),
         r'ffn groups \(\(0, 2\),\)'),
    ]
    for fn, msg in cases:
        with pytest.raises(genes.GeneError, match=msg):
            fn()
