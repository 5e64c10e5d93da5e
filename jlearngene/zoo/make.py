r"""Train a shipped gene again: `python -m jlearngene.zoo.make NAME [--workdir DIR] [--out DIR]`.

    python -m jlearngene.zoo.make letra_digits --workdir workdirs/zoo   # 11-13 minutes on a busy 2-core machine

A shipped gene is one seed's gene of a recorded study, made as that study made it: the
teacher is the study's Scratch run at the reference shape (the recorded lr and steps of that
seed), and the gene trains inside its Aux-Net by soft distillation for the study's fraction of
the recorded S_ref (`experiments.harness.fit` and `distil`, the study's own runs and names).
The recorded choices are read from the study's `results.json` in the source tree (not in the
wheel: run this from a checkout), and the numbers `jlearngene demo` shows beside the gene's
descendants (Scratch's tuned lr, its converged accuracy ± std and S at every shape) are
copied from it into the gene's `gene.json` (`provenance.record`), with the commit of that
file. The gene directory is written to jlearngene/zoo/NAME unless `--out` says otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import jax

from jlearngene import artefacts, genes
from jlearngene.experiments import configs, harness
from jlearngene.experiments.results import shape_key
from jlearngene.models import init
from jlearngene.train import checkpoint, tasks
from jlearngene.zoo import ROOT

CHECKOUT = os.path.dirname(os.path.dirname(ROOT))

# name -> the recorded study (its bundled config and results.json), its method and seed. A
# gene of a transfer study ('from': 'study') is taken from that study's finished workdir
# (`from_study`); the others are trained again from their record (`make`).
GENES = {
    'letra_digits': dict(config='letra:digits', method='letra', seed=0,
                         results='experiments/letra/results.json',
                         readme='experiments/letra/README.md'),
    'tleg_fashion': {'from': 'study', 'config': 'tleg:fashion', 'method': 'tleg', 'seed': 0,
                     'results': 'experiments/tleg/fashion/results.json'},
    'letra_fashion': {'from': 'study', 'config': 'letra:fashion', 'method': 'letra', 'seed': 0,
                      'results': 'experiments/letra/fashion/results.json'},
}
# what a shipped gene may weigh on disk (gene.json and its arrays)
MAX_BYTES = 1_000_000

# config fields the recorded run and the bundled config must agree on
_SAME = ('model', 'data', 'optim', 'batch_size', 'depth', 'mlp_ratio')


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(['git', '-C', CHECKOUT, *args], capture_output=True, text=True,
                             timeout=30)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit() -> dict:
    """The checkout's commit and whether its tree differs from it (None outside git)."""
    head = _git('rev-parse', 'HEAD')
    status = _git('status', '--porcelain', '--untracked-files=no')
    return {'commit': head, 'dirty': None if status is None else bool(status)}


def study_record(results_file: str, readme: str | None = None) -> dict:
    """What a shipped gene keeps of its recorded study: per shape Scratch's tuned lr,
    converged accuracy (mean ± std over the seeds), S and steps; the descendants' budget
    (fraction of S, lr, evaluations); the reference S; the recorded Aux-Net accuracy per
    seed; the file, the commit that last changed it and the code commit its README names."""
    with open(results_file, encoding='utf-8') as f:
        res = json.load(f)
    cfg = res['config']
    rel = os.path.relpath(os.path.abspath(results_file), CHECKOUT)
    code = None
    if readme and os.path.isfile(readme):
        with open(readme, encoding='utf-8') as f:
            found = re.search(r'the code of\s+commit\s+([0-9a-f]{7,40})', f.read())
        code = found.group(1) if found else None
    aux = {s: v for s, info in res.get('info', {}).items() for k, v in info.items()
           if k.startswith('aux_') and k.endswith('_accuracy')}
    return {
        'study': cfg['experiment'], 'file': rel, 'file_commit': _git('log', '-1', '--format=%H', '--', rel),
        'code_commit': code, 'seeds': res['seeds'], 'reference': res['reference'],
        'aux_accuracy': aux,
        'scratch': {k: {f: v[f] for f in ('lr', 'acc', 'std', 'S', 'steps', 'converged')}
                    for k, v in res['scratch'].items()},
        'descend': {'lr': cfg['descend']['lr'], 'fraction': max(cfg['descend']['fractions']),
                    'evals': cfg['descend']['evals']},
        'runs': {f"{shape_key(r['shape'])}_s{r['seed']}": {'lr': r['lr'], 'steps': r['steps']}
                 for r in res['rows'] if r['method'] == 'scratch'},
        'config': {k: cfg[k] for k in _SAME + ('aux', 'scratch')},
    }


def _check_config(config, record: dict) -> None:
    for k in _SAME:
        now, then = harness.plain(config[k]), record['config'][k]
        if json.loads(json.dumps(now)) != then:
            raise ValueError(f'zoo.make: the bundled config\'s {k} {now} is not the recorded '
                             f"study's {then} ({record['file']}); record the study again first")
    for k in ('fraction', 'tau', 'alpha'):
        if float(config['aux'][k]) != float(record['config']['aux'][k]):
            raise ValueError(f"zoo.make: aux.{k} differs from the recorded study's")


def _check_options(options: dict, record: dict) -> None:
    # an older record keeps the learngene's sizes in its aux section
    for k, v in options.items():
        if record['config']['aux'].get(k, v) != v:
            raise ValueError(f"zoo.make: gene option {k}={v} is not the recorded study's "
                             f"{record['config']['aux'][k]}")


def make(name: str, workdir: str, out: str | None = None, *, command: str | None = None) -> str:
    """Train the shipped gene `name` (`GENES`) in `workdir` and write its gene directory to
    `out` (default jlearngene/zoo/NAME); returns the directory."""
    if name not in GENES:
        raise ValueError(f'zoo.make: no recipe for {name!r}; known: {", ".join(GENES)}')
    spec = GENES[name]
    if spec.get('from') == 'study':
        raise ValueError(f'zoo.make: {name!r} is taken from its finished study (from_study), not trained here')
    t0 = time.perf_counter()
    source = commit()
    results_file = os.path.join(CHECKOUT, spec['results'])
    if not os.path.isfile(results_file):
        raise FileNotFoundError(f'zoo.make: {results_file} is missing: run this from a checkout')
    record = study_record(results_file, os.path.join(CHECKOUT, spec['readme']))
    config = harness.plain(configs.load(spec['config']))
    _check_config(config, record)
    seed, method = int(spec['seed']), genes.get(spec['method'])
    dset = harness.Data(config)
    ref = harness.reference_config(config, dset.num_classes)
    ref_shape = (ref.width, ref.depth)
    # the teacher: the study's Scratch run of this seed at the reference shape
    t_cfg = harness.shape_configs(config, ref_shape, dset.num_classes)[0]
    run = record['runs'][f'{shape_key(ref_shape)}_s{seed}']
    base = int(config['scratch']['steps'])
    suffix = '' if run['steps'] == base else f"_n{run['steps']}"
    teacher, curve, _ = harness.fit(
        f"scratch_{shape_key(ref_shape)}_lr{run['lr']:g}_s{seed}{suffix}",
        tasks.classification_loss(t_cfg), init(t_cfg, jax.random.key(seed)), harness.eval_fn(t_cfg),
        dset, steps=int(run['steps']), lr=float(run['lr']), optim=config['optim'], workdir=workdir,
        seed=seed, eval_every=int(config['scratch']['eval_every']), identity=config)
    print(f'teacher {shape_key(ref_shape)}: {curve[-1][1]:.4f} after {run["steps"]} steps', file=sys.stderr)
    # the gene: its Aux-Net distilled from the teacher, as the study's aux recipe does
    options = dict(config['method_options'][method.name]['gene'])
    _check_options(options, record)
    steps = harness.fraction_steps(float(config['aux']['fraction']), int(record['reference']['S']))
    gene, acc, _ = harness.distil(
        f'aux_{method.name}_s{seed}', lambda g: method.materialize(g, None, ref),
        method.init_gene(ref, jax.random.key(seed + 1), **options), teacher, t_cfg, ref, dset,
        steps=steps, tau=float(config['aux']['tau']), alpha=float(config['aux']['alpha']),
        optim=config['optim'], seed=seed + 1, workdir=workdir, identity=config,
        decay=method.trainable_decay)
    print(f'aux-net {method.name}: {acc:.4f} after {steps} steps', file=sys.stderr)
    provenance = {
        'command': command or f'python -m jlearngene.zoo.make {name} --workdir {workdir}',
        **source, 'seed': seed, 'aux_test_accuracy': acc,
        'data': {'name': config['data']['name'], 'splits': config['data']['splits'],
                 'train_examples': dset.num_examples, 'augment': config['data'].get('augment'),
                 'about': "scikit-learn's bundled handwritten digits at 16 px (one channel)"},
        'study': spec['config'],
        'teacher': {'shape': list(ref_shape), 'lr': run['lr'], 'steps': run['steps'],
                    'test_accuracy': curve[-1][1]},
        'aux': {'steps': steps, 'fraction_of_S_ref': config['aux']['fraction'],
                'S_ref': record['reference']['S'], 'tau': config['aux']['tau'],
                'alpha': config['aux']['alpha'], 'gene_options': options},
        'record': {k: v for k, v in record.items() if k not in ('runs', 'config')},
        'software': {'jax': jax.__version__, 'backend': jax.default_backend(),
                     'device': jax.devices()[0].device_kind},
        'seconds': round(time.perf_counter() - t0, 1),
    }
    return artefacts.save_gene(out or os.path.join(ROOT, name), method, jax.device_get(gene),
                               configs={'source': ref}, gene_options=options,
                               provenance=provenance, overwrite=True)


def _sha256(path: str) -> str:
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def transfer_record(results: dict, seed: int) -> dict:
    """What a gene of a transfer study keeps of its record: the source model of `seed` (its
    shape, classes, lr, steps, test accuracy and doubling chain), and per label budget
    Scratch's converged accuracy (mean ± std over the seeds), lr and steps at every shape.

    Args:
        results: a transfer study's record (`results.json`, with `budgets`).
        seed: the source seed the gene comes from.

    Returns:
        A dict with 'source_model', 'descendant_classes' and 'label_budgets'.

    Raises:
        ValueError: the record predates convergence by doubling.
    """
    first = next(iter(results['budgets'].values()))
    a = first['ancestor']
    if 'doubling' not in a:
        raise ValueError('zoo.make: the record predates convergence by doubling (its source model has '
                         'no doubling chain): run the study again')
    ref = first['reference']
    return {
        'source_model': {'shape': [ref['width'], ref['depth']], 'classes': a['classes'], 'lr': a['lr'],
                         'steps': a['steps'], 'test_accuracy': a['accs'][str(seed)],
                         'converged': a['converged'], 'doubling': (a.get('doubling') or {}).get(str(seed))},
        'descendant_classes': a['descendant_classes'],
        'label_budgets': {key: {'labelled': sub['labelled'], 'seeds': sub['seeds'],
                                'scratch': {k: {f: v[f] for f in ('lr', 'acc', 'std', 'steps', 'converged')}
                                            for k, v in sub['scratch'].items()}}
                          for key, sub in results['budgets'].items()},
    }


def from_study(name: str, workdir: str, out: str | None = None, *, spec: dict | None = None,
               command: str | None = None) -> str:
    """Write the shipped gene `name` from the finished transfer study in `workdir`: the gene
    the study trained for seed `spec['seed']` (`workdir/genes/<method>/seed_<seed>`, its
    Aux-Net's config and test accuracy), with its provenance and source model from the
    study's record. Nothing trains.

    Args:
        name: a `GENES` entry with `'from': 'study'`.
        workdir: the study's workdir, finished (its `results.json` written).
        out: the gene directory to write; None: jlearngene/zoo/NAME.
        spec: the entry to use instead of `GENES[name]` (its 'results' may be an absolute
            path).
        command: the command to record; None: the module's own.

    Returns:
        The gene directory.

    Raises:
        ValueError: `name` has no such entry, or the written gene weighs more than
            `MAX_BYTES`.
        FileNotFoundError: the study is not finished, or the record or the gene is missing.
        RuntimeError: the study's record is not the committed one (`spec['results']`).
    """
    spec = spec or GENES.get(name)
    if not spec or spec.get('from') != 'study':
        known = ', '.join(k for k, v in GENES.items() if v.get('from') == 'study')
        raise ValueError(f'zoo.make: {name!r} is not a gene of a transfer study; those are: {known}')
    t0, source = time.perf_counter(), commit()
    finished = os.path.join(workdir, 'results.json')
    committed = os.path.join(CHECKOUT, spec['results'])
    for path, what in ((finished, 'the study is not finished (no results.json)'),
                       (committed, 'the committed record is missing')):
        if not os.path.isfile(path):
            raise FileNotFoundError(f'zoo.make: {path}: {what}')
    if _sha256(finished) != _sha256(committed):
        raise RuntimeError(f"zoo.make: {finished} is not the committed record {spec['results']}: "
                           'commit the finished study\'s record first')
    with open(finished, encoding='utf-8') as f:
        results = json.load(f)
    seed, method = int(spec['seed']), genes.get(spec['method'])
    gene_dir = os.path.join(workdir, 'genes', method.name, f'seed_{seed}')
    if not os.path.isdir(gene_dir):
        raise FileNotFoundError(f'zoo.make: {gene_dir}: the study saved no {method.name} gene of seed {seed}')
    gene, aux_cfg, extra = checkpoint.load_model(gene_dir)
    cfg = next(iter(results['budgets'].values()))['config']
    rel = os.path.relpath(os.path.abspath(committed), CHECKOUT)
    provenance = {
        'command': command or f'python -m jlearngene.zoo.make {name} --workdir {workdir}',
        **source, 'seed': seed, 'aux_test_accuracy': extra['aux_test_accuracy'],
        'data': {'name': cfg['data']['name'], 'augment': cfg['data'].get('augment'),
                 'about': 'Fashion-MNIST (Debian dataset-fashion-mnist); the gene is trained on the '
                          'source classes, its descendants fine-tune on the others'},
        'study': spec['config'],
        **transfer_record(results, seed),
        'record': {'file': rel, 'file_commit': _git('log', '-1', '--format=%H', '--', rel)},
        'seconds': round(time.perf_counter() - t0, 1),
    }
    path = artefacts.save_gene(out or os.path.join(ROOT, name), method, jax.device_get(gene),
                               configs={'source': aux_cfg},
                               gene_options=dict(cfg['method_options'][method.name]['gene']),
                               provenance=provenance, overwrite=True)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    if size > MAX_BYTES:
        raise ValueError(f'zoo.make: {path} weighs {size:,} bytes, more than a shipped gene may ({MAX_BYTES:,})')
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m jlearngene.zoo.make NAME`: train the shipped gene NAME again from its study and
    write its gene directory; returns the exit status.
    """
    p = argparse.ArgumentParser(prog='python -m jlearngene.zoo.make', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('name', choices=sorted(GENES))
    p.add_argument('--workdir', default='workdirs/zoo',
                   help="where the runs go (default: %(default)s); for a transfer study's gene "
                        '(tleg_fashion, letra_fashion) the finished study\'s workdir')
    p.add_argument('--out', help='gene directory to write (default: jlearngene/zoo/NAME)')
    args = p.parse_args(argv)
    command = 'python -m jlearngene.zoo.make ' + ' '.join(argv if argv is not None else sys.argv[1:])
    build = from_study if GENES[args.name].get('from') == 'study' else make
    path = build(args.name, args.workdir, args.out, command=command)
    print(artefacts.describe(artefacts.read_meta(path), probe=False))
    return 0


if __name__ == '__main__':
    sys.exit(main())
