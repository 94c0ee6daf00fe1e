"""The call scanner: where a tool call being written stands, and the structure that may follow it."""

import json

import pytest
from helpers import APIBANK_TOOLS

from oospec.tools.callscan import CallPosition, CallScanner, Habits
from oospec.tools.continuations import structure_continuations
from oospec.tools.pasted import ShownTools, name_label, schema_entries
from oospec.tools.profile import DialectProfile, Rate
from oospec.tools.render import CallRenderer
from oospec.tools.schema import Param, Tool
from oospec.tools.toolprior import tool_weights
from oospec.tools.valuesource import ValueSource


def test_callscan_tracks_states():
    scan = CallScanner(Habits().style)
    scan.feed('<tool_call>\n{"name": "Mod')
    conts = structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ("<tool_call>\n",))
    assert conts and conts[0].text.startswith('ifyRegistration", "parameters": {"appointment_id": "')
    scan.feed('ifyRegistration", "parameters": {"appointment_id": "34567890"')
    conts = structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ())
    assert conts[0].text == ', "new_appointment_date": "'
    scan.feed(', "new_appointment_date": "2023-03-26", "urgent": t')
    conts = structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ())
    assert [c.text for c in conts] == ["rue"]
    scan.feed('rue}}')
    assert scan.calls_done == 1 and scan.name == "ModifyRegistration" and scan.opener == "<tool_call>\n"
    # Before the target has finished a request, its opener says how the call is closed; after, its habit does.
    conts = structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ())
    assert [(c.text, c.end_of_turn) for c in conts] == [("\n</tool_call>", True)]
    learned = Habits(closers=["\n</tool_call>\n"])
    assert [c.text for c in structure_continuations(scan, APIBANK_TOOLS, learned, "parameters", ())] == ["\n</tool_call>\n"]
    fenced = CallScanner(Habits().style)
    fenced.feed('```json\n{"name": "CancelRegistration", "parameters": {"appointment_id": "1"}}\n`')
    assert [c.text for c in structure_continuations(fenced, APIBANK_TOOLS, Habits(), "parameters", ())] == ["``"]


def test_callscan_ignores_braces_inside_strings():
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "CancelRegistration", "parameters": {"appointment_id": "a}\\"{b"')
    assert scan.depth == 2 and not scan.in_string
    conts = structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ())
    assert conts[0].text == "}}"


def test_unknown_tool_name_proposes_nothing_for_arguments():
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "NoSuchTool", "parameters": {"x": "1"')
    assert structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ()) == []


def test_a_pretty_printing_target_is_followed_from_its_first_indented_line():
    # Habits learned from an inline call (one client's prompt), then a request where the target pretty-prints
    # (json.dumps(indent=2), as Qwen2.5-Coder does for BFCL): depths and closing braces not seen yet in this
    # request are drafted by the indentation rule, not by the stale inline habits.
    habits = Habits()
    CallScanner(habits.style).feed('{"name": "CancelRegistration", "parameters": {"appointment_id": "1"}}')
    assert habits.style.indent is None and habits.style.ws(",", 2) == " "
    scan = CallScanner(habits.style)
    scan.feed('```json\n{')
    assert habits.style.indent is None  # a brace followed by nothing yet decides nothing
    scan.feed('\n  "name": "ModifyRegistration",')
    assert habits.style.indent == 2
    conts = structure_continuations(scan, APIBANK_TOOLS, habits, "parameters", ())
    # The arguments' key runs on into the first argument: depth 2, never seen indented, is the rule's.
    assert conts[0].text == '\n  "parameters": {\n    "appointment_id": "'
    scan.feed('\n  "parameters": {')
    conts = structure_continuations(scan, APIBANK_TOOLS, habits, "parameters", ())
    assert conts[0].text == '\n    "appointment_id": "'  # depth 2, never seen indented: the rule
    scan.feed('\n    "appointment_id": "34567890"')
    conts = structure_continuations(scan, APIBANK_TOOLS, habits, "parameters", ())
    assert conts[0].text == ',\n    "new_appointment_date": "'
    # An inline array inside a pretty-printed call does not switch the rule off.
    scan.feed(', "tags": [1, 2]')
    assert habits.style.indent is None  # the comma before "tags" was inline: the newest object-level sign wins
    scan.feed(',\n    "x": [1, 2],\n    "')
    assert habits.style.indent == 2
    args = {"appointment_id": "1", "when": {"day": 3, "slots": [1, 2]}}
    rendered = CallRenderer(habits.style, "parameters").call("ModifyRegistration", args)
    assert rendered == json.dumps({"name": "ModifyRegistration", "parameters": args}, indent=2)
    # And back: an inline call afterwards is drafted inline again.
    CallScanner(habits.style).feed('{"name": "CancelRegistration", "parameters": {"appointment_id": "1"}}')
    assert habits.style.indent is None
    assert CallRenderer(habits.style, "parameters").call("C", {"a": 1}) == '{"name": "C", "parameters": {"a": 1}}'


def test_the_call_position_names_every_place_in_a_call():
    """One typed state, read from the scanner, that the schema drafter and the sidecar's alignment match on."""
    P = CallPosition
    steps = [("<tool_call>\n", P.OUTSIDE), ("{", P.CALL_KEY_NEXT), ('"na', P.CALL_KEY), ('me"', P.CALL_COLON),
             (":", P.CALL_VALUE_NEXT), (' "Get', P.NAME), ('X"', P.CALL_VALUE_DONE), (', "arguments": {', P.ARG_KEY_NEXT),
             ('"ci', P.ARG_KEY), ('ty"', P.ARG_COLON), (": ", P.ARG_VALUE), ('"Par', P.ARG_STRING),
             ('is"', P.ARG_VALUE_DONE), (', "n": 1', P.ARG_VALUE), (', "box": [', P.ARG_NESTED), ("2]", P.ARG_VALUE_DONE),
             ("}", P.CALL_VALUE_DONE), ("}", P.OUTSIDE)]
    scan = CallScanner(Habits().style)
    for text, where in steps:
        scan.feed(text)
        assert scan.position is where, text
        assert where.in_arguments == where.name.startswith("ARG_")
    other = CallScanner(Habits().style)
    other.feed('{"name": "f", "id": "x')  # a call key the schema says nothing of
    assert other.position is P.OTHER


def test_request_numbers_and_spans_say_where_a_value_ends():
    values = ValueSource("plan 7 days in Tokyo, a daily budget of 100 dollars; charges 1e-9 and 0.05 m (v1.2)")
    assert values.number_endings("1") == ["e-9", "00"]  # latest mention first; "v1.2" is no number
    assert values.number_endings("7") == [""]  # one of the request's numbers, whole
    assert values.number_endings("0.0") == ["5"] and values.number_endings("3") == []
    assert values.is_span("Tokyo") and values.is_span("daily budget") and not values.is_span("Tok")


def test_a_whole_request_number_or_span_is_drafted_with_what_follows_it():
    tools = [Tool("plan", parameters=(Param("city"), Param("days", type="integer"),
                                      Param("kind", enum=("nature", "urban"))))]
    values = ValueSource("plan 7 days in Tokyo")
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "plan", "arguments": {"city": "Tokyo')
    conts = structure_continuations(scan, tools, Habits(), "arguments", (), values)
    best = max(conts, key=lambda c: c.confidence)
    assert best.text == '", "days": ' and best.confidence > 0.4  # a whole span of the request: likely done
    scan.feed('", "days": 7')
    conts = {c.text: c.confidence for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)}
    assert conts[', "kind": "'] > 0.4 and conts["}}"] > 0.4  # 7 is a request number, whole
    scan.feed(', "kind": "nat')
    conts = structure_continuations(scan, tools, Habits(), "arguments", (), values)
    assert conts[0].text.startswith('ure"}}')  # the enum value, then the close
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "plan", "arguments": {"city": "Tok')
    ends = [c for c in structure_continuations(scan, tools, Habits(), "arguments", (), values) if c.text[0] == '"']
    assert ends and max(c.confidence for c in ends) < 0.3  # mid-word: ending here is a side branch


def test_dates_and_times_the_request_names_are_drafted_as_iso_values_once_the_year_is_written():
    values = ValueSource("Add a meeting on December 15th at 2 PM. Also the 3rd of March 2022, at 9:30am")
    assert values.dates == [("2022", 3, 3), (None, 12, 15)] and values.times == ["09:30", "14:00"]
    assert "12-15 14:00:00" in values.date_endings("2023-")  # the year the target chose, the request's date
    assert "-12-15 14:00:00" in values.date_endings("2023")  # from the year's last digit on
    assert values.date_endings("2023-12-15 1") == ["4:00:00", "4:00"]
    assert values.date_endings("20") == ["22-03-03 09:30:00", "22-03-03 14:00:00", "22-03-03", "22-03-03 09:30"]
    assert ValueSource("no dates here, 12 items").date_endings("2") == []
    tools = [Tool("add", parameters=(Param("time"),))]
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "add", "arguments": {"time": "2023-12-')
    texts = [c.text for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)]
    assert '15 14:00:00"}}' in texts
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "add", "arguments": {"time": "2')  # begun with a digit: the ISO date before the spans
    best = max(structure_continuations(scan, tools, Habits(), "arguments", (), values), key=lambda c: c.confidence)
    assert best.text == '022-03-03 09:30:00"}}'


def test_an_array_of_strings_is_drafted_item_by_item_from_the_request():
    tools = [Tool("meet", parameters=(Param("attendees", type="array", items=Param("", type="string")),
                                      Param("room"))),
             Tool("rooms", parameters=(Param("ids", type="array", items=Param("", type="integer")),))]
    values = ValueSource("a meeting with John Smith and Jane Doe in Room A")

    def texts(written, call='{"name": "meet", "arguments": {"attendees": ['):
        scan = CallScanner(Habits().style)
        scan.feed(call + written)
        conts = structure_continuations(scan, tools, Habits(), "arguments", (), values)
        return [c.text for c in sorted(conts, key=lambda c: -c.confidence)]

    assert texts("") == ['"']
    assert {' Smith", "', ' Smith"], "room": "'} <= set(texts('"John')[:4])  # the span, then an item or the end
    assert set(texts('"John Smith"')) == {', "', '], "room": "'}
    assert set(texts('"Qx')) == {'", "', '"], "room": "'}  # nothing of the request: only the item's end
    assert texts("1, ", '{"name": "rooms", "arguments": {"ids": [') == []  # an array of numbers: nothing


def test_values_the_request_gives_an_argument_by_name_are_drafted_with_its_key():
    values = ValueSource('My email is jane@example.com, username is JaneSmith, and password is pw1.\n'
                         'The meeting topic is Sales Meeting. My account identifier is user4. My password is pw2.')
    assert values.named("username") == ["JaneSmith"] and values.named("email") == ["jane@example.com"]
    assert values.named("password") == ["pw2", "pw1"]  # latest mention first
    assert values.named("meeting_topic") == ["Sales Meeting"] and values.named("account") == ["user4"]
    assert values.named("token") == [] and ValueSource("").named("password") == []
    tools = [Tool("login", parameters=(Param("username"), Param("password"), Param("remember", type="boolean")))]
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "login", "arguments": {"username": "JaneSmith"')
    texts = [c.text for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)]
    # Each guess runs on into the next key, so that a right guess and the key after it cost one forward.
    assert ', "password": "' in texts and ', "password": "pw2", "remember": ' in texts
    assert ', "password": "pw1", "remember": ' in texts
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "login", "arguments": {"username": "')  # the value not begun: the named guesses alone
    assert [c.text for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)] == [
        'JaneSmith", "password": "pw2", "remember": ']  # through the value named for the next key too
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "login", "arguments": {"username": "x", "password": "y", "remember": ')
    assert all("pw" not in c.text for c in structure_continuations(scan, tools, Habits(), "arguments", (), values))


def test_a_first_request_drafts_the_openers_closers_and_indentation_targets_are_known_to_write():
    """Before a target has finished a request nothing of its habits is known: a dialect's opener may come after a
    fence, other known openers are side branches, a newline after a brace is likeliest an indent of 2."""
    scan = CallScanner(Habits().style)
    scan.feed("```")
    conts = {c.text: c.confidence for c in structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters",
                                                                   ("<tool_call>\n",))}
    assert '<tool_call>\n{"name": "' in conts and 'json\n{"name": "' in conts  # after the fence; ```json
    scan.feed('<tool_call>\n{"name": "CancelRegistration", "parameters": {"appointment_id": "1"}}')
    assert [c.text for c in structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ())] == [
        "\n</tool_call>\n```"]  # both close, inside out
    scan = CallScanner(Habits().style)
    scan.feed("```json\n{\n")
    conts = structure_continuations(scan, APIBANK_TOOLS, Habits(), "parameters", ("<tool_call>\n",))
    assert conts[0].text == '  "name": "'


def test_values_an_earlier_call_or_tool_result_gave_the_argument_are_guessed():
    values = ValueSource('<tool_call>{"name": "GetUserToken", "parameters": {"username": "JohnDoe"}}</tool_call>\n'
                         "<obs> {'token': 'a9s8d7f6'} </obs> then \"name\": \"Ann\"")
    assert values.named("token") == ["a9s8d7f6"] and values.named("username") == ["JohnDoe"]
    assert values.named("name") == ["Ann"]  # the call's own "name" (a tool's, before "parameters") is no value


def test_quoted_strings_and_dates_are_guessed_before_a_value_begins():
    values = ValueSource('Add "Meeting with clients" on December 15, 2023 at 2 PM; the sequence \'AGTC\'. '
                         "Result: {'status': 'done'}; booked for 2023-10-15.")
    assert values.quoted == ["AGTC", "Meeting with clients"]  # latest first; a dict's keys and values are not
    assert values.whole_dates[0] == "2023-10-15" and "2023-12-15 14:00:00" in values.whole_dates
    assert ValueSource("on March 20th at 2pm").date_endings("") == []  # no year named: nothing before it is written
    tools = [Tool("add", parameters=(Param("content"), Param("date"), Param("n", type="integer")))]
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "add", "arguments": {"content": "')
    conts = {c.text: c.confidence for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)}
    assert conts['AGTC", "date": "'] > conts['Meeting with clients", "date": "'] > 0
    scan.feed('Meeting with clients", "date": "')
    conts = {c.text: c.confidence for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)}
    assert max(conts, key=conts.get) == '2023-10-15", "n": '  # a date argument: the request's dates, not quotes
    assert not any("AGTC" in text for text in conts)


def test_the_tool_the_dialogue_points_to_is_the_likeliest_name():
    tools = [Tool("GetUserToken", "Get the user token by username and password"),
             Tool("AddAgenda", "Add an agenda item with content, time and location"),
             Tool("QueryStock", "Query the stock price of a company on a date")]
    weights = tool_weights(tools, 'Add "Meeting" to my agenda at 2 PM.')
    assert max(range(3), key=weights.__getitem__) == 1 and abs(sum(weights) - 1) < 1e-9
    called = '<tool_call>{"name": "AddAgenda", "parameters": {}}</tool_call> now the price of that stock'
    assert max(range(3), key=tool_weights(tools, called).__getitem__) == 2  # called already: another tool next
    assert tool_weights(tools[:1], "anything") == [1.0]
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "')
    conts = structure_continuations(scan, tools, Habits(), "arguments", (), ValueSource("add it to my agenda"))
    assert max(conts, key=lambda c: c.confidence).text.startswith('AddAgenda", "arguments": {')


def test_an_array_of_numbers_is_drafted_item_by_item_from_the_request():
    tools = [Tool("fit", parameters=(Param("values", type="array", items=Param("", type="number")), Param("k")))]
    values = ValueSource("trait A has a value of 0.8 and trait B a value of 0.7.")
    assert values.number_endings("0.") == ["7", "8"]  # a number ending a sentence is a number

    def best(written):
        scan = CallScanner(Habits().style)
        scan.feed('{"name": "fit", "arguments": {"values": [' + written)
        conts = structure_continuations(scan, tools, Habits(), "arguments", (), values)
        return max(conts, key=lambda c: c.confidence).text if conts else None

    assert best("") is None  # no item begun: nothing says which
    assert best("0.") == "8, 0.7"  # the request's number, then the one it names next
    assert best("0.8") == ", 0.7" and best("0.8, 0.7") == '], "k": "'


def test_numeric_arguments_are_guessed_in_the_order_the_request_gives_its_numbers():
    values = ValueSource("Plan a 7 days trip to Tokyo with daily budgets not exceeding $100, for 2 people.")
    assert values.next_numbers("") == ["7", "100", "2"]
    assert values.next_numbers('{"days": 7, "budget": ') == ["100", "2"]  # after the last number the call used
    assert values.next_numbers('{"days": 100') == ["2"]
    tools = [Tool("plan", parameters=(Param("city"), Param("days", type="integer"), Param("budget", type="number")))]
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "plan", "arguments": {"city": "Tokyo", "days": ')
    conts = structure_continuations(scan, tools, Habits(), "arguments", (), values)
    assert max(conts, key=lambda c: c.confidence).text == '7, "budget": '  # the value, then the next key
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "plan", "arguments": {"city": "Tokyo')  # the value may end here: the next key's guess too
    texts = [c.text for c in structure_continuations(scan, tools, Habits(), "arguments", (), values)]
    assert '", "days": ' in texts and '", "days": 7, "budget": ' in texts


ACCOUNT = Tool("OpenBankAccount", "Open a bank account.", (Param("account", "string"), Param("password", "string")))
ACCOUNT_PROMPT = ("1. Name: OpenBankAccount\nDescription: Open a bank account.\nParameters: {'account': {'type': "
                  "'str', 'description': 'The account identifier for the user.'}, 'password': {'type': 'str', "
                  """'description': "The user's password."}}\n2. Name: Other\nParameters: {'x': {'type': 'int'}}""")


# A target that copies the listing: pastes the schema in 12 calls of 100, the label as the name in 6 of 100.
COPIES_LISTING = DialectProfile("listing", pasted_schema=Rate(12, 100), paste_continued=Rate(9, 10),
                                listing_label=Rate(6, 100), label_alone=Rate(6, 10))


def test_schema_entries_are_read_where_the_prompt_shows_a_tools_parameters():
    entries = schema_entries(ACCOUNT_PROMPT, [ACCOUNT])
    assert entries == {"OpenBankAccount": {
        "account": {"type": "str", "description": "The account identifier for the user."},
        "password": {"type": "str", "description": "The user's password."}}}
    # Not shown (a chat template's tool block is not in the turns), shown in part, or cut off: left out, no error.
    assert schema_entries("You call tools.", [ACCOUNT]) == {}
    assert schema_entries(ACCOUNT_PROMPT.replace("'password'", "'pin'"), [ACCOUNT]) == {}
    assert schema_entries(ACCOUNT_PROMPT[:150], [ACCOUNT]) == {}
    # An entry that is not a schema (no type, no description) is no schema to paste.
    assert schema_entries(ACCOUNT_PROMPT.replace("'type': 'str', 'description'", "'kind': 'str', 'note'", 1),
                          [ACCOUNT]) == {}


def test_the_schema_pasted_as_values_is_a_side_branch_and_followed_once_begun():
    pasted = ShownTools.from_prompt(ACCOUNT_PROMPT, [ACCOUNT])
    paste = ('{"type": "str", "description": "The account identifier for the user."}, "password": {"type": "str", '
             '"description": "The user\'s password."}}}')
    scan = CallScanner(Habits().style)
    scan.feed('<tool_call>\n{"name": "OpenBankAccount"')
    conts = structure_continuations(scan, [ACCOUNT], Habits(), "parameters", ("<tool_call>\n",), ValueSource(""),
                                    pasted, COPIES_LISTING)
    head = ', "parameters": {"account": '
    assert conts[0].text == head + '"'  # a value is still the likeliest
    side = [c for c in conts if c.text == head + paste]
    assert len(side) == 1 and side[0].confidence == pytest.approx(0.9 * COPIES_LISTING.pasted_schema.share)
    # Once the first value is a `{`, the rest of the paste comes first, through the call's close and its closer.
    scan.feed(head + '{"type": "str", "desc')
    conts = structure_continuations(scan, [ACCOUNT], Habits(), "parameters", ("<tool_call>\n",), ValueSource(""),
                                    pasted, COPIES_LISTING)
    assert conts[0].text == paste[len('{"type": "str", "desc'):]
    assert conts[0].confidence == COPIES_LISTING.paste_continued.share
    assert conts[1].text == conts[0].text + "\n</tool_call>" and conts[1].end_of_turn
    # A value written otherwise: no paste, before or after it (and none for a prompt that does not show them).
    other = CallScanner(Habits().style)
    other.feed('<tool_call>\n{"name": "OpenBankAccount", "parameters": {"account": "u1", "password": ')
    conts = structure_continuations(other, [ACCOUNT], Habits(), "parameters", (), ValueSource(""), pasted,
                                    COPIES_LISTING)
    assert conts and not any("description" in c.text for c in conts)
    scan = CallScanner(Habits().style)
    scan.feed('<tool_call>\n{"name": "OpenBankAccount"')
    assert not any("description" in c.text for c in structure_continuations(
        scan, [ACCOUNT], Habits(), "parameters", (), ValueSource(""), ShownTools({}), COPIES_LISTING))


def test_a_pretty_printing_target_pastes_the_schema_indented():
    pasted = ShownTools.from_prompt(ACCOUNT_PROMPT, [ACCOUNT])
    habits = Habits()
    scan = CallScanner(habits.style)
    scan.feed('```json\n{\n  "name": "OpenBankAccount",\n  "parameters": {\n    "account": {\n      "type": "str",\n')
    conts = structure_continuations(scan, [ACCOUNT], habits, "parameters", (), ValueSource(""), pasted,
                                    COPIES_LISTING)
    assert conts[0].text == ('      "description": "The account identifier for the user."\n    },\n    "password": {\n'
                             '      "type": "str",\n      "description": "The user\'s password."\n    }\n  }\n}')


def test_the_listings_label_written_as_the_name_still_drafts_the_tools_arguments():
    tools = [ACCOUNT, Tool("QueryStock", "Stock price.", (Param("stock_code", "string"),))]
    listing = ACCOUNT_PROMPT.replace("2. Name: Other", "2. Name: QueryStock").replace("'x'", "'stock_code'")
    shown = ShownTools.from_prompt(listing, tools)
    assert shown.label == "Name" and name_label("OpenBankAccount and QueryStock", tools) is None
    values = ValueSource("Open an account for me, my account is user7.")  # the dialogue points to OpenBankAccount
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "')
    conts = structure_continuations(scan, tools, Habits(), "parameters", (), values, shown, COPIES_LISTING)
    alone = [c for c in conts if c.text.startswith('Name", "parameters": {"account": "')]
    assert alone and alone[0].confidence == pytest.approx(0.9 * 0.06 * 0.6)
    assert any(c.text.startswith('Name: QueryStock", "parameters": {"stock_code": "') for c in conts)
    assert conts[0].text.startswith("OpenBankAccount")  # a real name stays the likeliest
    # The label alone means the tool the dialogue points to; with a name, that tool: both draft its keys.
    scan.feed('Name", "parameters": {"account": "user7"')
    assert structure_continuations(scan, tools, Habits(), "parameters", (), values, shown, COPIES_LISTING)[0].text \
        == ', "password": "'
    labelled = CallScanner(Habits().style)
    labelled.feed('{"name": "Name: QueryStock", "parameters": {')
    assert structure_continuations(labelled, tools, Habits(), "parameters", (), values, shown, COPIES_LISTING)[0].text \
        .startswith('"stock_code": "')
    # Without a label in the prompt, "Name" is a tool the request does not offer: nothing is drafted for it.
    assert structure_continuations(labelled, tools, Habits(), "parameters", (), values, ShownTools({}),
                                   COPIES_LISTING) == []


def test_a_whole_date_written_is_drafted_on_with_the_time_the_request_names():
    values = ValueSource("Add a meeting on 2022-05-06 at 2 PM, and remind me to call mom tomorrow at 10:30 am.")
    # The request's own ISO date, once begun, with each time it names (latest mention first).
    assert values.date_endings("2022-05")[:2] == ["-06 10:30:00", "-06 14:00:00"]
    # A date the request only implies ("tomorrow"): once the target has written it whole, the times follow.
    assert values.date_endings("2023-04-01") == [" 10:30:00", " 14:00:00", " 10:30", " 14:00"]
    assert values.date_endings("2023-04-0") == []  # not whole yet, and no such date in the request
    assert ValueSource("tomorrow, please").date_endings("2023-04-01") == []  # no time named: nothing to add
