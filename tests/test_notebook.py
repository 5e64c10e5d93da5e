"""examples/walkthrough.ipynb runs: every code cell, in order, in one namespace (no Jupyter
kernel), at the notebook's own sizes; any cell that raises fails the test. The file itself
is valid nbformat 4 with its outputs cleared.

Cost: nearly all compilation (about twenty distinct XLA programs: the ancestor, the TLEG
Aux-Net, the descendants' shapes, the diagnostics' captures), so it is marked slow."""
import json
import os

import pytest

NOTEBOOK = os.path.join(os.path.dirname(__file__), os.pardir, 'examples', 'walkthrough.ipynb')


def load():
    with open(NOTEBOOK, encoding='utf-8') as f:
        return json.load(f)


def test_notebook_is_nbformat_4_with_outputs_cleared():
    nb = load()
    assert nb['nbformat'] == 4 and nb['cells']
    for cell in nb['cells']:
        assert cell['cell_type'] in ('markdown', 'code') and isinstance(cell['source'], list)
        if cell['cell_type'] == 'code':
            assert cell['outputs'] == [] and cell['execution_count'] is None
    kinds = [c['cell_type'] for c in nb['cells']]
    assert kinds[0] == 'markdown' and kinds.count('code') >= 10


@pytest.mark.slow
def test_every_code_cell_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('TMPDIR', str(tmp_path))       # the notebook's figures and exports
    import tempfile
    monkeypatch.setattr(tempfile, 'tempdir', None)
    namespace = {'__name__': '__main__'}
    for i, cell in enumerate(load()['cells']):
        if cell['cell_type'] != 'code':
            continue
        source = ''.join(cell['source'])
        try:
            exec(compile(source, f'walkthrough.ipynb cell {i}', 'exec'), namespace)
        except Exception as e:
            pytest.fail(f'cell {i} raised {type(e).__name__}: {e}\n--- cell source ---\n{source}')
    # What the cells claim: descendants of two sizes per method, trained, exported, plotted.
    assert {n.split('_')[0] for n in namespace['descendants']} == {'tleg', 'letra', 'cluster', 'scala', 'mango'}
    assert len(namespace['descendants']) == 10
    for name in ('linearity.png', 'mad.png', 'cka.png', 'tleg_d6.safetensors'):
        assert os.path.getsize(os.path.join(namespace['OUT'], name)) > 0, name
    assert namespace['lin_init']['score'] == pytest.approx(1.0, abs=1e-6)   # TLEG's line, exactly
    assert namespace['lin_d']['score'] < 1.0            # fine-tuning moved it
