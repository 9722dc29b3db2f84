"""Weight broadcast to the rollout actors through Ray's object store, version-stamped.

The trainer `publish`es each new version once: one `ray.put` of the policy (and
draft) state dicts, Hugging Face names, whose small `VersionedWeights` handle goes to the
`WeightBoard`, one Ray actor that holds the newest handle. A rollout actor asks the
board for the newest handle when it starts a request (so a request that waited in an
actor's queue still runs on the newest weights), fetches the tensors (`ray.get`, shared
memory on one node) only when the handle is newer than what it holds, loads them into
its backend (`adopt`), and stamps the new version on every token it generates from then
on. The starting version (0, or a resumed checkpoint's) is what every actor loads itself,
so it is never put in the store. Only the newest version is referenced by the board; Ray
frees older ones once no actor holds them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import ray
import torch


@dataclass(frozen=True)
class VersionedWeights:
    """A version number and (for versions > 0) the object-store reference of its state dicts."""

    version: int
    # wrapped in a list so that Ray hands the actor the reference, not the tensors, with every request
    refs: list = field(default_factory=list)


def to_numpy(state: dict[str, torch.Tensor] | None) -> dict[str, np.ndarray] | None:
    # numpy arrays travel zero-copy through the object store; torch tensors are pickled (~30x slower here)
    return None if state is None else {name: tensor.detach().cpu().numpy() for name, tensor in state.items()}


def to_torch(state: dict[str, np.ndarray] | None) -> dict[str, torch.Tensor] | None:
    # a private copy: the store's buffers are read-only, and the backend keeps what it is given
    return None if state is None else {name: torch.from_numpy(array.copy()) for name, array in state.items()}


def publish(version: int, policy: dict[str, torch.Tensor], draft: dict[str, torch.Tensor] | None) -> VersionedWeights:
    """One `ray.put` of {"policy": ..., "draft": ... or None}; returns the handle for the board."""
    return VersionedWeights(version, [ray.put({"policy": to_numpy(policy), "draft": to_numpy(draft)})])


class WeightBoard:
    """The newest published weights (a Ray actor: the trainer posts, rollout actors read)."""

    def __init__(self, start: VersionedWeights):
        self.current = start

    def post(self, weights: VersionedWeights) -> None:
        if weights.version > self.current.version:
            self.current = weights

    def latest(self) -> VersionedWeights:
        return self.current


WeightBoardActor = ray.remote(num_cpus=0)(WeightBoard)


def adopt(backend, weights: VersionedWeights) -> float:
    """Load `weights` into `backend` if newer than its version; returns the seconds it took (0 when current)."""
    if weights.version <= backend.version:
        return 0.0
    start = time.perf_counter()
    state = ray.get(weights.refs[0])
    backend.sync_weights(to_torch(state["policy"]), version=weights.version, draft=to_torch(state["draft"]))
    return time.perf_counter() - start
