"""Starting jax's distributed runtime: one process per host (or per GPU), all in one run.

`initialize` is called once per process, before anything touches a jax device; after it,
`jax.devices()` lists every process's devices and `fit` trains over all of them. Where the
settings come from, first match wins (`resolve`):

1. arguments (the `jlearngene train` flags `--coordinator_address`, `--num_processes`,
   `--process_id`);
2. the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`;
3. SLURM (`srun`): `SLURM_NTASKS` > 1 with `SLURM_PROCID` (jax derives the coordinator
   from `SLURM_STEP_NODELIST` and the job id);
4. a Cloud TPU VM: jax reads the pod slice's workers from the TPU metadata;
5. otherwise one process, and nothing is started.

On CPU the cross-process collectives are gloo's (`jax_cpu_collectives_implementation`),
so the same code runs as several processes on one machine (the tests do: 2 processes x 4
devices on 127.0.0.1).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping

log = logging.getLogger(__name__)

SOURCES = ('args', 'env', 'slurm', 'tpu', 'single')
ENV_ADDRESS, ENV_COUNT, ENV_ID = 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'


class DistributedError(ValueError):
    """Inconsistent or incomplete multi-process settings; the message names the setting."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where this process stands: `source` is one of SOURCES; address / count / id are None
    where jax detects them itself (SLURM's coordinator, a TPU pod slice)."""
    source: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    @property
    def multi_process(self) -> bool:
        return self.source != 'single'


def _int(value, name: str) -> int | None:
    if value is None or value == '':
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedError(f'{name} must be an integer, got {value!r}') from None


def _on_tpu_vm() -> bool:
    """A Cloud TPU VM: libtpu is installed and TPU chips are visible (/dev/accel* or vfio)."""
    import importlib.util
    if importlib.util.find_spec('libtpu') is None:
        return False
    return any(n.startswith('accel') for n in os.listdir('/dev')) or os.path.isdir('/dev/vfio')


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, *, environ: Mapping[str, str] | None = None,
            tpu: bool | None = None) -> Setup:
    """The multi-process settings of this process (see the module docstring for the order);
    nothing is started. `environ` defaults to `os.environ`, `tpu` to `_on_tpu_vm()`."""
    env = os.environ if environ is None else environ
    for source, (addr, count, pid) in (
            ('args', (coordinator_address, num_processes, process_id)),
            ('env', (env.get(ENV_ADDRESS), env.get(ENV_COUNT), env.get(ENV_ID)))):
        names = (('--coordinator_address', '--num_processes', '--process_id') if source == 'args'
                 else (ENV_ADDRESS, ENV_COUNT, ENV_ID))
        count, pid = _int(count, names[1]), _int(pid, names[2])
        given = [v not in (None, '') for v in (addr, count, pid)]
        if not any(given):
            continue
        if not all(given):
            missing = [n for n, g in zip(names, given) if not g]
            raise DistributedError(f'multi-process settings from {source}: {", ".join(missing)} '
                                   f'missing (give all of {", ".join(names)})')
        if count < 1 or not 0 <= pid < count:
            raise DistributedError(f'{names[2]}={pid} must be in [0, {names[1]}={count})')
        if ':' not in str(addr):
            raise DistributedError(f'{names[0]}={addr!r} must be host:port')
        return Setup(source, str(addr), count, pid)
    ntasks = _int(env.get('SLURM_NTASKS'), 'SLURM_NTASKS')
    if ntasks is not None and ntasks > 1:
        pid = _int(env.get('SLURM_PROCID'), 'SLURM_PROCID')
        if pid is None:
            raise DistributedError('SLURM_NTASKS > 1 but SLURM_PROCID is unset: start the '
                                   'processes with srun')
        return Setup('slurm', None, ntasks, pid)
    if _on_tpu_vm() if tpu is None else tpu:
        return Setup('tpu')
    return Setup('single')


_STARTED: Setup | None = None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, environ: Mapping[str, str] | None = None,
               tpu: bool | None = None, timeout_s: int = 300) -> Setup:
    """Start jax's distributed runtime as `resolve` says (no-op for one process, and when
    this process started it already). Must run before any jax device is used. Returns the
    `Setup`. `timeout_s` bounds the wait for the other processes to connect."""
    global _STARTED
    setup = resolve(coordinator_address, num_processes, process_id, environ=environ, tpu=tpu)
    if _STARTED is not None:
        if setup.multi_process and setup != _STARTED:
            raise DistributedError(f'the distributed runtime runs as {_STARTED}; cannot start it '
                                   f'again as {setup}')
        return _STARTED
    if not setup.multi_process:
        return setup
    import jax
    # The CPU devices' collectives across processes (GPU and TPU devices ignore it).
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    kwargs = dict(initialization_timeout=int(timeout_s))
    if setup.source in ('args', 'env'):
        kwargs.update(coordinator_address=setup.coordinator_address,
                      num_processes=setup.num_processes, process_id=setup.process_id)
    elif setup.source == 'slurm':
        kwargs.update(num_processes=setup.num_processes, process_id=setup.process_id)
    jax.distributed.initialize(**kwargs)
    _STARTED = Setup(setup.source, setup.coordinator_address, jax.process_count(), jax.process_index())
    log.info('distributed runtime: process %d of %d (%s)', jax.process_index(),
             jax.process_count(), setup.source)
    return _STARTED


def shutdown() -> None:
    """Stop the runtime this process started (the processes leave together)."""
    global _STARTED
    if _STARTED is not None:
        import jax
        jax.distributed.shutdown()
        _STARTED = None


def is_main_process() -> bool:
    """Process 0: the one that writes metrics, logs, config files and plots."""
    import jax
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (no-op for one process)."""
    import jax
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
