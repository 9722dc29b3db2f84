"""Models that need no download: `tiny` (+ `tiny-draft`), `smollm2-135m` (+ its draft).

Use `specrl.models.registry.resolve_checkpoint(name_or_path)` to get a checked
Hugging Face layout folder; `DRAFT_FOR[name]` names a target's default draft.
"""
from specrl.models.registry import DRAFT_FOR, resolve_checkpoint

__all__ = ["DRAFT_FOR", "resolve_checkpoint"]
