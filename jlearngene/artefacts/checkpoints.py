"""Genes and descendants as model checkpoints (`train.checkpoint.save_model`'s artefacts):
the gene directory of a run's saved gene (`save_run_gene`) or of a model (`save_model_gene`),
and a descendant written as a model, optionally also as a timm file (`write_descendant`,
whose outputs `check_descendant_outputs` checks).
"""
from __future__ import annotations

import inspect
import os
from typing import Any
from collections.abc import Mapping

import jax

from jlearngene.artefacts.gene_file import FORMAT, GeneFileError, as_method, jsonable, save_gene
from jlearngene.genes.common import Method
from jlearngene.models.config import ViTConfig


def check_descendant_outputs(out: str | os.PathLike, to_timm: str | None, *, gene: str | None,
                             overwrite: bool, how: str = 'overwrite=True') -> None:
    """A one-line error unless a descendant of a gene directory may be written where asked.

    Each output is new, or with `overwrite` an artefact of the same kind that is not, and does
    not contain, the gene (`train.files.check_replaceable`). Nothing is written.

    Args:
        out: where the descendant's model checkpoint would go.
        to_timm: where its timm `.safetensors` file would go; `None`: no timm file.
        gene: the gene directory read (never replaced); `None`: none.
        overwrite: whether an existing artefact of the same kind may be replaced.
        how: the switch that sets `overwrite`, in words, for the message ('--overwrite' on the
          command line).

    Raises:
        CheckpointError: `out` may not be written as a model.
        ValueError: `to_timm` does not end in `.safetensors`.
        FileExistsError: `to_timm` may not be written.
    """
    from jlearngene.interop.state_dict import check_output
    from jlearngene.train import checkpoint
    checkpoint.check_model_output(out, overwrite=overwrite, inputs=(gene,), how=how)
    if to_timm is not None:
        check_output(to_timm, '--to-timm', 'timm', overwrite, inputs=(gene,), how=how)


def write_descendant(out: str | os.PathLike, params: Any, cfg: ViTConfig, *, meta: Mapping[str, Any],
                     options: Mapping[str, Any], seed: int, overwrite: bool = False,
                     to_timm: str | None = None) -> dict[str, Any]:
    """Save a descendant as a model artefact, and optionally as a timm file.

    The model is written by `jlearngene.train.checkpoint.save_model` (what `jlearngene train
    --config.init=OUT` and every other command load); the timm `.safetensors` state dict's
    header holds the jlearngene config, timm class and constructor arguments, as `jlearngene
    convert --to-timm` writes. Outputs that may not be written (`check_descendant_outputs`) and
    parameters that are not finite floats are refused, and the timm conversion runs, before
    anything is written.

    Args:
        out: where the model checkpoint goes.
        params: the descendant's parameters.
        cfg: the descendant's config.
        meta: the gene's checked `gene.json` (`read_meta`); its 'path' and 'method' go into the
          checkpoint's provenance.
        options: the descend options used, stored in the provenance (JSON-able).
        seed: the seed the descendant was made with, stored in the provenance.
        overwrite: whether existing artefacts of the same kind may be replaced.
        to_timm: a `.safetensors` path for the timm state dict; `None`: none written.

    Returns:
        A dict of 'out' (the model's absolute path), 'timm' (the timm file's absolute path, or
        `None`) and 'timm_kwargs' (timm's constructor arguments, or `None`).

    Raises:
        CheckpointError: `out` may not be written as a model.
        ValueError: `to_timm` does not end in `.safetensors`.
        FileExistsError: `to_timm` may not be written.
        StateDictError: a parameter is not a finite float, or (with `to_timm`) blocks differ in
          shape or do not fit `cfg`.
        ConfigError: (with `to_timm`) timm cannot hold `cfg`.
        GeneFileError: `options` is not JSON-able.
    """
    from jlearngene.interop import timm as T
    from jlearngene.interop.state_dict import check_values
    from jlearngene.train import checkpoint
    result: dict[str, Any] = {'out': os.path.abspath(os.fspath(out)), 'timm': None, 'timm_kwargs': None}
    inputs = (meta.get('path'),)
    check_descendant_outputs(out, to_timm, gene=meta.get('path'), overwrite=overwrite)
    check_values(params, f"the descendant of gene {meta.get('path') or meta.get('method')!r}")
    sd = None
    if to_timm is not None:
        sd = T.to_timm(params, cfg)
        result['timm_kwargs'] = T.timm_kwargs(cfg)
    extra = {'source': {'format': FORMAT, 'gene': meta.get('path'), 'method': meta.get('method'),
                        'options': jsonable(dict(options), 'options'), 'seed': int(seed)}}
    checkpoint.save_model(result['out'], params, cfg, extra=extra, overwrite=overwrite, inputs=inputs)
    if sd is not None:
        result['timm'] = os.path.abspath(T.save_model_safetensors(sd, to_timm, cfg, result['timm_kwargs']))
    return result


def save_run_gene(checkpoint_dir: str | os.PathLike, out: str | os.PathLike, *,
                  overwrite: bool = False) -> str:
    """A gene that an experiment run saved as a model checkpoint, written as a gene directory.

    Args:
        checkpoint_dir: the run's saved gene (`workdir/genes/NAME/seed_S`: the gene tree, its
          Aux-Net config, `extra['method']` and `extra['options']`).
        out: the gene directory to write; the checkpoint's extra goes into its provenance.
        overwrite: whether an existing gene directory at `out` may be replaced.

    Returns:
        The gene directory's absolute path.

    Raises:
        CheckpointError: `checkpoint_dir` is not a readable model checkpoint.
        GeneFileError: the checkpoint's metadata names no method, or `save_gene` refuses the
          gene or `out`.
        GeneError: the named method is not registered.
    """
    from jlearngene.train import checkpoint
    src = os.path.abspath(os.fspath(checkpoint_dir))
    gene, cfg, extra = checkpoint.load_model(src)
    name = extra.get('method')
    if name is None:
        raise GeneFileError(f"{src}: the checkpoint's metadata names no method (extra['method']); "
                            'use jlearngene gene --method NAME --from-model for a model')
    return save_gene(out, name, gene, configs={} if cfg is None else {'source': cfg},
                     gene_options=extra.get('options') or {},
                     provenance={'from': src, 'checkpoint_extra': extra}, overwrite=overwrite,
                     inputs=(src,))


def save_model_gene(checkpoint_dir: str | os.PathLike, method: str | Method,
                    out: str | os.PathLike, *, options: Mapping[str, Any] | None = None,
                    target: ViTConfig | None = None, overwrite: bool = False) -> str:
    """The gene of a method of source 'model' taken from a model checkpoint.

    The gene is `method.gene_from_model(params, cfg, **options)`, with `large_cfg=target`
    for methods that grow into one target (Mango, LiGO).

    Args:
        checkpoint_dir: a model checkpoint (e.g. one that `jlearngene convert --from-timm`
          wrote) that stores its config.
        method: a registered name or a `Method` whose gene comes from a model.
        out: the gene directory to write.
        options: keyword options of `gene_from_model`; `None`: none.
        target: the target config of a method that grows into one; `None`: none.
        overwrite: whether an existing gene directory at `out` may be replaced.

    Returns:
        The gene directory's absolute path.

    Raises:
        GeneFileError: the method does not take its gene from a model; the checkpoint holds a
          run's saved gene or stores no config; a `target` is given for a method that takes
          none; or `save_gene` refuses the gene or `out`.
        GeneError: `method` is not registered, or `options` names one `gene_from_model` does
          not take.
        CheckpointError: `checkpoint_dir` is not a readable model checkpoint.
    """
    from jlearngene.train import checkpoint
    m = as_method(method)
    if m.gene_from_model is None:
        raise GeneFileError(f'{m.label} (source {m.source!r}) does not take its gene from a model; '
                            'save a learned gene with artefacts.save_gene')
    opts = dict(options or {})
    m.check_options(opts, 'gene_from_model', '--option')
    src = os.path.abspath(os.fspath(checkpoint_dir))
    params, cfg, extra = checkpoint.load_model(src)
    if extra.get('method') is not None:
        raise GeneFileError(f"{src}: holds a run's saved gene of method {extra['method']!r}, not a "
                            f'model to take a {m.label} gene from; write it with jlearngene gene '
                            f'--from-run {src}')
    if cfg is None:
        raise GeneFileError(f'{src}: the model checkpoint stores no config')
    if target is not None:
        if 'large_cfg' not in inspect.signature(m.gene_from_model).parameters:
            raise GeneFileError(f'{m.label} makes descendants of any target; it takes no target config')
        opts['large_cfg'] = target
    gene = m.gene_from_model(params, cfg, **opts)
    configs_ = {'source': cfg, **({'target': target} if target is not None else {})}
    return save_gene(out, m, jax.device_get(gene), configs=configs_,
                     gene_options={k: v for k, v in opts.items() if k != 'large_cfg'},
                     provenance={'from': src}, overwrite=overwrite, inputs=(src,))
