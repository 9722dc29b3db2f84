"""A draft family is one plug-in: the registry maps kind -> `ProposerKind`, each defined in its family's module,
and no code outside the plug-ins and the registry asks which kind or class a proposer is.

Chain of checks:
    one module    each registered plug-in is its family module's `PLUGIN`, so adding a family is that module plus
                  one registry line;
    no switches   a scan of every source file outside the plug-ins' modules and the registry finds no comparison
                  with a kind's name and no isinstance on a proposer or head class (the scan is checked to catch
                  both, on a line written to fail it);
    refit         on a weight sync, draft weights go to the proposer's own refit: a draft model takes them, a
                  proposer without trained weights refuses them by name, before the policy is replaced.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

from specrl.backends import BackendConfig, make_backend
from specrl.models.checkpoint import load_state_dict
from specrl.models.registry import resolve_checkpoint
from specrl.speculation.plugin import ProposerKind
from specrl.speculation.proposer_registry import KINDS, PROPOSER_NAMES

SRC = Path(__file__).resolve().parents[1] / "src" / "specrl"
REGISTRY = {"speculation/proposer_registry.py", "speculation/plugin.py"}
FAMILY_CLASSES = {"NgramProposer", "SuffixProposer", "DraftModelProposer", "HeadProposer", "Int8DraftProposer",
                  "HybridProposer", "Eagle3Head", "MTPHead"}


def plugin_modules() -> dict[str, str]:
    """kind -> the source file (relative to the package) whose module-level PLUGIN it is."""
    found = {}
    for path in sorted((SRC / "speculation").glob("*.py")):
        module = importlib.import_module(f"specrl.speculation.{path.stem}")
        plugin = getattr(module, "PLUGIN", None)
        if isinstance(plugin, ProposerKind):
            found[plugin.name] = str(path.relative_to(SRC))
    return found


def switches(source: str) -> list[str]:
    """Comparisons against a kind's name (==, !=, in, not in, also inside a tuple or set) and isinstance calls on a
    family's proposer or head class, as 'line: code'."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [c.value for o in operands for c in ([o] if isinstance(o, ast.Constant) else
                                                         getattr(o, "elts", [])) if isinstance(c, ast.Constant)]
            if any(name in PROPOSER_NAMES for name in names):
                hits.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            classes = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if classes & FAMILY_CLASSES:
                hits.append(f"{node.lineno}: {ast.unparse(node)}")
    return hits


def test_every_registered_kind_is_its_family_modules_plugin():
    modules = plugin_modules()
    assert set(modules) == set(KINDS), f"registered {sorted(KINDS)}, defined as PLUGIN {sorted(modules)}"
    for name, path in modules.items():
        module = importlib.import_module("specrl." + path.removesuffix(".py").replace("/", "."))
        assert module.PLUGIN is KINDS[name]


def test_no_code_outside_the_plugins_and_the_registry_switches_on_a_kind_or_a_proposer_class():
    allowed = REGISTRY | set(plugin_modules().values())
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        relative = str(path.relative_to(SRC))
        if relative not in allowed and (hits := switches(path.read_text())):
            found[relative] = hits
    assert not found, f"switches on a proposer kind or class outside the plug-ins: {found}"


def test_the_scan_catches_a_kind_comparison_and_an_isinstance():
    assert switches('if proposer == "mtp":\n    pass\n') and switches('x = kind in ("eagle3", "mtp")\n')
    assert switches("ok = isinstance(p, HeadProposer)\n")
    assert not switches('if proposer == "none":\n    pass\n')


@pytest.fixture(scope="module")
def tiny_policy() -> dict[str, torch.Tensor]:
    return load_state_dict(resolve_checkpoint("tiny"))


def test_a_draft_models_weights_load_through_its_own_refit(tiny_policy):
    backend = make_backend(BackendConfig(model="tiny", proposer="draft"))
    draft = load_state_dict(resolve_checkpoint("tiny-draft"))
    changed = {name: t + 0.01 if t.is_floating_point() and t.dim() == 2 else t for name, t in draft.items()}
    backend.sync_weights(tiny_policy, version=1, draft=changed)
    assert backend.version == 1
    loaded = backend.proposer.model.layers[0]["o"].weight
    assert torch.allclose(loaded, changed["model.layers.0.self_attn.o_proj.weight"].float())


@pytest.mark.parametrize("proposer, reason", [("ngram", "the ngram proposer has no draft model or head"),
                                              ("suffix", "the suffix proposer has no draft model or head"),
                                              ("int8", "the int8 self-draft has no trained weights: it is rebuilt")])
def test_draft_weights_for_a_proposer_without_trained_weights_are_refused_before_the_policy_changes(
        tiny_policy, proposer, reason):
    backend = make_backend(BackendConfig(model="tiny", proposer=proposer))
    draft = load_state_dict(resolve_checkpoint("tiny-draft"))
    with pytest.raises(ValueError, match=f"draft weights of version 1 were sent, but {reason}"):
        backend.sync_weights(tiny_policy, version=1, draft=draft)
    assert backend.version == 0  # the policy was not replaced
