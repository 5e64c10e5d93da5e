"""`jlearngene descend GENE --out DIR [--width W] [--depth L] [--heads H|h1,h2,...]`: a
descendant of a gene directory (`jlearngene.artefacts`), written as a model artefact.

  jlearngene descend genes/letra --width 12 --depth 8 --out ckpt/des --to-timm des.safetensors
  jlearngene descend letra_digits --width 48 --depth 6 --out ckpt/des   # a shipped gene, by name
  jlearngene descend genes/cluster --heads 4,4,2,2 --out ckpt/des --option head=inherit
  jlearngene descend genes/scala --width 96 --out ckpt/des

The target is the gene's config ('target' where the gene makes one shape, else 'source')
with the requested width, depth and heads (the MLP size scales with the width unless
`--mlp-dim` is given; any field with `--set FIELD=VALUE`, e.g. --set num_classes=100 with
--option head=new). Where the request leaves the head size open, the one the method accepts
is taken (LeTra and Cluster keep the head size, Scala the head count). `--heads` takes one
count, or one per layer for methods whose descend takes `heads=` (Cluster-Learngene).
`--option KEY=VALUE` (repeatable; VALUE as JSON, else a string) overrides the descend
options stored with the gene; `--seed` seeds whatever is drawn fresh.

`--out DIR` is a model checkpoint: `jlearngene train --config digits_vit --config.init=DIR`
starts from it (the run's model config must equal the printed one), `jlearngene eval`,
`info` and `convert` read it. `--to-timm FILE` also writes a timm `.safetensors` state dict.
`--overwrite` replaces only what the command writes (a model checkpoint at --out, a timm
state dict at --to-timm), never other files or the gene read. A request the gene cannot
make exits with status 2, like a malformed flag, before anything is computed.
"""
from __future__ import annotations

import argparse
import json

HELP = 'write a descendant of any width/depth from a gene directory (model checkpoint, timm)'


def _heads(text: str):
    parts = [p for p in text.replace(' ', '').split(',') if p]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f'--heads {text!r}: expected an integer or a comma-separated '
                                         'list of integers (one per layer)') from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f'--heads {text!r}: head counts must be positive')
    return values[0] if len(values) == 1 and ',' not in text else values


def parse_option(text: str):
    """`--option key=value`: the value as JSON (numbers, lists, objects, true/false), else
    the plain string; a value that starts as JSON ('[', '{', '"') but does not parse is an
    error, not a string."""
    key, sep, value = text.partition('=')
    if not sep or not key:
        raise argparse.ArgumentTypeError(f'--option {text!r} is not of the form key=value')
    try:
        return key, json.loads(value)
    except ValueError as e:
        if value.lstrip().startswith(('[', '{', '"')):
            raise argparse.ArgumentTypeError(f'--option {key}: {value!r} is not valid JSON ({e})') from None
        return key, value


def _parser() -> argparse.ArgumentParser:
    from jlearngene.commands.config_args import Parser, parse_override
    p = Parser('jlearngene descend', __doc__)
    p.add_argument('gene', help="gene directory (gene.json + gene.safetensors) or a shipped gene's "
                   'name (jlearngene info lists them)')
    p.add_argument('--out', required=True, help='output model checkpoint directory')
    p.add_argument('--width', type=int, help="descendant width (default: the gene config's)")
    p.add_argument('--depth', type=int, help="descendant depth (default: the gene config's)")
    p.add_argument('--heads', type=_heads, help='attention heads: one count, or one per layer '
                   '(comma-separated) for Cluster-Learngene')
    p.add_argument('--mlp-dim', type=int, help='MLP size (default: scaled with the width)')
    p.add_argument('--set', action='append', type=parse_override, default=[], metavar='FIELD=VALUE',
                   help='override any config field (repeatable), e.g. --set num_classes=100')
    p.add_argument('--option', action='append', type=parse_option, default=[], metavar='KEY=VALUE',
                   help="descend option (repeatable; JSON value), e.g. --option head=new")
    p.add_argument('--seed', type=int, default=0, help='PRNG seed for what is drawn fresh')
    p.add_argument('--to-timm', metavar='FILE', help='also write a timm .safetensors state dict')
    p.add_argument('--overwrite', action='store_true',
                   help='replace existing outputs of the same kind (never other files, nor the gene)')
    return p


def descend_gene_dir(gene_dir: str, *, width=None, depth=None, heads=None, mlp_dim=None,
                     overrides=None, options=None, seed: int = 0):
    """(params, cfg, options, meta): the descendant of the gene directory for a request
    (`artefacts.descendant_config`), computed under `jax.jit`."""
    from jlearngene import artefacts
    method, gene, meta = artefacts.load_gene(gene_dir)   # a folder, or a shipped gene's name
    cfg, opts = _request(method, gene, meta, width=width, depth=depth, heads=heads,
                         mlp_dim=mlp_dim, overrides=overrides, options=options)
    return _descend(method, gene, cfg, opts, seed), cfg, opts, meta


def _request(method, gene, meta, *, options, **request):
    """(target cfg, descend options) of a request: the gene's stored descend options
    overridden by `options`, and `artefacts.descendant_config` (GeneError for a request
    that no config fits)."""
    from jlearngene import artefacts
    opts = {**meta.get('descend_options', {}), **dict(options or {})}
    return artefacts.descendant_config(method, gene, artefacts.base_config(meta), options=opts,
                                       **request)


def _descend(method, gene, cfg, opts, seed: int):
    """The descendant's params, computed under `jax.jit` and fetched to the host."""
    import jax
    run = jax.jit(lambda g, k: method.descend(g, cfg, key=k, **opts))
    return jax.device_get(run(gene, jax.random.key(seed)))


SHAPE_FIELDS = ('width', 'depth', 'num_heads', 'mlp_dim')   # what a descend request sets


def train_overrides(cfg, base) -> str:
    """The `--config.model.FIELD=VALUE` overrides that make a training config's model the
    descendant `cfg`: its shape fields, its head size where it is not width / heads, and
    every other field where it differs from the gene's `base` config."""
    fields = list(SHAPE_FIELDS)
    if cfg.head_dim is not None and cfg.head_dim * cfg.num_heads != cfg.width:
        fields.append('head_dim')
    mine, theirs = cfg.to_dict(), base.to_dict()
    fields += [k for k in mine if k not in fields and k != 'head_dim' and mine[k] != theirs.get(k)]
    return ' '.join(f'--config.model.{k}={mine[k]}' for k in fields)


def main(argv: list[str]) -> int:
    """The command: its outputs are checked first (`artefacts.check_descendant_outputs`,
    naming --overwrite), then the request against the gene on shapes, where a request
    that no config fits is a usage error (status 2, like a malformed flag), then the
    descendant is computed and written."""
    args = _parser().parse_args(argv)
    from jlearngene import artefacts, genes, zoo
    from jlearngene.commands.config_args import UsageError
    gene_dir = zoo.find(args.gene)
    artefacts.check_descendant_outputs(args.out, args.to_timm, gene=gene_dir,
                                       overwrite=args.overwrite, how='--overwrite')
    method, gene, meta = artefacts.load_gene(gene_dir)
    try:
        cfg, opts = _request(method, gene, meta, width=args.width, depth=args.depth,
                             heads=args.heads, mlp_dim=args.mlp_dim, overrides=dict(args.set),
                             options=dict(args.option))
    except genes.GeneError as e:
        raise UsageError(str(e)) from None
    params = _descend(method, gene, cfg, opts, args.seed)
    written = artefacts.write_descendant(args.out, params, cfg, meta=meta, options=opts,
                                         seed=args.seed, overwrite=args.overwrite,
                                         to_timm=args.to_timm)
    label = genes.get(meta['method']).label     # the registry's, not gene.json's 'label' field
    print(f"wrote {written['out']}: {label} descendant, ViT width={cfg.width} depth={cfg.depth} "
          f'heads={cfg.num_heads} head_dim={cfg.head_dim} mlp={cfg.mlp_dim} '
          f'({artefacts.n_params(params) / 1e6:.3f}M params)'
          + (f', options {json.dumps(artefacts.jsonable(opts, "options"))}' if opts else ''))
    print(f'  train from it: jlearngene train --config CONFIG --config.init={written["out"]} '
          f'{train_overrides(cfg, artefacts.base_config(meta))} (CONFIG\'s other model fields '
          f'must be the descendant\'s: `jlearngene info {written["out"]}` shows them all)')
    if written['timm']:
        print(f"wrote {written['timm']}: timm state dict; rebuild with {written['timm_kwargs']}")
    return 0
