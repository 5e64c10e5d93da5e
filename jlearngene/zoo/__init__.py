"""Genes that ship inside the package: one gene directory per name under this folder
(`gene.json` + `gene.safetensors`, `jlearngene.artefacts`), found from a wheel as from a
checkout. `jlearngene descend NAME`, `jlearngene info NAME` and `jlearngene demo` take them
by name; `jlearngene info` with no argument lists them.

Each was made by this project's own command (`python -m jlearngene.zoo.make NAME`): trained
again from its recorded study, or (a transfer study's gene) taken from that finished study.
Its `gene.json` records that command, the commit, the data, the seed, its Aux-Net's test
accuracy, the recorded study it comes from and, for a transfer study's gene, the source
model it learned from (`provenance`).
"""
from __future__ import annotations

import os

from jlearngene import artefacts

ROOT = os.path.dirname(os.path.abspath(__file__))


def names() -> tuple[str, ...]:
    """The shipped genes' names."""
    return tuple(sorted(d for d in os.listdir(ROOT)
                        if os.path.isfile(os.path.join(ROOT, d, artefacts.META_FILE))))


def path(name: str) -> str:
    """The gene directory of the shipped gene `name` (a one-line ValueError for another)."""
    if name not in names():
        raise ValueError(f'no shipped gene {name!r}; shipped: {", ".join(names()) or "none"}')
    return os.path.join(ROOT, name)


def find(spec: str) -> str:
    """`spec` itself when it exists (a gene directory on disk), else the shipped gene of
    that name; an unknown name is a one-line ValueError naming the shipped ones."""
    if os.path.exists(spec) or os.sep in spec or '/' in spec:
        return spec
    if spec in names():
        return path(spec)
    raise ValueError(f'{spec!r} is neither a gene directory nor a shipped gene (shipped: '
                     f'{", ".join(names()) or "none"})')


def listing() -> str:
    """One line per shipped gene: name, method, stored parameters, Aux-Net, its accuracy (and a
    transfer study's gene's source model)."""
    lines = []
    for name in names():
        meta = artefacts.read_meta(path(name))
        src = artefacts.configs(meta).get('source')
        prov = meta['provenance']
        aux = f"Aux-Net width {src.width}, depth {src.depth}" if src else 'no Aux-Net'
        acc = prov.get('aux_test_accuracy')
        model = prov.get('source_model')     # a transfer study's gene: the model it learned from
        teacher = (f"; source model w{model['shape'][0]} L{model['shape'][1]}, test accuracy "
                   f"{model['test_accuracy']:.4f}" if model else '')
        lines.append(f"  {name:<14} {meta['label']} gene, {meta['params']['stored']:,} parameters; "
                     f"{aux}" + (f", test accuracy {acc:.4f}" if acc is not None else '') + teacher
                     + f"; data {prov.get('data', {}).get('name', '?')}")
    return '\n'.join(lines)
