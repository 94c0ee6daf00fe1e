"""Models of a real architecture with random weights, built in seconds: for timing (cost curves, kernel
studies), where weight values do not matter, on models too big to download here."""

from __future__ import annotations

import torch

# Configurations for random-initialised stand-ins of models too big to download here; timing does not
# depend on weight values, so these give the cost curve of the real model on any device.
ARCH_PRESETS: dict[str, dict] = {
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=False, rms_norm_eps=1e-6,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=True, rms_norm_eps=1e-6,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=True, rms_norm_eps=1e-6,
    ),
}


def random_model(preset_or_config: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 attn_implementation: str | None = None, seed: int = 0) -> torch.nn.Module:
    """A model of a preset architecture (ARCH_PRESETS) or of a config file/folder, with random weights.

    Parameters are allocated uninitialised (meta device, then `to_empty`) and filled with small normal
    values from `seed`, so no NaN can take a slow path; tied embeddings stay tied, as in the real model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if preset_or_config in ARCH_PRESETS:
        spec = dict(ARCH_PRESETS[preset_or_config])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    else:
        config = AutoConfig.from_pretrained(preset_or_config)
    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **options)
    model = model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # to_empty unties shared parameters
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for module in model.modules():  # rotary inverse frequencies are buffers: recompute them from the config
            if hasattr(module, "inv_freq"):
                fresh = type(module)(config=config)  # on the CPU; copy_ moves the values to `device`
                for buf in ("inv_freq", "original_inv_freq"):
                    if hasattr(module, buf) and hasattr(fresh, buf):
                        getattr(module, buf).copy_(getattr(fresh, buf))
    return model.eval().requires_grad_(False)
