r"""`jlearngene gene --out GENE (--from-run CKPT | --method NAME --from-model CKPT)`: write a
gene directory (`jlearngene.artefacts`) that `jlearngene descend` and `info` read.

  jlearngene gene --from-run runs/tleg/genes/tleg/seed_0 --out genes/tleg
  jlearngene gene --method cluster --from-model ckpt/deit_ti --out genes/cluster \
      --option 'clusters=[[0, 2], [1], ...]'
  jlearngene gene --method mango --from-model ckpt/small --out genes/mango \
      --target-set width=384 --target-set num_heads=6 --target-set mlp_dim=1536

`--from-run` reads a gene that an experiment run saved as a model checkpoint
(`workdir/genes/NAME/seed_S`: the gene, its Aux-Net config and method). `--from-model` takes the
gene of a method of source 'model' (He-LG, Auto-LG, Pre-Fin, Cluster-Learngene, IMwLM, the
growth methods, Mango) from a model checkpoint, e.g. one `jlearngene convert --from-timm`
wrote; `--option KEY=VALUE` (JSON value) passes gene options, and `--target-set
FIELD=VALUE` makes the one target config that Mango and LiGO operators are drawn for (the
source config with those fields changed).
"""
from __future__ import annotations

import argparse
import glob
import os

HELP = 'write a gene directory from a run\'s saved gene or from a model checkpoint'


def _parser() -> argparse.ArgumentParser:
    from jlearngene.commands.config_args import Parser, parse_override
    from jlearngene.commands.descend import parse_option
    p = Parser('jlearngene gene', __doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument('--from-run', metavar='CKPT', help="a run's saved gene (workdir/genes/NAME/seed_S)")
    src.add_argument('--from-model', metavar='CKPT', help='a model checkpoint (with --method)')
    p.add_argument('--method', help="registered method name for --from-model ('cluster', 'he_lg', ...)")
    p.add_argument('--out', required=True, help='output gene directory')
    p.add_argument('--option', action='append', type=parse_option, default=[], metavar='KEY=VALUE',
                   help='gene option for --from-model (repeatable; JSON value)')
    p.add_argument('--target-set', action='append', type=parse_override, default=[],
                   metavar='FIELD=VALUE', help='--from-model: the target config for Mango/LiGO')
    p.add_argument('--overwrite', action='store_true',
                   help='replace an existing gene directory (never another folder, nor the input)')
    return p


def _model_method(args):
    """The `Method` that --method names for --from-model, after what the command line alone
    decides, as a UsageError (status 2) before anything is read: --method is given and names
    a method that takes its gene from a model, which takes every --option, and --target-set
    is given exactly where the method draws its operator for one target config (Mango, LiGO;
    their Python argument `large_cfg`, unless a trained operator is passed)."""
    import inspect

    from jlearngene import genes
    from jlearngene.commands.config_args import UsageError
    from jlearngene.commands.convert import check_fields
    if not args.method:
        raise UsageError('--from-model needs --method NAME')
    from_model = [n for n in genes.names() if genes.get(n).gene_from_model is not None]
    if args.method not in genes.names():
        raise UsageError(f'--method {args.method!r}: no such method; those that take their gene '
                         f"from a model: {', '.join(from_model)}")
    m, options = genes.get(args.method), dict(args.option)
    if m.gene_from_model is None:
        raise UsageError(f'--method {args.method}: {m.label} (source {m.source!r}) does not take its '
                         f"gene from a model (those that do: {', '.join(from_model)}); a study saves "
                         f'its learned gene as WORKDIR/genes/{m.name}/seed_S, which --from-run reads')
    try:
        m.check_options(options, 'gene_from_model', '--option')
    except genes.GeneError as e:
        raise UsageError(str(e)) from None
    takes_target = 'large_cfg' in inspect.signature(m.gene_from_model).parameters
    if 'large_cfg' in options:
        raise UsageError('--option large_cfg: give the target config with --target-set FIELD=VALUE')
    if args.target_set and not takes_target:
        raise UsageError(f'--target-set: {m.label} makes descendants of any target; it takes no '
                         'target config')
    if takes_target and not args.target_set and 'operator' not in options:
        raise UsageError(f'--method {args.method}: {m.label} draws its operator for one target '
                         'config; give it with --target-set FIELD=VALUE (the source config with '
                         'those fields changed, e.g. --target-set width=384 --target-set num_heads=6)')
    check_fields(args.target_set, '--target-set')
    return m


def _seed_key(path: str):
    """Sorts 'genes/tleg/seed_10' after 'genes/tleg/seed_2'."""
    head, _, seed = path.rpartition('_')
    return (head, int(seed) if seed.isdigit() else -1, path)


def _holds_run_genes(path: str) -> str | None:
    """Why `path`, given as --from-run, is a folder that holds a run's saved genes rather than
    one (a study's workdir, its genes/ folder or one method's folder there: the genes are
    `genes/METHOD/seed_S`), naming those found; None for any other path, and for a
    checkpoint, complete or not (the checkpoint reader says what is wrong with it)."""
    full = os.path.abspath(path)
    if not os.path.isdir(full) or any(os.path.exists(os.path.join(full, f)) for f in
                                      ('commit_success.txt', '_CHECKPOINT_METADATA', 'params')):
        return None   # a checkpoint, perhaps incomplete
    if any(os.path.exists(os.path.join(full, f)) for f in ('study.json', 'runs', 'genes')):
        what, pattern = "a study's workdir", os.path.join('genes', '*', 'seed_*')
    elif os.path.basename(full) == 'genes':
        what, pattern = "a study's genes/ folder", os.path.join('*', 'seed_*')
    elif os.path.basename(os.path.dirname(full)) == 'genes':
        what, pattern = f"the folder of a study's {os.path.basename(full)!r} genes", 'seed_*'
    else:
        return None
    found = sorted((os.path.relpath(p, full) for p in glob.glob(os.path.join(full, pattern))
                    if os.path.isdir(p)), key=_seed_key)
    if not found:
        return (f'--from-run {path!r} is {what}, not a saved gene, and holds none (a study saves '
                "each seed's learned gene as genes/METHOD/seed_S)")
    shown = ', '.join(found[:6]) + (f', ... ({len(found)} in all)' if len(found) > 6 else '')
    return (f'--from-run {path!r} is {what}, not a saved gene; the genes in it: {shown} '
            f'(e.g. --from-run {os.path.join(path, found[0])})')


def main(argv: list[str]) -> int:
    """The command: checks the flags first (a UsageError, status 2: `_model_method`), then
    --out (`artefacts.check_gene_output`), then writes the gene directory from the run's saved
    gene (`artefacts.save_run_gene`; a folder that holds saved genes is named as such,
    `_holds_run_genes`) or from the model checkpoint (`artefacts.save_model_gene`, with the
    target config --target-set makes) and prints its description; exit status 0.

    Raises:
        UsageError: --method, --option or --target-set with --from-run; a --from-model
            request that `_model_method` refuses.
        ValueError: --from-run names a folder of saved genes, not one; --target-set for a
            model checkpoint that stores no config.
    """
    from jlearngene.commands.config_args import UsageError
    args = _parser().parse_args(argv)
    if args.from_run:
        if args.method or args.option or args.target_set:
            raise UsageError('--method/--option/--target-set apply to --from-model only; a run '
                             "records its gene's method and options")
    else:
        method = _model_method(args)
    from jlearngene import artefacts
    artefacts.check_gene_output(args.out, overwrite=args.overwrite, how='--overwrite',
                                inputs=(args.from_run or args.from_model,))
    if args.from_run:
        folder = _holds_run_genes(args.from_run)
        if folder:
            raise ValueError(folder)
        path = artefacts.save_run_gene(args.from_run, args.out, overwrite=args.overwrite)
    else:
        target = None
        if args.target_set:
            from jlearngene.train.checkpoint import model_metadata
            from jlearngene.models.config import ViTConfig
            cfg = model_metadata(args.from_model)['config']
            if cfg is None:
                raise ValueError(f'{args.from_model}: the model checkpoint stores no config')
            target = ViTConfig.from_dict(cfg).replace(**dict(args.target_set))
        path = artefacts.save_model_gene(args.from_model, method, args.out,
                                         options=dict(args.option), target=target,
                                         overwrite=args.overwrite)
    print(artefacts.describe(artefacts.read_meta(path), probe=False))
    return 0
