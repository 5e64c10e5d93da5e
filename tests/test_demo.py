"""`jlearngene demo` on a tiny budget (one shape, 2 steps): what it prints and writes. The
full demo from an installed wheel is in tests/test_demo_wheel.py (slow tier)."""
import json
import os

from jlearngene import cli
from jlearngene.commands import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = b'\x89PNG\r\n\x1a\n'


def test_the_demo_prints_a_short_table_and_writes_its_curves(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo, 'SHAPES', ((32, 4),))
    workdir = tmp_path / 'demo'
    assert cli.main(['demo', '--steps', '2', '--workdir', str(workdir)]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) <= 30 - 3, out                     # four shapes: three rows more
    assert lines[0].startswith('One LeTra learngene') and 'letra_digits' in out
    row = next(line for line in lines if line.startswith('| 32 | 4 |'))
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[3] == '2'                               # K
    scratch = json.load(open(os.path.join(ROOT, 'experiments', 'letra', 'results.json')))['scratch']['w32_d4']
    assert cells[7].startswith(f"{scratch['acc']:.3f} ± {scratch['std']:.3f} ({scratch['steps']})")   # from the record
    text = ' '.join(out.split())
    assert 'experiments/letra/results.json' in text and 'no verdicts' in text
    assert 'jlearngene train --config letra:digits' in text
    png = os.path.join(os.path.abspath(workdir), demo.PNG)
    assert f'curves: {png}' in out
    assert open(png, 'rb').read(8) == PNG


def test_the_demo_refuses_bad_flags_before_anything_runs(tmp_path, capsys):
    for argv in (['--steps', '0'], ['quick'], ['smoke']):
        assert cli.main(['demo', *argv, '--workdir', str(tmp_path / 'w')]) == 2, argv
        assert capsys.readouterr().err.startswith('jlearngene demo: ')
    assert not os.path.exists(tmp_path / 'w')
