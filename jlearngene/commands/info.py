"""`jlearngene info`: parameter table of named variants (with no argument, also the genes
shipped with the package, `jlearngene.zoo`), of one config, what a study config trains
(`file.py[:arg]` or a bundled `NAME[:arg]`: rows, shapes, seeds, tasks, sweeps, budgets and
the descendant each row makes at each shape, `study.describe`), of a checkpoint (a model
artefact, a run checkpoint step directory, or a training workdir), of a study's workdir
(finished or not: its runs, what is left, its results), another folder of runs
(`jlearngene demo`'s) or a store of finished runs ($JLEARNGENE_STORE), of a gene directory
or a shipped gene's name (`jlearngene.artefacts`: its method, configs, stored parameters
and the widths and depths of the descendants it makes, tried on shapes), or of a file: a
timm state dict (.safetensors, .npz, .pth) or a big_vision .npz (the config `jlearngene
convert` infers from it, its parameter count and its tensors), a plot (.png), a run's
metrics.jsonl, config.json (config.txt) or another JSON file. A path that does not exist,
an empty file and a file of another kind are one-line errors that say which."""
from __future__ import annotations

import json
import math
import os
import re

import jax

from jlearngene import pytree
from jlearngene.commands.config_args import Parser, dangling_symlink, parse_override
from jlearngene.models import VARIANTS, init, vit_config

HELP = ('parameter table of variants and the shipped genes, what a config (.py[:arg], NAME[:arg]) trains, a '
        'checkpoint/workdir, a gene or a timm/big_vision file')


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


def _tensor_table(arrays: dict, title: str, column: str, total: str) -> str:
    """Markdown table of arrays ({key: array or ShapeDtypeStruct}) under `title`, `total` last."""
    rows = [title, ''] if title else []
    rows += [f'| {column} | shape | dtype | count |', '|---|---|---|---|']
    rows += [f'| {k} | {tuple(a.shape)} | {a.dtype} | {math.prod(a.shape):,} |' for k, a in arrays.items()]
    return '\n'.join(rows + ['', total])


def leaf_table(shapes, title: str = '') -> str:
    """Markdown table of every leaf (path, shape, dtype, count) plus group totals."""
    counts = pytree.count_params(shapes)
    return _tensor_table(pytree.flatten(shapes), title, 'parameter',
                         'totals: ' + ', '.join(f'{k} {v:,}' for k, v in counts.items()))


def _config_text(spec: str) -> str:
    """A config (`file.py[:arg]` or a bundled `NAME[:arg]`): for an experiment, what the study
    trains (`study.describe`); otherwise its model's parameter table."""
    from jlearngene.experiments import configs
    from jlearngene.models import model_config
    config = configs.load(spec)     # a missing file, a directory or bad Python: one line
    if config.get('task') == 'experiment':
        from jlearngene.experiments import study
        return study.describe(config, _descendant_classes(config))
    return param_table({spec: model_config(config.model)})


def _descendant_classes(config) -> int:
    """The class count of a study's descendants, from its config where it says (its tasks,
    its data's classes), else from its data's description (nothing is read for the bundled
    digits; a dataset that cannot be opened gives the model's default head)."""
    from jlearngene import data
    from jlearngene.models import model_config
    if config.get('tasks'):
        return len(config.tasks.descendant)
    if config.data.get('classes'):
        return len(config.data.classes)
    try:
        return data.source_from_config(config.data.to_dict(), 'train').info.num_classes
    except (ValueError, OSError, data.DataError):
        return model_config(config.model).num_classes


def _checkpoint_table(path: str) -> str:
    from jlearngene.train import checkpoint, integrity, run_checkpoint
    if os.path.isdir(os.path.join(path, 'model')):
        path = os.path.join(path, 'model')
    elif os.path.isdir(os.path.join(path, 'checkpoints')):
        with run_checkpoint.RunCheckpointer(os.path.join(path, 'checkpoints')) as ck:
            step = ck.latest_step()
        if step is None:
            raise integrity.CheckpointError(f'{path!r} has no checkpoints yet')
        path = os.path.join(path, 'checkpoints', str(step))
    parent, step = os.path.split(os.path.abspath(path))
    if step.isdigit() and not os.path.isdir(os.path.join(path, 'params')):
        with run_checkpoint.RunCheckpointer(parent) as ck:
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


def _array_table(arrays: dict, title: str) -> str:
    """Markdown table of a file's arrays and their total."""
    total = sum(math.prod(a.shape) for a in arrays.values())
    return _tensor_table(arrays, title, 'tensor', f'total {total:,} parameters')


def _one_line(e: Exception) -> str:
    """A multi-line problem list (`state_dict.problem_message`) on one line."""
    return '; '.join(line.strip(' -') for line in str(e).splitlines() if line.strip())


def _state_dict_file_table(path: str, fmt: str) -> str:
    """A timm state dict (.safetensors, .npz, torch) or a big_vision .npz: its config as
    inferred from the shapes (as `jlearngene convert` infers it), the parameter count of
    that config and the file's tensors."""
    from jlearngene.commands import convert
    from jlearngene.interop import big_vision as BV
    from jlearngene.interop import state_dict as SD
    from jlearngene.interop import timm as T
    kind = SD.file_kind(path)
    suffix = {'safetensors': ('.safetensors',), 'npz': ('.npz',), 'torch': SD.PICKLE_SUFFIXES}[kind]
    if not path.lower().endswith(suffix):
        raise ValueError(f'{path!r} holds a {kind} file but its name does not end in {suffix[0]}; '
                         f'rename it to end in {suffix[0]} to read it')
    extra = []
    if fmt == 'big_vision':
        arrays = BV.load_npz(path)
        layout = BV.detect_layout(arrays)
        title = f'big_vision checkpoint {path} ({layout!r} layout, {len(arrays)} arrays)'
        infer = lambda: BV.infer_config(arrays, layout)  # noqa: E731
        how = '--from-big-vision'
    else:
        arrays = SD.load_state_dict(path)
        title = f'timm state dict {path} ({kind}, {len(arrays)} tensors)'
        meta = SD.read_safetensors_metadata(path) if kind == 'safetensors' else {}
        if meta.get('timm_class'):
            extra.append(f"timm model: {meta['timm_class']}({meta.get('timm_kwargs', '')})")
        defaults = convert.timm_file_defaults(path)
        infer = lambda: T.infer_config(arrays, **defaults)  # noqa: E731
        how = '--from-timm'
    try:
        cfg = infer()
    except ValueError as e:   # StateDictError, ConfigError: not (all) a ViT of ours
        return '\n'.join([_array_table(arrays, title), '',
                          f'no ViT config can be inferred ({_one_line(e)})'])
    return '\n'.join([title, *extra, f'inferred config (as convert {how} reads it): {cfg.to_dict()}',
                      '', param_table({os.path.basename(path): cfg}), '', _array_table(arrays, '')])


def _png_size(path: str) -> tuple[int, int] | None:
    with open(path, 'rb') as f:
        head = f.read(24)
    if head[:8] != b'\x89PNG\r\n\x1a\n' or head[12:16] != b'IHDR':
        return None
    return int.from_bytes(head[16:20], 'big'), int.from_bytes(head[20:24], 'big')


def _other_file_table(path: str) -> str | None:
    """The other files the CLI writes: a plot (PNG), a run's metrics.jsonl, config.json (or
    its readable form config.txt) and other JSON files; None for a file of none of these
    kinds."""
    size = _png_size(path)
    if size:
        return f'PNG image {path}: {size[0]} x {size[1]} pixels (jlearngene plot writes one)'
    if path.endswith('.jsonl'):
        from jlearngene.train.metrics import read_metrics
        records = read_metrics(path)
        lines = [f'metrics {path}: {len(records)} records']
        for kind in sorted({str(r.get('kind', '?')) for r in records}):
            rows = [r for r in records if str(r.get('kind', '?')) == kind]
            last = {k: v for k, v in rows[-1].items() if k not in ('step', 'kind', 'time')}
            lines.append(f"  {kind}: {len(rows)} records, steps {rows[0]['step']}..{rows[-1]['step']}; "
                         f'last: {last}')
        return '\n'.join(lines + _warning_lines(records))
    beside = os.path.join(os.path.dirname(path), 'config.json')
    if os.path.basename(path) == 'config.txt' and os.path.isfile(beside):
        return (f'{path}: the readable form of the run config {beside}\n\n'
                + (_other_file_table(beside) or ''))
    if not path.endswith('.json'):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            obj = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f'{path!r} is not a readable JSON file ({e})') from None
    if not isinstance(obj, dict):
        return f'JSON file {path}: a {type(obj).__name__}'
    if ('rows' in obj or isinstance(obj.get('budgets'), dict)) and isinstance(obj.get('config'), dict):
        return _results_text(path, obj)   # an experiment's results.json (a transfer study's: per budget)
    if not isinstance(obj.get('model'), dict):   # not a run config (config.json)
        return f'JSON file {path}: keys {sorted(obj)}'
    from jlearngene.models import model_config
    cfg = model_config(obj['model'])
    name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return (f"run config {path} (task {obj.get('task', 'classification')!r})\n\n"
            + param_table({name or path: cfg}))


def _results_text(path: str, results: dict) -> str:
    """An experiment's results.json: the experiment, its seeds and shapes, its records and,
    for a study, its verdicts; a transfer study's, each label budget's."""
    config = results['config']
    head = f"results of the experiment {config.get('experiment', '?')!r} ({path})"
    budgets = results.get('budgets')
    if not isinstance(budgets, dict):
        return head + ': ' + _records_text(results)
    return '\n'.join([head + f': {len(budgets)} label budgets'] + [
        f'labels {float(key):.0%}: ' + _records_text(sub) for key, sub in budgets.items()])


def _records_text(results: dict) -> str:
    lines = [f"{len(results['rows'])} records"
             + (f", seeds {results['seeds']}, shapes {results['shapes']}" if 'seeds' in results else '')]
    lines += [f"  {v['claim']}: {v['verdict']}" for v in results.get('verdicts', [])]
    return '\n'.join(lines)


def _workdir_text(path: str) -> str:
    """An experiment's workdir: its results, the model artefacts and runs it holds."""
    text = _other_file_table(os.path.join(path, 'results.json')) or ''
    parts = [f'{folder}/: {len(os.listdir(os.path.join(path, folder)))} entries'
             for folder in ('teacher', 'genes', 'runs') if os.path.isdir(os.path.join(path, folder))]
    return f'experiment workdir {path}\n' + text + ('\n' + ', '.join(parts) if parts else '')


def _label_budget(run_name: str) -> str | None:
    """The label budget a transfer study's run belongs to, from its name (`scratch_l0.01_...`,
    `..._l0.1_lr...`: `harness.LabelBudget.key`); None for an upstream run."""
    match = re.search(r'(?:^|_)l(\d*\.?\d+)(?:_|$)', run_name)
    return match.group(1) if match else None


def _study_owner(path: str) -> dict | None:
    """The `study.json` of a workdir (which study owns it), None when it has none; a
    damaged one is a one-line ValueError naming the file."""
    file = os.path.join(path, 'study.json')
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding='utf-8') as f:
            owner = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f'{file}: not a readable JSON file ({e}); it names the study that '
                         f'owns {path}') from None
    if not isinstance(owner, dict):
        raise ValueError(f'{file}: holds a JSON {type(owner).__name__}, not the object naming '
                         f'the study that owns {path}')
    return owner


def _study_text(path: str) -> str:
    """A study's workdir (its `study.json`), finished or not, or a folder of runs that no
    study owns (`jlearngene demo`'s workdir: `runs/` without `study.json`): which study,
    its finished runs and their training seconds (wall clock; CPU time where every record
    has it), for a transfer study by stage (upstream, each label budget), the runs stopped
    part-way (where each resumes from: its last checkpoint, or step 0), the superseded ones,
    and its results once it has them; until then, a table of the finished runs in the order
    they finished (steps, final test and validation accuracy, seconds)."""
    from jlearngene.train.metrics import read_metrics
    owner = _study_owner(path)
    runs_dir = os.path.join(path, 'runs')
    names = sorted(n for n in os.listdir(runs_dir) if not n.startswith('.')) if os.path.isdir(runs_dir) else []
    seconds, cpu, partial, finished = 0.0, [], [], []
    stages: dict[str, list[float]] = {}   # label budget (or upstream): [runs, seconds]
    for name in names:
        try:
            with open(os.path.join(runs_dir, name, 'finished.json'), encoding='utf-8') as f:
                record = json.load(f)
            run_seconds = float(record.get('seconds', 0.0))
            when = os.path.getmtime(os.path.join(runs_dir, name, 'finished.json'))
            finished.append((when, name, _finished_row(name, record)))
            seconds += run_seconds
            cpu.append(record.get('cpu_seconds'))
            stage = stages.setdefault(_label_budget(name), [0, 0.0])
            stage[0] += 1
            stage[1] += run_seconds
            continue
        except FileNotFoundError:
            state = 'not started'
        except (OSError, ValueError):
            state = 'finished.json damaged: trains again'
        try:
            steps = [r['step'] for r in read_metrics(os.path.join(runs_dir, name)) if 'step' in r]
            state = f'at step {max(steps)}' if steps and state == 'not started' else state
        except (FileNotFoundError, ValueError):
            pass
        if state.startswith('at step'):
            state += _resumes_from(os.path.join(runs_dir, name))
        partial.append(f'{name} ({state})')
    superseded = os.path.join(path, 'superseded')
    n_sup = len(os.listdir(superseded)) if os.path.isdir(superseded) else 0
    done = os.path.isfile(os.path.join(path, 'results.json'))
    if owner is None:
        head = (f'workdir {path}: runs that no study owns (no study.json; e.g. jlearngene '
                'demo\'s), ' + ('with results.json' if done else 'no results.json'))
    else:
        head = (f"study workdir {path}: the {owner.get('experiment', '?')!r} study, "
                + ('finished (results.json)' if done else 'not finished (no results.json yet)'))
    lines = [head,
             f'runs/: {len(names) - len(partial)} finished ({seconds:,.0f} s of training'
             + (f', {sum(cpu):,.0f} s of CPU time' if cpu and None not in cpu else '') + ')'
             + (f', {len(partial)} unfinished: ' + ', '.join(partial) if partial else '')]
    if len(stages) > 1:   # a transfer study: its upstream, then each label budget's runs
        lines.append('finished by stage: ' + ', '.join(
            f"{'upstream' if key is None else f'{float(key) * 100:g} % of the labels'} {n} run{'s' * (n != 1)} "
            f"({secs:,.0f} s)"
            for key, (n, secs) in sorted(stages.items(), key=lambda kv: -1 if kv[0] is None else float(kv[0]))))
    if n_sup:
        lines.append(f'superseded/: {n_sup} finished runs whose settings, data, code or software '
                     'differ from the study that ran after them')
    if done:
        lines.append(_other_file_table(os.path.join(path, 'results.json')) or '')
    elif owner is not None:
        lines.append('the runs listed are those begun so far: the study decides its later runs as it '
                     'goes. The command that started it (`jlearngene train --config ... --workdir`, '
                     'or `jlearngene compare`) resumes it: finished runs are read back, the others '
                     'resume from their last checkpoint')
        if finished:
            lines += ['', '| finished run | steps | test accuracy | validation accuracy | seconds |',
                      '|---|---|---|---|---|', *(row for *_, row in sorted(finished))]
    return '\n'.join(lines)


_FINGERPRINT = re.compile(r'[0-9a-f]{64}')


def _is_store(path: str) -> bool:
    """Whether `path` is a store of finished runs ($JLEARNGENE_STORE, `harness.fit`): every
    visible entry a folder named by a run's fingerprint."""
    names = [n for n in os.listdir(path) if not n.startswith('.')]
    return bool(names) and all(_FINGERPRINT.fullmatch(n) and os.path.isdir(os.path.join(path, n))
                               for n in names)


def _store_text(path: str) -> str:
    """A store of finished runs: how many, their seconds, and what each reached (by the
    first 12 characters of its fingerprint, the name of its folder)."""
    rows, seconds = [], 0.0
    for name in sorted(n for n in os.listdir(path) if not n.startswith('.')):
        try:
            with open(os.path.join(path, name, 'finished.json'), encoding='utf-8') as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = {}
        seconds += float(record.get('seconds', 0.0) or 0.0)
        rows.append(_finished_row(name[:12], record))
    return '\n'.join([f'run store {path}: {len(rows)} finished runs ({seconds:,.0f} s of training), each '
                      'in the folder of its fingerprint; a study run with $JLEARNGENE_STORE set to it '
                      'takes a run with the same fingerprint from here instead of training it', '',
                      '| fingerprint | steps | test accuracy | validation accuracy | seconds |',
                      '|---|---|---|---|---|', *rows])


def _finished_row(name: str, record: dict) -> str:
    """A finished run's row in a study's status: its steps, final test and validation
    accuracy and seconds ('–' for what its record lacks)."""
    def last(key: str) -> str:
        try:
            return f'{float(record[key][-1][1]):.4f}'
        except (KeyError, IndexError, TypeError, ValueError):
            return '–'
    steps = record.get('step')
    secs = record.get('seconds')
    return (f"| {name} | {f'{steps:,}' if isinstance(steps, int) else '–'} | {last('curve')} | "
            f"{last('val_curve')} | {f'{secs:,.0f}' if isinstance(secs, (int, float)) else '–'} |")


def _resumes_from(run_dir: str) -> str:
    """', resumes from step K' for an unfinished study run with a checkpoint of its own
    settings (`progress.json` beside it), else ', starts again'."""
    ckpt = os.path.join(run_dir, 'checkpoints')
    steps = [int(n) for n in os.listdir(ckpt) if n.isdigit()] if os.path.isdir(ckpt) else []
    if steps and os.path.isfile(os.path.join(run_dir, 'progress.json')):
        return f', resumes from step {max(steps)}'
    return ', starts again'


def _file_table(path: str) -> str:
    """A file: a timm or big_vision checkpoint, or another file the CLI writes."""
    from jlearngene.commands.convert import file_format
    if os.path.getsize(path) == 0:
        raise ValueError(f'{path!r} is an empty file (0 bytes): nothing to describe')
    fmt = file_format(path)
    if fmt in ('timm', 'big_vision'):
        return _state_dict_file_table(path, fmt)
    table = _other_file_table(path)
    if table is None:
        raise ValueError(f'{path!r} is a file of unknown kind: not a timm state dict (.safetensors, '
                         '.npz, .pth), a big_vision .npz, a config file (.py), a plot (.png), '
                         'metrics.jsonl or a JSON file such as a run config.json')
    return table


def _gene_table(path: str) -> str:
    """A gene directory: `artefacts.describe` and its leaf table (from gene.json; the
    safetensors header is checked against it)."""
    from jlearngene import artefacts
    meta = artefacts.read_meta(path)
    artefacts.check_arrays(meta)
    return leaf_table(artefacts.gene_shapes(meta), artefacts.describe(meta)) if meta['arrays'] \
        else artefacts.describe(meta)


def _path_text(target: str) -> str | None:
    """What `info` prints for a config file or an existing path; None for neither."""
    dangling = dangling_symlink(target.partition(':')[0], 'path')
    if dangling:
        raise FileNotFoundError(dangling)
    if target.partition(':')[0].endswith('.py'):
        return _config_text(target)
    if not os.path.isdir(target):
        if os.path.exists(target) and not os.path.isfile(target):
            raise ValueError(f'{target!r} is not a regular file (a FIFO, socket or device): '
                             'nothing to describe')
        return _file_table(target) if os.path.exists(target) else None
    if any(os.path.exists(os.path.join(target, f)) for f in ('gene.json', 'gene.safetensors')):
        return _gene_table(target)
    if not os.listdir(target):
        raise ValueError(f'{target!r} is an empty directory: not a checkpoint, training workdir or '
                         'gene directory')
    if _is_store(target):
        return _store_text(target)
    if os.path.isfile(os.path.join(target, 'study.json')) or (
            os.path.isdir(os.path.join(target, 'runs'))
            and not os.path.isfile(os.path.join(target, 'results.json'))):
        return _study_text(target)
    if os.path.isfile(os.path.join(target, 'results.json')):
        return _workdir_text(target)
    text = _checkpoint_table(target)
    if os.path.isfile(os.path.join(target, 'metrics.jsonl')):   # a training workdir
        from jlearngene.train.metrics import read_metrics
        text = '\n'.join([text, *_warning_lines(read_metrics(target, kind='warning'))])
    return text


def _warning_lines(records: list[dict]) -> list[str]:
    """The run's warnings (a diverged loss, `train.trainer`) among metrics records."""
    return [f"warning at step {r['step']}: {r.get('text', '')}" for r in records
            if r.get('kind') == 'warning']


def main(argv: list[str]) -> int:
    """The command: prints what the argument names, tried in this order: a config file or an
    existing path (`_path_text`), a shipped gene's name, a bundled config's name (a study's:
    what it trains, `study.describe`), a ViT variant (its parameter table,
    with --set's overrides); with no argument, every variant and the shipped genes. Exit
    status 0.

    Raises:
        FileNotFoundError: an argument that is none of these.
    """
    parser = Parser('jlearngene info', __doc__)
    parser.add_argument('variant', nargs='?', help="variant name ('S', 'B/16'; all if omitted), a config "
                        'file (file.py[:arg]) or bundled config (tleg:fashion; a study says what it '
                        'trains), a checkpoint directory, a training workdir, a gene '
                        'directory, an experiment workdir or a file (timm .safetensors/.npz/.pth, '
                        'big_vision .npz, .png, metrics.jsonl, config.json, results.json)')
    parser.add_argument('--set', action='append', type=parse_override, default=[], metavar='FIELD=VALUE',
                        help='override a config field (repeatable), e.g. --set depth=6')
    args = parser.parse_args(argv)
    target = args.variant or ''
    text = _path_text(target) if target else None
    if text is not None:
        print(text)   # errors: one line on stderr, from jlearngene.cli
        return 0
    from jlearngene import zoo
    if target in zoo.names() and target not in VARIANTS:   # a shipped gene, by its name
        print(_gene_table(zoo.path(target)))
        return 0
    from jlearngene.experiments import configs
    if target.partition(':')[0] in configs.names():     # a bundled config, by its name
        print(_config_text(target))
        return 0
    if target and target.partition('/')[0] not in VARIANTS:
        if os.sep in target or '/' in target or '.' in target:   # a path
            raise FileNotFoundError(f'{target!r} does not exist')
        raise FileNotFoundError(f'{target!r} is neither a ViT variant (known: {sorted(VARIANTS)}, '
                                "optionally with '/patch', e.g. 'S/16'), a shipped gene (known: "
                                f'{", ".join(zoo.names())}), a bundled config (known: '
                                f'{", ".join(configs.names())}) nor an existing file or directory')
    names = [args.variant] if args.variant else list(VARIANTS)
    print(param_table({n: vit_config(n, **dict(args.set)) for n in names}))
    if not args.variant and zoo.names():
        print('\nshipped genes (jlearngene info NAME, jlearngene descend NAME ...):\n' + zoo.listing())
    return 0
