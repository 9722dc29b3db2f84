"""specrl's small-row matmul kernel (the engine's fast path) against PyTorch, and its fallback.

Chain of invariants:
    kernel(x, pack(W))       == x @ W^T to fp32 rounding, for any M, N (not a multiple of 8 too) and K, on the AVX2
                                kernel (blocks of 8) and the AVX-512 one (16), which give the same bits;
    each row's result        is the same bit for bit whatever the other rows (M) and the thread count;
    Projection, fast path    == Projection, eager, bias included;
    int8 kernel(x, W)        == x @ (q * scale)^T, the dequantized weights, to fp32 rounding, and is batch-invariant
                                like the fp32 kernel; quantize_int8 rounds each row to within half a step;
    VNNI kernel(x, W)        == quantize_activations(x) @ (q * scale)^T likewise; quantize_activations rounds each
                                group of 16 along K to within half its step (max |x| / 127);
    quantize_pack_vnni(W)    == quantize_int8 then pack_vnni, bit for bit, at 1 and 2 threads (the one-pass rebuild);
    Int8Projection, fast     == Int8Projection, eager (the dequantized weights through MKL), of the VNNI kernel's
                                rounded activations where the kernel is VNNI;
    a kernel that cannot run  warns once with the reason and the engine runs eager;
    fma_peak_gflops          is a ceiling the fp32 kernel does not pass (the kernel bench's floor rests on it).
"""
from __future__ import annotations

import time

import pytest
import torch

from specrl.kernels import small_gemm
from specrl.models.llama import Int8Projection, LlamaModel, Projection, int8_kernels

pytestmark = pytest.mark.skipif(bool(small_gemm.unavailable()), reason=f"kernel unavailable: {small_gemm.unavailable()}")
FP32_BLOCKS = [8, pytest.param(16, marks=pytest.mark.skipif(bool(small_gemm.avx512_unavailable()),
                                                           reason="this CPU lacks AVX-512"))]


@pytest.mark.parametrize("block", FP32_BLOCKS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 24, 33, 64, 128])
@pytest.mark.parametrize("out_features, in_features", [(48, 64), (22, 64), (1001, 63), (7, 5)])
def test_the_kernel_equals_a_matmul(rows, out_features, in_features, block):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator)
    w = torch.randn(out_features, in_features, generator=generator)
    got = small_gemm.matmul(x, small_gemm.pack(w, block), out_features)
    assert got.shape == (rows, out_features)
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(bool(small_gemm.avx512_unavailable()), reason="this CPU lacks AVX-512")
def test_the_avx512_and_avx2_kernels_give_the_same_bits():
    generator = torch.Generator().manual_seed(1)
    x, w = torch.randn(21, 200, generator=generator), torch.randn(333, 200, generator=generator)
    assert small_gemm.fp32_block() == 16
    assert torch.equal(small_gemm.matmul(x, small_gemm.pack(w, 16), 333), small_gemm.matmul(x, small_gemm.pack(w, 8), 333))


def test_the_fp32_kernel_can_be_pinned_and_a_pin_this_cpu_cannot_run_is_named(monkeypatch):
    native = small_gemm.fp32_block()
    monkeypatch.setenv("SPECRL_FP32_KERNEL", "avx2")
    assert small_gemm.pack(torch.randn(20, 8)).shape == (3, 8, 8)
    assert Projection(torch.randn(20, 8), fast=True).packed.shape[-1] == 8
    monkeypatch.setenv("SPECRL_FP32_KERNEL", "avx512")
    if native == 16:
        assert small_gemm.pack(torch.randn(20, 8)).shape == (2, 8, 16)
    else:
        with pytest.raises(ValueError, match="SPECRL_FP32_KERNEL='avx512': this CPU runs the fp32 kernels avx2$"):
            small_gemm.pack(torch.randn(20, 8))
    monkeypatch.setenv("SPECRL_FP32_KERNEL", "fp16")
    with pytest.raises(ValueError, match="SPECRL_FP32_KERNEL='fp16': this CPU runs the fp32 kernels"):
        small_gemm.pack(torch.randn(20, 8))


@pytest.mark.parametrize("block", FP32_BLOCKS)
def test_a_rows_result_does_not_depend_on_the_other_rows_or_the_threads(block):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 96, generator=generator)
    packed = small_gemm.pack(torch.randn(200, 96, generator=generator), block)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([small_gemm.matmul(x[i:i + 1], packed, 200) for i in range(40)])
        torch.set_num_threads(2)
        for m in (2, 4, 7, 16, 40):
            assert torch.equal(small_gemm.matmul(x[:m], packed, 200), alone[:m])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [1, 4, 200])  # 200 > MAX_ROWS: MKL on both paths
def test_fast_and_eager_projections_agree_bias_included(rows):
    w, b = torch.randn(30, 16), torch.randn(30)
    x = torch.randn(2, rows, 16)
    torch.testing.assert_close(Projection(w, b, fast=True)(x), Projection(w, b)(x), rtol=1e-5, atol=1e-5)


def test_a_kernel_that_cannot_run_warns_and_the_engine_runs_eager(target_dir, monkeypatch):
    monkeypatch.setattr(small_gemm, "unavailable", lambda: "no C++ compiler found (set CXX, or install g++)")
    with pytest.warns(RuntimeWarning, match="fast path is unavailable \\(no C\\+\\+ compiler found"):
        model = LlamaModel.from_pretrained(target_dir)
    assert not model.fast_path and model.lm_head.packed is None


def test_the_kernel_builds_from_its_source(tmp_path):
    built = small_gemm.build(tmp_path / "k.so")
    assert built.is_file() and built.stat().st_size > 1000


def test_int8_quantization_is_symmetric_per_row_and_within_half_a_step():
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(50, 70, generator=generator) * torch.linspace(0.01, 3, 50).unsqueeze(1)
    w[7] = 0.0  # a zero row quantizes to zeros
    q, scale = small_gemm.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (50,) and int(q.abs().max()) == 127
    assert ((q.float() * scale.unsqueeze(1) - w).abs() <= scale.unsqueeze(1) / 2 + 1e-7).all()
    assert (q[7] == 0).all()


@pytest.mark.parametrize("threads", [1, 2])
# a short last group of blocks (20, 1001), K not a multiple of 16 (63, 5, 130), a zero row and huge weights
@pytest.mark.parametrize("out_features, in_features", [(48, 64), (1001, 63), (7, 5), (33, 130), (20, 40)])
def test_the_one_pass_rebuild_gives_the_bits_of_quantize_then_pack(out_features, in_features, threads):
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(in_features)) * 3
    weight[out_features // 2] = 0
    weight[0, 0] = 1e30
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, scale, packed, scales = small_gemm.quantize_pack_vnni(weight)
    finally:
        torch.set_num_threads(previous)
    q_ref, scale_ref = small_gemm.quantize_int8(weight)
    packed_ref, scales_ref = small_gemm.pack_vnni(q_ref, scale_ref)
    for got, expected in ((q, q_ref), (scale, scale_ref), (packed, packed_ref), (scales, scales_ref)):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16, 33, 200])
@pytest.mark.parametrize("out_features, in_features", [(48, 64), (1001, 63), (7, 5)])
def test_the_int8_kernel_equals_a_matmul_with_the_dequantized_weights(rows, out_features, in_features):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator)
    q, scale = small_gemm.quantize_int8(torch.randn(out_features, in_features, generator=generator))
    packed, scales = small_gemm.pack_int8(q, scale)
    got = small_gemm.matmul(x, packed, out_features, scales=scales)
    expected = (x.double() @ (q.double() * scale.double().unsqueeze(1)).T).float()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_an_int8_rows_result_does_not_depend_on_the_other_rows_or_the_threads():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40, 96, generator=generator)
    packed, scales = small_gemm.pack_int8(*small_gemm.quantize_int8(torch.randn(200, 96, generator=generator)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([small_gemm.matmul(x[i:i + 1], packed, 200, scales=scales) for i in range(40)])
        torch.set_num_threads(2)
        for m in (2, 4, 7, 16, 40):
            assert torch.equal(small_gemm.matmul(x[:m], packed, 200, scales=scales), alone[:m])
    finally:
        torch.set_num_threads(threads)


INTEGER_KERNELS = tuple(small_gemm.INTEGER_KERNELS)  # activations rounded to int8 in groups of 16 too


@pytest.mark.parametrize("kernel", int8_kernels())
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16, 33])
# (20, 40): a short last group of two blocks; (1001, 63): on VNNI two runs of ten groups read side by side, one
# left, on AVX2 four runs of five, one left
@pytest.mark.parametrize("out_features, in_features", [(48, 64), (1001, 63), (7, 5), (33, 130), (20, 40)])
def test_every_int8_kernel_equals_a_matmul_with_the_dequantized_weights(kernel, rows, out_features, in_features):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator)
    w, b = torch.randn(out_features, in_features, generator=generator), torch.randn(out_features, generator=generator)
    projection = Int8Projection(Projection(w, b, fast=True), kernel)
    assert projection.kernel == kernel
    applied = small_gemm.quantize_activations(x) if kernel in INTEGER_KERNELS else x
    expected = (applied.double() @ projection.dequantized().double().T + b.double()).float()
    torch.testing.assert_close(projection(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", int8_kernels())
def test_every_int8_kernels_rows_do_not_depend_on_the_other_rows_or_the_threads(kernel):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(40, 96, generator=generator)
    projection = Int8Projection(Projection(torch.randn(200, 96, generator=generator), fast=True), kernel)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([projection(x[i:i + 1]) for i in range(40)])
        torch.set_num_threads(2)
        for m in (2, 4, 7, 16, 40):
            assert torch.equal(projection(x[:m]), alone[:m])
    finally:
        torch.set_num_threads(threads)


def test_the_default_int8_kernel_is_the_first_this_cpu_runs():
    kernels = int8_kernels()
    missing = {"vnni": small_gemm.vnni_unavailable(), "avx-vnni": small_gemm.avx_vnni_unavailable(),
               "avx512": small_gemm.avx512_unavailable(), "avx2-int8": "", "avx2": ""}
    assert kernels == tuple(name for name, why in missing.items() if not why)
    assert Int8Projection(Projection(torch.randn(16, 8), fast=True)).kernel == kernels[0]
    assert Int8Projection(Projection(torch.randn(16, 8))).kernel == "eager"


@pytest.mark.parametrize("kernel", int8_kernels())
@pytest.mark.parametrize("rows", [1, 4, 200])
def test_fast_and_eager_int8_projections_agree_bias_included(rows, kernel):
    w, b = torch.randn(30, 16), torch.randn(30)
    x = torch.randn(2, rows, 16)
    fast, eager = Int8Projection(Projection(w, b, fast=True), kernel), Int8Projection(Projection(w, b))
    assert fast.packed is not None and eager.packed is None and eager.kernel == "eager"
    applied = small_gemm.quantize_activations(x) if kernel in INTEGER_KERNELS else x
    torch.testing.assert_close(fast(x), eager(applied), rtol=1e-5, atol=1e-5)


def test_quantize_activations_rounds_each_group_of_16_to_its_own_step():
    x = torch.zeros(2, 35)
    x[0, :16] = torch.tensor([-127, -100, -64, -50, -3, -1, 0, 1, 2, 5, 17, 33, 64, 90, 126, 127]) / 64  # step 1/64:
    # every value a whole number of steps, kept exactly
    x[0, 16:32] = 0.0                           # an all-zero group stays zero (scale 1)
    x[0, 32:] = torch.tensor([127.0, 0.4, -0.6])  # the last group, padded: step 1, so 0.4 -> 0 and -0.6 -> -1
    x[1] = torch.randn(35)
    y = small_gemm.quantize_activations(x)
    torch.testing.assert_close(y[0, :16], x[0, :16])
    assert torch.equal(y[0, 16:32], torch.zeros(16))
    assert torch.equal(y[0, 32:], torch.tensor([127.0, 0.0, -1.0]))
    for start in (0, 16, 32):  # a random row: within half a step of itself, the step its group's max |x| / 127
        group = x[1, start:start + 16]
        assert (y[1, start:start + 16] - group).abs().max() <= group.abs().max() / 127 / 2 * (1 + 1e-6)


@pytest.mark.skipif(len([k for k in int8_kernels() if k in INTEGER_KERNELS]) < 2,
                    reason="this CPU runs one integer int8 kernel")
def test_the_integer_int8_kernels_give_the_same_bits():
    """`vnni` (AVX-512), `avx-vnni` (vpdpbusd on 256-bit registers) and `avx2-int8` (vpmaddubsw, vpmaddwd) make the
    same exact integer sums and scale them in the same order: each gives the others' bits wherever it runs."""
    generator = torch.Generator().manual_seed(5)
    w, x = torch.randn(1001, 130, generator=generator), torch.randn(9, 130, generator=generator)
    kernels = [kernel for kernel in int8_kernels() if kernel in INTEGER_KERNELS]
    first, *others = (Int8Projection(Projection(w, fast=True), kernel) for kernel in kernels)
    for m in (1, 2, 4, 9):
        for other in others:
            assert torch.equal(first(x[:m]), other(x[:m])), other.kernel


def test_the_256_bit_vnni_kernel_runs_where_the_cpu_has_avx_vnni_or_avx512_vl_with_vnni():
    flags = small_gemm.cpu_flags()
    with open("/proc/cpuinfo") as info:
        listed = next(line for line in info if line.startswith("flags")).split()
    has = "avx_vnni" in flags or ("avx512vl" in listed and "avx512_vnni" in flags)
    assert (not small_gemm.avx_vnni_unavailable()) == has
    assert ("avx-vnni" in int8_kernels()) == has


def test_the_int8_kernel_can_be_pinned_and_a_pin_this_cpu_cannot_run_is_named(monkeypatch):
    monkeypatch.setenv("SPECRL_INT8_KERNEL", "avx2")
    assert Int8Projection(Projection(torch.randn(16, 8), fast=True)).kernel == "avx2"
    monkeypatch.setenv("SPECRL_INT8_KERNEL", "int4")
    with pytest.raises(ValueError, match="SPECRL_INT8_KERNEL='int4': this CPU runs the int8 kernels"):
        Int8Projection(Projection(torch.randn(16, 8), fast=True))


def test_an_int8_kernel_this_cpu_cannot_run_is_refused_by_name():
    with pytest.raises(ValueError, match="int8 kernel .int4. cannot run here"):
        Int8Projection(Projection(torch.randn(16, 8), fast=True), "int4")


def test_the_fma_probe_is_a_ceiling_the_fp32_kernel_does_not_pass():
    """The kernel bench prices each pass's compute floor at `fma_peak_gflops`. A probe whose chains the compiler
    folded or serialised would read several times too low, and the kernel, 16 rows on a matrix held in L2 (as
    compute-bound as it gets), would run faster than the 'peak'; the margin leaves room for a busy machine."""
    x, w = torch.randn(16, 512), torch.randn(256, 512)
    packed = small_gemm.pack(w, 8)  # the AVX2 tiles, whose ceiling the probe's 8-wide FMAs are
    timed = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            small_gemm.matmul(x, packed, 256)
        timed.append(time.perf_counter() - start)
    kernel = 2 * 16 * 256 * 512 * 50 / min(timed) / 1e9
    peak = small_gemm.fma_peak_gflops(threads=torch.get_num_threads(), seconds=0.1)
    assert 0 < kernel < 1.5 * peak, (kernel, peak)
