"""timm/DeiT interop: layouts, bit-exact round trips, error reports, files, CLI, and (with
the optional torch+timm extra) numerical parity with real timm models."""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import pytree
from jlearngene.interop import state_dict as SD
from jlearngene.interop import timm as T
from jlearngene.models import ConfigError, apply, init, init_block, unstack_blocks, vit_config


# ----------------------------------------------------------------------------------------
# Random state dicts with timm's key names and shapes, written out key by key (not with the
# module's own `timm_shapes`), so the tests do not check the code against itself.

def timm_state_dict(seed=0, *, width=32, depth=2, mlp=64, patch=4, image=16, chans=3, classes=10,
                    cls=True, dist=False, fc_norm=False, qkv_bias=True, layer_scale=False,
                    no_embed_class=False, dtype=np.float32):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    d, n = width, (image // patch) ** 2
    prefix = int(cls) + int(dist)
    sd = {}
    if cls:
        sd['cls_token'] = r(1, 1, d)
    sd['pos_embed'] = r(1, n + (0 if no_embed_class else prefix), d)
    if dist:
        sd['dist_token'] = r(1, 1, d)
    sd['patch_embed.proj.weight'] = r(d, chans, patch, patch)
    sd['patch_embed.proj.bias'] = r(d)
    for i in range(depth):
        b = f'blocks.{i}.'
        sd[b + 'norm1.weight'], sd[b + 'norm1.bias'] = r(d), r(d)
        sd[b + 'attn.qkv.weight'] = r(3 * d, d)
        if qkv_bias:
            sd[b + 'attn.qkv.bias'] = r(3 * d)
        sd[b + 'attn.proj.weight'], sd[b + 'attn.proj.bias'] = r(d, d), r(d)
        if layer_scale:
            sd[b + 'ls1.gamma'] = r(d)
        sd[b + 'norm2.weight'], sd[b + 'norm2.bias'] = r(d), r(d)
        sd[b + 'mlp.fc1.weight'], sd[b + 'mlp.fc1.bias'] = r(mlp, d), r(mlp)
        sd[b + 'mlp.fc2.weight'], sd[b + 'mlp.fc2.bias'] = r(d, mlp), r(d)
        if layer_scale:
            sd[b + 'ls2.gamma'] = r(d)
    norm = 'fc_norm' if fc_norm else 'norm'
    sd[norm + '.weight'], sd[norm + '.bias'] = r(d), r(d)
    if classes:
        sd['head.weight'], sd['head.bias'] = r(classes, d), r(classes)
        if dist:
            sd['head_dist.weight'], sd['head_dist.bias'] = r(classes, d), r(classes)
    return sd


def random_params(cfg, seed=0):
    """Canonical params of `cfg` (shapes from `init`, traced only) filled with N(0, 1) values."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))
    return jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)


LAYOUTS = {
    'cls': dict(),
    'avg_fc_norm': dict(cls=False, fc_norm=True),
    'avg_fc_norm_with_cls_token': dict(fc_norm=True),
    'distilled': dict(dist=True),
    'no_qkv_bias': dict(qkv_bias=False),
    'layer_scale': dict(layer_scale=True),
    'no_head': dict(classes=0),
    'distilled_no_head': dict(dist=True, classes=0),
    'no_embed_class': dict(no_embed_class=True, layer_scale=True),
    'no_embed_class_distilled': dict(no_embed_class=True, dist=True),
}


def assert_state_dicts_identical(a, b):
    assert list(a) == list(b) or sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), f'{k} differs bitwise'


@pytest.mark.parametrize('name', sorted(LAYOUTS))
def test_round_trip_timm_canonical_timm_is_bit_exact(name):
    kw = LAYOUTS[name]
    sd = timm_state_dict(**kw)
    cfg, params = T.from_timm(sd, num_heads=2)
    # Inferred config.
    assert (cfg.width, cfg.depth, cfg.mlp_dim, cfg.patch_size, cfg.image_size, cfg.channels) == \
        (32, 2, 64, 4, 16, 3)
    assert cfg.num_classes == kw.get('classes', 10)
    assert cfg.distill_token == kw.get('dist', False)
    assert cfg.class_token == kw.get('cls', True)
    assert cfg.pool == ('avg' if kw.get('fc_norm') else 'cls')
    assert cfg.pool_norm == ('after' if kw.get('fc_norm') else 'before')
    assert cfg.qkv_bias == kw.get('qkv_bias', True)
    assert cfg.layer_scale == kw.get('layer_scale', False)
    # Canonical tree: exactly the shapes `init` makes for that config (stacked layout).
    want = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))
    assert not any(pytree.structure_diff(want, params).values())
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    back = T.to_timm(params, cfg, no_embed_class=kw.get('no_embed_class', False))
    assert_state_dicts_identical(sd, back)
    assert list(back) == list(T.timm_shapes(cfg, no_embed_class=kw.get('no_embed_class', False)))


def test_round_trip_float16_and_list_layout():
    sd = timm_state_dict(3, dtype=np.float16, dist=True)
    cfg, params = T.from_timm(sd, num_heads=4)
    assert_state_dicts_identical(sd, T.to_timm(unstack_blocks(params), cfg, dtype=np.float16))


@pytest.mark.parametrize('kw', [dict(), dict(pool='avg', pool_norm='after', class_token=False),
                                dict(distill_token=True, num_classes=0), dict(qkv_bias=False, layer_scale=True)])
def test_round_trip_canonical_timm_canonical(tiny_cfg, kw):
    cfg = tiny_cfg.replace(**kw)
    params = random_params(cfg, 1)
    cfg2, params2 = T.from_timm(T.to_timm(params, cfg), num_heads=cfg.num_heads)
    assert cfg2 == cfg
    assert pytree.trees_equal(params, jax.device_get(params2))


def test_no_embed_class_pads_zero_prefix_rows():
    sd = timm_state_dict(dist=True, no_embed_class=True)
    cfg, params = T.from_timm(sd, num_heads=2)
    assert not T.has_embed_class(sd, cfg)
    assert params['pos_embed'].shape == (1, 2 + 16, 32)
    np.testing.assert_array_equal(params['pos_embed'][:, :2], 0)
    np.testing.assert_array_equal(params['pos_embed'][:, 2:], sd['pos_embed'])
    with pytest.raises(SD.StateDictError, match='no_embed_class=True.*pos_embed'):
        T.to_timm(random_params(cfg), cfg, no_embed_class=True)


def test_mapping_semantics_match_timm_formulas():
    """Each converted leaf computes what timm's torch layer computes (checked in numpy)."""
    sd = timm_state_dict(5, width=32, patch=4, image=8)
    cfg, params = T.from_timm(sd, num_heads=4)
    p = jax.tree.map(np.asarray, params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(32).astype(np.float32)
    # Fused qkv: timm's rows reshape to (3, H, Dh).
    fused = (sd['blocks.1.attn.qkv.weight'] @ x + sd['blocks.1.attn.qkv.bias']).reshape(3, 4, 8)
    for s, n in enumerate('qkv'):
        ours = np.einsum('d,dhk->hk', x, p['blocks']['attn'][n]['kernel'][1]) + p['blocks']['attn'][n]['bias'][1]
        np.testing.assert_allclose(ours, fused[s], rtol=1e-5, atol=1e-5)
    # Output projection over concatenated heads.
    o = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(np.einsum('hk,hkd->d', o, p['blocks']['attn']['out']['kernel'][1]),
                               sd['blocks.1.attn.proj.weight'] @ o.reshape(-1), rtol=1e-5, atol=1e-5)
    # Conv patch embedding (OIHW over NCHW) vs our HWIO kernel over an NHWC patch.
    patch = rng.standard_normal((3, 4, 4)).astype(np.float32)  # C, H, W
    conv = np.einsum('ochw,chw->o', sd['patch_embed.proj.weight'], patch)
    ours = np.einsum('hwco,hwc->o', p['patch_embed']['kernel'], patch.transpose(1, 2, 0))
    np.testing.assert_allclose(ours, conv, rtol=1e-5, atol=1e-5)
    # MLP and head: Linear(out, in).
    np.testing.assert_allclose(x @ p['blocks']['mlp']['fc1']['kernel'][0], sd['blocks.0.mlp.fc1.weight'] @ x,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x @ p['head']['kernel'], sd['head.weight'] @ x, rtol=1e-5, atol=1e-5)


def test_heads_default_to_head_dim_64_and_overrides_pass_through():
    sd = timm_state_dict(width=128, mlp=256)
    cfg, _ = T.from_timm(sd)
    assert cfg.num_heads == 2 and cfg.head_dim == 64
    cfg, _ = T.from_timm(sd, num_heads=8, ln_eps=1e-5, gelu='tanh', dtype='bfloat16')
    assert (cfg.num_heads, cfg.ln_eps, cfg.gelu, cfg.dtype) == (8, 1e-5, 'tanh', 'bfloat16')
    with pytest.raises(SD.StateDictError, match='width 32.*num_heads='):
        T.from_timm(timm_state_dict(width=32))
    with pytest.raises(ConfigError, match=r"\['heads'\]"):
        T.from_timm(sd, heads=2)
    with pytest.raises(SD.StateDictError, match='width=128.*num_heads=3'):
        T.from_timm(sd, num_heads=3)


def test_one_error_lists_every_problem():
    sd = timm_state_dict()
    del sd['blocks.1.mlp.fc2.bias'], sd['norm.weight']
    sd['blocks.0.attn.q_norm.weight'] = np.ones(16, np.float32)
    sd['reg_token'] = np.zeros((1, 4, 32), np.float32)
    sd['extra.thing'] = np.zeros(3, np.float32)
    sd['head.bias'] = np.zeros(11, np.float32)
    sd['blocks.0.norm1.weight'] = np.ones(32, np.int64)
    with pytest.raises(SD.StateDictError) as e:
        T.from_timm(sd, num_heads=2)
    msg = str(e.value)
    for needle in ['missing keys (2)', 'blocks.1.mlp.fc2.bias', 'norm.weight',
                   'unexpected keys (3)', 'blocks.0.attn.q_norm.weight',
                   'reg_token', 'extra.thing',
                   'head.bias: shape (11,), expected (10,)', 'blocks.0.norm1.weight: dtype int64']:
        assert needle in msg, (needle, msg)


def test_overrides_contradicting_shapes_are_listed():
    with pytest.raises(SD.StateDictError) as e:
        T.from_timm(timm_state_dict(), num_heads=2, image_size=32, num_classes=5)
    msg = str(e.value)
    assert 'pos_embed: shape (1, 17, 32), expected (1, 65, 32)' in msg
    assert 'head.weight: shape (10, 32), expected (5, 32)' in msg


def test_uninferable_state_dict_lists_problems_and_strange_keys():
    sd = timm_state_dict()
    del sd['patch_embed.proj.weight']
    sd['module.foo'] = np.zeros(2, np.float32)
    with pytest.raises(SD.StateDictError) as e:
        T.from_timm(sd, num_heads=2)
    msg = str(e.value)
    assert 'missing patch_embed.proj.weight' in msg and 'module.foo' in msg
    with pytest.raises(SD.StateDictError, match='no encoder blocks'):
        T.from_timm({k: v for k, v in timm_state_dict().items() if not k.startswith('blocks')}, num_heads=2)


def test_to_timm_lists_every_parameter_problem(tiny_cfg):
    params = random_params(tiny_cfg)
    del params['blocks']['mlp']['fc2']['bias']
    params['head']['kernel'] = np.zeros((32, 7), np.float32)
    params['extra'] = np.zeros(3)
    with pytest.raises(SD.StateDictError) as e:
        T.to_timm(params, tiny_cfg)
    msg = str(e.value)
    assert 'blocks/mlp/fc2/bias' in msg and 'extra' in msg and 'head/kernel: shape (32, 7), expected (32, 10)' in msg
    with pytest.raises(ConfigError, match='VisionTransformerDistilled'):
        T.to_timm(params, tiny_cfg.replace(distill_token=True, pool='avg'))
    with pytest.raises(ConfigError, match='num_heads=4.*head_dim=16.*width 32'):
        T.to_timm(params, tiny_cfg.replace(num_heads=4, head_dim=16))


def test_to_timm_refuses_what_timm_vit_cannot_hold_in_one_line(tiny_cfg):
    rep = tiny_cfg.replace(representation_size=12)
    with pytest.raises(ConfigError) as e:
        T.to_timm(random_params(rep), rep)
    assert 'representation_size=12' in str(e.value)
    assert '\n' not in str(e.value)
    with pytest.raises(ConfigError, match='representation_size=12'):
        T.timm_kwargs(rep)
    scaled = tiny_cfg.replace(attn_scale=0.5)
    with pytest.raises(ConfigError, match=r'0\.25.*attn_scale=0\.5'):
        T.to_timm(random_params(scaled), scaled)
    # blocks of different head counts (list layout): each block's shape is named
    cfg = tiny_cfg.replace(depth=2)
    params = unstack_blocks(random_params(cfg))
    params['blocks'][1] = jax.tree.map(np.asarray, init_block(cfg, jax.random.key(1), num_heads=1))
    with pytest.raises(SD.StateDictError, match=r'timm.*heads per block \[2, 1\], MLP sizes \[64, 64\]'):
        T.to_timm(params, cfg)


def test_old_timm_representation_layer_is_named_when_read():
    sd = timm_state_dict()
    sd['pre_logits.fc.weight'] = np.zeros((12, 32), np.float32)
    sd['pre_logits.fc.bias'] = np.zeros(12, np.float32)
    with pytest.raises(SD.StateDictError) as e:
        T.from_timm(sd, num_heads=2)
    assert 'pre_logits.fc.weight (a representation layer' in str(e.value)
    assert 'pre_logits.fc.bias (a representation layer' in str(e.value)


# ----------------------------------------------------------------------------------------
# Files.

def test_safetensors_and_npz_files(tmp_path):
    sd = timm_state_dict(dist=True)
    f = SD.save_safetensors(sd, tmp_path / 'sub' / 'model.safetensors', metadata={'note': 'x'})
    assert_state_dicts_identical(sd, SD.load_state_dict(f))
    assert SD.read_safetensors_metadata(f) == {'format': 'pt', 'note': 'x'}
    np.savez(tmp_path / 'model.npz', **sd)
    assert_state_dicts_identical(sd, SD.load_state_dict(tmp_path / 'model.npz'))
    with pytest.raises(FileNotFoundError, match='nope.safetensors'):
        SD.load_state_dict(tmp_path / 'nope.safetensors')
    (tmp_path / 'model.h5').write_bytes(b'')
    with pytest.raises(SD.StateDictError, match=r'model\.h5'):
        SD.load_state_dict(tmp_path / 'model.h5')
    with pytest.raises(ValueError, match=r'model\.bin.*\.safetensors'):
        SD.save_safetensors(sd, tmp_path / 'model.bin')


def test_bfloat16_safetensors_is_read_exactly(tmp_path):
    import ml_dtypes
    a = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 8
    raw = a.astype(ml_dtypes.bfloat16).tobytes()
    b = np.ones(2, np.float32).tobytes()
    header = {'a': {'dtype': 'BF16', 'shape': [3, 4], 'data_offsets': [0, len(raw)]},
              'b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [len(raw), len(raw) + len(b)]}}
    h = json.dumps(header).encode()
    h += b' ' * (-len(h) % 8)
    (tmp_path / 'bf.safetensors').write_bytes(len(h).to_bytes(8, 'little') + h + raw + b)
    got = SD.load_state_dict(tmp_path / 'bf.safetensors')
    assert got['a'].dtype == np.float32 and np.array_equal(got['a'], a)
    assert np.array_equal(got['b'], np.ones(2, np.float32))


def _safetensors_file(path, header: dict, data: bytes):
    h = json.dumps(header).encode()
    h += b' ' * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, 'little') + h + data)
    return path


def test_safetensors_dtype_numpy_cannot_hold_and_damaged_files_are_one_line_errors(tmp_path):
    f8 = _safetensors_file(tmp_path / 'f8.safetensors',
                           {'a': {'dtype': 'F8_E4M3', 'shape': [4], 'data_offsets': [0, 4]}}, bytes(4))
    with pytest.raises(SD.StateDictError, match=r"f8\.safetensors.*'a' has dtype F8_E4M3.*not supported"):
        SD.load_state_dict(f8)
    short = _safetensors_file(tmp_path / 'short.safetensors',
                              {'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]}}, bytes(8))
    for read in (SD.load_state_dict, SD.read_safetensors_metadata):
        with pytest.raises(SD.StateDictError, match=r"short\.safetensors' is not a readable "
                                                   r"\.safetensors file \(.*header") as e:
            read(short)
        assert '\n' not in str(e.value)
    plain = _safetensors_file(tmp_path / 'plain.safetensors',
                              {'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]}}, bytes(4))
    assert SD.read_safetensors_metadata(plain) == {}


def test_pth_without_torch_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / 'model.pth').write_bytes(b'not really')
    monkeypatch.setitem(sys.modules, 'torch', None)  # import torch -> ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[timm\]"'):
        SD.load_state_dict(tmp_path / 'model.pth')


def test_pth_with_torch_unwraps_training_checkpoints(tmp_path):
    torch = pytest.importorskip('torch', reason='reading .pth needs the optional torch extra')
    sd = timm_state_dict(layer_scale=True)
    wrapped = {'model': {'module.' + k: torch.from_numpy(v) for k, v in sd.items()}, 'epoch': 3}
    torch.save(wrapped, tmp_path / 'ckpt.pth')
    assert_state_dicts_identical(sd, SD.load_state_dict(tmp_path / 'ckpt.pth'))
    half = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in sd.items()}
    torch.save(half, tmp_path / 'bf16.pt')
    got = SD.load_state_dict(tmp_path / 'bf16.pt')
    assert got['head.weight'].dtype == np.float32
    np.testing.assert_array_equal(got['head.weight'], half['head.weight'].float().numpy())


# ----------------------------------------------------------------------------------------
# CLI.

def test_cli_round_trip(tmp_path, capsys):
    from jlearngene.cli import main
    from jlearngene.train.checkpoint import load_model
    sd = timm_state_dict(fc_norm=True, cls=False, layer_scale=True)
    src = SD.save_safetensors(sd, tmp_path / 'timm.safetensors')
    assert main(['convert', '--from-timm', src, '--out', str(tmp_path / 'ckpt'), '--num-heads', '4',
                 '--set', 'ln_eps=1e-5']) == 0
    assert 'heads=4' in capsys.readouterr().out
    params, cfg, extra = load_model(str(tmp_path / 'ckpt'))
    assert (cfg.num_heads, cfg.ln_eps, cfg.pool, cfg.pool_norm, cfg.layer_scale) == (4, 1e-5, 'avg', 'after', True)
    assert extra['source']['format'] == 'timm' and extra['source']['no_embed_class'] is False
    out = tmp_path / 'back.safetensors'
    assert main(['convert', '--to-timm', str(tmp_path / 'ckpt'), '--out', str(out)]) == 0
    assert_state_dicts_identical(sd, SD.load_state_dict(out))
    meta = SD.read_safetensors_metadata(out)
    assert json.loads(meta['jlearngene_config'])['num_heads'] == 4
    assert json.loads(meta['timm_kwargs'])['global_pool'] == 'avg'
    # The metadata carries the head count back: no --num-heads needed the second time.
    assert main(['convert', '--from-timm', str(out), '--out', str(tmp_path / 'ckpt2')]) == 0
    params2, cfg2, _ = load_model(str(tmp_path / 'ckpt2'))
    assert cfg2 == cfg and pytree.trees_equal(jax.device_get(params), jax.device_get(params2))
    # Existing outputs are refused without --overwrite.
    assert main(['convert', '--to-timm', str(tmp_path / 'ckpt'), '--out', str(out)]) == 1
    assert str(out) in capsys.readouterr().err
    assert main(['convert', '--to-timm', str(tmp_path / 'ckpt'), '--out', str(out), '--overwrite']) == 0


def test_cli_reports_bad_state_dict(tmp_path, capsys):
    from jlearngene.cli import main
    sd = timm_state_dict()
    del sd['blocks.0.attn.proj.bias']
    src = SD.save_safetensors(sd, tmp_path / 'bad.safetensors')
    assert main(['convert', '--from-timm', src, '--out', str(tmp_path / 'ckpt'), '--num-heads', '2']) == 1
    err = capsys.readouterr().err
    assert 'blocks.0.attn.proj.bias' in err and 'missing keys (1)' in err
    assert not (tmp_path / 'ckpt').exists()
    assert main(['convert', '--to-timm', str(tmp_path / 'ckpt'), '--out', str(tmp_path / 'x.npz')]) == 2
    assert '.safetensors' in capsys.readouterr().err


# ----------------------------------------------------------------------------------------
# Numerical parity with real timm models (optional extra).

def _import_timm():
    """Import torch + timm or skip. torchvision's PyPI build (needed by `import timm`) cannot
    load its compiled ops beside a CPU-only torch wheel and then fails while registering
    fake kernels for `torchvision::nms`/`qnms`; declaring those two op schemas lets its
    Python part import. timm's ViT uses no torchvision op, so the comparison is unaffected."""
    torch = pytest.importorskip('torch', reason='parity test needs the optional extra: pip install -e ".[timm]"')
    try:
        import timm  # noqa: F401
    except ImportError as e:
        pytest.skip(f'parity test needs timm (pip install -e ".[timm]"): {e}')
    except RuntimeError as e:
        if 'torchvision::' not in str(e):
            raise
        for name in [m for m in sys.modules if m.split('.')[0] in ('timm', 'torchvision')]:
            del sys.modules[name]
        lib = torch.library.Library('torchvision', 'DEF')
        lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
        lib.define('qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor')
        _import_timm.lib = lib  # the definitions live as long as the Library object
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer
    return torch, VisionTransformer, VisionTransformerDistilled


def _randomise(torch, model, seed):
    """Every parameter (weights, biases, LayerNorm, tokens, pos_embed, LayerScale) random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model.eval()


TIMM_MODELS = {
    'vit_cls': ('ViT', dict()),
    'deit_distilled': ('Distilled', dict()),
    'vit_avg_fc_norm': ('ViT', dict(global_pool='avg', class_token=False)),
    'vit_layer_scale_no_qkv_bias_no_embed_class': ('ViT', dict(qkv_bias=False, init_values=0.1,
                                                                 no_embed_class=True)),
}


@pytest.mark.timm
@pytest.mark.parametrize('name', sorted(TIMM_MODELS))
def test_parity_with_timm_logits(name):
    torch, ViT, Distilled = _import_timm()
    kind, kw = TIMM_MODELS[name]
    cls = Distilled if kind == 'Distilled' else ViT
    model = _randomise(torch, cls(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                  num_classes=10, **kw), seed=len(name))
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    cfg, params = T.from_timm(model.state_dict(), num_heads=2)
    got, _ = jax.jit(apply, static_argnames='cfg')(params, jnp.asarray(x.numpy().transpose(0, 2, 3, 1)), cfg=cfg)
    diff = float(np.max(np.abs(np.asarray(got) - want)))
    print(f'{name}: max |jlearngene - timm| = {diff:.3g} (logit scale {np.abs(want).max():.3g})')
    assert diff <= 1e-4


@pytest.mark.timm
@pytest.mark.parametrize('kw', [dict(), dict(distill_token=True),
                                dict(pool='avg', pool_norm='after', class_token=False),
                                dict(layer_scale=True, qkv_bias=False)])
def test_parity_exported_to_timm(kw):
    """jlearngene params -> to_timm -> a timm model built from timm_kwargs, strict load."""
    torch, ViT, Distilled = _import_timm()
    cfg = vit_config('Ti', width=64, num_heads=2, mlp_dim=128, depth=2, image_size=32, patch_size=8,
                     num_classes=10, **kw)
    params = jax.tree.map(lambda x: 0.5 * x, random_params(cfg, 3))  # random LN, biases, LayerScale too
    sd = T.to_timm(params, cfg)
    model = (Distilled if cfg.distill_token else ViT)(**T.timm_kwargs(cfg))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
    model.eval()
    x = np.random.default_rng(2).standard_normal((4, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    got, _ = apply(params, jnp.asarray(x), cfg)
    diff = float(np.max(np.abs(np.asarray(got) - want)))
    print(f'export {kw}: max |jlearngene - timm| = {diff:.3g}')
    assert diff <= 1e-4
