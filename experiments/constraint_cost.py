"""Cost of constrained decoding per token: a forced tool call (tool_choice named) on a real target, decoded with
and without the call grammar, plain (ar) and speculative (toolspec).

    PYTHONPATH=. python experiments/constraint_cost.py [--model smollm2-135m] [--repeats 3]

Prints ms per produced token of the decode loop (prefill excluded) and, under the grammar, the time spent in the
grammar itself (pruning/mask filling, applying the masks, advancing the matcher) per token."""

from __future__ import annotations

import argparse
import time

import numpy as np

from oospec.drafters import make_drafter
from oospec.engine import constraint as constraint_module
from oospec.engine.engine import Engine
from oospec.models.provision import pull
from oospec.tools.call_grammar import call_grammar, forced_call_start
from oospec.tools.dialects import get_dialect

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city", "unit", "days"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What will the weather be like in Paris over the next three days?"}]


class GrammarTimer:
    """Wraps the three GrammarConstraint calls to add up the time spent in them."""

    def __init__(self):
        self.seconds = 0.0
        for name in ("prune", "apply", "advance"):
            original = getattr(constraint_module.GrammarConstraint, name)
            setattr(constraint_module.GrammarConstraint, name, self._timed(original))

    def _timed(self, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    engine = Engine.from_pretrained(str(pull(args.model)), dtype="float32")
    dialect = get_dialect("hermes")
    forced = forced_call_start(dialect, "get_weather")
    prompt = np.concatenate([engine.encode(MESSAGES, [WEATHER, TIME]),
                             engine.tokenizer.encode(forced, add_special_tokens=False)])
    t0 = time.perf_counter()
    vocabulary = engine.grammar_vocabulary()
    print(f"grammar vocabulary ({vocabulary.ll.vocab_size} tokens): {time.perf_counter() - t0:.2f} s, once per target")
    grammar = call_grammar([WEATHER, TIME], ["get_weather"], dialect, special_tokens=vocabulary.special_tokens)
    t0 = time.perf_counter()
    engine.constraint(grammar, forced)
    print(f"grammar compile + forced start: {(time.perf_counter() - t0) * 1e3:.1f} ms per request")
    timer = GrammarTimer()
    engine.generate(prompt_ids=prompt, max_new_tokens=4)  # warm-up
    for method in ("ar", "toolspec"):
        for grammar_on in (False, True):
            per_token, in_grammar = [], []
            for _ in range(args.repeats):
                timer.seconds = 0.0
                result = engine.generate(
                    prompt_ids=prompt, max_new_tokens=args.max_new_tokens, drafter=make_drafter(method),
                    tools=[WEATHER, TIME], dialect="hermes",
                    constraint=engine.constraint(grammar, forced) if grammar_on else None)
                s = result.stats
                per_token.append(s.decode_s / max(s.new_tokens - 1, 1) * 1e3)
                in_grammar.append(timer.seconds / max(s.new_tokens, 1) * 1e3)
            text = forced + engine.tokenizer.decode(result.tokens, skip_special_tokens=True)
            print(f"{method:9s} grammar={'on ' if grammar_on else 'off'} tokens={s.new_tokens:3d} "
                  f"forwards={s.target_forwards:3d} decode ms/token={np.median(per_token):6.2f} "
                  f"(grammar {np.median(in_grammar):5.2f}) finish={result.generation.finish_reason} {text[len(forced):]!r:.160}")


if __name__ == "__main__":
    main()
