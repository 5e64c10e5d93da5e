"""big_vision / original ViT (AugReg) checkpoints <-> canonical tree: parity of logits with an
independent numpy forward of big_vision's ViT, bit-exact round trips, one error for every problem.

The checkpoints are built here from the published key names and shapes (no downloads).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from jlearngene import genes, pytree
from jlearngene.interop import big_vision as BV
from jlearngene.interop import timm as T
from jlearngene.interop.state_dict import StateDictError
from jlearngene.models import ConfigError, apply, init, unstack_blocks, vit_config

WIDTH, HEADS, MLP, DEPTH, PATCH, IMAGE, CHANS, CLASSES = 16, 2, 32, 2, 4, 8, 3, 5

# Module names inside an encoder block, as the released files spell them.
BLOCK_NAMES = {
    'vit': ('LayerNorm_0', 'MultiHeadDotProductAttention_1', 'LayerNorm_2', 'MlpBlock_3'),
    'big_vision': ('LayerNorm_0', 'MultiHeadDotProductAttention_0', 'LayerNorm_1', 'MlpBlock_0'),
    'big_vision_scan': ('LayerNorm_0', 'MultiHeadDotProductAttention_0', 'LayerNorm_1', 'MlpBlock_0'),
}


def checkpoint(layout, pool='tok', *, classes=CLASSES, rep=0, seed=0):
    """A random flat checkpoint of big_vision's / vit_jax's ViT with the published keys."""
    rng = np.random.default_rng(seed)

    def r(*shape, scale=0.3, offset=0.0):
        return (offset + scale * rng.standard_normal(shape)).astype(np.float32)

    d, dh, n = WIDTH, WIDTH // HEADS, (IMAGE // PATCH) ** 2
    ck = {'embedding/kernel': r(PATCH, PATCH, CHANS, d), 'embedding/bias': r(d)}
    if pool == 'tok':
        ck['cls'] = r(1, 1, d)
    if layout == 'vit':
        ck['Transformer/posembed_input/pos_embedding'] = r(1, n + (pool == 'tok'), d)
    else:
        ck['pos_embedding'] = r(1, n, d)
    ln1, mha, ln2, mlp = BLOCK_NAMES[layout]
    scan = layout == 'big_vision_scan'
    lead = (DEPTH,) if scan else ()
    for i in ([None] if scan else range(DEPTH)):
        b = 'Transformer/encoderblock/' if scan else f'Transformer/encoderblock_{i}/'
        for ln in (ln1, ln2):
            ck[f'{b}{ln}/scale'] = r(*lead, d, scale=0.1, offset=1.0)
            ck[f'{b}{ln}/bias'] = r(*lead, d, scale=0.1)
        for name in ('query', 'key', 'value'):
            ck[f'{b}{mha}/{name}/kernel'] = r(*lead, d, HEADS, dh)
            ck[f'{b}{mha}/{name}/bias'] = r(*lead, HEADS, dh, scale=0.1)
        ck[f'{b}{mha}/out/kernel'] = r(*lead, HEADS, dh, d)
        ck[f'{b}{mha}/out/bias'] = r(*lead, d, scale=0.1)
        ck[f'{b}{mlp}/Dense_0/kernel'] = r(*lead, d, MLP)
        ck[f'{b}{mlp}/Dense_0/bias'] = r(*lead, MLP, scale=0.1)
        ck[f'{b}{mlp}/Dense_1/kernel'] = r(*lead, MLP, d)
        ck[f'{b}{mlp}/Dense_1/bias'] = r(*lead, d, scale=0.1)
    ck['Transformer/encoder_norm/scale'] = r(d, scale=0.1, offset=1.0)
    ck['Transformer/encoder_norm/bias'] = r(d, scale=0.1)
    if rep:
        ck['pre_logits/kernel'] = r(d, rep)
        ck['pre_logits/bias'] = r(rep, scale=0.1)
    if classes:
        ck['head/kernel'] = r(rep or d, classes)
        ck['head/bias'] = r(classes, scale=0.1)
    return ck


# ----------------------------------------------------------------------------------------
# An independent numpy (float64) forward pass written from big_vision's `models/vit.py`
# and vit_jax's `models_vit.py` (Flax LayerNorm eps 1e-6, nn.gelu = tanh approximation,
# MultiHeadDotProductAttention with query scaled by 1/sqrt(head_dim)).

def _ln(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * p['scale'] + p['bias']


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def reference_forward(ck, images, layout):
    t = jax.tree.map(lambda a: np.asarray(a, np.float64), traverse_util.unflatten_dict(ck, sep='/'))
    x = np.asarray(images, np.float64)
    b, h, w, c = x.shape
    p = t['embedding']['kernel'].shape[0]
    patches = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = np.einsum('bhwijc,ijcd->bhwd', patches, t['embedding']['kernel']) + t['embedding']['bias']
    x = x.reshape(b, (h // p) * (w // p), -1)
    cls = [np.tile(t['cls'], (b, 1, 1))] if 'cls' in t else []
    if layout == 'vit':   # class token first, then the position embedding (with its row)
        x = np.concatenate(cls + [x], axis=1) + t['Transformer']['posembed_input']['pos_embedding']
    else:                 # position embedding first, then the class token
        x = np.concatenate(cls + [x + t['pos_embedding']], axis=1)
    tr = t['Transformer']
    if layout == 'big_vision_scan':
        blocks = [jax.tree.map(lambda a, i=i: a[i], tr['encoderblock']) for i in range(DEPTH)]
    else:
        blocks = [tr[f'encoderblock_{i}'] for i in range(DEPTH)]
    ln1, mha, ln2, mlp = BLOCK_NAMES[layout]
    for blk in blocks:
        y = _ln(x, blk[ln1])
        a = blk[mha]
        q, k, v = (np.einsum('btd,dhk->bthk', y, a[n]['kernel']) + a[n]['bias']
                   for n in ('query', 'key', 'value'))
        q = q / np.sqrt(q.shape[-1])
        logits = np.einsum('bqhk,bthk->bhqt', q, k)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        o = np.einsum('bhqt,bthk->bqhk', probs, v)
        x = x + np.einsum('bqhk,hkd->bqd', o, a['out']['kernel']) + a['out']['bias']
        y = _ln(x, blk[ln2])
        hid = _gelu_tanh(y @ blk[mlp]['Dense_0']['kernel'] + blk[mlp]['Dense_0']['bias'])
        x = x + hid @ blk[mlp]['Dense_1']['kernel'] + blk[mlp]['Dense_1']['bias']
    x = _ln(x, tr['encoder_norm'])
    out = {'head_input': x[:, 0] if 'cls' in t else x.mean(axis=1)}   # 'tok' / 'gap'
    pre = out['head_input']
    if 'pre_logits' in t:
        pre = np.tanh(pre @ t['pre_logits']['kernel'] + t['pre_logits']['bias'])
    out['pre_logits'] = pre
    if 'head' in t:
        out['logits'] = pre @ t['head']['kernel'] + t['head']['bias']
    return out


apply_jit = jax.jit(apply, static_argnums=2)


def images(n=3, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (n, IMAGE, IMAGE, CHANS)).astype(np.float32)


# ----------------------------------------------------------------------------------------
# Parity.

@pytest.mark.parametrize('layout,pool,rep', [('vit', 'tok', 12), ('big_vision', 'tok', 0),
                                             ('big_vision_scan', 'gap', 24), ('vit', 'gap', 0)])
def test_parity_of_logits_and_pre_logits_with_numpy_big_vision(layout, pool, rep):
    ck = checkpoint(layout, pool, rep=rep)
    assert BV.detect_layout(ck) == layout
    params, cfg = BV.from_big_vision(ck)
    shape = (cfg.width, cfg.depth, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.patch_size, cfg.image_size,
             cfg.channels, cfg.num_classes, cfg.representation_size)
    assert shape == (WIDTH, DEPTH, HEADS, WIDTH // HEADS, MLP, PATCH, IMAGE, CHANS, CLASSES, rep or None)
    assert ('pre_logits' in params) == bool(rep)
    pooling = ('cls', True) if pool == 'tok' else ('avg', False)
    assert (cfg.pool, cfg.class_token, cfg.gelu, cfg.ln_eps) == pooling + ('tanh', 1e-6)
    x = images()
    logits, aux = apply_jit(params, jnp.asarray(x), cfg)
    want = reference_forward(ck, x, layout)
    assert np.abs(want['logits']).max() > 0.5   # a non-trivial function
    np.testing.assert_allclose(np.asarray(logits), want['logits'], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(aux['pre_logits']), want['pre_logits'], atol=1e-5, rtol=0)
    assert want['pre_logits'].shape == (3, rep or WIDTH)
    if rep:   # the tanh layer matters: without it the head input differs
        assert np.abs(want['pre_logits'] - np.tanh(want['head_input'] @ ck['pre_logits/kernel'])).max() > 1e-3
        assert np.abs(want['pre_logits']).max() < 1


def test_pre_logits_mismatches_are_named_and_the_backbone_loads_without_it():
    ck = checkpoint('vit', 'tok', rep=12)
    cfg = BV.infer_config(ck)
    assert cfg.representation_size == 12
    with pytest.raises(StateDictError) as e:
        BV.from_big_vision(ck, cfg.replace(representation_size=None))
    msg = str(e.value)
    assert 'unexpected keys (2): pre_logits/bias, pre_logits/kernel' in msg
    assert 'head/kernel: shape (12, 5), expected (16, 5)' in msg
    assert 'pre_logits/kernel of shape (16, 12)' in msg and 'representation_size=None' in msg
    with pytest.raises(StateDictError, match=r'(?s)missing keys \(2\): pre_logits/kernel, pre_logits/bias.*'
                                             r'representation_size=16'):
        BV.from_big_vision(checkpoint('vit', 'tok', rep=0), cfg.replace(representation_size=16))
    bad = dict(ck, **{'pre_logits/kernel': ck['pre_logits/kernel'][0]})
    with pytest.raises(StateDictError, match=r'pre_logits/kernel.*\(12,\).*\(D, R\)'):
        BV.from_big_vision(bad)
    backbone = {k: v for k, v in ck.items() if not k.startswith(('pre_logits/', 'head/'))}
    params, cfg = BV.from_big_vision(backbone)
    assert cfg.num_classes == 0 and 'head' not in params
    # A new head on the backbone (the fine-tuning set-up); its pre-logits are the pooled tokens.
    params['head'] = {'kernel': jnp.ones((WIDTH, CLASSES)), 'bias': jnp.zeros(CLASSES)}
    x = images()
    _, aux = apply_jit(params, jnp.asarray(x), cfg.replace(num_classes=CLASSES))
    want = reference_forward(ck, x, 'vit')
    assert want['pre_logits'].shape == (3, 12)
    np.testing.assert_allclose(np.asarray(aux['pre_logits']), want['head_input'], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# Round trips.

def assert_checkpoints_identical(a, b):
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32 and a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize('layout', BV.LAYOUTS)
@pytest.mark.parametrize('pool,rep', [('tok', 0), ('gap', 0), ('tok', 12)])
def test_round_trip_checkpoint_canonical_checkpoint_is_bit_exact(layout, pool, rep):
    ck = checkpoint(layout, pool, rep=rep, seed=3)
    params, cfg = BV.from_big_vision(ck)
    assert cfg.representation_size == (rep or None)
    back = BV.to_big_vision(params, cfg, layout=layout)
    assert sorted(back) == sorted(ck)
    assert_checkpoints_identical({k: ck[k] for k in back}, back)
    assert list(back) == list(BV.big_vision_shapes(cfg, layout))


def test_nested_float16_and_list_layout_inputs():
    ck = checkpoint('big_vision_scan', 'tok')
    nested = traverse_util.unflatten_dict({k: v.astype(np.float16) for k, v in ck.items()}, sep='/')
    params, cfg = BV.from_big_vision(nested)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    back = BV.to_big_vision(unstack_blocks(params), cfg, layout='big_vision_scan')
    assert_checkpoints_identical({k: ck[k].astype(np.float16).astype(np.float32) for k in back}, back)
    assert BV.to_big_vision(params, cfg, layout='vit', dtype=np.float16)['cls'].dtype == np.float16


def test_canonical_round_trips_and_class_token_row_folding():
    params, cfg = BV.from_big_vision(checkpoint('vit', 'tok', seed=5))
    params = jax.device_get(params)
    assert np.all(params['pos_embed'][:, 0] != 0)
    # The original ViT layout keeps the class-token row of the position embedding.
    again, cfg2 = BV.from_big_vision(BV.to_big_vision(params, cfg, layout='vit'), cfg)
    assert cfg2 == cfg and pytree.trees_equal(params, jax.device_get(again))
    # big_vision adds pos_embedding before the class token: the row is folded into it.
    for layout in ('big_vision', 'big_vision_scan'):
        ck = BV.to_big_vision(params, cfg, layout=layout)
        np.testing.assert_array_equal(ck['cls'], params['cls_token'] + params['pos_embed'][:, :1])
        folded = jax.device_get(BV.from_big_vision(ck, cfg)[0])
        np.testing.assert_array_equal(folded['pos_embed'][:, 0], 0)
        np.testing.assert_array_equal(folded['cls_token'], ck['cls'])
        def rest(p):
            return {k: v for k, v in pytree.flatten(p).items() if k not in ('cls_token', 'pos_embed')}
        assert pytree.trees_equal(rest(params), rest(folded))
        np.testing.assert_array_equal(folded['pos_embed'][:, 1:], params['pos_embed'][:, 1:])
        # Written again, nothing changes: a zero row is not folded (keeps -0.0 as it is).
        assert_checkpoints_identical(ck, BV.to_big_vision(folded, cfg, layout=layout))


def test_tleg_ancestor_and_descendant_round_trip_through_big_vision_and_timm():
    tleg = genes.get('tleg')
    aux_cfg = vit_config('Ti', width=WIDTH, num_heads=HEADS, mlp_dim=MLP, depth=4, image_size=IMAGE,
                         patch_size=PATCH, num_classes=CLASSES, pool='avg')
    # A trained-like gene: random values in the gene's shapes (no special init constants).
    rng = np.random.default_rng(0)
    gene = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32),
                        jax.eval_shape(lambda: tleg.init_gene(aux_cfg, jax.random.key(0))))
    des_cfg = aux_cfg.replace(depth=3)
    models = {'ancestor': (tleg.materialize(gene, None, aux_cfg), aux_cfg),
              'descendant': (tleg.descend(gene, des_cfg, key=jax.random.key(1)), des_cfg)}
    for what, (params, cfg) in models.items():
        params = jax.device_get(params)
        for layout in BV.LAYOUTS:
            ck = BV.to_big_vision(params, cfg, layout=layout)
            back, inferred = BV.from_big_vision(ck)
            assert inferred == cfg.replace(gelu='tanh'), (what, layout)
            assert pytree.trees_equal(params, jax.device_get(back)), (what, layout)
            assert_checkpoints_identical(ck, BV.to_big_vision(back, cfg, layout=layout))
        cfg_t, back_t = T.from_timm(T.to_timm(params, cfg), num_heads=cfg.num_heads)
        assert cfg_t == cfg and pytree.trees_equal(params, jax.device_get(back_t)), what


# ----------------------------------------------------------------------------------------
# Errors.

def test_one_error_lists_every_missing_unexpected_and_misshaped_key():
    ck = checkpoint('big_vision', 'tok')
    del ck['Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias']
    ck['MAPHead_0/probe'] = np.zeros((1, 1, WIDTH), np.float32)
    ck['extra/thing'] = np.zeros(3, np.float32)
    ck['head/bias'] = np.zeros(CLASSES + 1, np.float32)
    ck['Transformer/encoderblock_0/LayerNorm_1/scale'] = np.zeros(WIDTH, np.int32)
    with pytest.raises(StateDictError) as e:
        BV.from_big_vision(ck)
    msg = str(e.value)
    assert '(4 problems)' in msg and 'layout=big_vision' in msg
    assert 'missing keys (1): Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias' in msg
    assert 'unexpected keys (2)' in msg and 'extra/thing' in msg and 'MAPHead_0/probe' in msg
    assert f'head/bias: shape ({CLASSES + 1},), expected ({CLASSES},)' in msg
    assert 'LayerNorm_1/scale: dtype int32' in msg


def test_given_config_is_checked_and_uninferable_checkpoints_list_problems():
    ck = checkpoint('vit', 'tok')
    cfg = BV.infer_config(ck).replace(mlp_dim=MLP * 2)
    with pytest.raises(StateDictError, match=r'(?s)Dense_0/kernel: shape \(16, 32\), expected \(16, 64\).*'
                                             r'Dense_0/kernel: shape \(16, 32\)'):
        BV.from_big_vision(ck, cfg)
    bad = {k: v for k, v in ck.items() if not k.startswith('embedding/')}
    bad['reg_token'] = np.zeros((1, 1, WIDTH), np.float32)
    with pytest.raises(StateDictError) as e:
        BV.from_big_vision(bad)
    msg = str(e.value)
    assert 'missing embedding/kernel' in msg and 'reg_token' in msg


def test_to_big_vision_refuses_unrepresentable_configs_and_misfit_params():
    cfg = vit_config('Ti', width=WIDTH, num_heads=HEADS, mlp_dim=MLP, depth=1, image_size=IMAGE,
                     patch_size=PATCH, num_classes=CLASSES, layer_scale=True, distill_token=True,
                     qkv_bias=False)
    with pytest.raises(ConfigError) as e:
        BV.to_big_vision(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), cfg)
    assert all(s in str(e.value) for s in ('layer_scale', 'distill_token', 'qkv_bias'))
    with pytest.raises(ConfigError, match="pool_norm='after'"):
        BV.big_vision_shapes(cfg.replace(layer_scale=False, distill_token=False, qkv_bias=True,
                                         pool='avg', pool_norm='after'))
    params, ok = BV.from_big_vision(checkpoint('big_vision', 'tok'))
    params = jax.device_get(params)
    del params['head']['bias']
    params['norm']['scale'] = np.ones(WIDTH + 1, np.float32)
    with pytest.raises(StateDictError, match=r'(?s)missing parameters \(1\): head/bias.*norm/scale: shape'):
        BV.to_big_vision(params, ok)
    with pytest.raises(ValueError, match="'scan'"):
        BV.to_big_vision(params, ok, layout='scan')


# ----------------------------------------------------------------------------------------
# Files.

def test_npz_files(tmp_path):
    ck = checkpoint('big_vision_scan', 'gap')
    path = BV.save_npz(traverse_util.unflatten_dict(ck, sep='/'), tmp_path / 'sub' / 'bv.npz')
    with np.load(path) as f:
        assert sorted(f.files) == sorted(ck)
    assert_checkpoints_identical(ck, {k: BV.load_npz(path)[k] for k in ck})
    params, cfg = BV.from_big_vision(path)
    assert pytree.trees_equal(jax.device_get(params), jax.device_get(BV.from_big_vision(ck)[0]))
    junk = tmp_path / 'junk.npz'
    junk.write_bytes(b'PK\x03\x04 not really a zip archive')
    with pytest.raises(StateDictError, match=r'junk\.npz'):
        BV.from_big_vision(junk)
    with pytest.raises(StateDictError, match=r'model\.safetensors'):
        BV.load_npz(tmp_path / 'model.safetensors')
    with pytest.raises(ValueError, match=r'bv\.zip'):
        BV.save_npz(ck, tmp_path / 'bv.zip')
