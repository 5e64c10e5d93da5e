"""Metric output of a run: JSONL in the workdir, console lines, a tqdm bar, TensorBoard.

Console lines go to stdout with the run's other results; the progress bar goes to stderr,
with the errors, so that stdout redirected to a file holds no bar redraws.

Console lines: `[train] step N  loss=...`, `[ eval] step N  eval/accuracy=...` and run
events such as `[  run] step N  resumed from DIR at step N` (`MetricWriter.event`).

`workdir/metrics.jsonl` gets one JSON object per line: {"step", "kind" ('train'|'eval'),
"time", <metric>: value, ...}. A run starting (or resuming) at step S first drops the rows
after S that an earlier attempt left, and any cut-off line (`truncate_after`), so no step is
logged twice and the file reads back. TensorBoard events go to `workdir/tensorboard` when
tensorboardX is importable (optional dependency).

In a multi-process run only process 0 writes (`primary`): one metrics file, one console,
one TensorBoard log and one progress bar, however many processes train.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping

from jlearngene import distributed

METRICS_FILE = 'metrics.jsonl'

log = logging.getLogger(__name__)


def _fmt(v) -> str:
    if not isinstance(v, float):
        return str(v)
    return f'{v:.3e}' if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5) else f'{v:.4f}'


def format_line(step: int, kind: str, metrics: Mapping[str, float]) -> str:
    """A console line: `[ kind] step N  name=value ...`.

    Args:
        step: the step number, right-aligned in 7 characters.
        kind: the record's kind ('train', 'eval', ...), right-aligned in 5 characters.
        metrics: {name: value}, in the order shown; floats get 4 decimals, or 3 significant
          digits in exponent notation when very small or large.

    Returns:
        The line, without a newline.
    """
    body = '  '.join(f'{k}={_fmt(v)}' for k, v in metrics.items())
    return f'[{kind:>5}] step {step:>7}  {body}'


class MetricWriter:
    """Writes each record to JSONL, the console (through tqdm so the bar stays intact) and
    TensorBoard. With `primary` False (default: every process but process 0) it writes
    nothing, so the other processes of a run leave the workdir to process 0."""

    def __init__(self, workdir: str, *, console: bool = True, tensorboard: bool = True,
                 primary: bool | None = None, start_step: int | None = None):
        self.primary = distributed.is_main_process() if primary is None else bool(primary)
        self.path = os.path.join(workdir, METRICS_FILE)
        self.console = console and self.primary
        self._file = self._tb = None
        self.dropped = 0   # rows after `start_step` from an earlier attempt (`truncate_after`)
        if not self.primary:
            return
        os.makedirs(workdir, exist_ok=True)
        if start_step is not None:
            self.dropped = truncate_after(workdir, start_step)
        self._file = open(self.path, 'a', encoding='utf-8')
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                pass
            else:
                self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))

    def write(self, step: int, metrics: Mapping[str, float], kind: str = 'train') -> None:
        """Write one record of `metrics` at `step` (on the primary process only).

        The record goes to a JSONL row with its `kind` and time (non-finite values as strings
        such as 'nan'), a console line when `console`, and TensorBoard scalars (tagged
        `kind/name` unless the name holds a '/').

        Args:
            step: the training step of the record.
            metrics: {name: value}; each value is converted with `float`.
            kind: the record's kind, 'train' or 'eval'.
        """
        if not self.primary:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        record = {'step': int(step), 'kind': kind, 'time': time.time(),
                  **{k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}
        self._file.write(json.dumps(record) + '\n')
        self._file.flush()
        if self.console:
            _console(format_line(step, kind, clean))
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k if '/' in k else f'{kind}/{k}', v, step)
            self._tb.flush()

    def event(self, step: int, text: str) -> None:
        """A run event (resumed, preempted): a console line `[  run] step N  text` when
        `console`, and an INFO log record (on every process).

        Args:
            step: the step at which the event happens.
            text: what happened.
        """
        log.info('step %d: %s', step, text)
        if self.console:
            _console(f'[{"run":>5}] step {step:>7}  {text}')

    def warning(self, step: int, text: str) -> None:
        """A warning about the run (it diverged), on the primary process only.

        It goes to a 'warning' record {'step', 'text'} in the JSONL, which `jlearngene info`
        shows, and a WARNING log record.

        Args:
            step: the step the warning is about.
            text: the warning.
        """
        if not self.primary:
            return
        log.warning('step %d: %s', step, text)
        record = {'step': int(step), 'kind': 'warning', 'time': time.time(), 'text': str(text)}
        self._file.write(json.dumps(record) + '\n')
        self._file.flush()

    def close(self) -> None:
        """Close the JSONL file and the TensorBoard writer."""
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def _console(line: str) -> None:
    try:
        from tqdm.auto import tqdm
        tqdm.write(line, file=sys.stdout)
    except ImportError:
        print(line, flush=True)


def read_metrics(workdir: str, kind: str | None = None) -> list[dict]:
    """Records of `workdir/metrics.jsonl`; for repeated steps the last record wins.

    A resumed run appends, so a (kind, step) may occur more than once. Only a regular file
    is opened (a FIFO or device would block or never end). A last line without its newline
    that is not JSON, as a crash or a full disk leaves it mid-write, is skipped with a
    warning naming it.

    Args:
        workdir: a training workdir, or the metrics file itself.
        kind: keep only records of this kind ('train', 'eval', 'warning'); `None` keeps all.

    Returns:
        The records (dicts), one per (kind, step), sorted by step and then kind.

    Raises:
        FileNotFoundError: there is no metrics file at `workdir`.
        ValueError: the path is not a regular file, a line other than a cut-off last one is
          not a JSON record with a step, or a record's step is not an integer or its kind
          not a string (the message names the file and line).
    """
    import stat
    path = os.path.join(workdir, METRICS_FILE) if os.path.isdir(workdir) else workdir
    if not os.path.exists(path):
        raise FileNotFoundError(f'no {METRICS_FILE} in {workdir!r} (not a training workdir?)')
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f'{path}: is not a regular file (a FIFO, device or folder); '
                         f'{METRICS_FILE} is a file that a run writes')
    with open(path, encoding='utf-8', errors='replace') as f:
        text = f.read()
    lines = text.split('\n')
    by_key: dict[tuple, dict] = {}
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
            step = rec['step']
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            if n == len(lines):   # no newline after it: cut off mid-write
                log.warning('%s:%d: skipped the last line, cut off mid-write (a crash or a full '
                            'disk?)', path, n)
                break
            why = f'{e}' if isinstance(e, json.JSONDecodeError) else 'no step'
            raise ValueError(f'{path}:{n}: not a JSON record with a step ({why})') from None
        _check_record(rec, path, n)
        if kind is None or rec.get('kind') == kind:
            by_key[(rec.get('kind'), step)] = rec
    return sorted(by_key.values(), key=lambda r: (r['step'], r.get('kind', '')))


def _check_record(rec: dict, path: str, n: int) -> None:
    """ValueError naming line `n` of `path` where the record's step is not an integer or its
    kind (where given) not a string: such records cannot be ordered with the others."""
    step, kind = rec['step'], rec.get('kind', '')
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f'{path}:{n}: the step must be an integer, got {step!r}')
    if not isinstance(kind, str):
        raise ValueError(f'{path}:{n}: the kind must be a string, got {kind!r}')


def truncate_after(workdir: str, step: int) -> int:
    """Drops the rows of `workdir/metrics.jsonl` with a step after `step`.

    Those are an earlier attempt's, which a run starting or resuming at `step` logs again;
    rows at or before `step` are kept. A line that is not a JSON record with a step (the
    cut-off last line a full disk or a kill leaves) is dropped too, with a warning, so that
    `read_metrics` (`jlearngene plot`, `info`) reads the file again; the file is replaced
    atomically.

    Args:
        workdir: the training workdir.
        step: the step the run starts or resumes at.

    Returns:
        How many rows with a later step were dropped (broken lines not counted); 0 when there
        is no metrics file.
    """
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return 0
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = f.read().splitlines()
    kept, dropped, broken = [], 0, []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            later = int(rec['step']) > step
        except (ValueError, KeyError, TypeError):
            broken.append(n)
            continue
        if later:
            dropped += 1
        else:
            kept.append(line)
    if broken:
        log.warning('%s: dropped %d line(s) that are not JSON records (at line %s; cut off by '
                    'a full disk or a kill?)', path, len(broken), ', '.join(map(str, broken)))
    tmp = path + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
        f.write(''.join(line + '\n' for line in kept))
    os.replace(tmp, path)
    return dropped


class Progress:
    """tqdm bar over steps on stderr (shows steps/s and ETA); a no-op when disabled and on
    every process but process 0 (unless `primary` says otherwise)."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True,
                 primary: bool | None = None):
        self._bar = None
        if enabled and (distributed.is_main_process() if primary is None else primary):
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, initial=initial, unit='step', dynamic_ncols=True,
                             smoothing=0.1, file=sys.stderr)

    def update(self, n: int = 1, **postfix) -> None:
        """Advance the bar `n` steps, showing `postfix` values beside it (no-op when disabled).

        Args:
            n: how many steps to advance.
            **postfix: {name: value} to show beside the bar; floats are formatted as in
              `format_line`.
        """
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in postfix.items()}, refresh=False)

    def close(self) -> None:
        """Close the bar."""
        if self._bar is not None:
            self._bar.close()

