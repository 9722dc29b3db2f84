"""The policy trainer as N ranks on Ray: one `PolicyTrainer` per rank, FSDP2 over torch.distributed.

    TrainerGroup(N)          N Ray actors (`TrainerRank`), each with its own process, torch threads
                             and slice of the model; rank 0 publishes a tcp:// rendezvous, every rank
                             joins the process group (gloo on CPU, NCCL on CUDA), loads the policy and
                             shards it (`fully_shard`, see `specrl.rl.trainer`).
    step(batch)              rank r trains on rows [r B/N, (r+1) B/N) with the whole batch's token
                             count as the loss denominator; FSDP reduce-scatters the gradients, so
                             every rank applies the whole batch's update to its shard. The stats come
                             back as the ranks' shares and are combined here (sums; maxima for *_max;
                             the gradient norm, which every rank computes whole, from rank 0).
    state_dict()             gathered from the ranks once per version (weight sync and checkpoints
                             call it once after each step), whole, on the CPU.
    optimizer_state / load_optimizer_state / save_policy    checkpoints in the single-rank layout.

The same interface as `PolicyTrainer` where the learner uses it, so the sync and async pipelines
run with either. Everything travels between processes as numpy arrays or Python lists (torch
tensors pickle ~30x slower through Ray's object store).

This is the NeMo-RL / verl / SkyRL shape (a Ray worker group of FSDP workers) at its smallest:
one model, one optimizer, data parallel with sharded parameters and optimizer state.
"""
from __future__ import annotations

import socket

import numpy as np
import ray
import torch
import torch.distributed as dist

from specrl.pipeline.weights import to_numpy, to_torch
from specrl.rl.grpo import GRPOConfig
from specrl.rl.trainer import OptimConfig, PolicyTrainer, check_sampling, with_parity_mean
from specrl.sampling import SamplingParams


def _optimizer_to(state: dict, convert) -> dict:
    return {"state": {i: {k: convert(v) if isinstance(v, (torch.Tensor, np.ndarray)) else v for k, v in slots.items()}
                      for i, slots in state["state"].items()},
            "param_groups": state["param_groups"]}


def combine_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The whole batch's stats from the ranks' shares: maxima for *_max, rank 0's gradient norm and skip
    verdict (every rank computes them whole), sums for the rest (token means over the whole batch's tokens),
    and the parity mean recomputed from the summed errors and tokens."""
    out = {}
    for key in per_rank[0]:
        values = [stats[key] for stats in per_rank]
        whole = key in ("grad_norm", "policy_step_skipped")
        out[key] = max(values) if key.endswith("_max") else values[0] if whole else sum(values)
    return with_parity_mean(out)


class TrainerRank:
    """One rank: a process-group member holding a shard of the policy and its optimizer state."""

    def __init__(self, rank: int, ranks: int, threads: int):
        torch.set_num_threads(threads)
        self.rank, self.ranks = rank, ranks
        self.trainer: PolicyTrainer | None = None

    def rendezvous(self) -> str:
        """Rank 0: a tcp:// address on its node that the others can reach."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def setup(self, address: str, checkpoint_dir: str, grpo: GRPOConfig, optim: OptimConfig,
              sampling: SamplingParams, pad_id: int, device: str) -> None:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=address,
                                rank=self.rank, world_size=self.ranks)
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each rank one GPU, visible as device 0
        self.trainer = PolicyTrainer(checkpoint_dir, grpo, optim, sampling, pad_id, device=device)

    def step(self, prompts, responses, behaviour, advantages: list[float], decoupled: bool, num_tokens: int,
             num_sequences: int) -> dict:
        return self.trainer.step(prompts, responses, behaviour, torch.tensor(advantages), decoupled=decoupled,
                                 num_tokens=num_tokens, num_sequences=num_sequences)

    def state_dict(self) -> dict[str, np.ndarray] | None:
        state = self.trainer.state_dict()  # every rank takes part in the gathers
        return to_numpy(state) if self.rank == 0 else None

    def save_policy(self, folder: str) -> None:
        self.trainer.save_policy(folder)

    def optimizer_state(self) -> dict | None:
        state = self.trainer.optimizer_state()
        return _optimizer_to(state, lambda t: t.numpy()) if self.rank == 0 else None

    def load_optimizer_state(self, state: dict) -> None:
        self.trainer.load_optimizer_state(_optimizer_to(state, lambda a: torch.from_numpy(np.array(a))))

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


TrainerRankActor = ray.remote(TrainerRank)


class TrainerGroup:
    """N `TrainerRank` actors acting as one `PolicyTrainer` (see the module docstring)."""

    def __init__(self, ranks: int, checkpoint_dir: str, grpo: GRPOConfig, optim: OptimConfig,
                 sampling: SamplingParams, pad_id: int, device: str = "cpu", threads_per_rank: int = 1):
        check_sampling(sampling)  # before any rank starts
        gpus = 1 if device == "cuda" else 0
        need = {"CPU": ranks * threads_per_rank, "GPU": ranks * gpus}
        have = ray.available_resources()
        short = {k: (v, have.get(k, 0)) for k, v in need.items() if v and have.get(k, 0) < v}
        if short:
            raise ValueError("run.trainer_ranks: " + ", ".join(f"{ranks} ranks need {v:g} {k}s, Ray has {h:g} free"
                                                              for k, (v, h) in short.items())
                             + " (lower run.trainer_ranks or run.threads, or join a larger cluster)")
        self.ranks, self.device = ranks, device
        self.actors = [TrainerRankActor.options(num_cpus=threads_per_rank, num_gpus=gpus).remote(r, ranks, threads_per_rank)
                       for r in range(ranks)]
        address = ray.get(self.actors[0].rendezvous.remote())
        ray.get([a.setup.remote(address, checkpoint_dir, grpo, optim, sampling, pad_id, device) for a in self.actors])

    def _all(self, method: str, *args) -> list:
        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def step(self, prompts, responses, behaviour_logprobs, advantages: torch.Tensor, on_micro_batch=None,
             decoupled: bool = False, hidden_layers: tuple[int, ...] = ()) -> dict[str, float]:
        if on_micro_batch is not None:
            raise ValueError("online draft adaptation runs with one trainer rank (run.trainer_ranks=1)")
        rows = len(prompts)
        if rows % self.ranks:
            raise ValueError(f"a batch of {rows} sequences does not split evenly over {self.ranks} trainer ranks")
        share, num_tokens = rows // self.ranks, sum(len(r) for r in responses)
        parts = [slice(r * share, (r + 1) * share) for r in range(self.ranks)]
        advantages = advantages.tolist()
        return combine_stats(ray.get([
            actor.step.remote(prompts[p], responses[p], behaviour_logprobs[p], advantages[p], decoupled, num_tokens,
                              rows)
            for actor, p in zip(self.actors, parts)]))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return to_torch(self._all("state_dict")[0])

    def save_policy(self, folder) -> None:
        self._all("save_policy", str(folder))

    def optimizer_state(self) -> dict:
        return _optimizer_to(self._all("optimizer_state")[0], lambda a: torch.from_numpy(np.array(a)))

    def load_optimizer_state(self, state: dict) -> None:
        self._all("load_optimizer_state", _optimizer_to(state, lambda t: t.numpy()))

    def close(self) -> None:
        try:
            self._all("close")
        finally:
            for actor in self.actors:
                ray.kill(actor)
