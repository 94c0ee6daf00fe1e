"""Int8 weights and activations for a drafter's model on a CPU.

A drafter (the sidecar) only proposes; the target checks every token, so the drafter's precision changes how
often it is right, never what the target writes. `quantize_int8(model)` replaces each linear layer by
`Int8Linear`: weights quantized once per output channel, activations per token at every call, products in
int8 with int32 accumulation (`torch._int_mm`), then scaled back to float32.

Why per token and not torch's own dynamic quantization (`torch.ao.quantization.quantize_dynamic`): that one
scales a whole batch of activations by one number, and these models put a few very large activations in some
rows (the first token's above all), so every other row loses its precision. On 6 validation prompts, against
the float32 model's own next tokens where it is confident (p > 0.5): per-tensor 77% agreement and KL 0.89 nats
(Qwen2.5-Coder-0.5B; SmolLM2-135M 70%, 1.25), per token 99.8% and 0.010 (SmolLM2 98.6%, 0.045).

Speed, one thread of an AMD EPYC with AVX-512 and AVX512_BF16, torch 2.13, Qwen2.5-0.5B's MLP product
(896 x 4864): 600 rows 8.2 ms against 11.4 ms in native bfloat16 and ~48 ms in float32; 8 rows 0.20 ms against
0.33 ms. Whether that holds on another CPU is measured there (`job_seconds`, used by the drafter rule in
`oospec.models.cpu_features`), not assumed.
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch
from torch import nn

# A sidecar job's products, as (rows, repetitions): the prompt read (hundreds of rows at once), then ~20 decoding
# steps of a row per slot. Timed on a Qwen2.5-0.5B-shaped MLP product (hidden 896, intermediate 4864).
JOB_SHAPE = ((512, 1), (8, 20))
PROBE_DIMS = (896, 4864)
INT8_MARGIN = 1.2  # int8 is taken only where it is this much faster: a near tie keeps the float precision


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (symmetric, a scale per output channel) and x quantized per row at each
    call (symmetric, a scale per token); float32 in and out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("weight_t", (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8).t()
                             .contiguous())  # [in, out]: what _int_mm takes
        self.register_buffer("weight_scale", scale)  # [out]
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        if rows.shape[0] == 0:  # amax has nothing to reduce
            return rows.new_zeros(*x.shape[:-1], self.out_features)
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)
        quantized = torch.div(rows, scale).round_().to(torch.int8)
        y = torch._int_mm(quantized, self.weight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel x per token"


@lru_cache(maxsize=1)
def int8_available() -> bool:
    """Whether this torch multiplies int8 matrices on the CPU (`torch._int_mm`)."""
    try:
        out = torch._int_mm(torch.ones(2, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return out.dtype == torch.int32 and int(out[0, 0]) == 8


def quantize_int8(model: nn.Module) -> nn.Module:
    """Every `nn.Linear` of a float32 CPU `model` (the output projection too) as an `Int8Linear`, in place;
    returns the model. Quantize after merging any adapter: a LoRA's factors belong to the weight they add to.
    Raises RuntimeError where `int8_available()` is False or the model is not float32 on the CPU."""
    if not int8_available():
        raise RuntimeError("this torch cannot multiply int8 matrices on the CPU (torch._int_mm)")
    param = next(model.parameters(), None)
    if param is None or param.dtype != torch.float32 or param.device.type != "cpu":
        raise RuntimeError("int8 quantization takes a float32 model on the CPU")
    with torch.no_grad():
        for owner in list(model.modules()):
            for name, child in list(owner.named_children()):
                if type(child) is nn.Linear:
                    setattr(owner, name, Int8Linear(child))
    return model


def job_seconds(dtype: str, *, repeats: int = 3) -> float:
    """Seconds the products of JOB_SHAPE take in `dtype` ("float32", "bfloat16" or "int8") on this CPU with the
    current torch threads: the best of `repeats` timings after a warm-up pass."""
    k, n = PROBE_DIMS
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(k, n, bias=False)
    linear.weight.data = torch.randn(n, k, generator=gen) / k**0.5
    float_dtype = torch.float32 if dtype == "int8" else getattr(torch, dtype)
    layer = Int8Linear(linear) if dtype == "int8" else linear.to(float_dtype)
    inputs = [torch.randn(rows, k, generator=gen).to(float_dtype) for rows, _ in JOB_SHAPE]
    best = float("inf")
    with torch.inference_mode():
        for attempt in range(repeats + 1):
            start = time.perf_counter()
            for x, (_, reps) in zip(inputs, JOB_SHAPE, strict=True):
                for _ in range(reps):
                    layer(x)
            if attempt:  # the first pass warms the kernels up
                best = min(best, time.perf_counter() - start)
    return best


@lru_cache(maxsize=8)
def measured_job_seconds(dtype: str, threads: int) -> float:
    """`job_seconds(dtype)`, measured once per process and torch thread count (~0.1-0.5 s)."""
    return job_seconds(dtype)


__all__ = ["INT8_MARGIN", "Int8Linear", "int8_available", "job_seconds", "measured_job_seconds", "quantize_int8"]
