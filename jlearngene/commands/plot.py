"""`jlearngene plot WORKDIR [--out FILE]`: loss and accuracy curves from metrics.jsonl."""
from __future__ import annotations

import os

HELP = 'plot loss/accuracy curves of a training workdir to a PNG'


def plot(workdir: str, out: str | None = None) -> str:
    """Render train/eval loss and accuracy against step; returns the PNG path."""
    from jlearngene.commands.config_args import dangling_symlink
    dangling = dangling_symlink(workdir, 'workdir')
    if dangling:
        raise FileNotFoundError(dangling)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from jlearngene.train.metrics import read_metrics
    if not os.path.exists(workdir):
        raise FileNotFoundError(f'{workdir!r} does not exist')
    records = read_metrics(workdir)
    if not records:
        raise ValueError(f'{workdir!r}: metrics.jsonl has no records yet')
    train = [r for r in records if r.get('kind') == 'train']
    evals = [r for r in records if r.get('kind') == 'eval']
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for rows, key, label, ax in ((train, 'loss', 'train loss', ax_loss), (evals, 'eval/loss', 'eval loss', ax_loss),
                                 (train, 'accuracy', 'train accuracy', ax_acc),
                                 (evals, 'eval/accuracy', 'eval accuracy', ax_acc)):
        pts = [(r['step'], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker='o' if len(pts) < 30 else None, label=label)
    for ax, name in ((ax_loss, 'loss'), (ax_acc, 'accuracy')):
        ax.set(xlabel='step', ylabel=name)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(os.path.basename(os.path.abspath(workdir)))
    fig.tight_layout()
    # WORKDIR may be the metrics.jsonl file itself (read_metrics reads either)
    out = out or os.path.join(workdir if os.path.isdir(workdir) else os.path.dirname(workdir) or '.',
                              'curves.png')
    from jlearngene.train.files import write_file
    try:
        write_file(out, lambda tmp: fig.savefig(tmp, dpi=100))   # renamed in when whole
    finally:
        plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    """The command: writes the curves of the workdir (or of its metrics.jsonl) with `plot`
    and prints the PNG's path; exit status 0."""
    from jlearngene.commands.config_args import Parser
    parser = Parser('jlearngene plot', __doc__)
    parser.add_argument('workdir')
    parser.add_argument('--out', help='PNG path (default WORKDIR/curves.png)')
    args = parser.parse_args(argv)
    print(plot(args.workdir, args.out))   # errors: one line on stderr, from jlearngene.cli
    return 0
