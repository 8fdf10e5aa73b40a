"""Which dtype a model runs in. `auto` (the default) takes bf16 where the hardware multiplies bf16 natively, fp32
elsewhere, and says why.

On a CPU with native bf16 matmul (x86 AVX-512-BF16 or AMX, ARM's BF16 extension) oneDNN runs bf16 GEMMs on those
instructions: SmolLM2-135M sweeps about 2.5x faster than in fp32. On a CPU without them (AVX2 only: most x86
laptops and many cloud VMs) every bf16 matmul is emulated by conversions, 4-40x slower than fp32 (docs/benchmarks.md,
"bf16 and fp32 by CPU kind"). On CUDA, bf16 where the device supports it.

oneDNN's own cap (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA, e.g. AVX2) is honoured: below AVX512_CORE_BF16 the bf16
instructions are not used, so `auto` takes fp32 there too (the benchmarks use it to measure an AVX2-class CPU here).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import PosbiasError

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_CHOICES = ("auto", *DTYPES)
NATIVE_BF16 = ("amx_bf16", "avx512_bf16", "bf16")  # /proc/cpuinfo flags (x86) / features (ARM), best first
_SLOW = "bf16 matmuls are emulated there, 4-40x slower than fp32"


@dataclass(frozen=True)
class CpuKind:
    """What the dtype rule reads of this CPU."""

    model: str  # "AMD EPYC", "Apple M2", ... ("" when unknown)
    arch: str  # x86_64 | aarch64 | arm64 | ...
    capability: str  # torch's kernel level: AVX2, AVX512, DEFAULT, ...
    bf16: str  # the native bf16 feature found ("avx512_bf16", "amx_bf16", "bf16"), "" when none
    capped: str = ""  # oneDNN's ISA cap when it hides a native bf16 feature ("AVX2")

    def describe(self) -> str:
        """E.g. 'AMD EPYC (x86_64, AVX512, native bf16: avx512_bf16)', 'Intel Core i7 (x86_64, AVX2, no native bf16)'."""
        bf = f"native bf16: {self.bf16}" if self.bf16 else "no native bf16"
        if self.capped:
            bf += f" (oneDNN capped at {self.capped})"
        return f"{self.model or 'unknown CPU'} ({self.arch}, {self.capability}, {bf})"


@functools.lru_cache(maxsize=1)
def _cpu_info() -> tuple[str, frozenset]:
    """(model name, feature flags) of this CPU: /proc/cpuinfo on Linux, sysctl on macOS; ("", {}) elsewhere."""
    if platform.system() == "Darwin":
        def sysctl(key: str) -> str:
            try:
                return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                return ""
        return sysctl("machdep.cpu.brand_string"), frozenset({"bf16"} if sysctl("hw.optional.arm.FEAT_BF16") == "1" else ())
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return "", frozenset()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or fields.get("hardware") or fields.get("cpu model") or ""
    return model, frozenset((fields.get("flags") or fields.get("features") or "").split())


def _onednn_cap() -> str:
    """oneDNN's ISA cap when it rules out bf16 instructions (x86 values: AVX2, AVX512_CORE, AVX512_CORE_VNNI ...)."""
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if not isa or isa in ("ALL", "DEFAULT") or "BF16" in isa or "AMX" in isa:
        return ""
    return isa


def cpu_kind() -> CpuKind:
    model, flags = _cpu_info()
    native = next((f for f in NATIVE_BF16 if f in flags), "")
    arch = platform.machine() or "unknown"
    cap = _onednn_cap() if native and arch in ("x86_64", "AMD64") else ""
    return CpuKind(model, arch, torch.backends.cpu.get_cpu_capability(), "" if cap else native, cap)


def choose_dtype(dtype: str, device: torch.device | str) -> tuple[str, str]:
    """(bf16 | fp32, why) for `dtype` (auto | bf16 | fp32) on `device`. The reason is what a run records in its
    fingerprint, so it names the rule, not the machine: a resume on a machine of the other kind says why it differs,
    one on another machine of the same kind resumes. An explicit bf16 on a CPU without native bf16 is kept, with a
    warning."""
    if dtype not in DTYPE_CHOICES:
        raise PosbiasError(f"unknown dtype '{dtype}'", f"use `dtype` {', '.join(DTYPE_CHOICES)}")
    kind = torch.device(device).type
    if dtype != "auto":
        if dtype == "bf16" and kind == "cpu" and not cpu_kind().bf16:
            logging.getLogger("posbias").warning("dtype bf16 on %s: %s; dtype auto (the default) takes fp32",
                                                 cpu_kind().describe(), _SLOW)
        return dtype, "asked for"
    if kind == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ("bf16", "auto: CUDA device with bf16") if ok else ("fp32", "auto: CUDA device without bf16")
    if kind != "cpu":
        return "fp32", f"auto: fp32 on {kind}"
    cpu = cpu_kind()
    if cpu.bf16:
        return "bf16", "auto: CPU with native bf16"
    return "fp32", f"auto: CPU without native bf16 ({_SLOW})"


def dtype_note(dtype: str, device: str) -> str:
    """What a command prints of the dtype before loading: 'bf16' as asked, or auto's choice with the CPU it read,
    e.g. 'auto -> fp32: AMD EPYC (x86_64, AVX2, no native bf16)'."""
    if dtype != "auto" or device not in ("cpu", "cuda", "auto"):
        return dtype
    dev = "cuda" if device in ("cuda", "auto") and torch.cuda.is_available() else "cpu" if device in ("cpu", "auto") else device
    chosen, _ = choose_dtype(dtype, dev)
    where = cpu_kind().describe() if dev == "cpu" else torch.cuda.get_device_name() if dev == "cuda" else dev
    return f"auto -> {chosen}: {where}"
