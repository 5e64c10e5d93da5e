"""Diagnostics: linear CKA's invariances, mean attention distance on attention maps with
known answers (and agreement with Cluster-Learngene's streamed definition), the linearity
score on linear and random layer stacks, the plots, and one-line errors for bad inputs."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import ortho_group

from jlearngene import diagnostics as dg
from jlearngene.genes import compose, tleg
from jlearngene.models import init, layout, unstack_blocks, vit_config


CFG = vit_config('Ti', width=16, num_heads=4, mlp_dim=32, depth=8, image_size=8, patch_size=4,
                 num_classes=5)


@pytest.fixture(scope='module')
def model():
    params = jax.jit(init, static_argnums=0)(CFG, jax.random.key(0))
    images = jax.random.normal(jax.random.key(1), (3, 8, 8, 3))
    return params, images


# ----------------------------------------------------------------------------------------- CKA

def test_cka_invariances_and_extremes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 12)) @ rng.standard_normal((12, 12))
    y = np.tanh(x @ rng.standard_normal((12, 9))) + 0.3 * rng.standard_normal((400, 9))
    base = dg.cka(x, y)
    assert 0.1 < base < 0.99
    q = ortho_group.rvs(9, random_state=1)
    assert dg.cka(x, 7.5 * y) == pytest.approx(base, abs=1e-5)          # isotropic scaling
    assert dg.cka(x, y @ q) == pytest.approx(base, abs=1e-5)            # orthogonal transform
    assert dg.cka(x + 3.0, y - 2.0) == pytest.approx(base, abs=1e-5)    # centred first
    assert dg.cka(y, x) == pytest.approx(base, abs=1e-5)                # symmetric
    assert dg.cka(x, x) == pytest.approx(1.0, abs=1e-5)
    # Independent representations, n >> d: about d/n (here 8/4000).
    a, b = rng.standard_normal((4000, 8)), rng.standard_normal((4000, 8))
    assert dg.cka(a, b) < 0.01
    # A non-isotropic scaling changes it: the invariance above is not vacuous.
    assert abs(dg.cka(x, y * np.linspace(0.1, 3, 9)) - base) > 1e-3


def test_cka_matrix_of_a_model_with_itself_and_a_descendant(model):
    params, images = model
    reps = dg.block_representations(params, CFG, images)
    assert reps.shape == (8, 3 * 4, 16)                   # class token dropped: 3 images x 4 patches
    m = dg.cka_matrix(reps, reps)
    assert m.shape == (8, 8)
    np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-5)
    np.testing.assert_allclose(m, m.T, atol=1e-5)
    assert (m > 0).all() and (m <= 1 + 1e-5).all()
    assert m[0, 1] == pytest.approx(dg.cka(reps[0], reps[1]), abs=1e-6)
    # A list of per-layer arrays of other widths (what a narrower descendant gives).
    narrow = [r[:, :8] for r in reps[:2]]
    assert dg.cka_matrix(narrow, reps).shape == (2, 8)
    assert dg.block_representations(params, CFG, images, tokens='all').shape == (8, 3 * 5, 16)


# ------------------------------------------------------------------- mean attention distance

def test_attention_distance_attend_to_self_is_zero_and_to_a_neighbour_one_patch():
    g, p, heads = 3, 4, 2
    eye = np.broadcast_to(np.eye(g * g), (2, heads, g * g, g * g))
    np.testing.assert_allclose(dg.attention_distance(eye, g, p), np.zeros(heads), atol=0)
    # Every patch attends to its right neighbour (the last column to its left one): p pixels.
    right = np.zeros((g * g, g * g))
    for i in range(g * g):
        r, c = divmod(i, g)
        right[i, r * g + (c + 1 if c + 1 < g else c - 1)] = 1.0
    np.testing.assert_allclose(dg.attention_distance(right[None, None], g, p), [p], rtol=1e-6)


def test_attention_distance_uniform_is_the_grids_mean_distance():
    p = 4
    # A 1 x g row of patches (a non-square grid): mean |i - j| over all ordered pairs = (g²-1)/(3g).
    g = 5
    uniform = np.full((1, 1, g, g), 1.0 / g)
    assert dg.attention_distance(uniform, (1, g), p)[0] == pytest.approx(p * (g * g - 1) / (3 * g), rel=1e-6)
    # 2 x 2: 4 pairs at 0, 8 at 1, 4 at √2.
    uniform = np.full((2, 3, 4, 4), 0.25)
    np.testing.assert_allclose(dg.attention_distance(uniform, 2, p), p * (8 + 4 * math.sqrt(2)) / 16,
                               rtol=1e-6)
    # With a class token: its row and column are dropped; rows are renormalised on request.
    t = 1 + 4
    with_cls = np.full((1, 1, t, t), 1.0 / t)
    plain = dg.attention_distance(with_cls, 2, p, n_prefix=1)
    renorm = dg.attention_distance(with_cls, 2, p, n_prefix=1, renormalise=True)
    assert plain[0] == pytest.approx(p * (8 + 4 * math.sqrt(2)) / 16 * 4 / 5, rel=1e-6)
    assert renorm[0] == pytest.approx(p * (8 + 4 * math.sqrt(2)) / 16, rel=1e-6)


def test_mean_attention_distance_streamed_matches_the_captured_maps(model):
    params, images = model
    probs = dg.attention_maps(params, CFG, images)
    assert probs.shape == (8, 3, 4, 5, 5)
    mad = dg.mean_attention_distance(params, CFG, [images], mean=None, std=None)
    assert mad.shape == (8, 4) and (mad > 0).all()
    np.testing.assert_allclose(dg.attention_distance(probs, 2, 4, n_prefix=1), mad, rtol=1e-5)
    # list-layout params with per-layer head counts: one array per layer, same numbers
    blocks = layout.unstack_blocks(params)['blocks']
    blocks[1] = layout.slice_tree({'blocks': [blocks[1]]}, {'heads': 2})['blocks'][0]
    listed = dg.mean_attention_distance(dict(params, blocks=blocks), CFG, [images], mean=None, std=None)
    assert [len(m) for m in listed] == [4, 2] + [4] * 6
    np.testing.assert_allclose(listed[0], mad[0], rtol=1e-5)
    # Per-layer lists (list layout, head counts may differ) give one array per layer.
    per_layer = dg.attention_distance(list(probs), 2, 4, n_prefix=1)
    np.testing.assert_allclose(np.stack(per_layer), mad, rtol=1e-6)


# ------------------------------------------------------------------- layer-position linearity

def test_linearity_score_of_a_tleg_stack_is_one_and_of_random_layers_low(model):
    params, _ = model
    # TLEG's expansion of the line fitted to the model: θ_l = θ_B + (l/L)·θ_A exactly.
    line = tleg.materialize(compose.linear_gene(params, CFG), None, CFG)
    lin = dg.layer_linearity(line, 'mlp/fc1/kernel')
    assert lin['score'] == pytest.approx(1.0, abs=1e-6)
    assert lin['pc1_r2'] == pytest.approx(1.0, abs=1e-6)
    assert lin['explained'][0] == pytest.approx(1.0, abs=1e-6)
    c = lin['coords'][:, 0]                               # evenly spaced, increasing with depth
    np.testing.assert_allclose(np.diff(c), np.diff(c)[0], rtol=1e-4)
    assert np.diff(c)[0] > 0
    # The score is the share of across-layer variance that line explains in the model itself.
    x, fit = dg.layer_matrix(params, 'mlp/fc1/kernel'), dg.layer_matrix(line, 'mlp/fc1/kernel')
    explained = 1 - ((x - fit) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert dg.linearity_score(x) == pytest.approx(explained, abs=1e-5)
    # The model's independently drawn layers, and random stacks: about 1/(L-1), chance level.
    assert dg.layer_linearity(params)['score'] < 0.4
    rng = np.random.default_rng(0)
    scores = [dg.linearity_score(rng.standard_normal((8, 500))) for _ in range(20)]
    assert np.mean(scores) == pytest.approx(1 / 7, abs=0.03)
    assert max(scores) < 0.5
    # A line with noise sits between.
    noisy = np.arange(8)[:, None] * rng.standard_normal((1, 500)) + 1.5 * rng.standard_normal((8, 500))
    assert 0.3 < dg.linearity_score(noisy) < 0.95


def test_layer_matrix_selects_kinds_in_both_layouts(model):
    params, _ = model
    x = dg.layer_matrix(params, ['attn/q/kernel', 'norm1/scale'])
    assert x.shape == (8, 16 * 4 * 4 + 16)
    np.testing.assert_array_equal(x, dg.layer_matrix(unstack_blocks(params), ['attn/q/kernel', 'norm1/scale']))
    np.testing.assert_array_equal(x[1, :256], np.asarray(params['blocks']['attn']['q']['kernel'][1]).ravel())
    coords, explained = dg.layer_pca(x, 2)
    assert coords.shape == (8, 2) and explained.sum() <= 1 + 1e-12


# ----------------------------------------------------------------------------------------- plots

def test_plots_are_written(tmp_path, model):
    params, images = model
    lin = dg.layer_linearity(params, 'mlp/.*/kernel')
    mad = dg.mean_attention_distance(params, CFG, [images], mean=None, std=None)
    reps = dg.block_representations(params, CFG, images)
    figs = {'lin.png': dg.plot_layer_linearity(lin, path=tmp_path / 'lin.png'),
            'mad.png': dg.plot_attention_distance(mad, path=tmp_path / 'mad.png'),
            'mad_list.png': dg.plot_attention_distance([mad[0], mad[1, :2]], path=tmp_path / 'mad_list.png'),
            'cka.png': dg.plot_cka(dg.cka_matrix(reps, reps[:2]), path=tmp_path / 'cka.png')}
    for name, fig in figs.items():
        assert (tmp_path / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', name
        assert fig.axes, name
    assert dg.plot_cka(np.eye(2)).axes                      # no path: the figure only


# ------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize('call, match', [
    (lambda: dg.cka(np.ones((10, 3)) + np.arange(10)[:, None], np.ones((9, 3))),
     r'cka: .*10.*9'),
    (lambda: dg.cka(np.ones((10, 3)), np.random.rand(10, 3)), r'cka: x\b.*constant'),
    (lambda: dg.cka(np.ones(5), np.ones(5)), r'cka: .*\(5,\)'),
    (lambda: dg.cka_matrix([np.random.rand(6, 2)], [np.random.rand(8, 2)]), r'cka_matrix: .*\[6, 8\]'),
    (lambda: dg.attention_distance(np.ones((1, 1, 5, 5)) / 5, 2, 4), r'5 tokens.*2x2.*0 prefix'),
    (lambda: dg.attention_distance(np.ones((1, 4, 4)), 2, 4), r'attention_distance: .*\(1, 4, 4\)'),
    (lambda: dg.attention_distance(np.ones((1, 1, 4, 3)), 2, 4), r'attention_distance: .*\(1, 1, 4, 3\)'),
    (lambda: dg.grid_distances((0, 3), 4), r'grid_distances: .*\(0, 3\)'),
    (lambda: dg.linearity_score(np.ones((1, 5))), r'linearity_score: .*\(1, 5\)'),
    (lambda: dg.linearity_score(np.ones((4, 5))), r'linearity_score: .*identical'),
    (lambda: dg.layer_pca(np.random.rand(3, 5), 4), r'n_components=4.*1\.\.3'),
    (lambda: dg.layer_matrix({'head': {}}), r'layer_matrix: .*blocks'),
    (lambda: dg.plot_cka(np.ones(3)), r'plot_cka: .*\(3,\)'),
])
def test_bad_inputs_give_one_line_errors(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert '\n' not in str(e.value)


def test_layer_matrix_errors_name_the_kinds(model):
    params, _ = model
    with pytest.raises(ValueError, match=r"\['attn/qkv'\]") as e:
        dg.layer_matrix(params, 'attn/qkv')
    assert '\n' not in str(e.value)
    blocks = unstack_blocks(params)['blocks']
    ragged = {'blocks': [blocks[0], {**blocks[1], 'mlp': {'fc1': {'kernel': jnp.zeros((16, 8))}}}]}
    with pytest.raises(ValueError, match='block 1'):
        dg.layer_matrix(ragged, 'mlp/fc1/kernel')


def test_mean_attention_distance_on_grey_images_names_the_default_normalisation():
    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                     channels=1, num_classes=3)
    params = init(cfg, jax.random.key(0))
    grey = np.zeros((2, 8, 8, 1), np.float32)
    with pytest.raises(ValueError, match=r"1 channel\(s\) but mean/std give 3 \(the default is "
                                         r"ImageNet's 3-channel normalisation\); pass your data's mean"):
        dg.mean_attention_distance(params, cfg, [grey])
    assert dg.mean_attention_distance(params, cfg, [grey], mean=(0.5,), std=(0.25,)).shape == (1, 2)
