"""What `outbox connect unblock` says a hanging transaction's abort does (pure)."""

from __future__ import annotations

from outbox_connect.open_transactions import OpenTransaction


def _open(state: str | None, outcome: str | None) -> OpenTransaction:
    return OpenTransaction(
        topic="outbox-connect-offsets",
        partition=3,
        producer_id=7,
        producer_epoch=1,
        coordinator_epoch=0,
        first_offset=40,
        idle_seconds=90,
        transactional_id="connect-cluster-outbox-0",
        coordinator_state=state,
        coordinator_outcome=outcome,
    )


def test_a_hanging_transaction_its_coordinator_committed_is_said_to_re_deliver() -> None:
    committed = _open(None, "CompleteCommit")
    assert committed.hanging and committed.abort_redelivers
    assert "aborting re-delivers its records" in committed.describe()
    assert "loses nothing" in committed.describe()


def test_a_hanging_transaction_never_committed_is_said_to_re_deliver_nothing() -> None:
    for outcome in ("CompleteAbort", "Empty", None):
        never = _open(None, outcome)
        assert never.hanging and not never.abort_redelivers
        assert "re-delivers nothing" in never.describe(), outcome


def test_one_its_coordinator_still_owns_is_left_to_it() -> None:
    owned = _open("Ongoing", None)
    assert not owned.hanging and not owned.abort_redelivers
    assert "ends it itself" in owned.describe()
