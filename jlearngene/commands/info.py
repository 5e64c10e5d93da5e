"""`jlearngene info`: parameter table of named variants, of one config, of an experiment
config file (`file.py[:arg]`), of a checkpoint (a model artefact, a run checkpoint
step directory, or a training workdir), or of a gene directory (`jlearngene.artefacts`:
its method, configs, stored parameters and the widths and depths of the descendants it
makes, tried on shapes)."""
from __future__ import annotations

import argparse

import jax

from jlearngene import pytree
from jlearngene.commands.config_args import parse_override
from jlearngene.models import VARIANTS, init, vit_config

HELP = 'parameter table of variants, a config file (.py[:arg]), a checkpoint/workdir or a gene'


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


def leaf_table(shapes, title: str = '') -> str:
    """Markdown table of every leaf (path, shape, dtype, count) plus group totals."""
    flat = pytree.flatten(shapes)
    rows = [title, '', '| parameter | shape | dtype | count |', '|---|---|---|---|'] if title else \
        ['| parameter | shape | dtype | count |', '|---|---|---|---|']
    for path, x in flat.items():
        rows.append(f'| {path} | {tuple(x.shape)} | {x.dtype} | {pytree.size(x):,} |')
    counts = pytree.count_params(shapes)
    rows.append('')
    rows.append('totals: ' + ', '.join(f'{k} {v:,}' for k, v in counts.items()))
    return '\n'.join(rows)


def _config_file_table(spec: str) -> str:
    import importlib.util
    path, _, arg = spec.partition(':')
    mod_spec = importlib.util.spec_from_file_location('_jlg_config', path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    config = module.get_config(arg or None)
    from jlearngene.train.tasks import model_config
    return param_table({f'{path}{":" + arg if arg else ""}': model_config(config.model)})


def _checkpoint_table(path: str) -> str:
    import os

    from jlearngene.train import checkpoint
    if os.path.isdir(os.path.join(path, 'checkpoints')) or os.path.isdir(os.path.join(path, 'model')):
        model = os.path.join(path, 'model')
        if os.path.isdir(model):
            path = model
        else:
            with checkpoint.RunCheckpointer(os.path.join(path, 'checkpoints')) as ck:
                step = ck.latest_step()
            if step is None:
                raise checkpoint.CheckpointError(f'{path!r} has no checkpoints yet')
            path = os.path.join(path, 'checkpoints', str(step))
    parent, step = os.path.split(os.path.abspath(path))
    if step.isdigit() and not os.path.isdir(os.path.join(path, 'params')):
        with checkpoint.RunCheckpointer(parent) as ck:
            meta = ck.metadata(int(step))
            shapes = ck.array_shapes(int(step)).get('params', {})
        cfg = meta.get('model_config')
        title = f'run checkpoint {path} (step {meta["step"]})' + (f'\nmodel config: {cfg}' if cfg else '')
        return leaf_table(shapes, title)
    meta = checkpoint.model_metadata(path)
    shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta['arrays'])
    title = (f"model {path} ({meta['layout']} layout)\nmodel config: {meta['config']}"
             + (f"\nextra: {meta['extra']}" if meta.get('extra') else ''))
    return leaf_table(shapes, title)


def _gene_table(path: str) -> str:
    """A gene directory: `artefacts.describe` and its leaf table (from gene.json; the
    safetensors header is checked against it)."""
    from jlearngene import artefacts
    meta = artefacts.read_meta(path)
    artefacts.check_arrays(meta)
    return leaf_table(artefacts.gene_shapes(meta), artefacts.describe(meta)) if meta['arrays'] \
        else artefacts.describe(meta)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='jlearngene info', description=__doc__)
    parser.add_argument('variant', nargs='?', help="variant name ('S', 'B/16'; all if omitted), a config "
                        'file (file.py[:arg]), a checkpoint directory, a training workdir or a gene '
                        'directory')
    parser.add_argument('--set', action='append', type=parse_override, default=[], metavar='FIELD=VALUE',
                        help='override a config field (repeatable), e.g. --set depth=6')
    args = parser.parse_args(argv)
    overrides = dict(args.set)
    import os
    target = args.variant or ''
    if target.partition(':')[0].endswith('.py'):
        print(_config_file_table(target))
        return 0
    if target and os.path.isdir(target) and any(
            os.path.exists(os.path.join(target, f)) for f in ('gene.json', 'gene.safetensors')):
        print(_gene_table(target))
        return 0
    if target and os.path.isdir(target):
        from jlearngene.train.checkpoint import CheckpointError
        try:
            print(_checkpoint_table(target))
        except CheckpointError as e:
            print(f'jlearngene info: {e}')
            return 1
        return 0
    names = [args.variant] if args.variant else list(VARIANTS)
    print(param_table({n: vit_config(n, **overrides) for n in names}))
    return 0
