"""Dialect profiles: the generic drafting code names no dataset, the shipped profiles are what the measuring
script makes of the training traces, and a dialect without a profile drafts no habit branch."""

import re
from pathlib import Path

import numpy as np
import pytest

from oospec.drafters import make_drafter
from oospec.engine.drafting import Request
from oospec.tools.callscan import CallScanner, Habits
from oospec.tools.continuations import structure_continuations
from oospec.tools.pasted import ShownTools
from oospec.tools.profile import HABIT_CAP, PROFILES, DialectProfile, Rate, profile_for
from oospec.tools.schema import Param, Tool, to_openai
from oospec.tools.valuesource import ValueSource
from oospec.training.profiles import DEFAULT_TRACES, meant_calls, measure, profiles_from_traces

REPOSITORY = Path(__file__).resolve().parents[1]
GENERIC = [REPOSITORY / "oospec" / "drafters", REPOSITORY / "oospec" / "tools"]
DATASET_NAMES = re.compile(r"api[-_ ]?bank|bfcl|toolalpaca", re.I)
# A dialect may be named after where its format comes from: that name is an identifier clients send
# (`dialect: "apibank"`), and the dialect's class is named after it. Nothing else in generic code may say it.
DIALECT_IDENTIFIERS = {"oospec/tools/dialects.py": re.compile(r'"apibank"|``apibank``|\bApiBankDialect\b')}


def test_no_generic_drafting_code_names_a_dataset():
    found = []
    for folder in GENERIC:
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(REPOSITORY).as_posix()
            text = path.read_text(encoding="utf-8")
            if rel in DIALECT_IDENTIFIERS:
                text = DIALECT_IDENTIFIERS[rel].sub("", text)
            found += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                      if DATASET_NAMES.search(line)]
    assert not found, "dataset knowledge belongs in a dialect profile:\n" + "\n".join(found)
    # The scan itself would see one.
    assert DATASET_NAMES.search("as API-Bank writes") and DATASET_NAMES.search("the BFCL items")


def test_the_shipped_profiles_are_what_the_script_measures_on_the_training_traces():
    traces = REPOSITORY / DEFAULT_TRACES
    assert traces.is_file(), f"{DEFAULT_TRACES}: the traced pool the profiles are measured on"
    measured = profiles_from_traces(traces)
    assert {p.dialect for p in measured} == {p.stem for p in PROFILES.glob("*.json")}  # none stale, none missing
    for profile in measured:
        assert profile_for(profile.dialect) == profile
    listing = profile_for("apibank")
    assert listing.tools_in_prompt and listing.reads_listing and listing.pasted_schema.of > 100


LISTING = ("1. Name: OpenBankAccount\nParameters: {'account': {'type': 'str', 'description': 'The account.'}, "
           "'password': {'type': 'str', 'description': 'The password.'}}\n2. Name: QueryStock\n"
           "Parameters: {'stock_code': {'type': 'str', 'description': 'The code.'}}")
ACCOUNT = Tool("OpenBankAccount", "Open an account.", (Param("account", "string"), Param("password", "string")))
STOCK = Tool("QueryStock", "Stock price.", (Param("stock_code", "string"),))
PASTED = {"account": {"type": "str", "description": "The account."},
          "password": {"type": "str", "description": "The password."}}


def trace(id, calls, dialect="listing", chat_tools=None, prompt=LISTING):
    return {"id": id, "dialect": dialect, "tools": [to_openai(ACCOUNT), to_openai(STOCK)], "chat_tools": chat_tools,
            "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "Open one, user7."}],
            "calls": [{"name": n, "arguments": a} for n, a in calls]}


def test_measuring_counts_each_habit_of_the_dialects_traces():
    traces = [
        trace("t1", [("OpenBankAccount", {"account": "user7", "password": "x"})]),
        trace("t2", [("OpenBankAccount", PASTED)]),  # the schema pasted, every value
        trace("t3", [("OpenBankAccount", {"account": PASTED["account"], "password": "x"})]),  # the first only
        trace("t4", [("Name", {"account": "user7", "password": "x"})]),  # the label alone
        trace("t5", [("Name: QueryStock", {"stock_code": "AAPL"}), ("QueryStock", {"stock_code": "MSFT"})]),
        trace("t6", [("get_weather", {"city": "Paris"})], dialect="other", chat_tools=[{}]),
    ]
    profile = measure(traces, "listing", "some-target", file="fixture")
    # Paste chances: calls of an offered tool whose entries the prompt shows (t1-t3, t5's second call).
    assert profile.pasted_schema == Rate(2, 4) and profile.paste_continued == Rate(1, 2)
    assert profile.listing_label == Rate(2, 6) and profile.label_alone == Rate(1, 2)
    assert profile.tools_in_prompt and profile.target == "some-target" and profile.measured_on["traces"] == 5
    assert not measure(traces, "other").tools_in_prompt and measure(traces, "other").pasted_schema == Rate(0, 0)
    # A call named by the label is split as the call of the tool it means (none for the label alone).
    assert [c["name"] for c in meant_calls(traces[4])["calls"]] == ["QueryStock", "QueryStock"]
    assert meant_calls(traces[3])["calls"] == [] and meant_calls(traces[3])["call"] is None
    assert meant_calls(traces[0])["calls"] == traces[0]["calls"]  # real names stay
    unlabelled = trace("t7", [("Name", {})], prompt="You call tools.")  # no listing, no label: left as it is
    assert meant_calls(unlabelled) is unlabelled


def test_a_share_has_the_digits_its_count_can_tell_and_never_certainty():
    assert Rate(21, 169).share == 0.12 and Rate(4, 7).share == 0.6 and Rate(0, 0).share == 0.0
    assert Rate(21, 21).share == HABIT_CAP
    profile = DialectProfile("x", pasted_schema=Rate(3, 30), measured_on={"file": "a"})
    assert DialectProfile.from_json(profile.to_json()) == profile


def continuations_after(written, shown, profile):
    scan = CallScanner(Habits().style)
    scan.feed(written)
    return structure_continuations(scan, [ACCOUNT, STOCK], Habits(), "parameters", (), ValueSource("user7"), shown,
                                   profile)


def test_a_dialect_without_a_profile_drafts_no_habit_branch():
    assert profile_for("no-such-dialect") == DialectProfile("no-such-dialect")
    assert profile_for("../apibank") == DialectProfile("../apibank")  # a name, never a path
    assert profile_for("hermes").reads_listing is False  # its training traces showed no habit
    shown = ShownTools.from_prompt(LISTING, [ACCOUNT, STOCK])
    assert shown.label == "Name" and set(shown.entries) == {"OpenBankAccount", "QueryStock"}
    copies = profile_for("apibank")
    for profile, habits in ((copies, True), (DialectProfile("plain"), False), (None, False)):
        names = [c.text for c in continuations_after('{"name": "', shown, profile)]
        values = [c.text for c in continuations_after('{"name": "OpenBankAccount"', shown, profile)]
        assert any(t.startswith("Name") for t in names) is habits, profile
        assert any('"description"' in t for t in values) is habits, profile
        assert any(t.startswith("OpenBankAccount") for t in names)  # the real names, with or without


def test_the_schema_drafter_reads_the_listing_only_for_a_dialect_whose_profile_says_so(smollm2_tokenizer):
    drafter = make_drafter("schema")
    for dialect, reads in (("apibank", True), ("hermes", False)):
        drafter.start(Request(np.asarray([1, 2, 3]), frozenset([2]), tokenizer=smollm2_tokenizer,
                              tools=[ACCOUNT, STOCK], dialect=dialect,
                              messages=[{"role": "system", "content": LISTING}]))
        assert drafter.profile == profile_for(dialect) and (drafter.shown is not None) is reads


@pytest.fixture(autouse=True)
def _fresh_profiles():
    profile_for.cache_clear()
    yield
