"""Early, incremental hints (issue 46): a payload published while its slots still grow (`Guess.pending`), the
SidecarDrafter proposing what it knows without closing the call early, and the slot rows' cost: rows ride only
where the target's cost curve says they pay, and none grows a value the target has written already."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from test_sidecar import END, TOOLS, drafter_after

from oospec.drafters.inline import written_arguments
from oospec.engine.budget import CostModel
from oospec.sidecar.inline import SlotRowSidecar, _Slot, _Ticket
from oospec.sidecar.protocol import Guess, Job, PayloadError, encode_payload, parse_payload
from oospec.tools.callscan import CallScanner
from oospec.tools.render import Style

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {'
# city and metric known, days (required, an integer) still growing
DAYS_PENDING = Guess("get_weather", {"city": "Paris", "metric": True}, pending=("days",))


def test_pending_slots_cross_the_protocol_and_only_valid_ones():
    raw = encode_payload("r", [DAYS_PENDING], 0.1, 1.0)
    payload = parse_payload(raw, "r", TOOLS)
    assert payload.best == DAYS_PENDING and not payload.complete
    whole = parse_payload(encode_payload("r", [Guess("get_weather", {"city": "Paris"})], 0.1, 1.0), "r", TOOLS)
    assert whole.complete and whole.best.pending == ()
    bad = parse_payload(encode_payload("r", [Guess("get_weather", {"city": "P"}, pending=("zone", "city"))],
                                       0, 0), "r", TOOLS)
    assert bad.best.pending == () and len(bad.dropped) == 2  # not a parameter; given already
    with pytest.raises(PayloadError):
        parse_payload(b'{"id": "r", "function": "get_weather", "pending": "days"}', "r", TOOLS)


@pytest.mark.parametrize("written, expected", [
    # The opening, the known values, then the pending slot's key: never its value nor the closing braces.
    ("", CALL + '"city": "Paris", "days": '),
    (CALL + '"city": "Lyon", ', '"days": '),
    (CALL + '"city": "Paris", "days": 4', None),  # inside the pending slot's value: nothing to say
    # Once the target has written the pending slot, the rest is whole: through the closer and end of turn.
    (CALL + '"city": "Paris", "days": 4, ', '"metric": true}}' + END),
])
def test_a_partial_hint_stops_at_its_first_pending_slot(written, expected):
    _, texts = drafter_after(written, [DAYS_PENDING])
    assert texts == ([] if expected is None else [expected])


def test_a_pending_optional_slot_is_not_taken_for_an_absent_one():
    """Without `pending`, a hint lacking the optional `unit` would close the call after `metric`."""
    guess = Guess("get_weather", {"city": "Paris", "days": 3, "metric": True}, pending=("unit",))
    _, texts = drafter_after(CALL + '"city": "Paris", "days": 3, ', [guess])
    assert texts == ['"metric": true, "unit": "']  # the enum's opening quote: a string follows
    _, texts = drafter_after(CALL + '"city": "Paris", "days": 3, ', [Guess(guess.function, guess.arguments)])
    assert texts == ['"metric": true}}' + END]


def test_a_fuller_payload_replaces_the_early_one():
    drafter, texts = drafter_after("", [DAYS_PENDING])
    fuller = Guess("get_weather", {"city": "Paris", "days": 3, "metric": True})
    drafter.sidecar.guesses = [fuller]
    context = np.array([ord("x")], dtype=np.int64)
    texts = ["".join(map(chr, c.tokens)) for c in drafter.candidates(context)]
    assert texts[0].startswith(CALL + '"city": "Paris", "days": 3, "metric": true}}\n<')  # on to the closer
    assert drafter.payload.complete and drafter.report.slot_arrivals == {"city": 0, "metric": 0, "days": 0}
    assert drafter.report.tokens_written_at_complete == 0


# -- what the rows cost --------------------------------------------------------------------------------------

def rows_with(curve: dict, queued: int = 30) -> SlotRowSidecar:
    """A sidecar with one job choosing get_weather, its two free slots growing, `queued` rows waiting."""
    rows = SlotRowSidecar(cost=CostModel.from_curve(curve))
    tool = TOOLS[0]
    ticket = _Ticket(Job("r", [], []), [tool], chosen=tool,
                     slots=[_Slot(tool.param("city"), True), _Slot(tool.param("days"), True)])
    rows.tickets = [ticket]
    rows.queue = deque((k,) for k in range(queued))
    return rows


def test_rows_ride_only_where_they_pay_for_the_wider_forward():
    # Free up to 16 rows, then each row costs most of a forward: past the knee no row's share of the saving pays.
    knee = {1: 1.0, 16: 1.0, 17: 10.0, 64: 50.0}
    rows = rows_with(knee)
    assert rows.rows_worth(beside=4, wanted=30) == 12
    feed = rows.slot_feed(np.zeros(1, dtype=np.int64), rows=32, beside=4)
    assert len(feed) == 12 and len(rows.queue) == 18
    assert rows_with({1: 1.0, 4096: 1.0}).rows_worth(beside=4, wanted=30) == 30  # a flat curve: all
    assert rows_with({1: 1.0, 64: 64.0}).rows_worth(beside=4, wanted=30) == 0  # each row a whole forward: none
    idle = rows_with(knee, queued=0)
    idle.tickets[0].slots = []
    assert idle.rows_worth(beside=4, wanted=5) == 0  # nothing left to predict: nothing saves


def test_a_target_that_writes_calls_fast_alone_gets_fewer_rows():
    gentle = {1: 1.0, 64: 2.0}  # each row a sixty-third of a forward
    slow, fast = rows_with(gentle), rows_with(gentle)
    for _ in range(50):
        slow.observe(np.zeros(1, dtype=np.int64))  # plain decoding's pace: a hinted token saves most of a forward
        fast.observe(np.zeros(12, dtype=np.int64))  # as fast as a hint would make it: nothing to save
    assert slow.rows_worth(beside=4, wanted=30) == 30
    assert fast.rows_worth(beside=4, wanted=30) == 0


def test_no_row_grows_a_value_the_target_has_written():
    rows = rows_with({1: 1.0, 4096: 1.0}, queued=0)
    ticket = rows.tickets[0]
    city, days = ticket.slots
    city.primer, city.value, days.primer, days.value = (1,), [5, 6], (2,), [7]
    rows.growing = {(1, 5, 6): [city], (2, 7): [days]}
    rows.queue = deque([(1, 5, 6), (2, 7)])
    rows.written(ticket, "get_weather", {"city"}, closed=False)
    assert city.done and rows.growing == {(2, 7): [days]} and list(rows.queue) == [(2, 7)]
    assert ticket.payload.best.pending == ("days",) and "city" not in ticket.payload.best.arguments
    rows.written(ticket, "get_weather", set(), closed=True)  # the call is closed: the job ends, its rows too
    assert not rows.tickets and not rows.queue and rows.slot_feed(np.zeros(1, dtype=np.int64), 32) is None


def test_written_arguments_are_those_whose_values_are_finished():
    def after(text):
        scan = CallScanner(Style())
        scan.feed(text)
        return written_arguments(scan)

    assert after(CALL) == set()
    assert after(CALL + '"city": "Par') == set()
    assert after(CALL + '"city": "Paris"') == {"city"}
    assert after(CALL + '"city": "Paris", "days": 3') == {"city"}
    assert after(CALL + '"city": "Paris", "days": 3, "met') == {"city", "days"}


def test_the_tree_gives_way_to_slot_rows_worth_more_than_its_last_nodes():
    """decode.draft sizes the tree beside the rows the drafter offers: past one x block a row costs a step, so rows
    ride only where the tree leaves room, and only when they are credited with more than the nodes they replace."""
    from oospec.engine.decode import DecodeState, GenerationStats, draft
    from oospec.engine.drafting import Candidate, Drafter

    class Offering(Drafter):
        slot_rows, slot_store = 32, 1024
        cost = CostModel.from_curve({1: 1.0, 16: 1.3, 17: 1.6, 64: 4.0})

        def __init__(self, credit: float):
            self.credit, self.asked = credit, []

        def candidates(self, context):
            return [Candidate(np.arange(10, 40), 0.95, 0.85)]

        def slot_offer(self):
            return 6, self.credit

        def slot_feed(self, context, rows, beside=1):
            self.asked.append(beside)
            return None

    def tree_with(credit: float) -> int:
        state = DecodeState(np.zeros(64, dtype=np.int64), 4, 40, 16, 32, np.zeros(0, dtype=np.int64), None, None,
                            None, None, n=5)
        drafter = Offering(credit)
        tree, _ = draft(drafter, state, GenerationStats())
        assert drafter.asked == [len(tree) + 1]  # the rows are then fed beside that tree
        return len(tree)

    alone = tree_with(0.0)
    assert 12 <= alone <= 15 and tree_with(0.05) < alone  # credited rows take the tail's place
