"""Each panel read on a thread of its own, so that a page never waits on a component.

As the relay's :class:`~outbox_relay.metrics.SlotWatch` keeps a scrape from waiting on the
database, a :class:`Watch` reads its component every ``interval_seconds`` and keeps the last
answer; a page shows that answer. A read under way for longer than ``answer_seconds`` shows
as "no answer in N s" (with the last answer, and its age); a read that fails shows as down,
with the reason. Nobody looking (no page asked for ``idle_seconds``): no reads, until the
next page asks (which then shows the last answer, and wakes the thread).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from outbox_console.panels import DOWN, SLOW, WAITING, Panel

__all__ = ["Watch", "reason_of"]


def reason_of(error: BaseException) -> str:
    """An error as one line for a panel: the driver's own message (not SQLAlchemy's
    wrapper, whose text carries the statement), its first line, at most 400 characters."""
    shown = getattr(error, "orig", None) or error
    text = " ".join(str(shown).strip().splitlines()[:1]) or type(shown).__name__
    line = f"{type(shown).__name__}: {text}"
    return line if len(line) <= 400 else line[:397] + "..."


class Watch:
    def __init__(
        self,
        name: str,
        read: Callable[[], Panel],
        *,
        interval_seconds: float,
        answer_seconds: float,
        idle_seconds: float = 60.0,
    ) -> None:
        self.name = name
        self._read = read
        self._interval = interval_seconds
        self._answer = answer_seconds
        self._idle = idle_seconds
        self._latest: Panel | None = None
        self._reading_since: float | None = None
        self._viewed = time.monotonic()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"console-{name}", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def panel(self) -> Panel:
        """The last answer (or what stands for it now); wakes the thread after an idle
        spell."""
        now = time.monotonic()
        idle = now - self._viewed > self._idle
        self._viewed = now
        if idle:
            self._wake.set()
        latest, since = self._latest, self._reading_since
        if since is not None and now - since > self._answer:
            facts = latest.facts if latest is not None else []
            last = f"; last answer {time.time() - latest.read_at:,.0f} s ago" if latest else ""
            return Panel(
                self.name,
                SLOW,
                f"no answer in {self._answer:g} s (asked {now - since:,.0f} s ago{last})",
                facts,
                read_at=latest.read_at if latest else time.time(),
            )
        if latest is None:
            return Panel(self.name, WAITING, "reading...")
        return latest

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._viewed <= self._idle:
                self._reading_since = time.monotonic()
                try:
                    found = self._read()
                except Exception as error:  # down: said in its panel, never raised to a page
                    found = Panel(self.name, DOWN, f"down: {reason_of(error)}")
                self._latest = found
                self._reading_since = None
            self._wake.wait(self._interval)
            self._wake.clear()
