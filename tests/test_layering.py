"""The package's floors: every module imports only from its own floor or the ones below.

From the ground up (a module's floor is that of the longest prefix listed):

| floor | modules | what they are |
|---|---|---|
| base | `pytree`, `compiler`, `ops`, `distributed`, `data`, `losses` | tree paths, how programs compile, backend speed paths, the multi-process runtime, input pipelines, loss math on logits |
| models | `models`, `diagnostics`, the package root `jlearngene` | the ViT's math, analyses of its parameters; the root imports these |
| genes | `genes` | the methods: pure functions, their losses included |
| train | `train`, `parallel`, `costs`, `interop`, `artefacts`, `zoo` | the engine; meshes and shardings; parameter and FLOP counts over genes; checkpoint readers and writers (timm, big_vision, gene files, flax nnx); the shipped genes |
| experiments | `experiments`, `zoo.make` | the harness, the studies and their configs; how a shipped gene is trained |
| commands | `commands`, `cli`, `__main__` | the command line |

On top of the floors, `genes/` imports neither the compiler nor data (the methods are
pure functions of their arrays). Every import counts, at module level or inside a
function, so a function-local import cannot hide an upward edge.
"""
import ast
import os
import sys

import jlearngene

ROOT = os.path.dirname(jlearngene.__file__)

FLOORS = ('base', 'models', 'genes', 'train', 'experiments', 'commands')
TABLE = {
    'jlearngene.pytree': 'base', 'jlearngene.compiler': 'base', 'jlearngene.ops': 'base',
    'jlearngene.distributed': 'base', 'jlearngene.data': 'base', 'jlearngene.losses': 'base',
    'jlearngene': 'models', 'jlearngene.models': 'models', 'jlearngene.diagnostics': 'models',
    'jlearngene.genes': 'genes',
    'jlearngene.train': 'train', 'jlearngene.parallel': 'train', 'jlearngene.costs': 'train',
    'jlearngene.interop': 'train', 'jlearngene.artefacts': 'train',
    'jlearngene.zoo': 'train', 'jlearngene.experiments': 'experiments',
    'jlearngene.zoo.make': 'experiments',
    'jlearngene.commands': 'commands', 'jlearngene.cli': 'commands',
    'jlearngene.__main__': 'commands',
}
# (importer prefix, imported prefix): edges the floors allow but the design forbids.
BANNED = (('jlearngene.genes', 'jlearngene.compiler'), ('jlearngene.genes', 'jlearngene.data'))
# The study protocol, its harness, report and recipes reach the methods through the registry
# (`jlearngene.genes`) only, never a method module, so adding a method touches no study code.
REGISTRY_ONLY = tuple(f'jlearngene.experiments.{m}' for m in (
    'study', 'scratch', 'results', 'report', 'headline', 'harness', 'recipes'))


def floor(module: str) -> str:
    """The floor of a dotted module name (its longest prefix in TABLE)."""
    parts = module.split('.')
    for n in range(len(parts), 0, -1):
        name = '.'.join(parts[:n])
        if name in TABLE:
            return TABLE[name]
    raise KeyError(f'{module} has no floor: add it to the table in {__file__}')


def _is_module(name: str) -> bool:
    path = os.path.join(os.path.dirname(ROOT), *name.split('.'))
    return os.path.isfile(path + '.py') or os.path.isfile(os.path.join(path, '__init__.py'))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + '.')


def modules() -> dict[str, str]:
    """{dotted module name: file} of every module in the package."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith('.py'):
                rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(ROOT))[:-3]
                name = rel.replace(os.sep, '.').removesuffix('.__init__')
                out[name] = os.path.join(folder, f)
    return out


def imports(name: str, path: str) -> list[tuple[int, str]]:
    """(line, imported jlearngene module) for every import in the module's file, at any
    depth; `from pkg import x` names pkg.x when that is a module, else pkg."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if _within(a.name, 'jlearngene')]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            if not _within(base, 'jlearngene'):
                continue
            for a in node.names:
                full = f'{base}.{a.name}'
                out.append((node.lineno, full if _is_module(full) else base))
    return out


def violations() -> list[str]:
    found = []
    for name, path in sorted(modules().items()):
        mine = FLOORS.index(floor(name))
        for line, imported in imports(name, path):
            theirs = floor(imported)
            where = f'{os.path.relpath(path, os.path.dirname(ROOT))}:{line}'
            if FLOORS.index(theirs) > mine:
                found.append(f'{where}: {name} ({floor(name)}) imports {imported} ({theirs})')
            for src, dst in BANNED:
                if _within(name, src) and _within(imported, dst):
                    found.append(f'{where}: {name} imports {imported} ({src} never imports {dst})')
            if any(_within(name, p) for p in REGISTRY_ONLY) and imported.startswith('jlearngene.genes.'):
                found.append(f'{where}: {name} imports {imported} (the study code imports only '
                             'the registry jlearngene.genes)')
    return found


def test_every_module_has_a_floor():
    for name in modules():
        floor(name)


def test_no_module_imports_upward():
    problems = violations()
    assert not problems, 'layering violations:\n' + '\n'.join(problems)


def test_the_walk_finds_upward_and_function_local_imports(tmp_path, monkeypatch):
    """Not vacuous: upward and banned imports inside a function are reported, each with its
    module and line."""
    pkg = tmp_path / 'jlearngene'
    (pkg / 'genes').mkdir(parents=True)
    (pkg / 'train').mkdir()
    for f in ('__init__.py', 'compiler.py', 'genes/__init__.py', 'genes/common.py',
              'train/__init__.py', 'train/trainer.py'):
        (pkg / f).write_text('')
    (pkg / 'experiments' / 'recipes').mkdir(parents=True)
    for f in ('experiments/__init__.py', 'experiments/recipes/__init__.py'):
        (pkg / f).write_text('')
    (pkg / 'experiments' / 'recipes' / 'bad.py').write_text(
        'from jlearngene import genes\nfrom jlearngene.genes import common, GeneError\n')
    (pkg / 'genes' / 'bad.py').write_text(
        'from jlearngene.genes import common\n\n\ndef f():\n'
        '    from jlearngene.train import trainer\n    from jlearngene import compiler\n')
    monkeypatch.setattr(sys.modules[__name__], 'ROOT', str(pkg))
    assert violations() == [
        'jlearngene/experiments/recipes/bad.py:2: jlearngene.experiments.recipes.bad imports '
        'jlearngene.genes.common (the study code imports only the registry jlearngene.genes)',
        'jlearngene/genes/bad.py:5: jlearngene.genes.bad (genes) imports '
        'jlearngene.train.trainer (train)',
        'jlearngene/genes/bad.py:6: jlearngene.genes.bad imports jlearngene.compiler '
        '(jlearngene.genes never imports jlearngene.compiler)']
