"""`oospec-rows` (oospec.sidecar.inline, oospec.drafters.inline): the sidecar's job done by slot rows in the
target's own forwards. Its output is `ar`'s token for token, with a random slot LoRA as without; without one,
its rows guess what the process sidecar's predictor guesses on the same weights; its hints reach the tree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import write_random_lora
from test_sidecar import WEATHER

from oospec.drafters import make_drafter
from oospec.engine.drafting import Request
from oospec.engine.slot_rows import add_slot_lora
from oospec.sidecar.predictor import SidecarPredictor
from oospec.sidecar.protocol import parse_payload
from oospec.sidecar.slot_values import closed_options
from oospec.tools.schema import tools_from_openai

pytestmark = pytest.mark.usefixtures("one_thread")

ASKS = ["What's the weather in Paris for the next 3 days? Use celsius.",
        "What time is it in Tokyo right now?",
        "Tell me the forecast for Lisbon this week, in fahrenheit."]


def ask(text: str, max_new_tokens: int = 48) -> Request:
    return Request.chat([{"role": "user", "content": text}], WEATHER, max_new_tokens=max_new_tokens)


def test_oospec_rows_is_ar_token_for_token_with_a_random_slot_lora(smollm2_path, tmp_path):
    from oospec.engine.engine import Engine

    engine = Engine.from_pretrained(smollm2_path, dtype="float32")  # its own: the LoRA changes its modules
    assert add_slot_lora(engine.model, write_random_lora(tmp_path / "lora", engine.model, scale=1.0)) == \
        7 * engine.model.config.num_hidden_layers
    for text in ASKS:
        reference = engine.generate(ask(text), drafter=make_drafter("ar")).tokens
        drafter = make_drafter("oospec-rows")
        out = engine.generate(ask(text), drafter=drafter)
        assert np.array_equal(out.tokens, reference), f"{text!r} diverged"
        # Rows ran in the forwards (a LoRA this random rarely ends a value: the job may be cut by the reply's end),
        # and the request's end left no job and no node behind.
        assert drafter.source.next_id > 3 * len(WEATHER)
        assert not drafter.source.tickets and not drafter.source.nodes


def test_without_a_lora_the_rows_guess_what_the_sidecar_predictor_guesses(smollm2_engine):
    """The same weights, the same task rows: the function and every free slot's value agree (the predictor scores
    enum and boolean slots option by option, the rows decode them: those may differ)."""
    predictor = SidecarPredictor(smollm2_engine.model, smollm2_engine.tokenizer)
    tools = tools_from_openai(WEATHER)
    for text in ASKS:
        drafter = make_drafter("oospec-rows")
        smollm2_engine.generate(ask(text), drafter=drafter)
        rows = drafter.sidecar_drafter.payload.best
        job = drafter.sidecar_drafter.job
        sidecar = parse_payload(predictor.predict(job), job.request_id, tools).best
        assert rows.function == sidecar.function, text
        tool = next(t for t in tools if t.name == rows.function)
        free = [p.name for p in tool.parameters if not closed_options(p)]
        assert {k: rows.arguments.get(k) for k in free} == {k: sidecar.arguments.get(k) for k in free}, text
        assert rows.score == pytest.approx(sidecar.score, abs=1e-3)


def test_under_the_call_grammar_the_rows_guess_the_call_the_target_writes(smollm2_engine):
    """A reply that must be a call (tool_choice "required": the grammar masks the tree's logits, the slot rows
    ride along): `ar`'s tokens, and the rows' payload holds the call the target wrote (optional enum and boolean
    slots get a value, as the predictor gives them), published early: the function first, each value as it ends."""
    engine = smollm2_engine
    for text in ASKS:
        runs = {}
        for method in ("ar", "oospec-rows"):
            request = ask(text, 40)
            forced, request.constraint = engine.forced_call(WEATHER, "hermes")
            request.prompt_ids = np.concatenate([engine.encode(request.messages, WEATHER), forced])
            drafter = make_drafter(method)
            runs[method] = engine.generate(request, drafter=drafter).tokens, drafter
        (reference, _), (tokens, drafter) = runs["ar"], runs["oospec-rows"]
        assert np.array_equal(tokens, reference), f"{text!r} diverged"
        written = json.loads(engine.tokenizer.decode(reference).split("\n")[0])
        guess, report = drafter.sidecar_drafter.payload.best, drafter.report
        assert guess.function == written["name"], text  # and every argument it gave, as the target wrote it;
        given = [k for k in written["arguments"] if k in guess.arguments]
        assert {k: guess.arguments[k] for k in given} == {k: written["arguments"][k] for k in given}, text
        # one left out is one the target wrote before its value came: its rows stopped there
        assert not set(written["arguments"]) - set(given) & set(report.slot_arrivals), text
        # The payload came early and grew: the function before the target had written its name, values after.
        named = next(i for i in range(tokens.size) if f'"{written["name"]}"' in engine.tokenizer.decode(tokens[:i]))
        assert report.arrived and 0 < report.tokens_written_at_arrival < named, text
        assert report.tokens_written_at_arrival < min(report.slot_arrivals.values()) < tokens.size, text
