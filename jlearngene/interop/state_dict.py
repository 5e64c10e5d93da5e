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
    """Read a state dict into numpy.

    Training checkpoints that wrap the weights under 'model' / 'state_dict' (DeiT, timm) are
    unwrapped and a DistributedDataParallel 'module.' prefix (on every key) is removed.

    Args:
        path: a `.safetensors` or `.npz` file, or a `.pth`/`.pt`/`.bin`/`.ckpt` torch pickle
          (loaded with `weights_only=True`; needs torch). The suffix (any letter case) picks the reader.

    Returns:
        The arrays by name, in numpy; bfloat16 arrays become float32.

    Raises:
        IsADirectoryError: `path` is a directory.
        FileNotFoundError: `path` is no file.
        StateDictError: the suffix is none of these, or the file cannot be read as its format
          (empty, truncated, another format, a `.safetensors` dtype numpy lacks, a pickled `.npz`
          array, a torch pickle that holds no state dict), or it holds no arrays.
        ImportError: a torch pickle without torch installed.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f'state dict file {path!r} is a directory, not a file')
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
    if not sd:
        raise StateDictError(f'{path!r} holds no arrays; a state dict file holds at least one')
    if any(k.startswith('module.') for k in sd) and all(k.startswith('module.') for k in sd):
        sd = {k[len('module.'):]: v for k, v in sd.items()}
    # numpy has no bfloat16 of its own (safetensors may hand back ml_dtypes.bfloat16).
    return {k: v.astype(np.float32) if v.dtype.name == 'bfloat16' else v for k, v in sd.items()}


def file_kind(path: str | os.PathLike) -> str:
    """What an existing file holds, from its first bytes (not its name).

    Args:
        path: the file.

    Returns:
        'safetensors' (an 8-byte header length and a JSON header), 'npz' (a zip archive of .npy
        arrays), 'torch' (a torch zip archive or pickle), 'empty' (0 bytes) or 'unknown'.

    Raises:
        IsADirectoryError: `path` is a directory.
        FileNotFoundError: `path` does not exist.
    """
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
    """numpy view of an array or a torch tensor (bfloat16 tensors become float32, exactly).

    Args:
        v: a torch tensor (detached and moved to the CPU; torch is not imported), or anything
          `np.asarray` reads.

    Returns:
        The numpy array.
    """
    if hasattr(v, 'detach') and hasattr(v, 'cpu'):  # torch.Tensor, without importing torch
        v = v.detach().cpu()
        if str(v.dtype) == 'torch.bfloat16':
            v = v.float()
        return v.numpy()
    return np.asarray(v)


def save_safetensors(state_dict: Mapping[str, Any], path: str | os.PathLike, *,
                     metadata: Mapping[str, str] | None = None) -> str:
    """Write a state dict of arrays to `.safetensors` (readable by `safetensors.torch` and timm).

    The file is renamed into place once complete (`train.files.write_file`): a failed write
    leaves the old one. Missing parent folders are made.

    Args:
        state_dict: {name: array or torch tensor}.
        path: the output file; its name must end in `.safetensors`.
        metadata: str -> str entries stored in the header, beside (or replacing) its
          `'format': 'pt'`.

    Returns:
        `path`, as a str.

    Raises:
        ValueError: `path` does not end in `.safetensors`.
        OSError: the file cannot be written (named by `train.files.write_file`).
    """
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
    """The str -> str metadata in a `.safetensors` header.

    Args:
        path: the `.safetensors` file.

    Returns:
        The metadata; {} when there is none.

    Raises:
        StateDictError: the header cannot be parsed (empty, truncated, not JSON).
        FileNotFoundError: there is no file at `path`.
    """
    path = os.fspath(path)
    with _safe_open(path) as f:
        return dict(f.metadata() or {})


# Keys that every timm ViT state dict has one of (after DDP's 'module.' prefix).
TIMM_VIT_KEYS = ('patch_embed.proj.weight', 'pos_embed', 'cls_token')


def archive_keys(path: str | os.PathLike, kind: str) -> list[str] | None:
    """The array names of an .npz or the tensor names of a .safetensors file.

    Only the zip directory or the JSON header is read, no array.

    Args:
        path: the file.
        kind: 'npz' for an .npz; anything else reads a .safetensors header.

    Returns:
        The names, in the file's order; `None` when they cannot be read.
    """
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
    """The checkpoint format that an archive's keys are written in.

    Args:
        keys: the archive's array names (`archive_keys`).
        kind: the archive's kind (`file_kind`): '/'-joined keys count only in 'npz'.

    Returns:
        'big_vision' for an .npz with '/'-joined keys; 'timm' for a timm ViT's '.'-joined keys
        (one of `TIMM_VIT_KEYS` or 'blocks.*', a 'module.' prefix ignored); else `None`.
    """
    if any('/' in k for k in keys):
        return 'big_vision' if kind == 'npz' else None
    bare = [k[len('module.'):] if k.startswith('module.') else k for k in keys]
    return 'timm' if any(k in TIMM_VIT_KEYS or k.startswith('blocks.') for k in bare) else None


# Each export: what it writes, and the suffix of its file.
EXPORTS = {'timm': ('a timm state dict', '.safetensors'),
           'big_vision': ('a big_vision checkpoint', '.npz')}


def is_export(path: str | os.PathLike, fmt: str) -> bool:
    """Whether a file is an export of a format, by its suffix, contents and keys.

    Args:
        path: the file.
        fmt: the format, a key of `EXPORTS` ('timm' or 'big_vision').

    Returns:
        True where `path` is a file with the format's suffix, its contents are of that kind
        (`file_kind`) and its keys are written in `fmt` (`keys_format`).
    """
    suffix = EXPORTS[fmt][1]
    if not os.fspath(path).endswith(suffix) or not os.path.isfile(path):
        return False
    kind = file_kind(path)
    keys = archive_keys(path, kind) if kind == suffix[1:] else None
    return bool(keys) and keys_format(keys, kind) == fmt


def check_output(path: str | os.PathLike, flag: str, fmt: str, overwrite: bool, *,
                 inputs=(), how: str = '--overwrite') -> None:
    """A one-line error unless `path` names a file that an export of a format may write.

    It may when the name has the format's suffix and nothing is there or, with `overwrite`, an
    export of the same format that is none of `inputs` (`train.files.check_replaceable`).

    Args:
        path: the output file.
        flag: how `path` was given, for the message (e.g. '--output').
        fmt: the export's format, a key of `EXPORTS`.
        overwrite: whether an existing export of `fmt` may be replaced.
        inputs: the paths the export reads; `path` may be none of them nor hold one.
        how: the switch that allows replacing, for the message: '--overwrite' or 'overwrite=True'.

    Raises:
        ValueError: `path` lacks the format's suffix.
        FileExistsError: something is at `path` that may not be replaced (another kind of file,
          an export without `overwrite`, or one of `inputs`).
    """
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
    """Check a canonical parameter tree against its config.

    Args:
        params: the parameters, stacked layout (arrays or `jax.ShapeDtypeStruct`s).
        cfg: the config that implies their paths and shapes (`vit.init`'s).

    Raises:
        StateDictError: a leaf is missing, unexpected or shaped differently from what `cfg`
          implies; the message lists every one.
    """
    want = jax.eval_shape(lambda: vit.init(cfg, jax.random.key(0)))
    diff = pytree.structure_diff(want, params)
    problems = [f'{kind} parameters ({len(diff[kind])}): ' + ', '.join(diff[kind])
                for kind in ('missing', 'unexpected') if diff[kind]]
    problems += [f'{k}: shape {got}, expected {exp}' for k, exp, got in diff['shape']]
    if problems:
        raise StateDictError(problem_message('parameters do not match the config', problems))


def check_values(params: Any, where: str) -> None:
    """Check that every parameter is a finite floating array.

    Parameters enter here from files and flags; an integer tree would run with all-zero logits
    and a NaN would reach the first loss.

    Args:
        params: a parameter tree.
        where: what the tree is, for the message: a file, a gene, a flag.

    Raises:
        StateDictError: naming the first leaf (in `pytree.flatten`'s order) that is not of a
          floating dtype or holds NaN or inf (with their counts).
    """
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
    """Parameters in the stacked layout, for a format whose blocks all have one shape.

    Args:
        params: canonical parameters, stacked or list layout.
        fmt: the format, in words, for the message (e.g. "timm's VisionTransformer").

    Returns:
        `params` itself when stacked, else its blocks stacked (`layout.stack_blocks`).

    Raises:
        StateDictError: list-layout blocks that differ (per-layer head counts, e.g.
          Cluster-Learngene), naming each block's head count and MLP size.
    """
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
    """Every mismatch in one error message.

    Args:
        title: what does not fit, without a final colon.
        problems: one phrase per problem.

    Returns:
        The first line, `title (N problems)` and a colon, then one indented `- problem` line per
        problem.
    """
    lines = [f'{title} ({len(problems)} problem{"s" if len(problems) != 1 else ""}):']
    lines += [f'  - {p}' for p in problems]
    return '\n'.join(lines)


def ranked_shape(shape: Mapping[str, tuple], key: str, rank: int, gives: str,
                 problems: list[str]) -> tuple | None:
    """`shape[key]` when it has `rank` axes; else `None`, with a problem saying what it gives.

    Args:
        shape: {key: shape} of a state dict.
        key: the key read.
        rank: the number of axes it must have.
        gives: what the key tells, for the problem (e.g. 'mlp_dim as (M, D)').
        problems: the list the problem is appended to, where the key is missing or of another rank.

    Returns:
        The shape, or `None`.
    """
    s = shape.get(key)
    if s is not None and len(s) == rank:
        return s
    problems.append(f'{key} is {"missing" if s is None else f"of shape {s}"}; it gives {gives}')
    return None


def unsupported_hint(key: str, unsupported=()) -> str:
    """Why jlearngene's ViT lacks a key of a known variant.

    Args:
        key: a state dict key.
        unsupported: the converter's (key regex, what the variant has) pairs; a regex must match
          the whole key.

    Returns:
        For the first matching pair, its `what` and 'not supported by jlearngene ViT' in
        parentheses after a space; '' where none matches.
    """
    return next((f' ({what}: not supported by jlearngene ViT)' for rx, what in unsupported
                 if re.fullmatch(rx, key)), '')


def unexpected_keys(keys: list[str], unsupported=()) -> list[str]:
    """The problem that names keys outside the layout.

    Args:
        keys: the keys outside the layout.
        unsupported: (key regex, what the variant has) pairs, as for `unsupported_hint`.

    Returns:
        One problem naming every key, each with the reason where a known ViT variant has it;
        [] for no keys.
    """
    hints = ', '.join(k + unsupported_hint(k, unsupported) for k in keys)
    return [f'unexpected keys ({len(keys)}): {hints}'] if keys else []


def key_problems(arrays: Mapping[str, Any], want: Mapping[str, tuple],
                 unsupported=()) -> list[str]:
    """The keys of a layout that a state dict lacks, and those it has beyond it.

    Args:
        arrays: the state dict, {key: array}.
        want: the layout, {key: shape}.
        unsupported: (key regex, what the variant has) pairs, as for `unsupported_hint`.

    Returns:
        At most two problems, the missing keys (in `want`'s order), then the unexpected ones
        (sorted, with their hints).
    """
    missing = [k for k in want if k not in arrays]
    problems = [f'missing keys ({len(missing)}): ' + ', '.join(missing)] if missing else []
    return problems + unexpected_keys(sorted(k for k in arrays if k not in want), unsupported)


def _dtype_name(v: Any) -> str:
    return str(getattr(v, 'dtype', np.asarray(v).dtype))


def _is_float(v: Any) -> bool:
    return bool(re.match(r'(torch\.)?(float|bfloat)', _dtype_name(v)))


def entry_problems(arrays: Mapping[str, Any], want: Mapping[str, tuple],
                   floating=_is_float) -> list[str]:
    """The entries of a state dict in a layout of another shape or a dtype that is not floating.

    Args:
        arrays: the state dict, {key: array or tensor}.
        want: the layout, {key: shape}; keys `arrays` lacks are skipped (`key_problems`).
        floating: True for an entry whose dtype is accepted; default: a numpy, jax or torch
          float or bfloat dtype, by its name.

    Returns:
        One problem per wrong shape and per rejected dtype, in `want`'s order.
    """
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
    """The integer square root of `n` when `n` is a perfect square.

    Args:
        n: an integer.

    Returns:
        `r` with `r * r == n`; `None` when there is none (negative `n` too).
    """
    r = math.isqrt(n) if n >= 0 else -1
    return r if r >= 0 and r * r == n else None
