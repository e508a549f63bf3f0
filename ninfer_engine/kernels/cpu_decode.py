"""The llama-family CPU decode step of `cpu_decode.c`, built by the system C compiler on first use.

`decode_step_library()` compiles the C file once per (source, compiler, flags) into
`$NINFER_HOME/kernels/` (about a second; later processes load the cached library) and returns
the loaded `ctypes` library, or raises `CpuKernelUnavailable` saying why it cannot run here: not
x86-64 with AVX2/FMA/F16C, or no C compiler. The library links the OpenMP runtime torch has
already loaded (same `libgomp.so.1`), so its parallel regions use the engine thread's team.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_decode.c")
SOURCES = (SOURCE, Path(__file__).with_name("cpu_gemv.h"))  # what the build key hashes
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
# NINFER_CPU_PORTABLE_DOT=1 builds the int8 path's quantization and block sums in plain C (the
# same codes and int32 sums; the tests check the SIMD build against it)
PORTABLE_ENV = "NINFER_CPU_PORTABLE_DOT"
CPU_FLAGS = ("avx2", "fma", "f16c")
# the C file's layout of its arguments (enum DIMS, enum PER_LAYER, MAX_ROWS)
DIMS = ("layers", "hidden", "inter", "nq", "nkv", "head_dim", "vocab", "page", "table_w",
        "scores_w", "activations")
# dims["activations"]: the GEMV inputs, by index (cpu_gemv.h's project())
ACTIVATIONS = ("fp32", "int8", "int16")
LAYER_POINTERS = ("input_norm", "post_attention_norm", "qkv_codes", "qkv_scales",
                  "output_codes", "output_scales", "gate_up_codes", "gate_up_scales",
                  "down_codes", "down_scales")
MAX_ROWS = 16
MAX_HEAD_DIM = 512


class CpuKernelUnavailable(RuntimeError):
    """A compiled CPU kernel (this step, `cpu_experts`) cannot run here (the message says why)."""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _cache_dir() -> Path:
    home = os.environ.get("NINFER_HOME") or Path.home() / ".cache" / "ninfer"
    return Path(home).expanduser() / "kernels"


def _flags(portable: bool) -> tuple[str, ...]:
    return FLAGS + (("-DNINFER_PORTABLE_DOT",) if portable else ())


def decode_step_library() -> ctypes.CDLL:
    """The compiled step (cached on disk and in this process); the portable-dot build when
    $NINFER_CPU_PORTABLE_DOT is 1."""
    return compiled_library(os.environ.get(PORTABLE_ENV, "0") == "1")


@functools.cache
def compiled_library(portable: bool) -> ctypes.CDLL:
    """The step built with the SIMD int8 dot or (`portable`) its plain-C form, cached."""
    target = build_library(SOURCE, SOURCES, _flags(portable), "the compiled CPU decode step")
    lib = ctypes.CDLL(str(target))
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.ninfer_llama_decode_step.argtypes = [p, f32, f32, i64, i64, *[p] * 22]
    lib.ninfer_llama_decode_step.restype = None
    lib.ninfer_q8_block_sums.argtypes = [p, p, i64, p]
    lib.ninfer_quantize_rows.argtypes = [p, i64, i64, p, p]
    lib.ninfer_project.argtypes = [i64, i64, i64, p, i64, i64, p, p, p, i64, p, p]
    for name in ("ninfer_q8_block_sums", "ninfer_quantize_rows", "ninfer_project"):
        getattr(lib, name).restype = None
    return lib


def build_library(source: Path, hashed: tuple[Path, ...], flags: tuple[str, ...],
                  what: str) -> Path:
    """`source` compiled into a shared library under `$NINFER_HOME/kernels/`, once per (the
    `hashed` files, compiler, flags); raises `CpuKernelUnavailable` naming `what` where this
    machine cannot build or run it (not x86-64 with AVX2/FMA/F16C, no C compiler)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise CpuKernelUnavailable(f"{what} is x86-64 only (this is {platform.machine()})")
    missing = [f for f in CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        raise CpuKernelUnavailable(f"{what} needs {', '.join(missing)}")
    cc = _compiler()
    if cc is None:
        raise CpuKernelUnavailable(f"{what} needs a C compiler (gcc)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([*(f.read_text() for f in hashed), version, *flags])
                         .encode()).hexdigest()
    target = _cache_dir() / f"{source.stem}-{key[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # built under a temporary name and renamed: servers starting together never load a
        # half-written library
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"],
                                  capture_output=True, text=True)
            if done.returncode:
                raise CpuKernelUnavailable(f"compiling {source.name} failed: "
                                           f"{done.stderr.strip()[-500:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


def cpu_decode_unavailable() -> str | None:
    """None when the compiled step runs here, else why not."""
    return unavailable(decode_step_library)


def unavailable(load) -> str | None:
    """None when `load()` (a compiled CPU kernel's library) succeeds here, else why not."""
    try:
        load()
    except CpuKernelUnavailable as exc:
        return str(exc)
    return None
