"""How the flags resolve on this machine: the serving device, its dtypes, the prefill chunk,
the weight forms and the CPU step; read by the engine (rank 0) and by tensor-parallel
followers alike."""
from __future__ import annotations

import logging

import torch

from .config import EngineConfig
from .kernels._dispatch import has_e4m3
from .models.packed import FP8_ROW, REPACK_FP8

log = logging.getLogger("ninfer.engine")

# `--cpu-matmul`: the decode copy of each projection (int8: `models.int8_rows.Int8Rows`)
MATMUL_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "int8": torch.int8}
CUDA_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def serving_device(config: EngineConfig) -> torch.device:
    """`cuda:{--device}` when CUDA is available, else the CPU."""
    return torch.device(f"cuda:{config.device}" if torch.cuda.is_available() else "cpu")


def serving_dtypes(config: EngineConfig,
                   device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(activation dtype, `--cpu-matmul` decode-copy dtype): fp32 activations on the CPU, whose
    projections `--cpu-matmul` narrows; `--cuda-dtype` on CUDA."""
    if device.type == "cpu":
        return torch.float32, MATMUL_DTYPES[config.cpu_matmul]
    return CUDA_DTYPES[config.cuda_dtype], None


BIG_DEVICE_BYTES = 70 * 2**30  # the device memory from which the auto prefill chunk is 8192


def prefill_chunk_for(config: EngineConfig, device: torch.device) -> int:
    """`--prefill-chunk`, or its auto value. On CUDA 4096 tokens, where a chunk's matmuls need
    rows (H200, 8K prompt: 35B-A3B 8.2 K tok/s at 1024, 21 K at 4096, as its grouped expert GEMMs
    get ~128 rows per expert instead of ~32; 27B 7.2 K → 8.1 K), and 8192 on a device of
    ≥ 70 GiB (vLLM's API-server default there too): eight 1K-token prompts arriving together
    then share one prompt step, where 4096 split them into two or three (H100, 8-layer
    35B-A3B: their TTFT p99 35-37 ms against 51-65, bench/results/h100-ttft-burst-handover.md).
    The chunk is also a hybrid prompt's snapshot spacing (`build_memory`): at 8192 a shared
    prefix is found up to 8191 tokens short of its end, where 4096 found it up to 4095 short
    (not measured on a served replay; `--prefill-chunk 4096` keeps the finer spacing).
    1024 on the CPU, whose matmuls are full at that size and where a long chunk stalls
    concurrent decodes for seconds."""
    return auto_prefill_chunk(device) if config.prefill_chunk is None else config.prefill_chunk


def auto_prefill_chunk(device: torch.device) -> int:
    """`--prefill-chunk auto` on `device` (`prefill_chunk_for`; `ninfer bench`'s default)."""
    if device.type != "cuda":
        return 1024
    return 8192 if torch.cuda.get_device_properties(device).total_memory >= BIG_DEVICE_BYTES \
        else 4096


def cpu_compiled(config: EngineConfig) -> bool:
    """Whether CPU decode rows may take the compiled step (`--cpu-step compiled`, the default):
    it multiplies by the artifact's stored weights in fp32, so a narrowed `--cpu-matmul` keeps
    the eager step it asked for."""
    return config.cpu_step == "compiled" and config.cpu_matmul == "fp32"


def weights_mode(config: EngineConfig, device: torch.device, dtype: torch.dtype,
                 artifact=None) -> str:
    """`--cuda-weights`, or "dequant" off CUDA and on the exact fp32 path (the packed kernels
    compute in bf16), and for "auto" below sm89: the forms "auto" serves (fp8-row, Q4/Q5 as
    fp8 groups, fp8 expert stacks) are e4m3 codes, which Triton compiles nothing for there
    ("fp8e4nv data type is not supported on CUDA arch < 89"). An explicit "packed" below sm89
    over an `artifact` that stores such codes raises ValueError (one line for the load's
    error), where it failed at the first request's compile."""
    if device.type != "cuda" or dtype != torch.bfloat16:
        return "dequant"
    if not has_e4m3(device):
        capability = "sm%d%d" % torch.cuda.get_device_capability(device)
        if config.cuda_weights == "auto":
            log.info("--cuda-weights auto: weights decoded to bf16 at load on this %s GPU (the "
                     "fp8 forms need sm89+)", capability)
            return "dequant"
        found = _e4m3_formats(artifact) if config.cuda_weights == "packed" else ()
        if found:
            raise ValueError(f"--cuda-weights packed keeps this artifact's {', '.join(found)} "
                             f"codes as stored, which need an sm89+ GPU (e4m3); {device} is "
                             f"{capability}: --cuda-weights auto or dequant decode them to bf16")
    return config.cuda_weights


def _e4m3_formats(artifact) -> list[str]:
    """The stored formats "packed" serves as e4m3 codes: fp8-row, and in a MoE model Q4/Q5
    (its routed experts become fp8 groups, `experts.expert_form`). nvfp4's kernels build its
    e4m3 block scales from their bits (`quant_gemv_kernels`): they compile anywhere."""
    objects = getattr(artifact, "objects", None)  # None: a benchmark's or a test's weights
    if objects is None:
        return []
    stored = {o.format for o in objects.values() if o.kind == "tensor"}
    e4m3 = {FP8_ROW} | (REPACK_FP8 if "num_experts" in artifact.config("text") else set())
    return sorted(stored & e4m3)
