"""The one-call decoder layer (`kernels/decoder_layer.cpp`) against the engine's PyTorch layer.

Chain of invariants:
    fused forward == PyTorch forward to fp32 rounding: logits, the KV cache it writes and the hidden states it
                     returns, for Llama (GQA), Qwen2 (qkv bias) and Qwen3 (q/k norms), fp32 and int8 weights on
                     every int8 kernel, chains of 1 and 4 tokens and a tree, rows of different lengths (on the
                     VNNI kernel, to within the activation rounding a last-bit difference can flip);
    a row's logits  are the same bits whether it runs alone or beside longer rows (another span) and other rows;
    the PyTorch path runs where the fused one cannot: eager projections, or more rows than the kernels take.
"""
from __future__ import annotations

import pytest
import torch

from helpers import save_random_checkpoint
from specrl.kernels import small_gemm
from specrl.models.llama import LlamaModel, int8_kernels
from specrl.speculation.tree import TreeShape

pytestmark = pytest.mark.skipif(bool(small_gemm.unavailable()), reason=f"kernel unavailable: {small_gemm.unavailable()}")


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    save_random_checkpoint(path, arch=request.param, layers=2, hidden=64, vocab=48, seed=3)
    return LlamaModel.from_pretrained(path)


def run(model: LlamaModel, fused: bool, lens: list[int], new: int, tree: TreeShape | None = None):
    """Prefill rows of `lens` tokens on the PyTorch path, then run `new` tokens per row on the path asked for."""
    generator = torch.Generator().manual_seed(sum(lens) + new)
    cache = model.new_cache(len(lens), 64)
    layers, model.fused_layers = model.fused_layers, None
    model.forward(torch.randint(0, 48, (len(lens), max(lens)), generator=generator), cache)
    cache.lens = torch.tensor(lens)
    model.fused_layers = layers if fused else None
    logits, hidden = model.forward(torch.randint(0, 48, (len(lens), new), generator=generator), cache,
                                   hidden_layers=(0, -1), tree=tree)
    model.fused_layers = layers
    return logits, hidden, cache


@pytest.mark.parametrize("weights", ["fp32", *int8_kernels()])
@pytest.mark.parametrize("lens, new, tree", [([5], 1, None), ([7, 3, 12], 1, None), ([4, 9], 4, None),
                                             ([6, 2], 5, TreeShape(width=2, depth=2))])
def test_the_fused_layer_equals_the_pytorch_layer(model, weights, lens, new, tree):
    net = model if weights == "fp32" else model.int8_copy(weights)
    assert net.fused_layers is not None
    (logits, hidden, cache), (want, want_hidden, want_cache) = run(net, True, lens, new, tree), run(net, False, lens, new, tree)
    # VNNI rounds each projection's input to int8 steps (max |x| / 127 per 16): where the two paths' norms differ in the
    # last bit an activation can round to the neighbouring step, moving an output by about a step times a weight
    integer = weights in small_gemm.INTEGER_KERNELS
    close = {"rtol": 2e-2, "atol": 2e-2} if integer else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(logits, want, **({"rtol": 1e-4, "atol": 1e-4} if not integer else close))
    for layer in (0, -1):
        torch.testing.assert_close(hidden[layer], want_hidden[layer], **close)
    for i in range(len(cache.keys)):
        torch.testing.assert_close(cache.keys[i], want_cache.keys[i], **close)
        torch.testing.assert_close(cache.values[i], want_cache.values[i], **close)


@pytest.mark.parametrize("new", [1, 3])
def test_a_rows_logits_do_not_depend_on_the_other_rows(model, new):
    generator = torch.Generator().manual_seed(new)
    prompt = torch.randint(0, 48, (3, 20), generator=generator)
    tokens = torch.randint(0, 48, (3, new), generator=generator)

    def logits(rows: list[int], lens: list[int]) -> torch.Tensor:
        cache = model.new_cache(len(rows), 64)
        model.forward(prompt[rows], cache)
        cache.lens = torch.tensor(lens)
        return model.forward(tokens[rows], cache)[0]

    alone = logits([0], [6])
    beside = logits([0, 1, 2], [6, 19, 11])  # another span (19 + new) and other rows
    assert torch.equal(beside[0], alone[0])


def test_the_pytorch_layer_runs_where_the_fused_one_cannot(target_dir):
    assert LlamaModel.from_pretrained(target_dir, fast_path=False).fused_layers is None
    model = LlamaModel.from_pretrained(target_dir)
    cache = model.new_cache(1, small_gemm.MAX_ROWS + 8)
    long = torch.randint(0, 40, (1, small_gemm.MAX_ROWS + 1))
    layers, model.fused_layers = model.fused_layers, None
    want = model.forward(long, cache)[0]
    model.fused_layers = layers
    torch.testing.assert_close(model.forward(long, cache)[0], want, rtol=0, atol=0)


def test_a_cache_of_another_batch_size_is_refused(target_dir):
    model = LlamaModel.from_pretrained(target_dir)
    with pytest.raises(ValueError, match="KV cache holds 1 rows but the input has 2"):
        model.forward(torch.zeros(2, 1, dtype=torch.long), model.new_cache(1, 8))
