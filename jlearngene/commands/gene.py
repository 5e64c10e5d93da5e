"""`jlearngene gene --out GENE (--from-run CKPT | --method NAME --from-model CKPT)`: write a
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


def main(argv: list[str]) -> int:
    """The command: checks --out first (`artefacts.check_gene_output`), writes the gene
    directory from the run's saved gene (`artefacts.save_run_gene`) or from the model
    checkpoint (`artefacts.save_model_gene`, with the target config --target-set makes) and
    prints its description; exit status 0.

    Raises:
        ValueError: --method, --option or --target-set with --from-run; --from-model without
            --method; --target-set for a model checkpoint that stores no config.
    """
    args = _parser().parse_args(argv)
    from jlearngene import artefacts
    artefacts.check_gene_output(args.out, overwrite=args.overwrite, how='--overwrite',
                                inputs=(args.from_run or args.from_model,))
    if args.from_run:
        if args.method or args.option or args.target_set:
            raise ValueError('--method/--option/--target-set apply to --from-model only; a run '
                             "records its gene's method and options")
        path = artefacts.save_run_gene(args.from_run, args.out, overwrite=args.overwrite)
    else:
        if not args.method:
            raise ValueError('--from-model needs --method NAME')
        target = None
        if args.target_set:
            from jlearngene.train.checkpoint import model_metadata
            from jlearngene.models.config import ViTConfig
            cfg = model_metadata(args.from_model)['config']
            if cfg is None:
                raise ValueError(f'{args.from_model}: the model checkpoint stores no config')
            target = ViTConfig.from_dict(cfg).replace(**dict(args.target_set))
        path = artefacts.save_model_gene(args.from_model, args.method, args.out,
                                         options=dict(args.option), target=target,
                                         overwrite=args.overwrite)
    print(artefacts.describe(artefacts.read_meta(path), probe=False))
    return 0
