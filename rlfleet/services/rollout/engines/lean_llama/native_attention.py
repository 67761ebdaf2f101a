"""The lean decode step's attention as one C kernel on a CPU with AVX-512 (`perf.native_attention`, on by default).

Why: a decode step's attention is one query per row and head against that row's cache. torch runs it as a batched
GEMV (q·Kᵀ), a mask add, a softmax and a second batched GEMV (p·V); on the AMD EPYC (Zen 4) here those GEMVs are
MKL's AVX2 code and read the cache at ~36 GB/s, where a plain `sum` over the same cache reads ~88 GB/s. A
`torch.compile`d kernel of the same math measured no faster. decode_attention.c does it in one pass over the keys
and one over the values with AVX-512 (64 rows x 4 heads x 32 wide at 44 columns, one thread, 79 -> ~39 us a
layer), writing the new token's key and value into the cache first (the step's append: two strided copies fewer).

How: the C source next to this file is compiled once with the system C compiler (`$CC`, else cc / gcc) into a
shared library in a cache folder (`$RLFLEET_NATIVE_CACHE`, else `$XDG_CACHE_HOME/rlfleet/native`, else
~/.cache/rlfleet/native; if that cannot be written, a private folder in the temp dir), named by a hash of the source
and flags, written atomically (two processes building at once each rename a complete file over the other), and
loaded with ctypes, which drops the GIL during the call. Loading a library runs its constructors, so before it is
loaded the folder, the file and its SHA-256 sidecar (`<name>.so.sha256`, written atomically at build time) must be
this user's own (created 0700; owned by this uid, not writable by group or others, no symlinks) and the file must
hash to the recorded SHA-256; a library without a sidecar is built again. Before first use `load()` checks the
kernel against float64 torch on a small case with masked columns and grouped heads at each supported head width.

Where it is not used (torch's ops instead, the same results up to rounding): no AVX-512F on the CPU, no C compiler
(the slim container images have none), a failed build, trust or numeric check (logged with the reason), a dtype other
than float32, a head width other than 16/32/64/128, more than one torch thread (the kernel is single-threaded; the
GEMVs split across threads), or `perf.native_attention: false`. What it changes: rounding, not math (summation
order and a polynomial exp within ~2 ulp; `tests/unit/lean_llama/test_native_attention.py` checks against float64).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from rlfleet.run_dir.atomic import write_atomic, write_text_atomic

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
FLAGS = ("-O3", "-mavx512f", "-mfma", "-std=c11", "-shared", "-fPIC")
HEAD_DIMS = (16, 32, 64, 128)
CHECK_TOLERANCE = 1e-5                 # max |kernel - float64 reference| on the check case (values are O(1))
BUILD_TIMEOUT_S = 120

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES: list[type[ctypes.c_int64] | type[ctypes.c_void_p]] = [
    _PTR, _I64, _I64, _I64,             # q and its strides over rows, key/value heads, the group's queries
    _PTR, _I64, _I64,                   # keys: rows, heads
    _PTR, _I64, _I64,                   # values: rows, heads
    _I64,                               # the column stride keys and values share
    _PTR, _I64,                         # additive mask and its row stride
    _PTR, _I64, _I64, _I64,             # out and its strides
    _PTR, _I64, _I64,                   # the new token's keys (or NULL) and their strides over rows, heads
    _PTR, _I64, _I64,                   # its values (or NULL)
    _I64, _I64, _I64, _I64, _I64,       # rows, key/value heads, queries a head, columns, head width
]


class NativeAttention:
    """attend(q [B, Hkv, rep, Dh], keys/values [B, Hkv, C, Dh] with C >= n, mask [B, 1, 1, >= n] additive, n,
    new=(k [B, Hkv, Dh], v [B, Hkv, Dh]) or None) -> [B, Hkv, rep, Dh]: softmax(q·Kᵀ + mask)·V over each row's first
    n cache columns, after writing `new` into column n - 1 when given (the decode step's append).

    The caller guarantees what `fits` checks (float32 on the CPU, last dimensions dense, one column stride for keys
    and values, Dh in HEAD_DIMS); the lean decode step's tensors are built that way."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.decode_attention
        self._fn.argtypes = _ARGTYPES
        self._fn.restype = ctypes.c_int

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, n: int,
               new: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, hkv, rep, dh = q.shape
        out = q.new_empty(b, hkv, rep, dh)
        qs, ks, vs, os_ = q.stride(), keys.stride(), values.stride(), out.stride()
        if new is None:
            kn = vn = None
            kns = vns = (0, 0, 1)
        else:
            (kn, vn), kns, vns = (new[0].data_ptr(), new[1].data_ptr()), new[0].stride(), new[1].stride()
        rc = self._fn(q.data_ptr(), qs[0], qs[1], qs[2], keys.data_ptr(), ks[0], ks[1], values.data_ptr(), vs[0],
                      vs[1], ks[2], mask.data_ptr(), mask.stride(0), out.data_ptr(), os_[0], os_[1], os_[2],
                      kn, kns[0], kns[1], vn, vns[0], vns[1], b, hkv, rep, n, dh)
        if rc != 0:
            raise RuntimeError(f"decode_attention kernel refused its arguments (code {rc})")
        return out

    @staticmethod
    def fits(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> bool:
        """Whether the kernel reads these tensors as they are: float32 on the CPU, last dimensions dense, keys and
        values with one column stride, a supported head width."""
        return (q.dtype == keys.dtype == values.dtype == mask.dtype == torch.float32 and q.device.type == "cpu"
                and q.shape[-1] in HEAD_DIMS and all(t.stride(-1) == 1 for t in (q, keys, values, mask))
                and keys.stride(2) == values.stride(2))


def _cache_dir() -> Path:
    if os.environ.get("RLFLEET_NATIVE_CACHE"):
        return Path(os.environ["RLFLEET_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlfleet" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_has_avx512f() -> bool:
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                     "")
    except OSError:
        return False
    return "avx512f" in flags.split()


def build(cache: Path | None = None) -> Path:
    """The kernel's shared library: the cache folder's build of this source and these flags, compiled there first if
    missing, and checked before it is returned (a library's constructor runs the moment it is loaded, before any
    numeric check). Raises RuntimeError with the reason when it cannot be built or is not to be trusted."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    folder = cache or _cache_dir()
    target = folder / f"decode_attention-{digest}.so"
    if target.exists() or target.is_symlink():   # built before (or shipped, with its .sha256, in a cache folder)
        if _sidecar(target).exists() or _sidecar(target).is_symlink():
            return trusted(target)
        log.info("%s has no recorded SHA-256 (%s): building it again", target, _sidecar(target).name)
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler ($CC, cc or gcc) on PATH")

    def compile_to(tmp: Path) -> None:
        done = subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        os.chmod(tmp, 0o700)
        write_text_atomic(_sidecar(target), _sha256(tmp) + "\n")      # the hash of what is renamed next

    try:
        private_folder(folder)
        write_atomic(target, compile_to)
    except PermissionError:                      # an unwritable cache folder: build into a private temp one
        if cache is not None:
            raise
        return build(_private_temp_folder())
    return trusted(target)


def _sidecar(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _private_problem(path: Path) -> str | None:
    """Why `path` is not this user's own (a symlink, owned by another uid, writable by group or others), or None."""
    st = path.lstat()
    if path.is_symlink():
        return f"{path} is a symlink"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not this user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def private_folder(folder: Path) -> None:
    """Create `folder` (and missing parents) with mode 0700; raise RuntimeError unless it is this user's own."""
    missing = [p for p in (folder, *folder.parents) if not (p.exists() or p.is_symlink())]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
    problem = _private_problem(folder) or (None if folder.is_dir() else f"{folder} is not a folder")
    if problem:
        raise RuntimeError(f"native kernel cache refused: {problem}")


def trusted(library: Path) -> Path:
    """`library`, after checking that it, its folder and its SHA-256 sidecar are this user's own (no symlink, not
    writable by group or others) and that it hashes to the recorded SHA-256; RuntimeError naming the reason."""
    for path in (library.parent, library, _sidecar(library)):
        problem = _private_problem(path)
        if problem:
            raise RuntimeError(f"native kernel refused: {problem}")
    recorded = _sidecar(library).read_text().strip()
    actual = _sha256(library)
    if actual != recorded:
        raise RuntimeError(f"native kernel refused: {library} has SHA-256 {actual[:16]}..., not the {recorded[:16]}... "
                           "recorded when it was built")
    return library


def _private_temp_folder() -> Path:
    """A folder under the temp dir that only this user can write (a library loaded from a folder that others can
    write would run their code): created with mode 0700, refused when it exists owned by another user or writable
    by others."""
    folder = Path(tempfile.gettempdir()) / f"rlfleet-native-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if _private_problem(folder) or not folder.is_dir():
        raise RuntimeError(f"{folder} is not a private folder of this user; not building there")
    return folder


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, n: int
               ) -> torch.Tensor:
    """torch's math in float64: softmax(q·Kᵀ + mask)·V over the first n columns."""
    q, k, v, m = (t.double() for t in (q, keys[:, :, :n], values[:, :, :n], mask[..., :n]))
    return torch.softmax(q @ k.transpose(2, 3) + m, dim=-1) @ v


def check(kernel: NativeAttention) -> str | None:
    """None when the kernel agrees with float64 torch on grouped heads, masked columns, spare buffer columns and a
    strided query, at each supported width; else what differed."""
    g = torch.Generator().manual_seed(0)
    for dh in HEAD_DIMS:
        b, hkv, rep, n, spare = 3, 2, 3, 21, 4
        qk = torch.randn(b, hkv * rep + 1, dh, generator=g) * dh ** -0.5                 # a strided view below
        q = qk[:, : hkv * rep].reshape(b, hkv, rep, dh)
        keys, values = (torch.randn(b, hkv, n + spare, dh, generator=g) for _ in range(2))
        mask = torch.zeros(b, 1, 1, n)
        mask[0, ..., :5] = float("-inf")                                                 # left padding of row 0
        got = kernel.attend(q, keys, values, mask, n).double()
        err = float((got - _reference(q, keys, values, mask, n)).abs().max())
        if not err <= CHECK_TOLERANCE:
            return f"head width {dh}: max difference {err:.2e} from float64 torch"
    return None


def load_for(device: torch.device, dtype: torch.dtype, head_dim: int) -> NativeAttention | None:
    """load() where the kernel applies to a model's tensors (a CPU, float32, a head width in HEAD_DIMS); else None,
    with nothing built."""
    if device.type != "cpu" or dtype != torch.float32 or head_dim not in HEAD_DIMS:
        return None
    return load()


def load() -> NativeAttention | None:
    """The checked kernel (built on first use, then loaded from the cache folder), or None with the reason logged
    where it cannot run here."""
    if not _cpu_has_avx512f():
        log.info("native decode attention off: the CPU reports no AVX-512F; torch's ops run attention")
        return None
    try:
        kernel = NativeAttention(ctypes.CDLL(str(build())))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("native decode attention off (%s); torch's ops run attention", exc)
        return None
    problem = check(kernel)
    if problem is not None:
        log.warning("native decode attention off: its check failed (%s); torch's ops run attention", problem)
        return None
    return kernel
