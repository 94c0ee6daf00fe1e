"""Helpers the tests share: tiny random models and the plain greedy reference every method must reproduce.

Test modules import these directly (`from helpers import tiny_model`); fixtures live in conftest.py, which
imports from here and never the other way round. Adversarial drafters are in adversarial.py; the scripted
sidecar predictors are in sidecar_fakes.py (the sidecar worker process imports that module by name).
"""

import numpy as np
import torch


def tiny_model(arch: str, seed: int = 0, vocab: int = 320):
    """A random-initialised model of a real architecture, small enough for hundreds of generations."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=0, eos_token_id=None, pad_token_id=0,
        # Wide initialisation: with the default 0.02 a tiny tied-embedding qwen2 repeats one token forever,
        # which would make equivalence trivially easy.
        initializer_range=0.3,
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    return model.eval()


def greedy_reference(model, prompt: np.ndarray, max_new_tokens: int, eos_ids=None) -> np.ndarray:
    """Plain greedy decoding by transformers itself: the ground truth every method must reproduce."""
    out = model.generate(
        torch.as_tensor(prompt).view(1, -1),
        attention_mask=torch.ones(1, prompt.size, dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_ids) if eos_ids else None,
        pad_token_id=0,
    )
    return out[0, prompt.size :].numpy()
