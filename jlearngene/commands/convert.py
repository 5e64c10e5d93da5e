"""`jlearngene convert`: timm/DeiT state dicts <-> jlearngene model checkpoints.

  jlearngene convert --from-timm deit_tiny.safetensors --out ckpt/deit_ti [--num-heads 3]
  jlearngene convert --to-timm ckpt/descendant --out descendant.safetensors
  jlearngene convert --from-big-vision Ti_16-i21k-300ep.npz --out ckpt/vit_ti [--set gelu=exact]
  jlearngene convert --to-big-vision ckpt/descendant --out descendant.npz [--layout big_vision_scan]

`--from-timm` reads .safetensors / .npz (numpy only) or .pth (needs torch), infers the
config from the shapes (heads: --num-heads, else width // 64) and writes a model checkpoint
(`jlearngene.train.checkpoint.save_model`) that every other command loads. `--to-timm`
writes a .safetensors state dict for timm's `VisionTransformer` / DeiT
`VisionTransformerDistilled`; its header metadata holds the jlearngene config and the timm
constructor arguments, and `--from-timm` reads them back (so head count etc. survive).

`--from-big-vision` reads a big_vision or original ViT / AugReg `.npz` (per-block or scanned
blocks; the config, head count included, comes from the shapes, with Flax's tanh GELU unless
`--set gelu=exact`). `--to-big-vision` writes a `.npz` in `--layout` ('vit', 'big_vision',
'big_vision_scan'; default: the layout the checkpoint was read from, else 'big_vision').
"""
from __future__ import annotations

import argparse
import json
import os

HELP = ('convert timm/DeiT state dicts (.safetensors/.npz/.pth) and big_vision / ViT .npz checkpoints '
        'to and from model checkpoints')

# Config fields that no shape reveals; taken from a file's metadata when it has them.
_NON_SHAPE_FIELDS = ('num_heads', 'ln_eps', 'gelu', 'pool', 'pool_norm', 'class_token', 'dtype',
                     'dense_precision', 'drop_path', 'dropout', 'remat')


def _parser() -> argparse.ArgumentParser:
    from jlearngene.commands.config_args import Parser, parse_override
    p = Parser('jlearngene convert', __doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument('--from-timm', metavar='FILE', help='timm state dict (.safetensors, .npz, .pth)')
    src.add_argument('--to-timm', metavar='CKPT', help='jlearngene model checkpoint directory')
    src.add_argument('--from-big-vision', metavar='FILE',
                     help='big_vision / original ViT (AugReg) checkpoint (.npz)')
    src.add_argument('--to-big-vision', metavar='CKPT', help='jlearngene model checkpoint directory')
    p.add_argument('--out', required=True, help='output checkpoint directory (--from-timm, '
                   '--from-big-vision), .safetensors file (--to-timm) or .npz file (--to-big-vision)')
    p.add_argument('--layout', choices=('vit', 'big_vision', 'big_vision_scan'),
                   help='--to-big-vision: key layout (default: as the checkpoint was converted, '
                   'else big_vision)')
    p.add_argument('--num-heads', type=int, help='attention heads (not visible in the shapes; '
                   'default: file metadata, else width // 64)')
    p.add_argument('--set', action='append', type=parse_override, default=[], metavar='FIELD=VALUE',
                   help='override a config field for --from-timm (repeatable), e.g. --set ln_eps=1e-5')
    pos = p.add_mutually_exclusive_group()
    pos.add_argument('--no-embed-class', dest='no_embed_class', action='store_const', const=True,
                     help='--to-timm: write pos_embed without prefix-token rows (timm no_embed_class, '
                     'DeiT-3); default: as the checkpoint was converted')
    pos.add_argument('--embed-class', dest='no_embed_class', action='store_const', const=False,
                     help='--to-timm: write pos_embed with prefix-token rows (timm default)')
    p.add_argument('--overwrite', action='store_true',
                   help='replace an existing output of the same kind (never other files, nor the input)')
    return p


def check_fields(pairs, flag: str) -> None:
    """A UsageError naming `flag` for the first FIELD of `pairs` (`parse_override`'s
    (FIELD, VALUE)) that ViTConfig does not have, before anything is read."""
    import dataclasses

    from jlearngene.commands.config_args import UsageError
    from jlearngene.models.config import ViTConfig, no_field
    fields = [f.name for f in dataclasses.fields(ViTConfig)]
    for key, _ in pairs:
        if key not in fields:
            raise UsageError(f"{flag} {key}=...: {no_field(key)}; its fields: {', '.join(fields)}")


def _check_export_name(out: str, fmt: str) -> None:
    """A UsageError unless --out has the suffix of export format `fmt` (as
    `interop.state_dict.check_output` requires), before the checkpoint is read."""
    from jlearngene.commands.config_args import UsageError
    from jlearngene.interop.state_dict import EXPORTS
    what, suffix = EXPORTS[fmt]
    if not out.endswith(suffix):
        raise UsageError(f'--out {out!r}: {what} is written as {suffix}; give a file name ending '
                         f'in {suffix}')


def file_format(path: str) -> str:
    """What a checkpoint file holds, from its contents (`interop.state_dict.file_kind`): 'timm'
    (a .safetensors, torch or .npz state dict with timm's '.'-joined keys), 'big_vision' (an
    .npz with '/'-joined keys), 'empty' or 'unknown'. OSError for a missing path or a directory."""
    from jlearngene.interop.state_dict import file_kind
    kind = file_kind(path)
    if kind == 'npz':
        import numpy as np
        try:
            with np.load(path, allow_pickle=False) as f:
                keys = list(f.files)
        except Exception:  # noqa: BLE001 - zipfile / numpy raise many kinds for bad files
            return 'unknown'
        return 'big_vision' if any('/' in k for k in keys) else 'timm'
    return 'timm' if kind in ('safetensors', 'torch') else kind


def _sniff(path: str) -> str:
    """What a file that is no state dict holds, from its first bytes."""
    with open(path, 'rb') as f:
        head = f.read(512)
    magic = ((b'\x93NUMPY', 'a single .npy array (np.save)'),
             (b'\x89PNG', 'a PNG image'), (b'\xff\xd8\xff', 'a JPEG image'),
             (b'\x1f\x8b', 'a gzip-compressed file (unpack it first)'),
             (b'\x89HDF', 'an HDF5 file (a Keras or Flax .h5?)'))
    for start, what in magic:
        if head.startswith(start):
            return what
    if head.startswith(b'PK'):
        import zipfile
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return 'a damaged zip archive'
        return f'a zip archive of {_some(names)} (no .npy arrays)'
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        return 'a file of unknown kind'
    return 'a JSON file' if text.lstrip()[:1] in ('{', '[') else 'a text file'


def _some(names: list[str], n: int = 3) -> str:
    shown = ', '.join(repr(k) for k in names[:n])
    return shown + (f', ... ({len(names)} in all)' if len(names) > n else '')


def describe_file(path: str) -> str:
    """What the file `path` holds, as a phrase for messages: 'a timm state dict', 'a big_vision
    .npz checkpoint', 'an empty file (0 bytes)', "an .npz archive of 2 arrays ('x', 'y') but
    no ViT's keys", 'a PyTorch checkpoint', 'a text file', 'a PNG image', ... (from its
    contents, not its name). OSError for a missing path or a directory."""
    from jlearngene.interop.state_dict import archive_keys, file_kind, keys_format
    kind = file_kind(path)
    if kind == 'empty':
        return 'an empty file (0 bytes)'
    if kind == 'torch':
        return 'a PyTorch checkpoint (torch.save; a timm state dict converts with --from-timm)'
    if kind not in ('npz', 'safetensors'):
        return _sniff(path)
    keys = archive_keys(path, kind)
    noun, unit = ('an .npz archive', 'array') if kind == 'npz' else ('a .safetensors file', 'tensor')
    if keys is None:
        return f'{noun} that cannot be read (truncated or damaged)'
    if any('/' in k for k in keys):
        return 'a big_vision .npz checkpoint' if kind == 'npz' else (
            f"{noun} with big_vision's '/'-joined keys (big_vision checkpoints are .npz files)")
    if keys_format(keys, kind) == 'timm':
        return 'a timm state dict'
    if not keys:
        return f'{noun} with no {unit}s'
    plural = 's' if len(keys) != 1 else ''
    return f"{noun} of {len(keys)} {unit}{plural} ({_some(keys)}) but no ViT's keys"


_CONVERT_FLAG = {'timm': '--from-timm', 'big_vision': '--from-big-vision'}
_SOURCE_FILE = {'timm': 'a timm state dict file (.safetensors, .npz, .pth)',
                'big_vision': 'a big_vision .npz file'}
_FORMAT_NAME = {'timm': 'a timm state dict', 'big_vision': 'a big_vision .npz checkpoint'}


def check_model_checkpoint(path: str, flag: str) -> None:
    """A one-line error naming `flag` when `path` cannot be a model checkpoint directory
    (`checkpoint.save_model`): it does not exist, or it is a file (a timm or big_vision file
    to convert first, an empty file or one of another kind). A directory passes: the
    checkpoint reader says what is wrong inside it."""
    if os.path.isdir(path):
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f'{flag} {path!r} does not exist')
    fmt, what = file_format(path), describe_file(path)
    message = f'{flag} {path!r} is {what}, not a model checkpoint directory'
    if fmt in _CONVERT_FLAG and what == _FORMAT_NAME[fmt]:
        message += f'; convert it first: jlearngene convert {_CONVERT_FLAG[fmt]} {path} --out DIR'
    raise ValueError(message)


def _check_source_file(path: str, flag: str, fmt: str) -> None:
    """`path` (given as `flag`) is an existing file that is not plainly of the other format."""
    if os.path.isdir(path):
        hint = ('; it holds a jlearngene model checkpoint, which --to-timm / --to-big-vision convert'
                if os.path.isdir(os.path.join(path, 'params')) else '')
        raise IsADirectoryError(f'{flag} {path!r} is a directory, not {_SOURCE_FILE[fmt]}{hint}')
    if not os.path.exists(path):
        raise FileNotFoundError(f'{flag} {path!r} does not exist')
    other = 'big_vision' if fmt == 'timm' else 'timm'
    found = file_format(path)
    if fmt == 'big_vision' and found != fmt:   # anything else: say what it is
        what = describe_file(path)
        hint = f'; convert it with {_CONVERT_FLAG[other]}' if what == _FORMAT_NAME[other] else ''
        raise ValueError(f'{flag} {path!r} is {what}, not a big_vision / ViT .npz checkpoint{hint}')
    if found == other:
        raise ValueError(f'{flag} {path!r} is {_FORMAT_NAME[other]}; convert it with '
                         f'{_CONVERT_FLAG[other]}')


def timm_file_defaults(path: str) -> dict:
    """The config fields no shape reveals (`_NON_SHAPE_FIELDS`) from the jlearngene config in
    a .safetensors header (written by --to-timm), {} for other files."""
    from jlearngene.interop import state_dict as SD
    if not path.lower().endswith('.safetensors'):
        return {}
    stored = SD.read_safetensors_metadata(path).get('jlearngene_config')
    if not stored:
        return {}
    try:
        stored = json.loads(stored)
    except ValueError:
        raise SD.StateDictError(f'{path!r}: the jlearngene_config in its header is not JSON') from None
    return {k: stored[k] for k in _NON_SHAPE_FIELDS if isinstance(stored, dict) and k in stored}


def from_timm_file(path: str, out: str, *, overrides: dict | None = None, overwrite: bool = False):
    """Convert a timm state dict file into a model checkpoint; returns (cfg, params, extra)."""
    from jlearngene.interop import timm as T
    from jlearngene.interop.state_dict import check_values, load_state_dict
    from jlearngene.train.checkpoint import check_model_output, save_model

    check_model_output(out, overwrite=overwrite, inputs=(path,), how='--overwrite')
    _check_source_file(path, '--from-timm', 'timm')
    sd = load_state_dict(path)
    defaults = timm_file_defaults(path)
    cfg, params = T.from_timm(sd, **{**defaults, **(overrides or {})})
    check_values(params, f'--from-timm {path!r}')
    extra = {'source': {'format': 'timm', 'file': os.path.abspath(path),
                        'no_embed_class': not T.has_embed_class(sd, cfg)}}
    save_model(out, params, cfg, extra=extra, overwrite=overwrite, inputs=(path,))
    return cfg, params, extra


# Each export format's flag (what it writes: `interop.state_dict.EXPORTS`).
_EXPORT_FLAG = {'timm': '--to-timm', 'big_vision': '--to-big-vision'}


def _load_for_export(ckpt: str, out: str, fmt: str, overwrite: bool):
    """(params, cfg, extra) of the model checkpoint `ckpt` to be written as `out` in `fmt`
    (`interop.state_dict.EXPORTS`); `out` is checked first: nothing there, or with
    `overwrite` an export of the same format (`check_output`)."""
    from jlearngene.interop.state_dict import check_output
    from jlearngene.train.checkpoint import load_model
    from jlearngene.train.integrity import CheckpointError
    check_output(out, '--out', fmt, overwrite, inputs=(ckpt,))
    check_model_checkpoint(ckpt, _EXPORT_FLAG[fmt])
    params, cfg, extra = load_model(ckpt)
    if cfg is None:
        raise CheckpointError(f'model checkpoint {ckpt!r} stores no model config; cannot name {fmt} keys')
    return params, cfg, extra


def to_timm_file(ckpt: str, out: str, *, no_embed_class: bool | None = None, overwrite: bool = False):
    """Write a model checkpoint as a timm .safetensors state dict; returns (state_dict, timm_kwargs)."""
    from jlearngene.interop import timm as T
    params, cfg, extra = _load_for_export(ckpt, out, 'timm', overwrite)
    if no_embed_class is None:   # as converted; a trained model's 'source' is a string
        source = extra.get('source')
        no_embed_class = isinstance(source, dict) and bool(source.get('no_embed_class', False))
    sd = T.to_timm(params, cfg, no_embed_class=no_embed_class)
    kwargs = T.timm_kwargs(cfg, no_embed_class=no_embed_class)
    T.save_model_safetensors(sd, out, cfg, kwargs)
    return sd, kwargs


def from_big_vision_file(path: str, out: str, *, overrides: dict | None = None,
                         overwrite: bool = False):
    """Convert a big_vision / ViT `.npz` into a model checkpoint; returns (cfg, params, extra)."""
    from jlearngene.interop import big_vision as BV
    from jlearngene.interop.state_dict import check_values
    from jlearngene.models.config import ViTConfig
    from jlearngene.train.checkpoint import check_model_output, save_model

    check_model_output(out, overwrite=overwrite, inputs=(path,), how='--overwrite')
    _check_source_file(path, '--from-big-vision', 'big_vision')
    ckpt = BV.load_npz(path)
    cfg = BV.infer_config(ckpt)
    if overrides:
        cfg = ViTConfig.from_dict({**cfg.to_dict(), **overrides})
    params, cfg = BV.from_big_vision(ckpt, cfg)
    check_values(params, f'--from-big-vision {path!r}')
    extra = {'source': {'format': 'big_vision', 'file': os.path.abspath(path),
                        'layout': BV.detect_layout(ckpt)}}
    save_model(out, params, cfg, extra=extra, overwrite=overwrite, inputs=(path,))
    return cfg, params, extra


def to_big_vision_file(ckpt: str, out: str, *, layout: str | None = None, overwrite: bool = False):
    """Write a model checkpoint as a big_vision / ViT `.npz`; returns (checkpoint dict, layout)."""
    from jlearngene.interop import big_vision as BV
    params, cfg, extra = _load_for_export(ckpt, out, 'big_vision', overwrite)
    source = extra.get('source')
    if layout is None:   # as converted; a trained model's 'source' is a string
        from_bv = isinstance(source, dict) and source.get('format') == 'big_vision'
        layout = source.get('layout', 'big_vision') if from_bv else 'big_vision'
    tree = BV.to_big_vision(params, cfg, layout=layout)
    BV.save_npz(tree, out)
    return tree, layout


def main(argv: list[str]) -> int:
    """The command: runs the one conversion `argv` names (`from_timm_file`,
    `from_big_vision_file`, `to_timm_file` or `to_big_vision_file`) and prints what it wrote;
    exit status 0.

    Raises:
        UsageError: a flag that does not apply to the chosen direction (`--layout` without
            `--to-big-vision`; `--embed-class` / `--no-embed-class` without `--to-timm`;
            `--num-heads` with `--from-big-vision`; `--set` or `--num-heads` with an export),
            a `--set` FIELD that ViTConfig lacks, or an export's --out without its format's
            suffix; all before anything is read.
    """
    from jlearngene.commands.config_args import UsageError
    args = _parser().parse_args(argv)
    from jlearngene import pytree
    if args.layout and not args.to_big_vision:
        raise UsageError('--layout applies to --to-big-vision only')
    if args.no_embed_class is not None and not args.to_timm:
        raise UsageError('--embed-class/--no-embed-class apply to --to-timm only')
    if args.from_timm or args.from_big_vision:
        check_fields(args.set, '--set')
        overrides = dict(args.set)
        if args.num_heads is not None:
            if args.from_big_vision:
                raise UsageError('--num-heads: a big_vision checkpoint has the head count in its '
                                 'attention kernels (D, H, Dh)')
            overrides['num_heads'] = args.num_heads
        src = args.from_timm or args.from_big_vision
        convert = from_timm_file if args.from_timm else from_big_vision_file
        cfg, params, extra = convert(src, args.out, overrides=overrides, overwrite=args.overwrite)
        n = pytree.count_params(params)['total']
        print(f'wrote {os.path.abspath(args.out)}: ViT width={cfg.width} depth={cfg.depth} '
              f'heads={cfg.num_heads} mlp={cfg.mlp_dim} patch={cfg.patch_size} image={cfg.image_size} '
              f'classes={cfg.num_classes} pool={cfg.pool} distill={cfg.distill_token} '
              f'({n / 1e6:.2f}M params) from {src}')
    else:
        if args.set or args.num_heads is not None:
            raise UsageError('--set/--num-heads apply to --from-timm / --from-big-vision only; '
                             "--to-timm / --to-big-vision use the checkpoint's config")
        _check_export_name(args.out, 'timm' if args.to_timm else 'big_vision')
        if args.to_timm:
            sd, kwargs = to_timm_file(args.to_timm, args.out, no_embed_class=args.no_embed_class,
                                      overwrite=args.overwrite)
            print(f'wrote {os.path.abspath(args.out)}: {len(sd)} tensors; rebuild in timm with '
                  f'{kwargs} and load_state_dict(safetensors.torch.load_file(...))')
        else:
            tree, layout = to_big_vision_file(args.to_big_vision, args.out, layout=args.layout,
                                              overwrite=args.overwrite)
            print(f'wrote {os.path.abspath(args.out)}: {len(tree)} arrays in the {layout!r} layout; '
                  "read with big_vision's utils.load_params or vit_jax's checkpoint.load")
    return 0
