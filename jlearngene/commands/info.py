"""`jlearngene info`: parameter table of named variants or of one config."""
from __future__ import annotations

import argparse

import jax

from jlearngene import pytree
from jlearngene.models import VARIANTS, init, vit_config

HELP = 'parameter table of the named variants, or of one variant with overrides'


def param_table(cfgs: dict) -> str:
    """Markdown table: shape and parameter counts (from `jax.eval_shape`, nothing allocated)."""
    rows = ['| model | width | depth | heads | mlp | patch | image | classes | params (M) | blocks (M) |',
            '|---|---|---|---|---|---|---|---|---|---|']
    for name, cfg in cfgs.items():
        shapes = jax.eval_shape(lambda c=cfg: init(c, jax.random.key(0)))
        c = pytree.count_params(shapes)
        rows.append(f'| {name} | {cfg.width} | {cfg.depth} | {cfg.num_heads} | {cfg.mlp_dim} | '
                    f'{cfg.patch_size} | {cfg.image_size} | {cfg.num_classes} | '
                    f"{c['total'] / 1e6:.2f} | {c['blocks'] / 1e6:.2f} |")
    return '\n'.join(rows)


def _parse_override(text: str):
    key, sep, value = text.partition('=')
    if not sep:
        raise argparse.ArgumentTypeError(f'override {text!r} is not of the form field=value')
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, {'true': True, 'false': False}.get(value.lower(), value)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='jlearngene info', description=__doc__)
    parser.add_argument('variant', nargs='?', help="variant name, e.g. 'S' or 'B/16'; all if omitted")
    parser.add_argument('--set', action='append', type=_parse_override, default=[], metavar='FIELD=VALUE',
                        help='override a config field (repeatable), e.g. --set depth=6')
    args = parser.parse_args(argv)
    overrides = dict(args.set)
    names = [args.variant] if args.variant else list(VARIANTS)
    print(param_table({n: vit_config(n, **overrides) for n in names}))
    return 0
