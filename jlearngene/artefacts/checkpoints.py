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
    """A one-line error unless a descendant of the gene directory `gene` may be written as
    the model `out` and, when given, the timm file `to_timm`: each is new, or with
    `overwrite` an artefact of the same kind that is not, and does not contain, the gene
    (`train.files.check_replaceable`); `how` names the switch in the message
    ('--overwrite' on the command line)."""
    from jlearngene.interop.state_dict import check_output
    from jlearngene.train import checkpoint
    checkpoint.check_model_output(out, overwrite=overwrite, inputs=(gene,), how=how)
    if to_timm is not None:
        check_output(to_timm, '--to-timm', 'timm', overwrite, inputs=(gene,), how=how)


def write_descendant(out: str | os.PathLike, params: Any, cfg: ViTConfig, *, meta: Mapping[str, Any],
                     options: Mapping[str, Any], seed: int, overwrite: bool = False,
                     to_timm: str | None = None) -> dict[str, Any]:
    """Save a descendant as the model artefact `out` (`jlearngene.train.checkpoint.save_model`,
    what `jlearngene train --config.init=OUT` and every other command load), and with
    `to_timm` also as a timm `.safetensors` state dict (header: the jlearngene config, timm
    class and constructor arguments, as `jlearngene convert --to-timm` writes). Parameters
    that are not finite floats are refused, and the timm conversion runs, before anything
    is written; so are outputs that may not be written (`check_descendant_outputs`).
    Returns {'out', 'timm', 'timm_kwargs'}."""
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
    """A gene that an experiment run saved as a model checkpoint (`workdir/genes/NAME/seed_S`:
    the gene tree, its Aux-Net config, `extra['method']` and `extra['options']`) written as
    the gene directory `out`; the checkpoint's extra goes into the provenance."""
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
    """The gene of a method of source 'model' taken from a model checkpoint (e.g. one that
    `jlearngene convert --from-timm` wrote): `method.gene_from_model(params, cfg,
    **options)`, with `large_cfg=target` for methods that grow into one target (Mango,
    LiGO), written as the gene directory `out`."""
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
