"""State dicts ({name: array}) as files, and the checks that every converter shares.

Files: `load_state_dict` reads `.safetensors` and `.npz` into numpy, and torch pickles when
the optional extra is installed (`pip install -e ".[timm]"`); `save_safetensors` writes a file
that `safetensors.torch.load_file` and timm read back; `file_kind` tells a file's format
from its first bytes. A file that cannot be read as its format (empty, truncated, another
format under the suffix, no arrays) is a `StateDictError` naming the file and the reason;
files are only ever opened for reading.

Checks (used by the timm, big_vision and LeTs converters, the NNX module and gene files):
`check_params` (a canonical tree against its config), `check_values` (finite floats, where
parameters enter: converted files, genes, descendants, `--config.init`), `stacked_for_export`
(blocks of one shape), and the problem helpers (`key_problems`, `entry_problems`,
`unexpected_keys`, `ranked_shape`, `problem_message`) that gather every missing, unexpected
and mis-shaped entry into one error.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any
from collections.abc import Mapping

import jax
import numpy as np

from jlearngene import pytree
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

StateDict = dict[str, np.ndarray]


TORCH_EXTRA_HINT = 'install the optional extra: pip install -e ".[timm]" (torch + timm)'


class StateDictError(ValueError):
    """A state dict (or parameter tree) does not fit the expected layout. The message lists
    every missing, unexpected and inconsistent entry at once."""


# ----------------------------------------------------------------------------------------
# Files.

PICKLE_SUFFIXES = ('.pth', '.pt', '.bin', '.ckpt')


_WRAPPER_KEYS = ('model', 'state_dict', 'model_ema', 'state_dict_ema', 'module')


def load_state_dict(path: str | os.PathLike) -> StateDict:
    """Read a state dict into numpy: `.safetensors` and `.npz`; `.pth`/`.pt`/`.bin`/`.ckpt`
    (torch pickles, loaded with `weights_only=True`) when torch is installed. Training
    checkpoints that wrap the weights under 'model' / 'state_dict' (DeiT, timm) are unwrapped
    and a DistributedDataParallel 'module.' prefix is removed. bfloat16 becomes float32."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'state dict file {path!r} does not exist')
    low = path.lower()
    if low.endswith('.safetensors'):
        sd = _load_safetensors(path)
    elif low.endswith('.npz'):
        sd = _load_npz(path)
    elif low.endswith(PICKLE_SUFFIXES):
        sd = _load_torch(path)
    else:
        raise StateDictError(f'{path!r}: unknown state dict format; expected .safetensors, .npz or '
                             f'{"/".join(PICKLE_SUFFIXES)} (torch)')
    if any(k.startswith('module.') for k in sd) and all(k.startswith('module.') for k in sd):
        sd = {k[len('module.'):]: v for k, v in sd.items()}
    # numpy has no bfloat16 of its own (safetensors may hand back ml_dtypes.bfloat16).
    return {k: v.astype(np.float32) if v.dtype.name == 'bfloat16' else v for k, v in sd.items()}


def file_kind(path: str | os.PathLike) -> str:
    """What an existing file holds, from its first bytes (not its name): 'safetensors' (an
    8-byte header length and a JSON header), 'npz' (a zip archive of .npy arrays), 'torch'
    (a torch zip archive or pickle), 'empty' (0 bytes) or 'unknown'. FileNotFoundError for
    a path that does not exist, IsADirectoryError for a directory."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f'{path!r} is a directory, not a file')
    if not os.path.exists(path):
        raise FileNotFoundError(f'{path!r} does not exist')
    size = os.path.getsize(path)
    with open(path, 'rb') as fh:
        head = fh.read(9)
    if not head:
        return 'empty' if size == 0 else 'unknown'
    if len(head) == 9 and head[8:9] == b'{' and int.from_bytes(head[:8], 'little') <= size - 8:
        return 'safetensors'
    if head[:4] in (b'PK\x03\x04', b'PK\x05\x06'):    # a zip archive: .npz, or torch.save's
        import zipfile
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return 'unknown'
        if any(n == 'data.pkl' or n.endswith('/data.pkl') for n in names):
            return 'torch'
        return 'npz' if all(n.endswith('.npy') for n in names) else 'unknown'
    if head[:1] == b'\x80' and 2 <= head[1] <= 5:    # a pickle (torch.save's legacy format)
        return 'torch'
    return 'unknown'


def _unreadable(path: str, kind: str, e: BaseException | str) -> StateDictError:
    reason = e if isinstance(e, str) else f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'
    return StateDictError(f'{path!r} is not a readable {kind} file ({reason}); it is empty, '
                          'truncated, corrupted or of another format')


def _load_npz(path: str) -> StateDict:
    try:
        with open(path, 'rb') as fh:
            magic = fh.read(4)
        if magic[:2] != b'PK':   # a zip archive; np.load would try other formats (pickle)
            raise _unreadable(path, '.npz', 'no zip archive header' if magic else 'the file is empty')
        with np.load(path, allow_pickle=False) as f:
            return {k: np.asarray(f[k]) for k in f.files}
    except StateDictError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile / numpy raise many kinds for bad files
        if isinstance(e, ValueError) and 'pickle' in str(e):
            raise StateDictError(f'{path!r} holds an object (pickled) array; a state dict .npz '
                                 'holds numeric arrays only') from None
        raise _unreadable(path, '.npz', e) from None


# safetensors dtypes read into numpy (BF16 through ml_dtypes, which jax registers with numpy).
_ST_DTYPES = ('F64', 'F32', 'F16', 'BF16', 'I64', 'I32', 'I16', 'I8', 'U64', 'U32', 'U16', 'U8', 'BOOL')


def _safe_open(path: str):
    """`safetensors.safe_open` of `path` for numpy; StateDictError naming the file when its
    header cannot be parsed (empty, truncated, not JSON, offsets that do not cover the file)."""
    import safetensors
    try:
        return safetensors.safe_open(path, framework='numpy')
    except safetensors.SafetensorError as e:
        raise _unreadable(path, '.safetensors', str(e)) from None


def _load_safetensors(path: str) -> StateDict:
    import safetensors
    with _safe_open(path) as f:
        out = {}
        for k in f.keys():
            dtype = f.get_slice(k).get_dtype()
            if dtype not in _ST_DTYPES:
                raise StateDictError(f'{path!r}: tensor {k!r} has dtype {dtype}, which is not supported')
            try:
                out[k] = f.get_tensor(k)
            except safetensors.SafetensorError as e:
                raise _unreadable(path, '.safetensors', f'tensor {k!r}: {e}') from None
        return out


def _load_torch(path: str) -> StateDict:
    try:
        import torch
    except ImportError as e:
        raise ImportError(f'reading {path!r} (a torch pickle) needs torch; {TORCH_EXTRA_HINT}, '
                          'or convert the file to .safetensors') from e
    try:
        obj = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle/zip/torch raise many kinds for bad files
        raise _unreadable(path, 'torch', e) from None
    while isinstance(obj, dict) and not any(torch.is_tensor(v) for v in obj.values()):
        inner = next((obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            raise StateDictError(f'{path!r} holds no tensors at the top level and none of the usual '
                                 f'wrapper keys {_WRAPPER_KEYS}; keys are {sorted(obj)[:20]}')
        obj = inner
    if not isinstance(obj, dict):
        raise StateDictError(f'{path!r} holds a {type(obj).__name__}, not a state dict')
    return {k: to_numpy(v) for k, v in obj.items() if torch.is_tensor(v)}


def to_numpy(v: Any) -> np.ndarray:
    """numpy view of an array or a torch tensor (bfloat16 tensors become float32, exactly)."""
    if hasattr(v, 'detach') and hasattr(v, 'cpu'):  # torch.Tensor, without importing torch
        v = v.detach().cpu()
        if str(v.dtype) == 'torch.bfloat16':
            v = v.float()
        return v.numpy()
    return np.asarray(v)


def save_safetensors(state_dict: Mapping[str, Any], path: str | os.PathLike, *,
                     metadata: Mapping[str, str] | None = None) -> str:
    """Write a state dict of arrays to `.safetensors` (readable by `safetensors.torch` and timm).
    `metadata` is a str -> str dict stored in the header. The file is renamed into place
    once complete (`train.files.write_file`): a failed write leaves the old one."""
    import safetensors.numpy

    from jlearngene.train import files
    path = os.fspath(path)
    if not path.endswith('.safetensors'):
        raise ValueError(f'{path!r}: the output file name must end in .safetensors')
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = {'format': 'pt', **(dict(metadata) if metadata else {})}
    data = safetensors.numpy.save({k: np.ascontiguousarray(to_numpy(v)) for k, v in state_dict.items()},
                                  metadata=meta)

    def write(tmp):
        with open(tmp, 'wb') as f:   # open(): the umask's mode (safetensors' save_file writes 0600)
            f.write(data)
    return files.write_file(path, write)


def read_safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The str -> str metadata in a `.safetensors` header ({} when there is none)."""
    path = os.fspath(path)
    with _safe_open(path) as f:
        return dict(f.metadata() or {})


# Keys that every timm ViT state dict has one of (after DDP's 'module.' prefix).
TIMM_VIT_KEYS = ('patch_embed.proj.weight', 'pos_embed', 'cls_token')


def archive_keys(path: str | os.PathLike, kind: str) -> list[str] | None:
    """The array names of an .npz (`kind` 'npz') or the tensor names of a .safetensors file
    (from its zip directory or JSON header: nothing else is read); None when they cannot be
    read."""
    import json
    try:
        if kind == 'npz':
            with np.load(path, allow_pickle=False) as f:
                return list(f.files)
        with open(path, 'rb') as f:
            n = int.from_bytes(f.read(8), 'little')
            header = json.loads(f.read(n))
        return [k for k in header if k != '__metadata__']
    except Exception:  # noqa: BLE001 - zipfile / numpy / json raise many kinds for bad files
        return None


def keys_format(keys: list[str], kind: str) -> str | None:
    """The checkpoint format that an archive's keys are written in: 'big_vision' for an .npz
    with '/'-joined keys, 'timm' for a timm ViT's '.'-joined keys (`TIMM_VIT_KEYS` or
    'blocks.*'), else None."""
    if any('/' in k for k in keys):
        return 'big_vision' if kind == 'npz' else None
    bare = [k[len('module.'):] if k.startswith('module.') else k for k in keys]
    return 'timm' if any(k in TIMM_VIT_KEYS or k.startswith('blocks.') for k in bare) else None


# Each export: what it writes, and the suffix of its file.
EXPORTS = {'timm': ('a timm state dict', '.safetensors'),
           'big_vision': ('a big_vision checkpoint', '.npz')}


def is_export(path: str | os.PathLike, fmt: str) -> bool:
    """Whether the file `path` is an export of format `fmt` (`EXPORTS`): its suffix, its
    contents' kind (`file_kind`) and its keys (`keys_format`)."""
    suffix = EXPORTS[fmt][1]
    if not os.fspath(path).endswith(suffix) or not os.path.isfile(path):
        return False
    kind = file_kind(path)
    keys = archive_keys(path, kind) if kind == suffix[1:] else None
    return bool(keys) and keys_format(keys, kind) == fmt


def check_output(path: str | os.PathLike, flag: str, fmt: str, overwrite: bool, *,
                 inputs=(), how: str = '--overwrite') -> None:
    """A one-line error unless `path` (given as `flag`) names a file that an export of
    format `fmt` (`EXPORTS`) may write: its suffix, and nothing there or, with `overwrite`,
    an export of the same format that is none of `inputs` (`train.files.check_replaceable`;
    `how` names the switch: '--overwrite' or 'overwrite=True')."""
    from jlearngene.train import files
    what, suffix = EXPORTS[fmt]
    if not str(path).endswith(suffix):
        raise ValueError(f'{flag} {path!r}: {what} is written as {suffix}; give a file name '
                         f'ending in {suffix}')
    files.check_replaceable(path, f'{what} ({suffix})', lambda p: is_export(p, fmt),
                            overwrite=overwrite, how=how, inputs=inputs)


# ----------------------------------------------------------------------------------------
# Checks.

def check_params(params: Any, cfg: ViTConfig) -> None:
    """Raise StateDictError listing every leaf of `params` (stacked layout) that is missing,
    unexpected or shaped differently from what `cfg` implies."""
    want = jax.eval_shape(lambda: vit.init(cfg, jax.random.key(0)))
    diff = pytree.structure_diff(want, params)
    problems = [f'{kind} parameters ({len(diff[kind])}): ' + ', '.join(diff[kind])
                for kind in ('missing', 'unexpected') if diff[kind]]
    problems += [f'{k}: shape {got}, expected {exp}' for k, exp, got in diff['shape']]
    if problems:
        raise StateDictError(problem_message('parameters do not match the config', problems))


def check_values(params: Any, where: str) -> None:
    """Raise StateDictError naming the first leaf of `params` that is not a floating array
    or holds NaN or inf (`where` names the tree: a file, a gene, a flag). Parameters
    enter here from files and flags; an integer tree would run with all-zero logits and a
    NaN would reach the first loss."""
    import jax.numpy as jnp
    for path, leaf in pytree.flatten(params).items():
        dtype = getattr(leaf, 'dtype', None) or np.asarray(leaf).dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise StateDictError(f"{where}: parameter '{path}' is {np.dtype(dtype).name}, not a "
                                 'floating type; parameters are float arrays')
        if bool(jnp.all(jnp.isfinite(leaf))):
            continue
        x = np.asarray(jax.device_get(leaf), np.float32)
        counts = [f'{n} {name}' for n, name in ((int(np.isnan(x).sum()), 'NaN'),
                                                (int(np.isinf(x).sum()), 'inf')) if n]
        raise StateDictError(f"{where}: parameter '{path}' holds {' and '.join(counts)} of "
                             f'{x.size} values; parameters must be finite')


def stacked_for_export(params: Any, fmt: str) -> Any:
    """`params` in the stacked layout, for a format (`fmt`, in words) whose blocks all have one
    shape; list-layout blocks that differ (per-layer head counts, e.g. Cluster-Learngene) are a
    StateDictError naming each block's head count and MLP size."""
    if layout.is_stacked(params):
        return params
    try:
        return layout.stack_blocks(params)
    except ValueError as e:
        try:
            blocks = params['blocks']
            heads = [int(np.shape(b['attn']['q']['kernel'])[1]) for b in blocks]
            mlps = [int(np.shape(b['mlp']['fc1']['kernel'])[1]) for b in blocks]
            why = f'heads per block {heads}, MLP sizes {mlps}'
        except (KeyError, TypeError, IndexError):   # not ViT blocks: the layout's own words
            why = str(e)
        raise StateDictError(f"{fmt} has blocks of one shape; this model's blocks differ ({why}): "
                             'it stays in the list layout and cannot be exported') from None


def problem_message(title: str, problems: list[str]) -> str:
    """`title (N problems):` and one indented line per problem: every mismatch in one error."""
    lines = [f'{title} ({len(problems)} problem{"s" if len(problems) != 1 else ""}):']
    lines += [f'  - {p}' for p in problems]
    return '\n'.join(lines)


def ranked_shape(shape: Mapping[str, tuple], key: str, rank: int, gives: str,
                 problems: list[str]) -> tuple | None:
    """`shape[key]` when it has `rank` axes; else None, with a problem saying what it gives."""
    s = shape.get(key)
    if s is not None and len(s) == rank:
        return s
    problems.append(f'{key} is {"missing" if s is None else f"of shape {s}"}; it gives {gives}')
    return None


def unsupported_hint(key: str, unsupported=()) -> str:
    """Why jlearngene's ViT lacks a key of a known variant, else ''. `unsupported`: the
    converter's (key regex, what the variant has) pairs."""
    return next((f' ({what}: not supported by jlearngene ViT)' for rx, what in unsupported
                 if re.fullmatch(rx, key)), '')


def unexpected_keys(keys: list[str], unsupported=()) -> list[str]:
    """The problem that names `keys` outside the layout (each with the reason where a known
    ViT variant has it); [] for no keys."""
    hints = ', '.join(k + unsupported_hint(k, unsupported) for k in keys)
    return [f'unexpected keys ({len(keys)}): {hints}'] if keys else []


def key_problems(arrays: Mapping[str, Any], want: Mapping[str, tuple],
                 unsupported=()) -> list[str]:
    """The keys of the layout `want` ({key: shape}) that `arrays` lacks, and those it has
    beyond it."""
    missing = [k for k in want if k not in arrays]
    problems = [f'missing keys ({len(missing)}): ' + ', '.join(missing)] if missing else []
    return problems + unexpected_keys(sorted(k for k in arrays if k not in want), unsupported)


def _dtype_name(v: Any) -> str:
    return str(getattr(v, 'dtype', np.asarray(v).dtype))


def _is_float(v: Any) -> bool:
    return bool(re.match(r'(torch\.)?(float|bfloat)', _dtype_name(v)))


def entry_problems(arrays: Mapping[str, Any], want: Mapping[str, tuple],
                   floating=_is_float) -> list[str]:
    """The entries of `arrays` in the layout `want` of another shape or a dtype that
    `floating` rejects."""
    problems = []
    for k, s in want.items():
        if k in arrays:
            got = tuple(np.shape(arrays[k]))
            if got != s:
                problems.append(f'{k}: shape {got}, expected {s}')
            if not floating(arrays[k]):
                problems.append(f'{k}: dtype {_dtype_name(arrays[k])}, expected a floating type')
    return problems


def isqrt_exact(n: int) -> int | None:
    """The integer square root of `n` when `n` is a perfect square, else None."""
    r = math.isqrt(n) if n >= 0 else -1
    return r if r >= 0 and r * r == n else None
