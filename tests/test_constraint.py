"""Constrained decoding (tool_choice named or required): a random-weight target, which writes garbage unconstrained,
writes a call of an offered function with an object for arguments under the call grammar; speculative decoding
under the grammar, with drafters built to break it, is token-identical to constrained plain greedy decoding."""

import json

import numpy as np
import pytest
from adversarial import DecoyOracleDrafter, EmptyDrafter, HugeTreeDrafter, RandomTreeDrafter
from helpers import tiny_model

from oospec.drafters import make_drafter
from oospec.engine.constraint import GrammarError
from oospec.engine.engine import Engine
from oospec.tools.call_grammar import CallGrammarUnavailable, call_grammar, forced_call_start
from oospec.tools.dialects import get_dialect


def tool(name, properties, required=()):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


# Finite argument spaces (enums, booleans): every constrained reply ends within a few dozen tokens.
LIGHT = tool("set_light", {"room": {"type": "string", "enum": ["kitchen", "hall"]}, "on": {"type": "boolean"}},
             ["room", "on"])
ALARM = tool("set_alarm", {"hour": {"type": "integer", "enum": [6, 7, 8]}}, ["hour"])
TOOLS = [LIGHT, ALARM]
NAMES = ["set_light", "set_alarm"]
MESSAGES = [{"role": "user", "content": "Turn on the kitchen light and wake me at seven."}]
MAX_NEW = 120


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer, one_thread):
    """A random target with SmolLM2's vocabulary (so the grammar has a real tokenizer to work with)."""
    return Engine(tiny_model("qwen2", seed=3, vocab=len(smollm2_tokenizer)), smollm2_tokenizer)


def setup(engine, forced_function, dialect_name="hermes", parallel=False, seed=0):
    dialect = get_dialect(dialect_name)
    forced = forced_call_start(dialect, forced_function)
    rng = np.random.default_rng(seed)
    noise = " ".join(rng.choice(["lamp", "hall", "seven", "wake", "light", "please"], 4))
    messages = [{"role": "user", "content": MESSAGES[0]["content"] + " " + noise}]
    prompt = np.concatenate([engine.encode(messages), engine.tokenizer.encode(forced, add_special_tokens=False)])
    names = [forced_function] if forced_function else NAMES
    grammar = call_grammar(TOOLS, names, dialect, parallel=parallel,
                           special_tokens=engine.grammar_vocabulary().special_tokens)
    return prompt, forced, grammar, dialect


def reply_calls(engine, dialect, forced, tokens):
    return dialect.parse(forced + engine.tokenizer.decode(tokens, skip_special_tokens=True))


def one_clean_call(text, dialect, names):
    """The reply is one call of one of `names`, arguments an object, byte for byte the dialect's own rendering."""
    calls = dialect.parse(text)
    return (len(calls) == 1 and calls[0].name in names and isinstance(calls[0].arguments, dict)
            and text == dialect.render(calls))


@pytest.mark.parametrize("forced_function", [None, "set_alarm", "set_light"])
@pytest.mark.parametrize("dialect_name", ["hermes", "apibank", "llama3_json"])
def test_forced_reply_is_a_call_of_an_offered_function(engine, forced_function, dialect_name):
    for seed in range(3):
        prompt, forced, grammar, dialect = setup(engine, forced_function, dialect_name, seed=seed)
        gen = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW, constraint=engine.constraint(grammar, forced))
        assert gen.generation.finish_reason == "stop", engine.tokenizer.decode(gen.tokens)
        text = forced + engine.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        assert one_clean_call(text, dialect, [forced_function] if forced_function else NAMES), text
        # The same target without the grammar writes no such call: the grammar is what made the reply a call.
        free = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW)
        assert not one_clean_call(forced + engine.tokenizer.decode(free.tokens, skip_special_tokens=True), dialect,
                                  NAMES)


def test_parallel_calls_all_parse(engine):
    prompt, forced, grammar, dialect = setup(engine, None, parallel=True)
    gen = engine.generate(prompt_ids=prompt, max_new_tokens=200, constraint=engine.constraint(grammar, forced))
    text = forced + engine.tokenizer.decode(gen.tokens, skip_special_tokens=True)
    calls = dialect.parse(text)
    assert calls and all(c.name in NAMES and isinstance(c.arguments, dict) for c in calls), text


class PoolTreeDrafter(RandomTreeDrafter):
    """Random trees of tokens the grammar often allows (those of the reply itself), so that many survive pruning
    and acceptance has real branches to choose between."""

    def __init__(self, pool: np.ndarray, seed: int, max_nodes: int = 48):
        super().__init__(len(pool), seed, max_nodes)
        self.pool = pool

    def candidates(self, context):
        return [type(c)(self.pool[c.tokens]) for c in super().candidates(context)]


@pytest.mark.parametrize("forced_function", [None, "set_light"])
def test_speculative_under_the_grammar_is_constrained_greedy(engine, forced_function):
    vocab = len(engine.tokenizer)
    for seed in range(2):
        prompt, forced, grammar, _ = setup(engine, forced_function, seed=seed)
        reference = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW,
                                    constraint=engine.constraint(grammar, forced)).tokens
        unconstrained = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW).tokens
        pool = np.unique(np.concatenate([reference, unconstrained]))
        drafters = [EmptyDrafter(), RandomTreeDrafter(vocab, seed), HugeTreeDrafter(vocab, seed),
                    PoolTreeDrafter(pool, seed), DecoyOracleDrafter(reference, vocab, seed),
                    DecoyOracleDrafter(unconstrained, vocab, seed), make_drafter("toolspec")]
        for drafter in drafters:
            for budget in (4, 32):
                gen = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW, drafter=drafter, budget=budget,
                                      tools=TOOLS, dialect="hermes", constraint=engine.constraint(grammar, forced))
                assert np.array_equal(gen.tokens, reference), (drafter.name, budget)
        oracle = DecoyOracleDrafter(reference, vocab, seed)
        fast = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW, drafter=oracle,
                               constraint=engine.constraint(grammar, forced))
        assert fast.stats.tau > 2  # the true path survives pruning and is accepted many tokens per forward


def test_sampling_under_the_grammar(engine):
    """Plain and speculative sampling under the grammar draw the same tokens for the same seed (speculative
    sampling's guarantee, oospec.engine.speculative_sampling), and every draw is a call."""
    prompt, forced, grammar, dialect = setup(engine, None)
    vocab = len(engine.tokenizer)
    for seed in range(4):
        options = dict(prompt_ids=prompt, max_new_tokens=MAX_NEW, temperature=1.0, seed=seed)
        plain = engine.generate(**options, constraint=engine.constraint(grammar, forced))
        calls = reply_calls(engine, dialect, forced, plain.tokens)
        assert len(calls) == 1 and calls[0].name in NAMES and isinstance(calls[0].arguments, dict)
        for drafter in (RandomTreeDrafter(vocab, seed), DecoyOracleDrafter(plain.tokens, vocab, seed)):
            spec = engine.generate(**options, drafter=drafter, constraint=engine.constraint(grammar, forced))
            assert np.array_equal(spec.tokens, plain.tokens), drafter.name


def test_grammar_shape_and_refusals(engine):
    grammar = call_grammar(TOOLS, ["set_alarm"], get_dialect("hermes"))
    assert "set_alarm" in grammar and "set_light" not in grammar
    assert json.loads(grammar.split("%json ", 1)[1].splitlines()[0])["additionalProperties"] is False
    odd = tool("odd", {})
    odd["function"]["parameters"]["type"] = "string"  # a schema claiming the arguments are not an object
    assert json.loads(call_grammar([odd], ["odd"], get_dialect("hermes")).split("%json ", 1)[1].splitlines()[0])[
        "type"] == "object"
    with pytest.raises(CallGrammarUnavailable):
        call_grammar(TOOLS, NAMES, get_dialect("pythonic"))
    with pytest.raises(ValueError, match="Paris"):
        call_grammar(TOOLS, ["Paris"], get_dialect("hermes"))
    with pytest.raises(GrammarError, match="forced reply start"):
        engine.constraint(grammar, "<tool_call>\n{\"name\": \"set_light\"")
    with pytest.raises(GrammarError, match="compile"):
        engine.constraint("start: undefined_rule\n")


# -- 100 random schemas and prompts ----------------------------------------------------------------------------
RANDOM_MAX_NEW = 80  # a call of these schemas fits (the parallel cases run to it)
WORDS = ("city", "room", "level", "mode", "tag", "unit", "count", "flag", "color", "target", "speed", "name")


def random_value_schema(rng, depth: int = 0) -> dict:
    """A parameter schema whose every value ends within a few tokens (a random model must still finish a call)."""
    kind = rng.choice(["enum", "boolean", "integer", "string", "array", "object"] if depth == 0 else
                      ["enum", "boolean", "integer", "string"])
    if kind == "enum":
        return {"type": "string", "enum": list(rng.choice(WORDS, int(rng.integers(1, 4)), replace=False))}
    if kind == "integer":
        return {"type": "integer", "enum": [int(x) for x in rng.integers(-5, 50, 3)]}
    if kind == "string":
        return {"type": "string", "maxLength": 3}
    if kind == "array":
        return {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}
    if kind == "object":
        return {"type": "object", "additionalProperties": False,  # else any key of any length may come
                "properties": {w: random_value_schema(rng, 1) for w in rng.choice(WORDS, 2, replace=False)}}
    return {"type": kind}


def random_tools(rng) -> list[dict]:
    names = rng.choice(["get_" + w for w in WORDS], int(rng.integers(1, 4)), replace=False)
    tools = []
    for name in names:
        keys = list(rng.choice(WORDS, int(rng.integers(1, 4)), replace=False))
        properties = {k: random_value_schema(rng) for k in keys}
        tools.append(tool(str(name), properties, [k for k in keys if rng.random() < 0.6]))
    return tools


def test_random_schemas_and_prompts_always_give_a_call_and_speculation_changes_nothing(engine):
    """100 random tool lists, choices (required or one named function), dialects and prompts: the constrained reply
    is a call of an allowed function with an object for arguments, and speculative decoding under the same grammar
    (a random-tree drafter, and toolspec) returns the same tokens."""
    vocab = len(engine.tokenizer)
    for case in range(100):
        rng = np.random.default_rng(1000 + case)
        tools = random_tools(rng)
        names = [t["function"]["name"] for t in tools]
        function = str(rng.choice(names)) if rng.random() < 0.5 else None
        dialect = get_dialect(str(rng.choice(["hermes", "apibank", "llama3_json"])))
        forced = forced_call_start(dialect, function)
        words = " ".join(rng.choice(list(WORDS) + ["please", "now", "7"], 5))
        prompt = np.concatenate([engine.encode([{"role": "user", "content": words}]),
                                 engine.tokenizer.encode(forced, add_special_tokens=False)])
        parallel = case % 4 == 0  # a random model then writes calls until max_new_tokens: those it closed must parse
        grammar = call_grammar(tools, [function] if function else names, dialect, parallel=parallel,
                               special_tokens=engine.grammar_vocabulary().special_tokens)
        plain = engine.generate(prompt_ids=prompt, max_new_tokens=RANDOM_MAX_NEW,
                                constraint=engine.constraint(grammar, forced))
        text = forced + engine.tokenizer.decode(plain.tokens, skip_special_tokens=True)
        where = f"case {case}: {text!r}"
        assert parallel or plain.generation.finish_reason == "stop", where
        calls = dialect.parse(text)
        assert calls and all(c.name in ([function] if function else names) for c in calls), where
        assert all(isinstance(c.arguments, dict) for c in calls), where
        drafter = RandomTreeDrafter(vocab, case) if case % 2 else make_drafter("toolspec")
        spec = engine.generate(prompt_ids=prompt, max_new_tokens=RANDOM_MAX_NEW, drafter=drafter, tools=tools,
                               dialect=dialect.name, constraint=engine.constraint(grammar, forced))
        assert np.array_equal(spec.tokens, plain.tokens), where


def test_bounds_no_float_holds_compile(engine):
    """Issue 33's fuzz: `minimum: 1e400` arrives as infinity, which the grammar's JSON cannot write; llguidance
    refused the grammar and tool_choice got a 400. The bound is left out and the forced reply is still a call."""
    params = json.loads('{"type": "object", "properties": {"x": {"type": "number", "minimum": 1e400}, "n": {'
                        '"type": "integer", "maximum": -1e400, "enum": [1, 2, 1e400]}}, "required": ["n"]}')
    tools = [{"type": "function", "function": {"name": "calc", "parameters": params}}]
    dialect = get_dialect("hermes")
    grammar = call_grammar(tools, ["calc"], dialect, special_tokens=engine.grammar_vocabulary().special_tokens)
    schema = json.loads(grammar.split("%json ", 1)[1].splitlines()[0])
    assert schema["properties"]["x"] == {"type": "number"} and schema["properties"]["n"]["enum"] == [1, 2]
    forced = forced_call_start(dialect, "calc")
    prompt = np.concatenate([engine.encode(MESSAGES), engine.tokenizer.encode(forced, add_special_tokens=False)])
    gen = engine.generate(prompt_ids=prompt, max_new_tokens=MAX_NEW, constraint=engine.constraint(grammar, forced))
    calls = dialect.parse(forced + engine.tokenizer.decode(gen.tokens, skip_special_tokens=True))
    assert [c.name for c in calls] == ["calc"] and calls[0].arguments["n"] in (1, 2)


def test_nested_objects_are_closed_to_undeclared_keys(engine):
    """Issue 33's fuzz: only the top-level object was closed, and a model filled a nested object with its own
    schema's keys ({"user": {"type": "string", "enum": [...]}}). Every object naming its properties is closed,
    in arrays and anyOf too; one that allows others keeps them, allOf members are left as given."""
    user = {"type": "object", "properties": {"id": {"type": "integer"}}}
    params = {"type": "object", "properties": {
        "user": user, "users": {"type": "array", "items": user}, "either": {"anyOf": [user, {"type": "string"}]},
        "open": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
        "both": {"allOf": [user, {"properties": {"b": {"type": "string"}}}]}}}
    grammar = call_grammar([{"type": "function", "function": {"name": "f", "parameters": params}}], ["f"],
                           get_dialect("hermes"))
    props = json.loads(grammar.split("%json ", 1)[1].splitlines()[0])["properties"]
    assert props["user"]["additionalProperties"] is False and props["users"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True and "additionalProperties" not in props["both"]["allOf"][0]
    assert "additionalProperties" not in user  # the client's tools are not changed
    engine.constraint(grammar, forced_call_start(get_dialect("hermes"), "f"))  # and llguidance compiles it
