"""The call scanner: where a tool call being written stands, and the structure that may follow it."""

from helpers import APIBANK_TOOLS

from oospec.tools.callscan import CallScanner, Habits, structure_continuations


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
