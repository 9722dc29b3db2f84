"""A run's model set is resolved once (`resolve_models`, or `starting_point` for a run) and handed down: the
backend loads the folders it is given and never resolves `backend.model` or `backend.draft` again."""
from __future__ import annotations

from specrl.backends import BackendConfig, ModelSet, make_backend, resolve_models
from specrl.models.registry import resolve_checkpoint
from specrl.pipeline.config import load_config
from specrl.pipeline.learner import starting_point


def test_resolve_models_names_the_folders_and_where_they_came_from():
    models = resolve_models(BackendConfig(model="tiny", proposer="draft"))
    assert models.policy == resolve_checkpoint("tiny") and models.draft == resolve_checkpoint("tiny-draft")
    assert models.policy_source == "backend.model=tiny" and models.draft_source == "the registered draft of tiny"
    assert resolve_models(BackendConfig(model="tiny", proposer="int8")).draft is None  # it loads no checkpoint


def test_the_backend_loads_the_model_set_it_is_given_and_resolves_no_name(tmp_path):
    config = BackendConfig(model="a-name-nothing-resolves", proposer="draft", draft="neither-does-this")
    models = ModelSet(resolve_checkpoint("tiny"), resolve_checkpoint("tiny-draft"))
    backend = make_backend(config, models=models)
    assert backend.engine.model.source == str(models.policy)


def test_a_fresh_run_starts_from_the_configured_models(tmp_path):
    config = load_config("tiny", overrides=[f"run.run_dir={tmp_path}", "backend.proposer=draft"])
    checkpoint, models = starting_point(config, resume=False)
    assert checkpoint is None and models == resolve_models(config.backend)
