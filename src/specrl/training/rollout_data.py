"""The target's own rollouts, the data every draft is trained on (draft models and hidden-state heads).

The embedded engine samples the target at temperature 1 on the prompts of its RL preset
(`tasks.presets.preset_prompts`, rendered exactly as RL renders them), on its fast path,
many prompts per call, with a `HiddenStateRecorder` in the proposer slot: the hidden states
the engine computes anyway (prefill and decode) become each rollout's features, so
teacher-forced features cost no extra forward pass. Per response position the target's
next-token distribution p = softmax(lm_head(final normed state)) is kept as its top-k.

One collection serves every kind: it records EAGLE-3's three feature layers and the final
state (MTP and p read that one). `save` / `load` keep it on disk (safetensors + JSON, no
pickle), so a long collection trains a draft model and a head alike (`--rollouts DIR`).
A collection into a folder appends each generate call's rollouts to it as they come (`*.partial/
batch_NNNNN`, swapped in whole), and a collection started again in the same folder loads the batches
already there instead of sampling them: a killed collection resumes where it stopped.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specrl.atomic import recover_folder, replace_folder, write_text_atomically
from specrl.engine.engine import EngineConfig, RolloutEngine
from specrl.models.checkpoint import load_tokenizer
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.draft_head import default_aux_layers
from specrl.speculation.eagle3 import engine_layers
from specrl.speculation.hidden_recorder import HiddenStateRecorder
from specrl.tasks.presets import preset_prompts
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class RolloutDataConfig:
    """How the target's rollouts are sampled (shared by `train-draft --kind draft|eagle3|mtp`).

    prompts: training prompts, one rollout each (sampling stops earlier when `sample_seconds` runs out).
    sample_batch: prompts per generate call.
    max_new_tokens: response cap when sampling.
    sample_seconds: sampling stops starting new batches after this many seconds.
    held_out_prompts: prompts of the held-out set (other seeds).
    top_k: target probabilities kept per training position.
    """

    SECTION: ClassVar[str] = "train-draft"

    prompts: int = within(512, "[1, inf)")
    sample_batch: int = within(64, "[1, inf)")
    max_new_tokens: int = within(128, "[1, inf)")
    sample_seconds: float = within(270.0, "(0, inf)")
    held_out_prompts: int = within(16, "[1, inf)")
    top_k: int = within(64, "[1, inf)")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class Rollouts:
    ids: list[torch.Tensor]  # per sequence [S] long: prompt + response
    prompt_lens: list[int]
    features: list[dict[int, torch.Tensor]]  # per sequence {layer: [S - 1, H]} fp16 (layer -1 always there)
    top_p: list[torch.Tensor]  # per sequence [R, top_k] fp16: p at positions L-1 .. S-2 (predicting the response)
    top_ids: list[torch.Tensor]  # per sequence [R, top_k] int32

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, other: "Rollouts") -> None:
        for name in ("ids", "prompt_lens", "features", "top_p", "top_ids"):
            getattr(self, name).extend(getattr(other, name))

    @property
    def tokens(self) -> int:
        """Response tokens."""
        return sum(len(i) - n for i, n in zip(self.ids, self.prompt_lens))

    def save(self, folder: Path, record: dict) -> None:
        """rollouts.safetensors (every tensor concatenated, with offsets) and rollouts.json (`record`)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        layers = sorted(self.features[0])
        tensors = {"ids": torch.cat(self.ids), "top_p": torch.cat(self.top_p), "top_ids": torch.cat(self.top_ids),
                   "lengths": torch.tensor([len(i) for i in self.ids]), "prompt_lens": torch.tensor(self.prompt_lens)}
        for layer in layers:
            tensors[f"features.{layer}"] = torch.cat([f[layer] for f in self.features])
        save_file(tensors, str(folder / "rollouts.safetensors"))
        (folder / "rollouts.json").write_text(json.dumps({**record, "layers": layers}, indent=2))

    @classmethod
    def load(cls, folder: Path) -> tuple["Rollouts", dict]:
        folder = Path(folder)
        record = json.loads((folder / "rollouts.json").read_text())
        t = load_file(str(folder / "rollouts.safetensors"))
        lengths, prompt_lens = t["lengths"].tolist(), t["prompt_lens"].tolist()
        ids = list(t["ids"].split(lengths))
        responses = [n - p for n, p in zip(lengths, prompt_lens)]
        features = [dict(zip(record["layers"], parts)) for parts in
                    zip(*(t[f"features.{layer}"].split([n - 1 for n in lengths]) for layer in record["layers"]))]
        return cls(ids, prompt_lens, features, list(t["top_p"].split(responses)),
                   list(t["top_ids"].split(responses))), record


def _save_batch(folder: Path, rollouts: Rollouts, soft: torch.Tensor) -> None:
    """One call's rollouts and soft counts, swapped into `folder` whole (a kill leaves the batch or nothing)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        rollouts.save(tmp, {"soft_counts": soft.tolist()})
        replace_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_batch(folder: Path) -> tuple[Rollouts, torch.Tensor] | None:
    recover_folder(folder)
    if not (folder / "rollouts.json").is_file():
        return None
    rollouts, record = Rollouts.load(folder)
    return rollouts, torch.tensor(record["soft_counts"], dtype=torch.float64)


@torch.inference_mode()
def collect_rollouts(target: LlamaModel, tokenizer, prompts: list[str], layers: tuple[int, ...],
                     data: RolloutDataConfig, seed: int, seconds: float | None, desc: str,
                     batches_dir: Path | None = None) -> tuple[Rollouts, torch.Tensor]:
    """Sample one rollout per prompt, batch by batch; returns the rollouts and soft counts [V] of p. With
    `batches_dir`, each batch is saved there as it is made, and batches already there are loaded, not sampled."""
    recorder = HiddenStateRecorder(tuple(sorted(set(layers) | {-1})))
    engine = RolloutEngine(target, tokenizer, recorder, EngineConfig(num_speculative_tokens=0))
    out = Rollouts([], [], [], [], [])
    soft = torch.zeros(target.cfg.vocab_size, dtype=torch.float64)
    start, sampled = time.perf_counter(), 0
    batches = range(0, len(prompts), data.sample_batch)
    bar = tqdm(total=len(batches), desc=desc, unit="batch", dynamic_ncols=True)
    for b, s in enumerate(batches):
        saved = _load_batch(batches_dir / f"batch_{b:05d}") if batches_dir is not None else None
        if saved is not None:
            out.extend(saved[0])
            soft += saved[1]
            bar.update(1)
            continue
        chunk = prompts[s:s + data.sample_batch]
        result = engine.generate(chunk, SamplingParams(temperature=1.0, max_tokens=data.max_new_tokens, seed=seed + b))
        batch, batch_soft = Rollouts([], [], [], [], []), torch.zeros_like(soft)
        for slot, completion in enumerate(result.completions):
            ids = torch.tensor(completion.prompt_ids + completion.token_ids)
            feats = recorder.features(slot, len(ids) - 1)
            L = len(completion.prompt_ids)
            p = torch.softmax(target.lm_head(feats[-1][L - 1:].float()), dim=-1)  # [R, V]
            batch_soft += p.sum(0, dtype=torch.float64)
            values, indices = p.topk(min(data.top_k, p.shape[-1]), dim=-1)
            batch.ids.append(ids)
            batch.prompt_lens.append(L)
            batch.features.append(feats)
            batch.top_p.append(values.half())
            batch.top_ids.append(indices.int())
        if batches_dir is not None:
            _save_batch(batches_dir / f"batch_{b:05d}", batch, batch_soft)
        out.extend(batch)
        soft += batch_soft
        sampled += 1
        bar.update(1)
        bar.set_postfix(tokens=out.tokens)
        elapsed = time.perf_counter() - start  # this sitting's sampling (batches loaded from disk are free)
        if seconds is not None and elapsed * (sampled + 1) / sampled > seconds:  # the next batch would overrun
            break
    bar.close()
    return out, soft


def draft_vocabulary(soft_counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A reduced draft vocabulary: the `size` target ids with the largest expected count sum_t p_t(x)
    (they cover the most probability mass), ascending -> (d2t [size], t2d [V]: -1 outside)."""
    d2t = torch.sort(torch.topk(soft_counts, size).indices).values
    return d2t, target_to_draft(d2t, soft_counts.numel())


def target_to_draft(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] long: each target id's draft id, -1 outside the draft's vocabulary `d2t`."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    return t2d


def full_distributions(target: LlamaModel, rollouts: Rollouts) -> list[torch.Tensor]:
    """p over the whole vocabulary at every response-predicting position, [R, V] fp16 per sequence
    (held-out metrics read p in full)."""
    with torch.inference_mode():
        return [torch.softmax(target.lm_head(f[-1][L - 1:].float()), dim=-1).half()
                for f, L in zip(rollouts.features, rollouts.prompt_lens)]


@dataclass
class TargetSamples:
    target: LlamaModel
    tokenizer: object
    held: Rollouts  # held-out prompts (seed + 1000)
    train: Rollouts
    soft_counts: torch.Tensor  # [V] float64: sum over training positions of p
    sample_seconds: float  # 0 when loaded from disk


def sample_target(target_name: str, target_dir: Path, data: RolloutDataConfig, seed: int,
                  rollouts_dir: Path | None = None) -> TargetSamples:
    """The target and its held-out and training rollouts: loaded from `rollouts_dir` when it holds a
    collection with these settings, else sampled (and saved there when given)."""
    target = LlamaModel.from_pretrained(target_dir)
    tokenizer = load_tokenizer(target_dir)
    record = {"target": target_name, "data": asdict(data), "seed": seed}
    saved = rollouts_dir is not None and (Path(rollouts_dir) / "train" / "rollouts.json").is_file()
    if saved:
        held, held_record = Rollouts.load(Path(rollouts_dir) / "held")
        train, train_record = Rollouts.load(Path(rollouts_dir) / "train")
        if {k: train_record[k] for k in record} != record:
            raise ValueError(f"{rollouts_dir} holds rollouts sampled with other settings ({train_record}); "
                             "pick another --rollouts folder or the same settings")
        soft = torch.tensor(train_record["soft_counts"], dtype=torch.float64)
        return TargetSamples(target, tokenizer, held, train, soft, 0.0)
    layers = tuple(sorted(set(engine_layers(default_aux_layers(target.cfg.num_hidden_layers))) | {-1}))
    partial = None
    if rollouts_dir is not None:  # batches land in *.partial as they are sampled; a restart loads them
        partial = Path(rollouts_dir)
        started = partial / "partial.json"
        if started.is_file() and json.loads(started.read_text()) != record:
            raise ValueError(f"{rollouts_dir} holds a partial collection with other settings "
                             f"({started.read_text()}); pick another folder or the same settings")
        write_text_atomically(started, json.dumps(record))
    start = time.perf_counter()
    held, _ = collect_rollouts(target, tokenizer, preset_prompts(target_name, tokenizer, data.held_out_prompts,
                                                                 seed + 1000),
                               layers, data, seed + 1000, None, "sample held-out",
                               partial / "held.partial" if partial else None)
    train, soft = collect_rollouts(target, tokenizer, preset_prompts(target_name, tokenizer, data.prompts, seed),
                                   layers, data, seed, data.sample_seconds, "sample rollouts",
                                   partial / "train.partial" if partial else None)
    seconds = time.perf_counter() - start
    if partial is not None:
        held.save(partial / "held", record)
        train.save(partial / "train", {**record, "soft_counts": soft.tolist(), "seconds": seconds})
        shutil.rmtree(partial / "held.partial", ignore_errors=True)  # the whole collection is saved
        shutil.rmtree(partial / "train.partial", ignore_errors=True)
        (partial / "partial.json").unlink(missing_ok=True)
    return TargetSamples(target, tokenizer, held, train, soft, seconds)
