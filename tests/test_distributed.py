"""Multi-process training on jax's distributed runtime: 2 processes x 4 CPU devices on
127.0.0.1 (gloo collectives) against 1 process x 8 devices, and a run preempted on one
process and resumed. Each run is a set of subprocesses (this file, run as a script) with a
hard deadline; they are killed when it passes or one of them fails."""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from jlearngene import distributed

DEADLINE_S = 420          # the whole test, every run of every process (~70 s on 2 idle cores)
TOTAL_DEVICES = 8
STEPS, INTERRUPT_AT_BATCH = 4, 1


needs_gloo = pytest.mark.skipif(sys.platform != 'linux',
                                reason="multi-process runs on CPU need gloo's collectives, "
                                       "which jaxlib ships in its Linux wheels")


# ------------------------------------------------------------------------------ settings

SLURM_TASK = {'SLURM_JOB_ID': '77', 'SLURM_STEP_NODELIST': 'node[3-4]', 'SLURM_NTASKS': '8',
              'SLURM_PROCID': '5', 'SLURM_LOCALID': '1'}


@pytest.fixture
def environ(monkeypatch):
    """Sets os.environ for `resolve`, starting from no JAX_ / SLURM_ / OMPI_ / Kubernetes variable."""
    for k in list(os.environ):
        if k.startswith(('JAX_COORDINATOR', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID', 'SLURM_', 'OMPI_',
                         'KUBERNETES_')):
            monkeypatch.delenv(k)

    def set_env(**values):
        for k, v in values.items():
            monkeypatch.setenv(k, v)
    return set_env


def test_resolve_order_and_errors(environ):
    environ(JAX_COORDINATOR_ADDRESS='10.0.0.1:1234', JAX_NUM_PROCESSES='4', JAX_PROCESS_ID='3',
            **SLURM_TASK)
    assert distributed.resolve('127.0.0.1:9', 2, 1) == distributed.Setup('args', '127.0.0.1:9', 2, 1)
    assert distributed.resolve() == distributed.Setup('env', '10.0.0.1:1234', 4, 3)
    with pytest.raises(distributed.DistributedError, match='JAX_PROCESS_ID missing'):
        environ(JAX_PROCESS_ID='')
        distributed.resolve()
    with pytest.raises(distributed.DistributedError, match="JAX_NUM_PROCESSES.*'two'"):
        environ(JAX_NUM_PROCESSES='two', JAX_PROCESS_ID='0')
        distributed.resolve()
    with pytest.raises(distributed.DistributedError, match='--process_id=2.*--num_processes=2'):
        distributed.resolve('h:1', 2, 2)
    with pytest.raises(distributed.DistributedError, match="'localhost'"):
        distributed.resolve('localhost', 2, 0)


def test_a_cluster_is_what_jax_detects(environ):
    assert distributed.resolve() == distributed.Setup('single')
    assert not distributed.resolve().multi_process
    environ(**SLURM_TASK)     # srun's variables: jax's SlurmCluster, which derives the coordinator
    assert distributed.resolve() == distributed.Setup('cluster', None, 8, 5, 'SlurmCluster')
    environ(SLURM_NTASKS='1', SLURM_PROCID='0')
    assert distributed.resolve().source == 'single'
    environ(SLURM_NTASKS='many')
    with pytest.raises(distributed.DistributedError, match='SlurmCluster.*many'):
        distributed.resolve()
    environ(SLURM_NTASKS='1')
    assert distributed.initialize() == distributed.Setup('single')   # one process: nothing starts


# ------------------------------------------------------------------------------ the worker

def _worker(pid: int, nproc: int, port: int, workdir: str, out: str, interrupt: int,
            cache: str) -> int:
    """One process of a multi-process run (see `_train`); the runs share compiled programs
    through jax's persistent cache in `cache`. Prints its phases' times (the test's
    failure message shows them)."""
    t0 = time.monotonic()
    os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={TOTAL_DEVICES // nproc}'
    os.environ['JAX_PLATFORMS'] = 'cpu'
    import jax
    jax.config.update('jax_disable_most_optimizations', True)   # tiny programs
    jax.config.update('jax_compilation_cache_dir', cache)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
    t1 = time.monotonic()
    distributed.initialize(f'127.0.0.1:{port}', nproc, pid, timeout_s=60)
    assert jax.process_count() == nproc and jax.device_count() == TOTAL_DEVICES
    t2 = time.monotonic()
    code = _train(pid, workdir, out, interrupt)
    print(f'process {pid}: import {t1 - t0:.1f} s, connect {t2 - t1:.1f} s, '
          f'train {time.monotonic() - t2:.1f} s', flush=True)
    return code


def _train(pid: int, workdir: str, out: str, interrupt: int) -> int:
    """Tiny ViT, grain data read per process, FSDP over every process's devices, metrics
    every 2 steps, a checkpoint at the end; process 1 sends itself SIGTERM while fetching
    batch `interrupt` (0: never). Process 0 writes the final params to `out`; returns the exit
    status."""
    import jax
    from jlearngene import data, parallel, pytree
    from jlearngene.models import init, vit_config
    import optax
    from jlearngene.train import hooks, tasks, trainer

    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                     num_classes=4)
    rng = np.random.default_rng(0)
    source = data.array_source(rng.integers(0, 256, (40, 8, 8, 3), np.uint8), rng.integers(0, 4, 40))
    it = data.train_iterator(source, batch_size=16, seed=3)   # this process's 16 / nproc rows

    class Data:   # the grain iterator, signalling SIGTERM on process 1 at one batch
        def __init__(self):
            self.n = 0

        def __next__(self):
            self.n += 1
            if interrupt and pid == 1 and self.n == interrupt:
                os.kill(os.getpid(), signal.SIGTERM)
            return next(it)

        def get_state(self):
            return it.get_state()

        def set_state(self, state):
            it.set_state(state)

    params = jax.jit(init, static_argnums=0)(cfg, jax.random.key(0))   # one program, not one per op
    if pid == 0:
        np.savez(out[:-len('.npz')] + '.init.npz', **{k: np.asarray(v) for k, v in pytree.flatten(params).items()})
    tx = optax.adamw(3e-3)
    try:
        params, _ = trainer.fit(tasks.classification_loss(cfg), params, Data(), tx,
                                trainer.FitConfig(workdir=workdir, steps=STEPS, log_every=2,
                                                  sharding='fsdp', fsdp_min_size=0,
                                                  steps_per_call=1, progress=False,
                                                  tensorboard=False,
                                                  experiment_config={'steps': STEPS}))
    except hooks.Preempted as e:
        print(f'process {pid}: {e}', flush=True)
        return int(e.code)
    host = jax.jit(lambda t: t, out_shardings=parallel.replicated(parallel.make_mesh()))(params)
    if pid == 0:
        np.savez(out, **{k: np.asarray(v) for k, v in pytree.flatten(host).items()})
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _run(nproc: int, workdir: str, out: str, deadline: float, interrupt: int = 0,
         cache: str = '') -> list[int]:
    """Start the run's processes and wait for all of them; on the deadline, or as soon as
    one fails while others still run, kill them all. Returns the exit codes."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(('JAX_', 'XLA_', 'SLURM_'))}
    env['PYTHONPATH'] = os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                         env.get('PYTHONPATH', '')])
    name = f'{workdir}.run{len(glob.glob(workdir + ".run*.log0"))}'   # one set of logs per run
    logs = [open(f'{name}.log{p}', 'w') for p in range(nproc)]
    procs = [subprocess.Popen([sys.executable, __file__, str(p), str(nproc), str(port), workdir,
                               out, str(interrupt), cache], env=env, stdout=logs[p],
                              stderr=subprocess.STDOUT) for p in range(nproc)]
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0, 143)]
            if time.monotonic() > deadline or failed:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    codes = [p.returncode for p in procs]
    if time.monotonic() > deadline or any(c not in (0, 143) for c in codes):
        tails = ''.join(f'\n--- process {i} (exit {c}):\n' + open(f'{name}.log{i}').read()[-3000:]
                        for i, c in enumerate(codes))
        pytest.fail(f'{nproc}-process run failed or passed the {DEADLINE_S} s deadline: {tails}')
    return codes


def _params(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.mark.slow
@needs_gloo
def test_two_processes_match_one_and_resume_exactly(tmp_path):
    deadline = time.monotonic() + DEADLINE_S
    one, two, cut = (str(tmp_path / n) for n in ('one', 'two', 'cut'))
    cache = str(tmp_path / 'jax_cache')
    t0 = time.monotonic()
    assert _train(0, one, one + '.npz', 0) == 0        # 1 process x 8 devices, in this process
    t1 = time.monotonic()
    assert _run(2, two, two + '.npz', deadline, cache=cache) == [0, 0]
    t2 = time.monotonic()
    # Process 1 alone is signalled while it fetches batch 1: both stop at the next sync
    # point (step 2, a log step), save it together and exit 143; the rerun resumes there.
    assert _run(2, cut, cut + '.npz', deadline, interrupt=INTERRUPT_AT_BATCH, cache=cache) == [143, 143]
    t3 = time.monotonic()
    assert not os.path.exists(cut + '.npz')
    assert sorted(os.listdir(os.path.join(cut, 'checkpoints'))) == ['2']
    assert _run(2, cut, cut + '.npz', deadline, cache=cache) == [0, 0]
    t4 = time.monotonic()
    print(f'run times: 1x8 {t1 - t0:.1f} s, 2x4 {t2 - t1:.1f} s, 2x4 preempted {t3 - t2:.1f} s, '
          f'resumed {t4 - t3:.1f} s')

    p1, p2, p3 = _params(one + '.npz'), _params(two + '.npz'), _params(cut + '.npz')
    d12, d23, moved = _max_diff(p1, p2), _max_diff(p2, p3), _max_diff(p1, _params(one + '.init.npz'))
    print(f'max |params| difference: 1x8 vs 2x4 {d12:.3g}, 2x4 vs preempted-and-resumed 2x4 '
          f'{d23:.3g}; training moved them by up to {moved:.3g}')
    # Adam's update m / sqrt(v) magnifies the rounding of the cross-process sums in
    # parameters with tiny gradients; the tolerance is still 1/100 of the training's change.
    assert moved > 1e-2 and d12 < 1e-4 and d23 < 1e-4
    # Process 0 alone writes the metrics: one record per log step (the resumed run appends
    # step 4 after the preempted run's 2) and one config.json; process 1 prints no metrics.
    for workdir in (two, cut):
        steps = [json.loads(l)['step'] for l in open(os.path.join(workdir, 'metrics.jsonl'))]
        assert steps == [2, 4], steps
        assert os.path.exists(os.path.join(workdir, 'config.json'))
    preempted = [open(f'{cut}.run0.log{p}').read() for p in range(2)]
    assert all('preempted (SIGTERM) at step 2' in text for text in preempted)
    assert 'loss=' in preempted[0] and 'loss=' not in preempted[1]


if __name__ == '__main__':
    pid, nproc, port, workdir, out, interrupt, cache = sys.argv[1:]
    sys.exit(_worker(int(pid), int(nproc), int(port), workdir, out, int(interrupt), cache))
