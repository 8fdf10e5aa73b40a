"""dtype auto (the default): bf16 where the device computes it natively, fp32 elsewhere (models/dtype.py).

The CPU is faked by replacing what posbias reads of it (/proc/cpuinfo's model name and flags), so every kind of
machine is tested on any machine; one real-model test runs the default on whatever CPU this is and prints its choice.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

import posbias
from posbias import SweepConfig, run_sweep
from posbias.cli import main
from posbias.models import dtype as dt

AVX2 = ("Intel(R) Core(TM) i7-10510U", frozenset("fpu sse2 avx avx2 fma".split()))
AVX512_NO_BF16 = ("Intel(R) Xeon(R) Gold 6148", frozenset("avx2 avx512f avx512bw avx512vl avx512_vnni".split()))
AVX512_BF16 = ("AMD EPYC 9R14", frozenset("avx2 avx512f avx512bw avx512_bf16".split()))
AMX = ("Intel(R) Xeon(R) Platinum 8480+", frozenset("avx2 avx512f avx512_bf16 amx_bf16 amx_tile".split()))
ARM_BF16 = ("", frozenset("fp asimd sve bf16 i8mm".split()))
ARM_OLD = ("", frozenset("fp asimd".split()))


@pytest.fixture
def cpu(monkeypatch):
    """fake(model, flags, arch="x86_64"): this process reads that CPU (and no oneDNN cap unless the test sets one)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)

    def fake(info, arch="x86_64"):
        monkeypatch.setattr(dt, "_cpu_info", lambda: info)
        monkeypatch.setattr(dt.platform, "machine", lambda: arch)
    return fake


@pytest.mark.parametrize("info, arch, want", [
    (AVX2, "x86_64", "fp32"), (AVX512_NO_BF16, "x86_64", "fp32"), (AVX512_BF16, "x86_64", "bf16"),
    (AMX, "x86_64", "bf16"), (ARM_BF16, "aarch64", "bf16"), (ARM_OLD, "aarch64", "fp32"), (("", frozenset()), "x86_64", "fp32"),
], ids=["avx2", "avx512-no-bf16", "avx512-bf16", "amx", "arm-bf16", "arm-no-bf16", "unknown"])
def test_auto_takes_bf16_only_where_the_cpu_multiplies_it_natively(cpu, info, arch, want):
    cpu(info, arch)
    chosen, why = dt.choose_dtype("auto", "cpu")
    assert chosen == want
    assert why == ("auto: CPU with native bf16" if want == "bf16" else
                   "auto: CPU without native bf16 (bf16 matmuls are emulated there, 4-40x slower than fp32)")
    assert ("no native bf16" in dt.cpu_kind().describe()) == (want == "fp32")


def test_a_onednn_cap_below_bf16_counts_as_no_native_bf16(cpu, monkeypatch):
    cpu(AVX512_BF16)
    for isa, want in (("AVX2", "fp32"), ("avx512_core_vnni", "fp32"), ("AVX512_CORE_BF16", "bf16"), ("ALL", "bf16")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        assert dt.choose_dtype("auto", "cpu")[0] == want, isa
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert "oneDNN capped at AVX2" in dt.cpu_kind().describe()


def test_an_explicit_dtype_is_kept_and_bf16_on_a_slow_cpu_warns(cpu, caplog):
    cpu(AVX2)
    with caplog.at_level(logging.WARNING, logger="posbias"):
        assert dt.choose_dtype("bf16", "cpu") == ("bf16", "asked for")
    assert "4-40x slower than fp32" in caplog.text and "dtype auto (the default) takes fp32" in caplog.text
    caplog.clear()
    cpu(AVX512_BF16)
    with caplog.at_level(logging.WARNING, logger="posbias"):
        assert dt.choose_dtype("bf16", "cpu") == ("bf16", "asked for") and dt.choose_dtype("fp32", "cpu")[0] == "fp32"
    assert caplog.text == ""
    with pytest.raises(posbias.PosbiasError, match="use `dtype` auto, bf16, fp32"):
        dt.choose_dtype("fp16", "cpu")


def test_cuda_auto_follows_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert dt.choose_dtype("auto", "cuda") == ("bf16", "auto: CUDA device with bf16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert dt.choose_dtype("auto", "cuda")[0] == "fp32"


def test_the_default_is_auto_everywhere():
    from posbias.analysis.theory import RealRollout
    from posbias.distill import DistillConfig
    from posbias.lpes import SearchConfig

    for cfg in (SweepConfig(), posbias.GridConfig(), DistillConfig(), SearchConfig(), RealRollout()):
        assert cfg.dtype == "auto", type(cfg).__name__


@pytest.mark.parametrize("info, want", [(AVX2, "fp32"), (AVX512_BF16, "bf16")], ids=["avx2", "avx512-bf16"])
def test_a_sweep_records_the_choice_and_a_resume_elsewhere_says_why_it_differs(cpu, tmp_path, model_dir, info, want):
    """run.json's fingerprint holds the dtype taken and the rule's reason: resuming on a CPU of the other kind is
    refused naming both; on one of the same kind it resumes."""
    cpu(info)
    cfg = SweepConfig(model=str(model_dir), task_options={"facts": 4, "digits": 3}, positions="0,3", n=2)
    run_sweep(cfg, tmp_path / "s", progress=False)
    model = json.loads((tmp_path / "s" / "run.json").read_text())["fingerprint"]["model"]
    assert model["dtype"] == want and model["dtype_reason"].startswith("auto: CPU with")
    assert json.loads((tmp_path / "s" / "timing.json").read_text())["cpu"] == dt.cpu_kind().describe()
    cpu(AMX if want == "bf16" else AVX512_NO_BF16)  # another machine of the same kind
    run_sweep(cfg, tmp_path / "s", resume=True, progress=False)
    cpu(AVX512_BF16 if want == "fp32" else AVX2)  # a machine of the other kind
    with pytest.raises(posbias.PosbiasError, match="model.dtype") as e:
        run_sweep(cfg, tmp_path / "s", resume=True, progress=False)
    assert "dtype_reason" in str(e.value) or "native bf16" in str(e.value)


def test_the_cli_says_what_auto_chose_before_loading(cpu, tmp_path, model_dir, capsys, monkeypatch):
    cpu(AVX2)
    monkeypatch.setattr(sys, "argv", ["posbias", "sweep", "--model", str(model_dir), "--facts", "4", "--digits", "3",
                                      "--positions", "0,3", "--n", "1", "--out", str(tmp_path / "s")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code in (0, None), err
    assert f"(auto -> fp32: {AVX2[0]} (x86_64, {torch.backends.cpu.get_cpu_capability()}, no native bf16), cpu)" in err


def test_transformers_gguf_hint_is_dropped_only_where_bf16_is_native(cpu):
    from posbias.models.load import _gguf_hint

    rec = logging.LogRecord("transformers.quantizers.quantizer_gguf", logging.WARNING, "", 0,
                            "Loading a GGUF checkpoint with its weights packed is fastest in float32, ...", None, None)
    other = logging.LogRecord("transformers.quantizers.quantizer_gguf", logging.WARNING, "", 0, "something else", None, None)
    cpu(AVX512_BF16)
    assert not _gguf_hint(rec) and _gguf_hint(other)
    cpu(AVX2)
    assert _gguf_hint(rec)


@pytest.mark.real
def test_the_default_on_this_machine(capsys):
    """The default model in the default dtype on whatever CPU runs the suite: it loads in what auto chose, and the
    choice is printed (pytest -s shows it; CI's log has it)."""
    chosen, why = dt.choose_dtype("auto", "cpu")
    lo = posbias.load_model("smollm2-135m", progress=False)
    assert lo.info["dtype"] == chosen and lo.info["dtype_reason"] == why
    assert next(lo.model.parameters()).dtype == dt.DTYPES[chosen]
    with capsys.disabled():
        print(f"\n[dtype auto] {dt.cpu_kind().describe()}: {chosen} ({why})")
