"""The default (fast) tier covers every module of `jlearngene/`: one test per module, each
passing when some test file imports that module and holds at least one test outside the
slow tier. `pytest --collect-only -q` lists one `test_module_has_a_fast_test[MODULE]` per
module; a new module without a fast test fails here.

Read statically (the AST of each test file), so nothing here depends on which tests this
run selected. Run as a script it prints, per module, the test files that cover it."""
import ast
import functools
import importlib
import pathlib
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'jlearngene'
TESTS = pathlib.Path(__file__).resolve().parent


def package_modules() -> list[str]:
    """Every module of the package, dotted (`jlearngene.genes.tleg`; packages by their
    `__init__`)."""
    names = []
    for path in sorted(PACKAGE.rglob('*.py')):
        parts = path.relative_to(ROOT).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        names.append('.'.join(parts))
    return names


def _is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow` (also as part of a list of marks)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(n) for n in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == 'slow'


def _owner(obj, known: set[str]) -> str | None:
    """The package module an imported object belongs to (a module is its own)."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, '__module__', None)
    return name if name in known else None


def _referenced(tree: ast.Module, known: set[str]) -> set[str]:
    """The package modules a test file reaches: the modules it imports and the modules
    that define the names it imports or reads from them (`from jlearngene.models import
    init` reaches `jlearngene.models.vit`; `data.tfds_source` reaches
    `jlearngene.data.sources`), the CLI commands it runs by name (a list starting with a
    command's name) and the bundled configs it loads (`configs.load('tleg:smoke')`,
    `--config tleg:smoke`)."""
    found, aliases = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    found.add(a.name)
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module in known and node.level == 0:
            found.add(node.module)
            parent = importlib.import_module(node.module)
            for a in node.names:
                sub = f'{node.module}.{a.name}'
                obj = importlib.import_module(sub) if sub in known else getattr(parent, a.name, None)
                if obj is None:
                    continue
                owner = _owner(obj, known)
                if owner:
                    found.add(owner)
                if isinstance(obj, types.ModuleType) and owner:
                    aliases[a.asname or a.name] = owner
    commands = set(importlib.import_module('jlearngene.cli').COMMANDS)
    config_names = set(importlib.import_module('jlearngene.experiments.configs').names())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            obj = getattr(importlib.import_module(aliases[node.value.id]), node.attr, None)
            if obj is not None and (owner := _owner(obj, known)):
                found.add(owner)
        elif isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in commands:
                found.add(f'jlearngene.commands.{first.value}')
            strings = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if any(a == '-m' and b == 'jlearngene' for a, b in zip(strings, strings[1:])):
                found.add('jlearngene.__main__')      # python -m jlearngene
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.removeprefix('--config=').partition(':')[0]
            if name in config_names and (':' in node.value or node.value.startswith('--config=')):
                found.add(f'jlearngene.experiments.configs.{name}')
        if (isinstance(node, ast.Call) and getattr(node.func, 'attr', None) == 'load' and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in config_names):
            found.add(f'jlearngene.experiments.configs.{node.args[0].value}')
    return found & known


def _fast_tests(tree: ast.Module) -> int:
    """How many test functions of a file are outside the slow tier."""
    module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, 'id', '') == 'pytestmark' for t in n.targets)
                      and _is_slow_mark(n.value) for n in tree.body)
    if module_slow:
        return 0
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith('test'):
            if not any(_is_slow_mark(d) or (isinstance(d, ast.Call) and _is_slow_mark(d.func))
                       for d in node.decorator_list):
                count += 1
    return count


@functools.cache
def coverage() -> dict[str, list[str]]:
    """{module: [test files with fast tests that import it]}."""
    known = set(package_modules())
    covered: dict[str, list[str]] = {m: [] for m in sorted(known)}
    for path in sorted(TESTS.glob('test_*.py')):
        tree = ast.parse(path.read_text(), filename=str(path))
        if path.name == pathlib.Path(__file__).name or not _fast_tests(tree):
            continue
        for module in _referenced(tree, known):
            covered[module].append(path.name)
    return covered


@pytest.mark.parametrize('module', package_modules())
def test_module_has_a_fast_test(module):
    assert coverage()[module], f'{module} has no test outside the slow tier (no fast test file imports it)'


def test_the_slow_mark_is_read_from_decorators_and_pytestmark():
    fast = ast.parse('import pytest\n@pytest.mark.slow\ndef test_a(): pass\ndef test_b(): pass\n')
    assert _fast_tests(fast) == 1
    slow = ast.parse('import pytest\npytestmark = [pytest.mark.slow]\ndef test_a(): pass\n')
    assert _fast_tests(slow) == 0


if __name__ == '__main__':
    for name, files in coverage().items():
        print(f'{name:<45} {", ".join(files) or "-- no fast test --"}')
    sys.exit(0 if all(coverage().values()) else 1)
