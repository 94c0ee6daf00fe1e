"""In-target slot rows (issue 46): the LoRA on the rows only, the prompt read by the base model alone, in training
(`TrainConfig.prompt_without_adapter`) and in the predictor (`RowRunner(prompt_without_adapter=True)`)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from oospec.sidecar.predictor import TaskFormat
from oospec.sidecar.rowrunner import RowRunner
from oospec.training.lora import encode_rows, request_loss
from oospec.training.rows import rows_for
from test_training import _trace


@pytest.fixture(scope="module")
def lora_model(smollm2_model):
    """SmolLM2 with a LoRA whose factors are random (peft's default B=0 would change nothing)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    return get_peft_model(copy.deepcopy(smollm2_model), config)


def _prefix_keys(model, ids: list[int], prompt_without_adapter: bool) -> torch.Tensor:
    runner = RowRunner(model, prompt_without_adapter=prompt_without_adapter)
    runner.prompt_ids = ids
    runner.encode_prefix(ids)
    return torch.stack([layer.keys[:, :, : len(ids)] for layer in runner._prefix_layers])


def test_the_shared_part_is_the_prompt_read_without_the_adapter(smollm2_model, smollm2_tokenizer, lora_model):
    fmt = TaskFormat(smollm2_tokenizer)
    rr = rows_for(_trace(), fmt)
    enc = encode_rows(rr, fmt, 4096, prompt_only=True)
    prompt = fmt.encode(rr.prompt)
    assert enc.shared == prompt
    # The sidecar's shared part stops a token short of the call-or-none row's completion (every label is in a
    # row); here that token, the prompt's last, is the target's own, and that row's first label is not trained.
    default = encode_rows(rr, fmt, 4096)
    assert default.shared == prompt[:-1] and enc.rows[1] == default.rows[1][1:] and enc.label_from[0] == 0
    base = _prefix_keys(smollm2_model, enc.shared, prompt_without_adapter=False)
    assert torch.allclose(_prefix_keys(lora_model, enc.shared, prompt_without_adapter=True), base, atol=1e-5)
    assert not torch.allclose(_prefix_keys(lora_model, enc.shared, prompt_without_adapter=False), base, atol=1e-3)


def test_training_scores_rows_as_the_predictor_does_and_trains_the_lora_only(smollm2_tokenizer, lora_model):
    """The ranking loss equals the softmax over the names' scores as the rows-only runner computes them, and its
    gradients reach the LoRA factors only."""
    fmt = TaskFormat(smollm2_tokenizer)
    enc = encode_rows(rows_for(_trace(), fmt), fmt, 4096, prompt_only=True)
    lora_model.zero_grad(set_to_none=True)
    loss = request_loss(lora_model, enc, prompt_without_adapter=True)
    (loss.tokens_nll + loss.rank).backward()
    runner = RowRunner(lora_model, prompt_without_adapter=True)
    runner.prompt_ids = enc.shared
    runner.encode_prefix(enc.shared)
    logprobs, _ = runner.run([enc.rows[i] for i in enc.choices], keep_all_logits=True)
    totals = np.array([lp[enc.label_from[i]:].sum() for lp, i in zip(logprobs, enc.choices)])
    want = -(totals[enc.chosen] - np.log(np.exp(totals).sum()))
    assert float(loss.rank) == pytest.approx(want, abs=2e-3)
    with torch.no_grad():  # with the adapter in the prompt too, the scores differ: the mode matters
        assert float(request_loss(lora_model, enc).rank) != pytest.approx(want, abs=2e-3)
    grads = {n for n, p in lora_model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all("lora_" in n for n in grads)


def test_a_rows_only_adapter_is_queried_rows_only(smollm2_model, smollm2_tokenizer, tmp_path):
    """Trained with `prompt_without_adapter`, the adapter says so (sidecar.json) and the predictor, loading it
    unmerged beside the quantized weights, reads every prompt with it switched off."""
    from oospec.engine.quantized import LoRALinear
    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.sidecar.protocol import parse_payload
    from oospec.tools.schema import tools_from_openai
    from oospec.training.lora import TrainConfig, train
    from oospec.training.rows import job_for

    trace = _trace()
    cfg = TrainConfig(base="smollm2-135m", r=4, alpha=8, lr=3e-3, epochs=8, batch_requests=1, warmup_steps=1,
                      prompt_without_adapter=True)
    summary = train([trace], tmp_path / "adapter", cfg, model=copy.deepcopy(smollm2_model),
                    tokenizer=smollm2_tokenizer, progress=False)
    assert summary["last_loss"] < 0.5 * summary["first_loss"]
    assert json.loads((tmp_path / "adapter" / "sidecar.json").read_text())["prompt_without_adapter"] is True
    # Whether a call comes rests on the prompt's last position, the base model's own here (this tiny base does not
    # believe in one): the adapter's slots are what is checked.
    predictor = SidecarPredictor.from_pretrained("smollm2-135m", adapter=str(tmp_path / "adapter"), dtype="float32",
                                                 min_call_probability=0.0)
    assert predictor.prompt_without_adapter and predictor.runner.prompt_without_adapter
    loras = [m for m in predictor.model.modules() if isinstance(m, LoRALinear)]
    assert loras  # unmerged, so that it can be switched off for the prompt
    seen = []
    hook = loras[0].register_forward_pre_hook(lambda m, args: seen.append((args[0].shape[-2], m.enabled)))
    job = job_for(trace)
    payload = parse_payload(predictor.predict(job), job.request_id, tools_from_openai(trace["tools"]))
    hook.remove()
    assert any(not on for _, on in seen) and any(on for _, on in seen)  # the prompts off, the rows on
    assert all(m.enabled for m in loras)  # and left on
    assert payload.best.function == trace["call"]["name"] and payload.best.arguments == trace["call"]["arguments"]
