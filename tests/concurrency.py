"""Run a function in several threads at once, in tests, and report what they raised."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(work: Callable[[int], None], count: int, *, timeout: float) -> None:
    """Call ``work(0)`` ... ``work(count - 1)`` in threads; re-raise the first error, and
    fail if a thread is still running after ``timeout`` seconds."""
    errors: list[BaseException] = []

    def guarded(number: int) -> None:
        try:
            work(number)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(number,)) for number in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), (
        f"threads still running after {timeout} s"
    )
    if errors:
        raise errors[0]
