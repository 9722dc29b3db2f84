"""The staleness-bounded buffer between the rollout actors and the trainer.

Terms: the trainer at step s holds weights of version s - 1 (it has taken s - 1
optimiser steps). A group's version is the oldest version that produced any of its
tokens (`Group.version`). Its staleness when trained on at step s is

    staleness = (s - 1) - group.version          (0 = made by the weights being trained)

`take(count, trainer_version)` first drops every group whose staleness would exceed
`max_staleness` (counted, never trained on), then hands out the `count` oldest
remaining groups (by version, then data position), so groups are used before they
expire. A group index is accepted once: a second arrival (a re-issued request whose
first answer also came back) is ignored and counted as a duplicate.

With `drop_uniform` (DAPO's dynamic sampling, `grpo.dynamic_sampling`), a group whose rewards
are all equal carries no advantage and is set aside on arrival (`filtered`), never trained on.

The ledger: every group that ever entered is in exactly one of `consumed`, `dropped`,
`filtered` or the buffer itself. `state_dict` / `load_state_dict` carry the buffer and the ledger
across a checkpoint (JSON-ready).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from specrl.generation import Completion
from specrl.pipeline.groups import Group


@dataclass(frozen=True)
class Consumed:
    """One trained-on group: when, and with what age."""

    index: int  # data position
    version: int  # the group's (oldest) weight version
    step: int  # the step that trained on it

    @property
    def staleness(self) -> int:
        return self.step - 1 - self.version


class StalenessBuffer:
    def __init__(self, max_staleness: int, drop_uniform: bool = False):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness, self.drop_uniform = max_staleness, drop_uniform
        self.groups: list[Group] = []
        self.seen: set[int] = set()
        self.consumed: list[Consumed] = []
        self.dropped: list[int] = []  # data positions dropped for staleness
        self.filtered: list[int] = []  # data positions set aside for rewards all equal (drop_uniform)
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self.groups)

    def put(self, groups: list[Group]) -> None:
        for group in groups:
            if group.index in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(group.index)
            if self.drop_uniform and len(set(group.rewards)) == 1:
                self.filtered.append(group.index)
            else:
                self.groups.append(group)

    def drop_stale(self, trainer_version: int) -> int:
        """Drop groups more than max_staleness versions behind `trainer_version`; returns how many."""
        keep = [g for g in self.groups if trainer_version - g.version <= self.max_staleness]
        self.dropped += [g.index for g in self.groups if trainer_version - g.version > self.max_staleness]
        dropped = len(self.groups) - len(keep)
        self.groups = keep
        return dropped

    def take(self, count: int, trainer_version: int) -> list[Group] | None:
        """`count` groups trainable at `trainer_version` (oldest first), or None while fewer are available.

        Example (max_staleness 1, trainer_version 3): groups of versions [1, 2, 3, 2] ->
        the version-1 group is dropped; take(2) returns the two version-2 groups."""
        self.drop_stale(trainer_version)
        if len(self.groups) < count:
            return None
        self.groups.sort(key=lambda g: (g.version, g.index))
        batch, self.groups = self.groups[:count], self.groups[count:]
        step = trainer_version + 1
        self.consumed += [Consumed(g.index, g.version, step) for g in batch]
        return batch

    def state_dict(self) -> dict:
        return {"groups": [asdict(g) for g in self.groups], "seen": sorted(self.seen),
                "consumed": [asdict(c) for c in self.consumed], "dropped": list(self.dropped),
                "filtered": list(self.filtered), "duplicates": self.duplicates}

    def load_state_dict(self, state: dict) -> None:
        self.groups = [Group(**{**g, "completions": [Completion(**c) for c in g["completions"]]})
                       for g in state["groups"]]
        self.seen = set(state["seen"])
        self.consumed = [Consumed(**c) for c in state["consumed"]]
        self.dropped = list(state["dropped"])
        self.filtered = list(state.get("filtered", []))
        self.duplicates = state["duplicates"]
