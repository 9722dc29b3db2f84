"""specrl's small-row matmul kernel (`small_gemm.cpp`), built once and loaded with ctypes.

Decoding and verification multiply a few rows (M = live rows x (k + 1)) by weights streamed
from memory; MKL's gemm for M >= 2 streams them slower than its gemv for M = 1, so before
this kernel verifying a few drafts cost far more than one decode step (the eager rows of
docs/fast_path.md's kernel table). The kernel streams
each weight from memory once for any M (see the .cpp) and is used for M <= MAX_ROWS; larger M goes
to MKL. Blocks of 16 outputs on AVX-512, 8 on AVX2 (`fp32_block()`, pinned by $SPECRL_FP32_KERNEL); the two give
the same bits.

    packed = pack(weight)              [N, K] -> [ceil(N/block), K, block], once per weight load or sync
    y = matmul(x, packed, N)           x [..., K] -> y [..., N]

int8 weights (the int8 self-draft), symmetric per output row, activations fp32 (each weight widened
to fp32 in registers; the fp32 FMA chain, so batch-invariant too):

    q, scale = quantize_int8(weight)   [N, K] -> int8 [N, K], fp32 [N]: W ~ q * scale[:, None]
  AVX2, 8 outputs per block:
    packed, scales = pack_int8(q, scale)           -> int8 [ceil(N/8), K, 8], fp32 [8 * ceil(N/8)]
    y = matmul(x, packed, N, scales=scales)        x [..., K] -> y [..., N] = x (q * scale)^T
  AVX-512, 16 outputs per block (where `avx512_unavailable()` is ""):
    packed, scales = pack_int8(q, scale, block=16) -> int8 [ceil(N/16), K, 16], fp32 [16 * ceil(N/16)]
    y = matmul(x, packed, N, scales=scales)        (the block size picks the kernel)

int8 activations too (AVX-512 VNNI, where `vnni_unavailable()` is "", 64 pairs per instruction; AVX-VNNI, or
AVX-512 VL with VNNI, where `avx_vnni_unavailable()` is "", 32 pairs per instruction; or AVX2, 32 pairs per two
instructions): each row of x quantized in groups of 16 along K (one fp32 scale per group,
`quantize_activations`), multiplied by int8 weights in integers; no widening, so it streams faster. The three
kernels compute the same bits:

    packed, scales = pack_vnni(q, scale)           -> uint8 [ceil(N/16), K16, 16] (K16 = K rounded up to 16;
                                                      q + 128, grouped as the .cpp says), fp32 [16 * ceil(N/16)]
    y = matmul(x, packed, N, scales=scales)        ~ quantize_activations(x) (q * scale)^T (the uint8 picks it;
                                                      integer="avx-vnni" or "avx2-int8": the others)

(One activation scale per row instead of per group of 16 cost the draft acceptance and lost in the engine.
int16 activations by VNNI's vpdpwssd, weights widened to int16 two k at a time, gained little on the widening
path at M = 1 and were slower from M = 4 on: not kept. The figures are in docs/log.md, "Dropped kernels".)

Where the library comes from, in order: the copy `make` builds next to the source
(`python -m specrl.kernels.small_gemm`), or one built on first use into the user's cache
(`$SPECRL_CACHE/kernels`, else ~/.cache/specrl/kernels; keyed by the source's hash, so a
changed source is rebuilt). It needs a C++ compiler with OpenMP and a CPU with AVX2 and FMA;
where either is missing `unavailable()` says why and the engine runs eager PyTorch.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from specrl.cache import cache_dir

# the kernels and, built into the same library, the decoder layer that calls them (`decoder_layer.py`) and the
# draft sampler (`draft_sampler.py`); the header they share is part of the build's hash
SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("small_gemm.cpp", "decoder_layer.cpp", "draft_sampler.cpp"))
HEADERS = tuple(Path(__file__).with_name(name)
                for name in ("vector_math.h", "small_gemm_int8_row.inc", "small_gemm_vnni256.inc"))
PACKAGED = Path(__file__).with_name("libspecrl_small_gemm.so")
MAX_ROWS = 128  # up to here the kernel beats MKL at 1 and 2 threads (docs/fast_path.md's kernel table); above, MKL
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]


def _digest() -> str:
    return hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES + HEADERS)
                          + " ".join(FLAGS).encode()).hexdigest()[:16]


def build(out: Path) -> Path:
    """Compile the kernel into `out` (atomically); raises RuntimeError naming what failed."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed to build {', '.join(source.name for source in SOURCES)}: "
                               f"{done.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _cached_path() -> Path:
    return cache_dir() / "kernels" / f"small_gemm-{_digest()}.so"


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why it is unavailable); decided once per process."""
    path = PACKAGED if PACKAGED.is_file() and PACKAGED.with_suffix(".sha").is_file() \
        and PACKAGED.with_suffix(".sha").read_text().strip() == _digest() else _cached_path()
    try:
        if not path.is_file():
            build(path)
        lib = ctypes.CDLL(str(path))
    except (RuntimeError, OSError) as err:
        return None, str(err)
    if not lib.specrl_small_gemm_supported():
        return None, "this CPU lacks AVX2 or FMA"
    p, i = ctypes.c_void_p, ctypes.c_int
    for fp32 in (lib.specrl_small_gemm, lib.specrl_small_gemm_avx512):
        fp32.argtypes = [p, p, p, i, i, i, i]
        fp32.restype = i
    for int8 in (lib.specrl_small_gemm_int8, lib.specrl_small_gemm_int8_avx512, lib.specrl_small_gemm_vnni,
                 lib.specrl_small_gemm_avx_vnni, lib.specrl_small_gemm_int8_avx2):
        int8.argtypes = [p, p, p, p, i, i, i, i]
        int8.restype = i
    lib.specrl_decoder_layer.argtypes = [p, p, p, p, p]
    lib.specrl_decoder_layer.restype = i
    lib.specrl_quantize_int8.argtypes = [p, i, i, p, p, p, i]
    lib.specrl_quantize_int8.restype = i
    lib.specrl_sample_softmax.argtypes = [p, i, i, ctypes.c_float, p, p, p]
    lib.specrl_sample_softmax.restype = i
    lib.specrl_draw.argtypes = [p, i, i, p, p]
    lib.specrl_draw.restype = i
    lib.specrl_race.argtypes = [p, i, i, i, p, p]
    lib.specrl_race.restype = i
    lib.specrl_fma_probe.argtypes = [ctypes.c_long, i]
    lib.specrl_fma_probe.restype = ctypes.c_double
    return lib, ""


def fma_peak_gflops(threads: int | None = None, seconds: float = 0.2) -> float:
    """The fp32 FMA rate this CPU gives `threads` threads together (default torch's), in GFLOP/s: 8-wide FMAs in
    independent register chains, the ceiling of the fp32 tiles (`specrl_fma_probe`), timed for about `seconds`.
    Needs the library."""
    threads = threads or torch.get_num_threads()
    probe = _library()[0].specrl_fma_probe
    iters = 1_000_000
    elapsed = probe(iters, threads)
    iters = max(iters, int(iters * seconds / max(elapsed, 1e-6)))
    return 12 * 16 * iters * threads / probe(iters, threads) / 1e9


CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni")  # the flags that choose the kernels


def cpu_flags() -> list[str]:
    """Which of CPU_FLAGS this CPU has, as /proc/cpuinfo lists them ([] where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as info:
            listed = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in CPU_FLAGS if flag in listed]


def cpu_class(flags: list[str]) -> str:
    """The class of CPU that `flags` (`cpu_flags()`) make, as the benchmark figures name them: `AVX-512 VNNI`,
    `AVX-512` (F and BW, no VNNI), `AVX2-only` (AVX2 and FMA), or `no AVX2` (the fast path cannot run)."""
    if {"avx512f", "avx512bw"} <= set(flags):
        return "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512"
    return "AVX2-only" if {"avx2", "fma"} <= set(flags) else "no AVX2"


def unavailable() -> str:
    """Why the kernel cannot run here ("" when it can)."""
    return _library()[1]


def avx512_unavailable() -> str:
    """Why the int8 AVX-512 path (int8 weights, fp32 activations) cannot run here ("" when it can)."""
    lib, why = _library()
    if lib is None:
        return why
    return "" if lib.specrl_small_gemm_avx512_supported() else "this CPU lacks AVX-512 (F, BW)"


def vnni_unavailable() -> str:
    """Why the int8 x int8 path (AVX-512 VNNI) cannot run here ("" when it can)."""
    lib, why = _library()
    if lib is None:
        return why
    return "" if lib.specrl_small_gemm_vnni_supported() else "this CPU lacks AVX-512 VNNI (F, BW, VNNI)"


def avx_vnni_unavailable() -> str:
    """Why the int8 x int8 path on 256-bit registers (vpdpbusd: AVX-VNNI, or AVX-512 VL and VNNI) cannot run here
    ("" when it can)."""
    lib, why = _library()
    if lib is None:
        return why
    return "" if lib.specrl_small_gemm_avx_vnni_supported() else "this CPU lacks AVX-VNNI (and AVX-512 VL with VNNI)"


def _blocks(weight: torch.Tensor, block: int) -> torch.Tensor:
    """[N, K] -> [ceil(N/block), K, block]: each block of outputs with its weights interleaved by k (outputs past
    N are zero rows)."""
    N, K = weight.shape
    padded = weight.new_zeros(-(-N // block) * block, K)
    padded[:N] = weight
    return padded.view(-1, block, K).transpose(1, 2).contiguous()


FP32_KERNEL_ENV = "SPECRL_FP32_KERNEL"  # pins the fp32 kernel: avx512 or avx2 (both give the same bits)


def fp32_block() -> int:
    """Outputs per block of the fp32 kernel this CPU runs: 16 on AVX-512, else 8 (AVX2); $SPECRL_FP32_KERNEL
    (`avx512` or `avx2`) pins one, refused, naming the variable, where this CPU cannot run it."""
    native = 8 if avx512_unavailable() else 16
    pinned = os.environ.get(FP32_KERNEL_ENV)
    if not pinned:
        return native
    runs = ("avx512", "avx2") if native == 16 else ("avx2",)
    if pinned not in runs:
        raise ValueError(f"{FP32_KERNEL_ENV}={pinned!r}: this CPU runs the fp32 kernels {', '.join(runs)}")
    return 16 if pinned == "avx512" else 8


def pack(weight: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """[N, K] fp32 -> [ceil(N/block), K, block]: each block of outputs with its weights interleaved by k
    (outputs past N are zero rows). block 8 for the AVX2 kernel, 16 for the AVX-512 one (None: `fp32_block()`);
    both compute the same bits."""
    return _blocks(weight.float(), block or fp32_block())


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] fp32 -> (q int8 [N, K], scale fp32 [N]): symmetric per output row, scale = max |w| / 127,
    q = round(w / scale) in [-127, 127] (a zero row gets scale 1 and q 0)."""
    scale = weight.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(weight / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
    return q, scale.float()


def pack_int8(q: torch.Tensor, scale: torch.Tensor, block: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], fp32 [N]) -> (int8 [ceil(N/block), K, block] in `pack`'s layout, fp32 [block * ceil(N/block)]);
    padded outputs have weight 0 and scale 0. block 8 for the AVX2 kernel, 16 for the AVX-512 one."""
    packed = _blocks(q, block)
    scales = torch.zeros(packed.shape[0] * block, dtype=torch.float32)
    scales[:scale.shape[0]] = scale
    return packed, scales


VNNI_GROUP = 3  # blocks of 16 outputs whose bytes the VNNI kernel interleaves (its tiles' width)


def pack_vnni(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], fp32 [N]) -> (uint8 [ceil(N/16), K16, 16], fp32 [16 * ceil(N/16)]) for the VNNI kernel:
    q + 128, K padded with q = 0 to K16 (a multiple of 16); each run of VNNI_GROUP blocks stored as
    [K16 / 4][blocks][16][4] (per 4 k, the blocks' 16 outputs x 4 k side by side). Padded outputs have scale 0."""
    N, K = q.shape
    K16 = -(-K // 16) * 16
    padded = torch.zeros(N, K16, dtype=torch.int16)
    padded[:, :K] = q
    blocks = _blocks((padded + 128).to(torch.uint8), 16)  # [N16, K16, 16] (padded outputs: 0, times scale 0)
    n16 = blocks.shape[0]
    fours = blocks.view(n16, K16 // 4, 4, 16).transpose(2, 3)  # [N16, K16/4, 16, 4]
    groups = [fours[b:b + VNNI_GROUP].transpose(0, 1).reshape(-1) for b in range(0, n16, VNNI_GROUP)]
    packed = torch.cat(groups).view(n16, K16, 16)
    scales = torch.zeros(n16 * 16, dtype=torch.float32)
    scales[:N] = scale
    return packed, scales


def quantize_pack_vnni(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] fp32 -> (q, scale, packed, scales): `quantize_int8`, then `pack_vnni`, in one kernel call and one
    pass over the weights, to the same bits (the int8 self-draft's rebuild at every weight sync). Needs the
    library (`unavailable()` is "")."""
    weight = weight.float().contiguous()
    N, K = weight.shape
    n16, K16 = -(-N // 16), -(-K // 16) * 16
    q, packed = torch.empty(N, K, dtype=torch.int8), torch.empty(n16, K16, 16, dtype=torch.uint8)
    scales = torch.empty(n16 * 16)
    _library()[0].specrl_quantize_int8(weight.data_ptr(), N, K, q.data_ptr(), packed.data_ptr(), scales.data_ptr(),
                                       torch.get_num_threads())
    return q, scales[:N].clone(), packed, scales


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """The VNNI kernel's rounding of x [..., K], dequantized: each row in groups of 16 along K (the last one
    zero-padded), scale = max |x| / 127 per group (1 where the group is 0), round(x / scale) * scale."""
    K = x.shape[-1]
    K16 = -(-K // 16) * 16
    groups = torch.nn.functional.pad(x.float(), (0, K16 - K)).reshape(*x.shape[:-1], K16 // 16, 16)
    scale = groups.abs().amax(-1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    rounded = torch.round(groups / scale).clamp_(-127, 127) * scale
    return rounded.reshape(*x.shape[:-1], K16)[..., :K]


INTEGER_KERNELS = {"vnni": "specrl_small_gemm_vnni", "avx-vnni": "specrl_small_gemm_avx_vnni",
                   "avx2-int8": "specrl_small_gemm_int8_avx2"}  # the int8 x int8 kernels, all `pack_vnni`'s layout


def matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int, scales: torch.Tensor | None = None,
           integer: str = "vnni") -> torch.Tensor:
    """x [..., K] @ W^T for the W that `pack` packed -> [..., out_features] (fp32); given the `scales` of
    `pack_int8`, `packed` holds int8 weights in blocks of 8 (the AVX2 kernel) or 16 (AVX-512) and W = q * scale;
    given those of `pack_vnni` (uint8), x is rounded by `quantize_activations` too, and multiplied by the
    `integer` kernel (one of INTEGER_KERNELS: the same bits)."""
    lib = _library()[0]
    K = x.shape[-1]
    N_blocks, block = packed.shape[0], packed.shape[2]
    rows = x.reshape(-1, K).contiguous()
    M = rows.shape[0]
    y = torch.empty(M, N_blocks * block)
    args = (M, N_blocks, K, torch.get_num_threads())
    if scales is None:
        kernel = lib.specrl_small_gemm_avx512 if block == 16 else lib.specrl_small_gemm
        kernel(rows.data_ptr(), packed.data_ptr(), y.data_ptr(), *args)
    elif packed.dtype == torch.uint8:
        kernel = getattr(lib, INTEGER_KERNELS[integer])
        kernel(rows.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), *args)
    else:
        kernel = lib.specrl_small_gemm_int8_avx512 if block == 16 else lib.specrl_small_gemm_int8
        kernel(rows.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), *args)
    if N_blocks * block != out_features:
        y = y[:, :out_features]
    return y.reshape(*x.shape[:-1], out_features)


def main() -> None:
    """`python -m specrl.kernels.small_gemm`: build the library next to its source (what `make` runs)."""
    build(PACKAGED)
    PACKAGED.with_suffix(".sha").write_text(_digest() + "\n")
    print(f"built {PACKAGED}")


if __name__ == "__main__":
    main()
