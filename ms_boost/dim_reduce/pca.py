r"""Streaming PCA of a stage-1 weight trajectory: ``N`` checkpoints -> a ``k x M`` projection matrix.

Stage 1 of dimension-reduce training saves ``N`` checkpoints :math:`x_1, \dots, x_N \in \mathbb{R}^M` (the
trainable weights, flattened in the network's parameter order). Stage 2 needs the top ``k`` principal
directions of that trajectory: the first ``k`` right singular vectors of the centred data matrix

.. math::
    X_c = X - \mathbf{1}\bar{x}^\top = U \Sigma V^\top, \qquad P = V_{:,1:k}^\top \in \mathbb{R}^{k\times M}.

``M`` is large (25.5 M for ResNet-50) and ``N`` small (about 60), so the ``N x N`` Gram matrix is the cheap
side of the SVD:

.. math::
    G = X_c X_c^\top = U \Sigma^2 U^\top, \qquad P = \Sigma_k^{-1} U_k^\top X_c .

The algorithm never holds :math:`X` in memory:

1. each checkpoint is read on its own and its flat float32 weight vector appended to a scratch file
   (``N x M`` float32, row-major, on disk);
2. :math:`G` is accumulated in float64 over column chunks of the scratch file, each chunk centred
   exactly with its own column means;
3. :math:`G` is diagonalised (``numpy.linalg.eigh``), eigenvectors sorted by decreasing eigenvalue, and
   each sign fixed so that the largest-magnitude entry of :math:`u_i` is positive (deterministic);
4. a second pass over the chunks writes :math:`P_{:,\text{chunk}} = \Sigma_k^{-1} U_k^\top X_{c,\text{chunk}}`
   straight into the output ``.npy`` (or an in-memory array when no output path is given).

Peak memory is a few chunks of ``N x chunk_columns`` float64 plus one checkpoint, independent of ``N*M``.
The rows of :math:`P` are orthonormal and equal ``numpy.linalg.svd(X_c)[2][:k]`` up to sign.

Which parameters: the trainable ones, in network order. The stage-1 run writes them beside its
weight-only checkpoints (:func:`write_weight_manifest` -> ``weights_manifest.json``: names and shapes of
``network.trainable_params()``); the command line and :func:`compute_pca_matrix` read that manifest when
present. Without one they fall back to every floating-point parameter of the first checkpoint whose name
does not match :data:`DEFAULT_EXCLUDE` (BatchNorm statistics, optimizer moments and the state of ms_boost's
own algorithms); ``--exclude`` / ``--names_file`` override both.

Temporary files: the output is written to ``.pca_<output name>.<host>.<pid>.<random>.npy.tmp`` beside it
and renamed; on any exception (and on SIGTERM in the command line) it is removed, and a run that was
killed harder (SIGKILL, power loss) leaves one that the next computation of the same target removes,
with a log line (``.pca_*.npy.tmp`` of this host whose process is gone, or of any host untouched for
``STALE_TEMP_SECONDS``).

Command line::

    python -m ms_boost.dim_reduce.pca --weight_load_dir DIR --n_components 32 --output pca_mat.npy
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ms_boost.checkpoint_file import read_checkpoint

__all__ = [
    "ParamSpec", "DEFAULT_EXCLUDE", "CHECKPOINT_SUFFIXES", "parameter_specs", "list_checkpoints",
    "infer_parameter_specs", "read_flat_weights", "gram_eigen_components", "compute_pca_matrix",
    "open_pca_matrix", "check_finite_rows", "write_npy_atomic", "write_weight_manifest", "read_weight_manifest",
    "MANIFEST_NAME", "remove_stale_temporaries", "main",
]

ParamSpec = Tuple[str, Tuple[int, ...]]

#: Names that are saved beside the weights but are not trainable: BatchNorm statistics and optimizer /
#: loss-scale state (used by the command line when no explicit list of names is given).
DEFAULT_EXCLUDE = (r"(^|\.)(moving_mean|moving_variance)$"
                   r"|^(moments|accum|momentum|adam_m|adam_v|moment1|moment2|mean_grads|mean_square|v|m"
                   r"|grad_accumulation|accumulators|adasum_saved|dim_reduce|overflow_shadow|thor_[a-z_]+)\."
                   r"|(^|\.)(matrix_a|matrix_g|matrix_a_batch|matrix_g_batch|thor_[a-z_]+|accumulation_step"
                   r"|group_loss_scales|scale_sense|loss_scale|global_step|learning_rate)$"
                   r"|^(beta1_power|beta2_power|current_iterator_step|last_overflow_iterator_step|epoch_num"
                   r"|step_num)$")

#: File name of the trainable-parameter manifest written beside stage-1 checkpoints.
MANIFEST_NAME = "weights_manifest.json"
_MANIFEST_FORMAT = "ms_boost.dim_reduce.weights_manifest"
#: A temporary PCA output of another host (or of an older ms_boost) untouched this long is stale.
STALE_TEMP_SECONDS = 3600.0

CHECKPOINT_SUFFIXES = (".ckpt", ".safetensors")

_DEFAULT_CHUNK_COLUMNS = 1 << 19
ProgressFn = Optional[Callable[[str], None]]


def _stderr_progress(message: str) -> None:
    print(f"[ms_boost.pca] {message}", file=sys.stderr, flush=True)


def parameter_specs(params) -> List[ParamSpec]:
    """``[(name, shape), ...]`` of parameters, in the given order (e.g. ``network.trainable_params()``)."""
    return [(p.name, tuple(int(d) for d in p.shape)) for p in params]


def _natural_key(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def list_checkpoints(weight_load_dir: str) -> List[str]:
    """Checkpoint files (``.ckpt`` / ``.safetensors``) of a folder, in natural name order.

    Raises:
        ValueError: the folder does not exist or holds no checkpoint.
    """
    if not isinstance(weight_load_dir, (str, os.PathLike)):
        raise TypeError(f"weight_load_dir must be a path, got {type(weight_load_dir).__name__}.")
    if not os.path.isdir(weight_load_dir):
        raise ValueError(f"weight_load_dir={weight_load_dir!r} is not an existing folder of stage-1 checkpoints.")
    files = [f for f in os.listdir(weight_load_dir) if f.endswith(CHECKPOINT_SUFFIXES)]
    if not files:
        raise ValueError(f"weight_load_dir={weight_load_dir!r} holds no checkpoint file "
                         f"(expected names ending in {' or '.join(CHECKPOINT_SUFFIXES)}).")
    return [os.path.join(weight_load_dir, f) for f in sorted(files, key=_natural_key)]


def _load(path: str, names: Optional[set]) -> dict:
    """The entries of one stage-1 checkpoint (only ``names`` when given); errors name the file and its fault."""
    choice = None if names is None else (lambda name: name in names)
    return read_checkpoint(path, choice_func=choice, what="stage-1 checkpoint")


def _as_float32(value) -> np.ndarray:
    import mindspore as ms

    if value.dtype == ms.bfloat16:
        value = value.astype(ms.float32)
    return np.asarray(value.asnumpy(), dtype=np.float32)


def _is_float(value) -> bool:
    import mindspore as ms

    return value.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)


def _compile_exclude(exclude: Optional[str], option: str = "exclude"):
    if not exclude:
        return None
    try:
        return re.compile(exclude)
    except re.error as exc:
        raise ValueError(f"{option}={exclude!r} is not a valid regular expression ({exc}).") from None


def write_weight_manifest(network_or_params, folder: str) -> str:
    """Write ``folder/weights_manifest.json``: names and shapes of the trainable parameters, in order.

    Called by the code that saves stage-1 checkpoints, so the PCA knows exactly which saved tensors are
    trainable weights (algorithm state such as ``adasum_saved.*``, ``dim_reduce.*``, ``thor_*`` or
    optimizer moments is saved beside them).

    Args:
        network_or_params: a ``Cell`` (its ``trainable_params()``) or a list of parameters.
        folder: the folder of the weight-only checkpoints (created if missing).

    Returns:
        The manifest's path (written atomically).
    """
    params = network_or_params.trainable_params() if hasattr(network_or_params, "trainable_params") \
        else list(network_or_params)
    specs = parameter_specs(params)
    if not specs:
        raise ValueError("write_weight_manifest: the network has no trainable parameter.")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, MANIFEST_NAME)
    text = json.dumps({"format": _MANIFEST_FORMAT, "version": 1,
                       "parameters": [{"name": n, "shape": list(s)} for n, s in specs]}, indent=1)
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_weight_manifest(path: str) -> List[ParamSpec]:
    """``[(name, shape), ...]`` from a manifest file (or a folder holding ``weights_manifest.json``).

    Raises:
        ValueError: unreadable file, invalid JSON or UTF-8, or a malformed entry (the message names the file).
    """
    if os.path.isdir(path):
        path = os.path.join(path, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"weights manifest {path!r} cannot be read: {exc}") from None
    entries = data.get("parameters") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != _MANIFEST_FORMAT or not isinstance(entries, list) \
            or not entries:
        raise ValueError(f"weights manifest {path!r} is not an ms_boost weights manifest "
                         f"(expected {{'format': {_MANIFEST_FORMAT!r}, 'parameters': [...]}}).")
    specs: List[ParamSpec] = []
    seen = set()
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or name in seen or not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(f"weights manifest {path!r}: parameters[{i}]={str(entry)[:120]} must be "
                             f"{{'name': unique non-empty string, 'shape': [non-negative ints]}}.")
        seen.add(name)
        specs.append((name, tuple(shape)))
    return specs


def infer_parameter_specs(checkpoint: str, exclude: Optional[str] = DEFAULT_EXCLUDE) -> List[ParamSpec]:
    """Floating-point parameters of a checkpoint, in file order, minus names matching ``exclude``.

    Used by the command line when the network is not at hand. A checkpoint saved with
    ``CheckpointConfig(saved_network=net)`` lists parameters in the network's order, so this gives the
    trainable weights in the order stage 2 uses, once BatchNorm statistics are excluded.
    """
    pattern = _compile_exclude(exclude)
    specs = []
    for name, value in _load(checkpoint, None).items():
        if pattern is not None and pattern.search(name):
            continue
        if not _is_float(value):
            continue
        specs.append((name, tuple(int(d) for d in value.shape)))
    if not specs:
        raise ValueError(f"checkpoint {checkpoint!r} has no floating-point parameter outside exclude={exclude!r}.")
    return specs


def read_flat_weights(checkpoint: str, specs: Sequence[ParamSpec]) -> np.ndarray:
    """The parameters ``specs`` of one checkpoint, flattened and concatenated in ``specs`` order (float32).

    Raises:
        ValueError: a parameter is missing from the checkpoint or has another shape.
    """
    names = [name for name, _ in specs]
    loaded = _load(checkpoint, set(names))
    total = sum(int(np.prod(shape, dtype=np.int64)) for _, shape in specs)
    flat = np.empty(total, dtype=np.float32)
    offset = 0
    for name, shape in specs:
        if name not in loaded:
            raise ValueError(f"checkpoint {checkpoint!r} is missing parameter {name!r} "
                             f"(every stage-1 checkpoint must hold all {len(specs)} trainable parameters).")
        value = loaded[name]
        got = tuple(int(d) for d in value.shape)
        if got != tuple(shape):
            raise ValueError(f"checkpoint {checkpoint!r}: parameter {name!r} has shape {got}, "
                             f"the network expects {tuple(shape)}.")
        size = int(np.prod(shape, dtype=np.int64))
        flat[offset:offset + size] = _as_float32(value).reshape(-1)
        offset += size
    return flat


def gram_eigen_components(gram: np.ndarray, n_components: int) -> Tuple[np.ndarray, np.ndarray]:
    r"""Top eigenpairs of a centred Gram matrix :math:`G = X_c X_c^\top = U\Sigma^2U^\top`.

    Eigenvalues are sorted in decreasing order; each eigenvector's sign is chosen so that its
    largest-magnitude entry is positive (a deterministic convention).

    Args:
        gram: ``(N, N)`` symmetric positive semi-definite matrix (float64).
        n_components: ``k <= N - 1`` (centring removes one dimension).

    Returns:
        ``(u_k, sigma_k)``: ``(N, k)`` eigenvectors and the ``k`` singular values :math:`\sqrt{\lambda_i}`.

    Raises:
        ValueError: the trajectory spans fewer than ``k`` directions (a singular value is numerically 0).
    """
    gram = 0.5 * (gram + gram.T)
    eigvals, eigvecs = np.linalg.eigh(gram)
    order = np.argsort(eigvals)[::-1][:n_components]
    lam = eigvals[order]
    vecs = eigvecs[:, order]
    tol = max(float(eigvals.max()), 0.0) * gram.shape[0] * np.finfo(np.float64).eps * 16
    if lam[-1] <= tol:
        rank = int(np.sum(eigvals > tol))
        raise ValueError(f"the weight trajectory spans only {rank} independent directions, fewer than "
                         f"n_components={n_components}: checkpoints are (nearly) identical or repeated.")
    pivot = np.argmax(np.abs(vecs), axis=0)
    signs = np.sign(vecs[pivot, np.arange(vecs.shape[1])])
    signs[signs == 0] = 1.0
    return vecs * signs, np.sqrt(lam)


class _RowFile:
    """An ``N x M`` float32 row-major matrix in a scratch file, read by column chunks without mmap."""

    def __init__(self, path: str, num_columns: int):
        self.path = path
        self.num_columns = num_columns
        self.rows = 0
        self._file = open(path, "w+b")  # noqa: SIM115 (closed in close())
        if os.name == "posix":  # unlinked while open: the space is freed however the process ends
            os.remove(path)

    def append(self, row: np.ndarray) -> None:
        self._file.seek(self.rows * self.num_columns * 4)
        self._file.write(memoryview(np.ascontiguousarray(row, dtype=np.float32)))  # type: ignore[arg-type]
        self.rows += 1

    def read_columns(self, start: int, stop: int) -> np.ndarray:
        width = stop - start
        out = np.empty((self.rows, width), dtype=np.float32)
        for i in range(self.rows):
            self._file.seek((i * self.num_columns + start) * 4)
            got = self._file.readinto(memoryview(out[i]))
            if got != width * 4:
                raise OSError(f"short read from scratch file {self.path!r}")
        return out

    def close(self) -> None:
        self._file.close()
        if os.path.exists(self.path):
            os.remove(self.path)


def _report(index: int, total: int) -> bool:
    """Progress for about every tenth chunk and the last one."""
    return index + 1 == total or (index + 1) % max(1, total // 10) == 0


def _centred_columns(stage: _RowFile, start: int, stop: int) -> np.ndarray:
    """Columns ``[start, stop)`` of the scratch matrix in float64, minus their mean over checkpoints."""
    block = stage.read_columns(start, stop).astype(np.float64)
    block -= block.mean(axis=0, keepdims=True)
    return block


class _NpyRowWriter:
    """Writes a ``(k, M)`` float32 ``.npy`` by column blocks, into a temporary name renamed on commit."""

    def __init__(self, path: str, shape: Tuple[int, int]):
        self.path = path
        self.shape = shape
        fd, self.tmp = _mkstemp_for(path)
        self._file = os.fdopen(fd, "w+b")
        try:
            np.lib.format.write_array_header_2_0(
                self._file, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                             "fortran_order": False, "shape": shape})
            self.offset = self._file.tell()
            self._file.truncate(self.offset + shape[0] * shape[1] * 4)
        except BaseException:
            self.abort()
            raise

    def write_columns(self, start: int, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=np.float32)
        for i in range(self.shape[0]):
            self._file.seek(self.offset + (i * self.shape[1] + start) * 4)
            self._file.write(memoryview(block[i]))

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        if os.path.exists(self.tmp):
            os.remove(self.tmp)


_TEMP_RE = re.compile(r"\.pca_(?P<target>.+)\.(?P<host>[^./]+)\.(?P<pid>[0-9]+)\.[^./]+\.npy\.tmp$")
_LEGACY_TEMP_RE = re.compile(r"\.pca_[A-Za-z0-9_]{8}\.npy\.tmp$")  # tempfile names of ms_boost before 12/2026


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"


def _mkstemp_for(path: str) -> Tuple[int, str]:
    """A temporary file beside ``path`` named after it, this host and this process."""
    directory = os.path.dirname(os.path.abspath(path))
    return tempfile.mkstemp(prefix=f".pca_{os.path.basename(path)}.{_host()}.{os.getpid()}.", suffix=".npy.tmp",
                            dir=directory)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(path: str, progress: ProgressFn = _stderr_progress) -> List[str]:
    """Remove temporary files that an interrupted computation of ``path`` left beside it.

    Stale: ``.pca_<name of path>.<host>.<pid>.*.npy.tmp`` of this host whose process no longer runs, or
    of another host (or the older ``.pca_XXXXXXXX.npy.tmp`` names) not modified for
    :data:`STALE_TEMP_SECONDS`. Each removal is reported through ``progress`` (stderr by default).

    Returns:
        The removed paths.
    """
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    removed: List[str] = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        full = os.path.join(directory, entry)
        match = _TEMP_RE.match(entry)
        if match and match.group("target") == name:
            if match.group("host") == _host():
                stale = int(match.group("pid")) != os.getpid() and not _pid_alive(int(match.group("pid")))
            else:
                stale = _age(full, now) > STALE_TEMP_SECONDS
        else:
            stale = bool(_LEGACY_TEMP_RE.match(entry)) and _age(full, now) > STALE_TEMP_SECONDS
        if not stale:
            continue
        try:
            size = os.path.getsize(full)
            os.remove(full)
        except OSError:
            continue
        removed.append(full)
        if progress:
            progress(f"removed stale temporary file {full} ({size / 2**20:.1f} MiB) left by an interrupted PCA")
    return removed


def _age(path: str, now: float) -> float:
    try:
        return now - os.path.getmtime(path)
    except OSError:
        return 0.0


def write_npy_atomic(path: str, array: np.ndarray) -> None:
    """``np.save`` into a temporary name in the same folder, then rename: readers never see half a file."""
    fd, tmp = _mkstemp_for(path)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _check_deadline(deadline: Optional[float], what: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"PCA of the weight trajectory exceeded its time limit while {what} "
                           f"(raise dim_reduce.timeout, or compute pca_mat.npy beforehand with "
                           f"`python -m ms_boost.dim_reduce.pca`).")


def compute_pca_matrix(checkpoints: Union[str, Sequence[str]], n_components: int,
                       param_specs: Optional[Sequence[ParamSpec]] = None, output: Optional[str] = None,
                       chunk_columns: int = _DEFAULT_CHUNK_COLUMNS, workdir: Optional[str] = None,
                       progress: ProgressFn = None, deadline: Optional[float] = None,
                       heartbeat: Optional[Callable[[], None]] = None) -> np.ndarray:
    r"""Top ``n_components`` principal directions of a weight trajectory, streamed from checkpoints.

    Args:
        checkpoints: a folder of checkpoints (see :func:`list_checkpoints`) or a list of files; the
            order does not change the result beyond rounding.
        n_components: ``k``; at least ``k + 1`` checkpoints are needed.
        param_specs: ``[(name, shape), ...]`` of the trainable parameters in the network's order
            (:func:`parameter_specs` of ``network.trainable_params()``); when None, read from the
            ``weights_manifest.json`` beside the checkpoints, else inferred from the first checkpoint with
            :data:`DEFAULT_EXCLUDE`.
        output: ``.npy`` path the ``(k, M)`` float32 matrix is streamed into (temporary name, then renamed);
            the returned array is then a read-only memory map of it. None keeps the result in memory.
        chunk_columns: columns per chunk (memory ~ ``3 * 8 * N * chunk_columns`` bytes).
        workdir: folder of the ``N x M`` float32 scratch file (default: the output's folder, else the
            system temporary folder). It is deleted at the end.
        progress: called with a short message per stage; None is silent.
        deadline: ``time.monotonic()`` value after which the computation stops with ``TimeoutError``.
        heartbeat: called before every unit of work (one checkpoint read, one chunk); the distributed
            preparation uses it to keep the waiting ranks in step (it may raise to abort).

    Returns:
        ``(k, M)`` float32 array with orthonormal rows :math:`P = \Sigma_k^{-1}U_k^\top X_c`.

    Raises:
        ValueError: fewer than ``k + 1`` checkpoints, a missing parameter or a shape mismatch in a
            checkpoint, a trajectory spanning fewer than ``k`` directions, bad ``n_components``.
        TimeoutError: ``deadline`` passed.
    """
    if isinstance(n_components, bool) or not isinstance(n_components, int) or n_components < 1:
        raise ValueError(f"n_components={n_components!r} must be a positive integer.")
    if output is not None and (os.path.isdir(output) or str(output).endswith(("/", os.sep))):
        raise ValueError(f"output={str(output)!r} is a folder; give the .npy file to write, e.g. "
                         f"{os.path.join(str(output), 'pca_mat.npy')!r}.")
    if isinstance(chunk_columns, bool) or not isinstance(chunk_columns, int) or chunk_columns < 1:
        raise ValueError(f"chunk_columns={chunk_columns!r} must be a positive integer.")
    files = list_checkpoints(checkpoints) if isinstance(checkpoints, (str, os.PathLike)) else list(checkpoints)
    num = len(files)
    if num < n_components + 1:
        raise ValueError(f"PCA with n_components={n_components} needs at least {n_components + 1} stage-1 "
                         f"checkpoints (centring removes one dimension), found {num}.")
    say = progress or (lambda _msg: None)
    if param_specs is not None:
        specs = list(param_specs)
    else:
        manifest = os.path.join(os.path.dirname(os.path.abspath(files[0])), MANIFEST_NAME)
        specs = read_weight_manifest(manifest) if os.path.isfile(manifest) else infer_parameter_specs(files[0])
    width = sum(int(np.prod(shape, dtype=np.int64)) for _, shape in specs)
    if width < n_components:
        raise ValueError(f"n_components={n_components} exceeds the number of weights ({width}).")
    if output:
        remove_stale_temporaries(output, progress or _stderr_progress)
    scratch_dir = workdir or (os.path.dirname(os.path.abspath(output)) if output else tempfile.gettempdir())
    fd, scratch_path = tempfile.mkstemp(prefix=".pca_stage_", suffix=".f32", dir=scratch_dir)
    os.close(fd)
    stage = _RowFile(scratch_path, width)
    writer = None
    start_time = time.monotonic()

    def next_unit(what: str) -> None:
        if heartbeat is not None:
            heartbeat()
        _check_deadline(deadline, what)

    try:
        for i, path in enumerate(files):
            next_unit(f"reading checkpoint {i + 1}/{num}")
            stage.append(read_flat_weights(path, specs))
            say(f"read checkpoint {i + 1}/{num} {os.path.basename(path)} "
                f"({time.monotonic() - start_time:.1f} s)")
        bounds = [(a, min(a + chunk_columns, width)) for a in range(0, width, chunk_columns)]
        gram = np.zeros((num, num), dtype=np.float64)
        for j, (a, b) in enumerate(bounds):
            next_unit(f"accumulating the Gram matrix (chunk {j + 1}/{len(bounds)})")
            block = None  # free the previous chunk before reading the next one
            block = _centred_columns(stage, a, b)
            gram += block @ block.T
            if _report(j, len(bounds)):
                say(f"Gram matrix chunk {j + 1}/{len(bounds)} ({time.monotonic() - start_time:.1f} s)")
        u_k, sigma_k = gram_eigen_components(gram, n_components)
        coef = (u_k / sigma_k).T  # (k, N)
        if output:
            writer = _NpyRowWriter(output, (n_components, width))
            result: Any = None
        else:
            result = np.empty((n_components, width), dtype=np.float32)
        for j, (a, b) in enumerate(bounds):
            next_unit(f"projecting (chunk {j + 1}/{len(bounds)})")
            block = rows = None
            block = _centred_columns(stage, a, b)
            rows = coef @ block
            if writer is not None:
                writer.write_columns(a, rows)
            else:
                result[:, a:b] = rows
            if _report(j, len(bounds)):
                say(f"components chunk {j + 1}/{len(bounds)} ({time.monotonic() - start_time:.1f} s)")
        if writer is not None:
            writer.commit()
            writer = None
            say(f"wrote {output} shape ({n_components}, {width}) in {time.monotonic() - start_time:.1f} s")
            return np.load(str(output), mmap_mode="r", allow_pickle=False)
        return result
    finally:
        stage.close()
        if writer is not None:
            writer.abort()


def open_pca_matrix(path: str, n_components: int, num_weights: int) -> np.ndarray:
    """Open a saved PCA matrix read-only (memory map) and check it fits the network.

    Rows beyond ``n_components`` are allowed (principal directions are ordered, so the first
    ``n_components`` rows are the ``n_components``-dimensional PCA); the caller takes ``[:n_components]``.

    Raises:
        ValueError: not a 2-D floating-point ``.npy``, fewer than ``n_components`` rows, or a column count
            other than the number of trainable weights ``num_weights``.
    """
    try:
        mat = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:
        raise ValueError(f"dim_reduce.pca_mat_path={path!r} is not a readable .npy array: {exc}") from exc
    if mat.ndim != 2 or not np.issubdtype(mat.dtype, np.floating):
        raise ValueError(f"dim_reduce.pca_mat_path={path!r} holds a {mat.ndim}-D {mat.dtype} array; "
                         f"expected a 2-D float matrix of shape (n_components, number of weights).")
    if mat.shape[1] != num_weights or mat.shape[0] < n_components:
        raise ValueError(f"dim_reduce.pca_mat_path={path!r} has shape {tuple(mat.shape)}, which does not fit "
                         f"the network: expected ({n_components}, {num_weights}) = (n_components, number of "
                         f"trainable weights) or more rows.")
    return mat


def check_finite_rows(rows: np.ndarray, path: str, first_row: int = 0) -> None:
    """Raise ``ValueError`` naming ``path`` and the first bad row when ``rows`` holds NaN or infinity.

    Args:
        rows: a block of rows of the PCA matrix saved at ``path``.
        path: the ``.npy`` file, for the message.
        first_row: index in the file of ``rows[0]``.
    """
    finite = np.isfinite(rows)
    if not finite.all():
        bad = np.argwhere(~finite)
        row, col = (int(v) for v in bad[0])
        raise ValueError(f"PCA matrix {path!r} holds NaN or infinite values ({len(bad)} in rows "
                         f"{first_row}..{first_row + rows.shape[0] - 1}; first at row {first_row + row}, column "
                         f"{col}: {rows[row, col]!r}); recompute it from the stage-1 checkpoints.")


def _read_names_file(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that remove temporary files


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: compute ``pca_mat.npy`` from a folder of stage-1 checkpoints."""
    parser = argparse.ArgumentParser(
        prog="python -m ms_boost.dim_reduce.pca",
        description="Top principal directions of a stage-1 weight trajectory (dimension-reduce training).")
    parser.add_argument("--weight_load_dir", required=True, help="folder of stage-1 checkpoints (.ckpt)")
    parser.add_argument("--n_components", "--n_component", type=int, default=32, help="k (default 32)")
    parser.add_argument("--output", default="pca_mat.npy", help="output .npy (default pca_mat.npy)")
    parser.add_argument("--manifest", default=None,
                        help=f"trainable-parameter manifest (default: {MANIFEST_NAME} in --weight_load_dir, "
                             f"written by stage 1)")
    parser.add_argument("--names_file", default=None,
                        help="override: text file with the trainable parameter names in network order, one "
                             "per line")
    parser.add_argument("--exclude", default=None,
                        help="override: regex of names to leave out of the first checkpoint's float parameters "
                             "(default without a manifest: ms_boost's list of non-trainable state)")
    parser.add_argument("--chunk_columns", type=int, default=_DEFAULT_CHUNK_COLUMNS,
                        help="columns per chunk (memory ~ 24 * N * chunk_columns bytes)")
    parser.add_argument("--workdir", default=None, help="folder of the N x M scratch file (default: output's)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.names_file and args.exclude is not None:
            raise ValueError("give at most one of --names_file and --exclude.")
        progress = None if args.quiet else _stderr_progress
        files = list_checkpoints(args.weight_load_dir)
        manifest = args.manifest or os.path.join(args.weight_load_dir, MANIFEST_NAME)
        if args.names_file:
            names = _read_names_file(args.names_file)
            shapes = {name: shape for name, shape in infer_parameter_specs(files[0], exclude=None)}
            missing = [n for n in names if n not in shapes]
            if missing:
                raise ValueError(f"--names_file lists parameters missing from {files[0]!r}: {missing[:5]}")
            specs, source = [(n, shapes[n]) for n in names], f"--names_file {args.names_file}"
        elif args.exclude is not None:
            _compile_exclude(args.exclude, "--exclude")
            specs, source = infer_parameter_specs(files[0], exclude=args.exclude), f"--exclude {args.exclude!r}"
        elif args.manifest or os.path.isfile(manifest):
            specs, source = read_weight_manifest(manifest), manifest
        else:
            specs = infer_parameter_specs(files[0])
            source = (f"no {MANIFEST_NAME} in {args.weight_load_dir}: every float parameter of {files[0]} "
                      f"outside ms_boost's exclude list")
        if progress:
            total = sum(int(np.prod(s, dtype=np.int64)) for _, s in specs)
            progress(f"{len(files)} checkpoints, {len(specs)} parameters ({source}), {total} weights, "
                     f"n_components={args.n_components}")
        compute_pca_matrix(files, args.n_components, specs, output=args.output, chunk_columns=args.chunk_columns,
                           workdir=args.workdir, progress=progress)
    except (ValueError, TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
