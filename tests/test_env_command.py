"""`specrl env`: the versions, the CPU class, the kernels and their pins, the checkpoints present."""
import json

import pytest
import torch

from specrl import cli
from specrl.kernels import small_gemm
from specrl.models.llama import int8_kernels


@pytest.mark.parametrize("flags, expected", [
    (["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"], "AVX-512 VNNI"),
    (["avx2", "fma", "avx512f", "avx512bw"], "AVX-512"),
    (["avx2", "fma"], "AVX2-only"),
    (["avx2", "fma", "avx_vnni"], "AVX2-only"),  # AVX-VNNI on 256-bit registers: an AVX2-class CPU
    (["avx2"], "no AVX2"),  # no FMA: the fast path does not run
    ([], "no AVX2"),
])
def test_the_cpu_class_follows_the_flags_that_choose_the_kernels(flags, expected):
    assert small_gemm.cpu_class(flags) == expected


def _env(capsys, monkeypatch, tmp_path, **pins) -> tuple[int, dict | None, str]:
    monkeypatch.setenv("SPECRL_CACHE", str(tmp_path))
    for name in ("SPECRL_FP32_KERNEL", "SPECRL_INT8_KERNEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in pins.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["env"])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]) if code == 0 else None, err


def test_env_reports_this_machines_class_kernels_and_the_checkpoints_present(capsys, monkeypatch, tmp_path):
    (tmp_path / "smollm2-135m-mtp").mkdir()
    (tmp_path / "smollm2-135m-mtp" / "config.json").write_text("{}")
    code, summary, err = _env(capsys, monkeypatch, tmp_path)
    assert code == 0
    flags = small_gemm.cpu_flags()
    assert summary["cpu_flags"] == flags and summary["cpu_class"] == small_gemm.cpu_class(flags)
    assert summary["packages"]["torch"] == torch.__version__ and summary["torch_build"] == "CPU"
    assert summary["int8_kernels"] == list(int8_kernels())
    assert summary["int8_kernel"] == (summary["int8_kernels"] or ["eager"])[0]
    assert summary["pins"] == {"SPECRL_FP32_KERNEL": None, "SPECRL_INT8_KERNEL": None}
    assert summary["cache"] == str(tmp_path)
    # the shipped checkpoints, and the one made into this cache; SmolLM2 itself is not converted here
    assert {"tiny", "tiny-draft", "smollm2-135m-mtp"} <= set(summary["checkpoints"])
    assert "smollm2-135m" not in summary["checkpoints"]
    assert repr(summary["cpu_class"]) in err.replace("\n", " ") or summary["fp32_kernel"] == "eager"


@pytest.mark.skipif(small_gemm.unavailable() != "", reason="no fast path on this CPU")
def test_env_reports_the_pinned_avx2_kernels_and_which_figures_were_measured_so(capsys, monkeypatch, tmp_path):
    code, summary, err = _env(capsys, monkeypatch, tmp_path, SPECRL_FP32_KERNEL="avx2",
                              SPECRL_INT8_KERNEL="avx2-int8")
    assert code == 0
    assert (summary["fp32_kernel"], summary["int8_kernel"]) == ("avx2", "avx2-int8")
    assert summary["pins"] == {"SPECRL_FP32_KERNEL": "avx2", "SPECRL_INT8_KERNEL": "avx2-int8"}
    if summary["cpu_class"].startswith("AVX-512"):
        assert "AVX2 kernels pinned" in err.replace("\n", " ")


def test_env_refuses_a_pin_this_cpu_cannot_run_naming_the_variable(capsys, monkeypatch, tmp_path):
    code, _, err = _env(capsys, monkeypatch, tmp_path, SPECRL_INT8_KERNEL="no-such-kernel")
    assert code == 1 and "SPECRL_INT8_KERNEL='no-such-kernel'" in err
