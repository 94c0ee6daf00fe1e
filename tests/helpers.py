"""Helpers the tests share: tiny random models, the plain greedy reference every method must reproduce, and
the data (tool schemas, chat templates, prompts) that more than one test module reads.

Test modules import these directly (`from helpers import tiny_model`); fixtures live in conftest.py, which
imports from here and never the other way round. Adversarial drafters are in adversarial.py; the scripted
sidecar predictors are in sidecar_fakes.py (the sidecar worker process imports that module by name).
"""

from pathlib import Path

import numpy as np
import torch

from oospec.tools.schema import Param, Tool

DATA = Path(__file__).resolve().parents[1] / "oospec" / "data"
VOCAB = 320  # the tiny models' vocabulary


def tiny_model(arch: str, seed: int = 0, vocab: int = VOCAB):
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


def decode_request(prompt, max_new_tokens: int, budget: int | None = None, sampling=None, eos_ids=()):
    """The Request oospec.engine.decode.generate reads, `sampling` (SamplingParams; None: greedy) written as the
    Request's own fields."""
    from oospec.engine.drafting import Request

    fields = {} if sampling is None else dict(temperature=sampling.temperature, top_p=sampling.top_p,
                                              top_k=sampling.top_k, seed=sampling.seed)
    return Request(np.asarray(prompt, dtype=np.int64), frozenset(eos_ids), max_new_tokens=max_new_tokens,
                   budget=budget, **fields)


def conversation(seed=0, turns=4):
    """Prompts of a growing conversation: each is the previous one, plus a reply and a new message; one
    branch goes back to an earlier turn and diverges."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, VOCAB, 40)
    out = [prompt]
    for _ in range(turns - 1):
        prompt = np.concatenate([prompt, rng.integers(2, VOCAB, int(rng.integers(5, 30)))])
        out.append(prompt)
    out.append(np.concatenate([out[1][:-3], rng.integers(2, VOCAB, 12)]))  # a branch off turn 2
    out.append(out[2].copy())  # the same prompt again: all but its last token is reused
    return out


# A tool with a parameter of every JSON Schema type, in the OpenAI format.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer"},
                "hourly": {"type": "boolean"},
                "coords": {"type": "array", "items": {"type": "number"}},
                "filters": {"type": "object", "properties": {"min": {"type": "number"}, "tags": {
                    "type": "array", "items": {"type": "string"}}}, "required": ["min"]},
                "note": {"type": ["string", "null"]},
            },
            "required": ["city"],
        },
    },
}


# The three tools of API-Bank level-1's first prompt.
APIBANK_TOOLS = [
    Tool("QueryHealthData", parameters=(Param("user_id"), Param("start_time"), Param("end_time")),
         required=("user_id", "start_time", "end_time")),
    Tool("CancelRegistration", parameters=(Param("appointment_id"),), required=("appointment_id",)),
    Tool("ModifyRegistration", parameters=(Param("appointment_id"), Param("new_appointment_date"),
                                           Param("urgent", type="boolean")), required=("appointment_id",)),
]

# A ChatML template small enough to read: the chat template of the tiny models and GGUFs the tests build.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5 / Qwen2.5-Coder chat template (tokenizer_config.json), used to check the hermes dialect byte for byte.
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def render_template(template: str, messages, tools=None, add_generation_prompt=False) -> str:
    """What a chat template renders for these messages, as transformers renders it (no tokenizer needed)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt)
    return rendered[0]


def request_by_id(item_id: str, called=()):
    """A request known only by its id and its gold tools: what a manifest without content hashes checks."""
    from oospec.sidecar.provenance import ProvenanceRequest

    return ProvenanceRequest(item_id, [], [], frozenset(called))


def tree_mask(tree, start: int, rows: int) -> torch.Tensor:
    """TargetBackend's (1, 1, rows, start+rows) float32 mask of a verification forward over `tree`."""
    from oospec.engine.slot_rows import SlotForest
    from oospec.engine.target import TargetBackend

    target = TargetBackend.__new__(TargetBackend)
    target.dtype, target.device, target._neg = torch.float32, torch.device("cpu"), torch.finfo(torch.float32).min
    target.slots = SlotForest()
    return target._tree_mask(tree, start, rows)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_random_lora(folder: Path, model, scale: float = 10.0, r: int = 4, alpha: int = 8, seed: int = 0) -> Path:
    """A peft-format LoRA adapter folder over every projection of `model` (LORA_TARGETS), factors drawn from
    N(0, scale^2): huge at the default scale, so whatever the rows that take it see changes completely."""
    import json

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    factors = {}
    for name, module in model.named_modules():
        if name.endswith(LORA_TARGETS) and hasattr(module, "in_features"):
            factors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(r, module.in_features, generator=g) * scale
            factors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(module.out_features, r, generator=g) * scale
    save_file(factors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha, "bias": "none",
                                                            "target_modules": list(LORA_TARGETS)}))
    return folder


def tiny_tokenizer():
    """A byte-level BPE tokenizer trained here. (transformers 5 reloads a qwen2 folder's tokenizer as
    Qwen2Tokenizer, rebuilt from vocab and merges, so it has to be a byte-level BPE to round-trip.)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    backend.train_from_iterator(["hello world", "user assistant system", "the quick brown fox"] * 10, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tiny_qwen2(folder: Path, hidden_size: int = 32) -> Path:
    """A tiny random qwen2 with its tokenizer and chat template, saved as a Hugging Face folder (4 heads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
        eos_token_id=2, pad_token_id=0,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    return folder
