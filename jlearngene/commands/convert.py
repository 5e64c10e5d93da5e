"""`jlearngene convert`: timm/DeiT state dicts <-> jlearngene model checkpoints.

  jlearngene convert --from-timm deit_tiny.safetensors --out ckpt/deit_ti [--num-heads 3]
  jlearngene convert --to-timm ckpt/descendant --out descendant.safetensors

`--from-timm` reads .safetensors / .npz (numpy only) or .pth (needs torch), infers the
config from the shapes (heads: --num-heads, else width // 64) and writes a model checkpoint
(`jlearngene.train.checkpoint.save_model`) that every other command loads. `--to-timm`
writes a .safetensors state dict for timm's `VisionTransformer` / DeiT
`VisionTransformerDistilled`; its header metadata holds the jlearngene config and the timm
constructor arguments, and `--from-timm` reads them back (so head count etc. survive).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HELP = 'convert timm/DeiT state dicts (.safetensors/.npz/.pth) to and from model checkpoints'

# Config fields that no shape reveals; taken from a file's metadata when it has them.
_NON_SHAPE_FIELDS = ('num_heads', 'ln_eps', 'gelu', 'pool', 'pool_norm', 'class_token', 'dtype',
                     'dense_precision', 'drop_path', 'dropout', 'remat')


def _parser() -> argparse.ArgumentParser:
    from jlearngene.commands._config import parse_override
    p = argparse.ArgumentParser(prog='jlearngene convert', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument('--from-timm', metavar='FILE', help='timm state dict (.safetensors, .npz, .pth)')
    src.add_argument('--to-timm', metavar='CKPT', help='jlearngene model checkpoint directory')
    p.add_argument('--out', required=True, help='output checkpoint directory (--from-timm) or '
                   '.safetensors file (--to-timm)')
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
    p.add_argument('--overwrite', action='store_true', help='replace an existing output')
    return p


def from_timm_file(path: str, out: str, *, overrides: dict | None = None, overwrite: bool = False):
    """Convert a timm state dict file into a model checkpoint; returns (cfg, params, extra)."""
    from jlearngene.interop import timm as T
    from jlearngene.train.checkpoint import save_model

    sd = T.load_state_dict(path)
    defaults = {}
    if path.lower().endswith('.safetensors'):
        stored = T.read_safetensors_metadata(path).get('jlearngene_config')
        if stored:
            stored = json.loads(stored)
            defaults = {k: stored[k] for k in _NON_SHAPE_FIELDS if k in stored}
    cfg, params = T.from_timm(sd, **{**defaults, **(overrides or {})})
    extra = {'source': {'format': 'timm', 'file': os.path.abspath(path),
                        'no_embed_class': not T.has_embed_class(sd, cfg)}}
    save_model(out, params, cfg, extra=extra, overwrite=overwrite)
    return cfg, params, extra


def to_timm_file(ckpt: str, out: str, *, no_embed_class: bool | None = None, overwrite: bool = False):
    """Write a model checkpoint as a timm .safetensors state dict; returns (state_dict, timm_kwargs)."""
    from jlearngene.interop import timm as T
    from jlearngene.train.checkpoint import CheckpointError, load_model

    if not out.endswith('.safetensors'):
        raise ValueError(f'--out {out!r}: the timm state dict is written as .safetensors; '
                         'give a file name ending in .safetensors')
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f'{out!r} already exists; pass --overwrite to replace it')
    params, cfg, extra = load_model(ckpt)
    if cfg is None:
        raise CheckpointError(f'model checkpoint {ckpt!r} stores no model config; cannot name timm keys')
    if no_embed_class is None:
        no_embed_class = bool((extra.get('source') or {}).get('no_embed_class', False))
    sd = T.to_timm(params, cfg, no_embed_class=no_embed_class)
    kwargs = T.timm_kwargs(cfg, no_embed_class=no_embed_class)
    cls = 'VisionTransformerDistilled' if cfg.distill_token else 'VisionTransformer'
    T.save_safetensors(sd, out, metadata={'jlearngene_config': json.dumps(cfg.to_dict()),
                                          'timm_class': cls, 'timm_kwargs': json.dumps(kwargs)})
    return sd, kwargs


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from jlearngene import pytree
    from jlearngene.interop.timm import StateDictError
    from jlearngene.models.config import ConfigError
    from jlearngene.train.checkpoint import CheckpointError

    try:
        if args.from_timm:
            overrides = dict(args.set)
            if args.num_heads is not None:
                overrides['num_heads'] = args.num_heads
            cfg, params, extra = from_timm_file(args.from_timm, args.out, overrides=overrides,
                                                overwrite=args.overwrite)
            n = pytree.count_params(params)['total']
            print(f'wrote {os.path.abspath(args.out)}: ViT width={cfg.width} depth={cfg.depth} '
                  f'heads={cfg.num_heads} mlp={cfg.mlp_dim} patch={cfg.patch_size} image={cfg.image_size} '
                  f'classes={cfg.num_classes} pool={cfg.pool} distill={cfg.distill_token} '
                  f'({n / 1e6:.2f}M params) from {args.from_timm}')
        else:
            if args.set or args.num_heads is not None:
                raise ValueError('--set/--num-heads apply to --from-timm only; --to-timm uses the '
                                 "checkpoint's config")
            sd, kwargs = to_timm_file(args.to_timm, args.out, no_embed_class=args.no_embed_class,
                                      overwrite=args.overwrite)
            print(f'wrote {os.path.abspath(args.out)}: {len(sd)} tensors; rebuild in timm with '
                  f'{kwargs} and load_state_dict(safetensors.torch.load_file(...))')
    except (StateDictError, ConfigError, CheckpointError, FileNotFoundError, FileExistsError,
            ImportError, ValueError) as e:
        print(f'jlearngene convert: error: {e}', file=sys.stderr)
        return 1
    return 0
