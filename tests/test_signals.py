"""SIGINT and SIGTERM at any moment of `python -m jlearngene train` (imports, the config and
data, compilation, a step, a checkpoint write, an evaluation): exit status 130 or 143, one
line `jlearngene train: ...` last on stderr, no traceback, never a crash by signal. The
default tier sends them in the first second (imports, setup); the slow tier during setup,
compilation, the loop, a checkpoint write and an evaluation."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--config', 'digits_vit:smoke', '--config.model.depth=1', '--config.batch_size=32',
        '--config.log_every=2', '--config.eval_every=4', '--config.checkpoint_every=2', '--noprogress']
needs_proc = pytest.mark.skipif(not os.path.exists('/proc/self/status'), reason='reads /proc/<pid>/status')


def _catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (its SigCgt mask in /proc): the
    command line's, installed when `cli.main` starts, before the command's imports."""
    with open(f'/proc/{pid}/status') as f:
        caught = next(int(ln.split()[1], 16) for ln in f if ln.startswith('SigCgt:'))
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _signalled(tmp_path, sig: str, *, after: float = 0.0,
               on_line: str | None = None) -> tuple[int, list[str], list[str]]:
    """Start a tiny training run; once `cli.main` runs (its handlers are in place), send
    `sig` `after` seconds later, or after the first stdout line holding `on_line`;
    -> (exit status, stdout lines, stderr lines)."""
    argv = [sys.executable, '-m', 'jlearngene', 'train', *TINY, '--config.steps=40',
            '--workdir', str(tmp_path / 'run')]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err, seen = [], [], threading.Event()

    def read(stream, lines, pattern):
        for line in stream:
            lines.append(line.rstrip('\n'))
            if pattern is not None and pattern in line:
                seen.set()
    readers = [threading.Thread(target=read, args=(proc.stdout, out, on_line)),
               threading.Thread(target=read, args=(proc.stderr, err, None))]
    for r in readers:
        r.start()
    try:
        deadline = time.monotonic() + 60
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, \
                f'the command line never handled SIGTERM: {proc.poll()} {err}'
            time.sleep(0.01)
        if on_line is not None:
            assert seen.wait(120), f'no line {on_line!r}: {out} {err}'
        time.sleep(after)
        assert proc.poll() is None, f'the run ended before the signal: {out} {err}'
        proc.send_signal(getattr(signal, sig))
        rc = proc.wait(120)
    finally:
        proc.kill()
        for r in readers:
            r.join(10)
    return rc, out, [ln for ln in err if ln.strip()]


def _check(rc, err, sig):
    assert rc == 128 + getattr(signal, sig), (rc, err)    # never a crash (-11, 139) or -2/-15
    assert err and err[-1].startswith('jlearngene train: '), err
    assert not any('Traceback' in ln or 'Exception ignored' in ln for ln in err), err
    assert len(err) <= 2, err   # the Ctrl-C notice of a training loop, then the one line


@needs_proc
@pytest.mark.parametrize('sig,after', [('SIGINT', 0.0), ('SIGTERM', 1.0)], ids=['int-imports', 'term-setup'])
def test_a_signal_before_training_is_one_line(tmp_path, sig, after):
    rc, _, err = _signalled(tmp_path, sig, after=after)
    _check(rc, err, sig)
    assert 'interrupted (Ctrl-C)' in err[-1] if sig == 'SIGINT' else 'stopped by SIGTERM' in err[-1]


@pytest.mark.slow
@needs_proc
def test_a_signal_in_the_training_loop_saves_a_checkpoint(tmp_path):
    rc, _, err = _signalled(tmp_path, 'SIGTERM', on_line='[train] step       2')
    _check(rc, err, 'SIGTERM')
    assert 'preempted (SIGTERM)' in err[-1] and 'checkpoint' in err[-1], err


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize('sig,after,on_line', [
    ('SIGINT', 2.0, None),                      # config, data, model init or compilation
    ('SIGTERM', 3.5, None),
    ('SIGINT', 0.0, '[train] step       2'),    # the checkpoint of step 2
    ('SIGINT', 0.0, '[train] step       4'),    # the evaluation of step 4
], ids=['int-2s', 'term-3.5s', 'int-checkpoint', 'int-eval'])
def test_a_signal_at_any_moment_is_one_line(tmp_path, sig, after, on_line):
    rc, _, err = _signalled(tmp_path, sig, after=after, on_line=on_line)
    _check(rc, err, sig)
