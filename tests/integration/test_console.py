"""The console in a real browser (Debian's headless Chromium, driven by Selenium through
Debian's chromedriver) against the suite's real PostgreSQL, broker and Kafka Connect, with
the CDC connector and a relay in auto mode, the console run as ops run it (``outbox
console``, a process):

- the overview shows the connector running; after a ``kill -9`` of Connect its panel,
  refreshed by htmx (no reload), shows Connect down and the relay delivering; Connect
  started again, the connector runs again and CDC delivers again;
- an event published is found by its id, its lineage on one page;
- a row too large for the relay becomes a dead letter, shows on the dead letters' page, and
  is replayed from there (actions allowed) once CDC is back;
- a record an ``IdempotentConsumer`` could not handle (its handler always raises) shows
  there too, and is replayed from its own page: the record is on its topic again.

It makes the screenshots of docs/operations.md: into the folder ``OUTBOX_CONSOLE_SCREENSHOTS``
names (``OUTBOX_CONSOLE_SCREENSHOTS=docs/images`` refreshes the docs' own), else into a
temporary folder, so a run leaves the checkout as it was.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from outbox import Event, Outbox
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import event_id_of, topic_for
from tests.fix_cdc import CdcPath, cdc_path_for
from tests.fix_postgres import ROOT, free_port
from tests.fix_relay import RelayBench, RelayProcess, wait_until
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(900)

IMAGES = (
    ROOT / os.environ["OUTBOX_CONSOLE_SCREENSHOTS"]
    if os.environ.get("OUTBOX_CONSOLE_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "outbox-console-screenshots"
)
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def wait_for(
    browser: WebDriver, condition: Callable[[WebDriver], Any], *, timeout: float, what: str
) -> Any:
    """``condition(browser)`` once it is true; a failure naming ``what`` past ``timeout``."""
    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.2).until(condition)
    except Exception as error:
        text = browser.find_element(By.TAG_NAME, "body").text[:3000]
        raise AssertionError(f"not within {timeout} s: {what}\npage:\n{text}") from error


def panel(browser: WebDriver, name: str) -> tuple[str, str]:
    """A panel's state (``ok``, ``down``...) and its text; empty while htmx swaps it."""
    found = browser.find_elements(By.ID, f"panel-{name}")
    if not found:
        return "", ""
    try:
        return found[0].get_attribute("data-state") or "", found[0].text
    except WebDriverException:  # swapped out between finding and reading it
        return "", ""


def running(browser: WebDriver) -> bool:
    """Connect's panel says the connector and its task run (a transaction left open on the
    offsets topic by the kill may make it ``warn`` meanwhile: the connector runs all the
    same)."""
    state, text = panel(browser, "kafka-connect")
    return state in ("ok", "warn") and re.search(r"task 0\s+RUNNING", text) is not None


def shown(browser: WebDriver, element_id: str) -> str:
    """The text of the page's element ``element_id`` (empty until it is there, or while the
    page replaces it)."""
    found = browser.find_elements(By.ID, element_id)
    try:
        return found[0].text if found else ""
    except WebDriverException:
        return ""


def outcome(browser: WebDriver) -> str:
    """The line an action's result page shows."""
    return shown(browser, "outcome")


def delivery(browser: WebDriver) -> str:
    """Who delivers now (the overview's delivery line)."""
    return shown(browser, "delivery")


def screenshot(browser: WebDriver, name: str) -> None:
    """The page, whole, as console-NAME.png in :data:`IMAGES`."""
    height = int(browser.execute_script("return document.documentElement.scrollHeight"))
    metrics = {"width": 1400, "height": min(max(height, 700), 3000), "deviceScaleFactor": 1}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "mobile": False})
    try:
        IMAGES.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(IMAGES / f"console-{name}.png"))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("install Debian's chromium and chromium-driver (apt-get install -y ...)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class ConsoleProcess:
    """``outbox console`` as ops run it: a process, its settings in its environment."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "outbox_cli.main", "console"],
                env={**os.environ, **env, "OUTBOX_CONSOLE_PORT": str(self.port)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def answers(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(f"{self.url}/static/console.css", timeout=2) as page:
                return page.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def publish(bench: RelayBench, events: list[Event]) -> None:
    with bench.database.connect() as connection, connection.transaction():
        Outbox().publish_many(connection, events)


class RefusingConsumer:
    """An ``IdempotentConsumer`` whose handler always raises (one attempt), on a thread until
    it has dead-lettered a record, or is stopped."""

    def __init__(self, bench: RelayBench, topic: str) -> None:
        self.engine = sa.create_engine(bench.database.url)
        self.consumer = IdempotentConsumer(
            name="console-refuser",
            group_id=f"console-refuser-{uuid.uuid4().hex[:6]}",
            topics=[topic],
            bootstrap_servers=bench.kafka.bootstrap_servers,
            begin=self.engine.begin,
            handler=self.refuse,
            max_attempts=1,
            consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def refuse(_connection: sa.Connection, event: ReceivedEvent) -> None:
        raise RuntimeError(f"the handler refuses {event.event_id}")

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.consumer.stats.dead_lettered == 0:
                self.consumer.poll_once(timeout_seconds=0.5)
        finally:
            self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.engine.dispose()
        assert not self.thread.is_alive(), "the refusing consumer did not stop within 30 s"


def connect_down_then_back(cdc: CdcPath) -> Callable[[], None]:
    """Kill Connect; the function that starts it again (idempotent)."""
    connect = cdc.kafka.connect
    connect.process.signal(signal.SIGKILL)
    wait_until(lambda: not connect.process.is_running(), timeout=30, what="Connect gone")

    def start_again() -> None:
        if not connect.process.is_running():
            cdc.kafka.start_connect()

    return start_again


def test_the_console_shows_the_pipeline_live_finds_events_and_replays_dead_letters(
    relay_bench: RelayBench, browser: WebDriver, tmp_path: Path
) -> None:
    kafka = relay_bench.kafka
    with cdc_path_for(kafka, relay_bench.database) as cdc:
        relay: RelayProcess = relay_bench.process(
            OUTBOX_RELAY_MODE="auto",
            OUTBOX_RELAY_GRACE_SECONDS="5",
            OUTBOX_RELAY_MAX_REQUEST_BYTES="4096",  # a 20 kB row is a dead letter
            OUTBOX_CONNECT_TOPIC_PREFIX=cdc.connector.topic_prefix,
            OUTBOX_RELAY_CONNECT_OFFSETS_TOPIC=kafka.offsets_topic,
        )
        console = ConsoleProcess(
            {
                "OUTBOX_DATABASE_URL": relay_bench.database.url,
                "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                "OUTBOX_CONNECT_URL": cdc.connector.url,
                "OUTBOX_CONNECT_NAME": cdc.connector.name,
                "OUTBOX_CONNECT_SLOT_NAME": cdc.connector.slot_name,
                "OUTBOX_CONNECT_OFFSETS_TOPIC": kafka.offsets_topic,
                "OUTBOX_LAKE_ROOT": str(tmp_path / "lake"),
                "OUTBOX_CONSOLE_RELAY_URLS": f"http://127.0.0.1:{relay.port}",
                "OUTBOX_CONSOLE_ALLOW_ACTIONS": "true",
                "OUTBOX_CONSOLE_REFRESH_SECONDS": "1",
            },
            tmp_path / "console.log",
        )
        start_connect: Callable[[], None] | None = None
        refuser: RefusingConsumer | None = None
        try:
            wait_until(console.answers, timeout=60, what="the console answers")
            wait_until(lambda: relay.probe("/readyz") == 200, timeout=60, what="the relay is ready")
            aggregate_type = f"c{uuid.uuid4().hex[:10]}"

            # The overview: the connector runs, CDC delivers.
            browser.get(console.url + "/")
            wait_for(
                browser,
                lambda b: (
                    running(b)
                    and panel(b, "relay")[0] == "ok"
                    and "by: CDC (Debezium)" in delivery(b)
                ),
                timeout=60,
                what="Connect's panel shows the connector RUNNING, and CDC delivering",
            )
            wait_for(
                browser,
                lambda b: all(
                    panel(b, name)[0] not in ("", "waiting")
                    for name in ("postgresql", "broker", "lake", "reconcile")
                ),
                timeout=30,
                what="every panel read once",
            )
            assert panel(browser, "postgresql")[0] == "ok", panel(browser, "postgresql")
            assert panel(browser, "broker")[0] == "ok", panel(browser, "broker")
            screenshot(browser, "overview")

            # An event published is found by its id, its lineage on one page.
            placed = Event(aggregate_type, "order-1", "OrderPlaced", {"total": "9.90"})
            publish(relay_bench, [placed])
            read_until(
                kafka.bootstrap_servers,
                topic_for(aggregate_type),
                lambda records: len(records) >= 1,
                timeout=60,
            )
            # A consumer that cannot handle it dead-letters it meanwhile (on its thread).
            refuser = RefusingConsumer(relay_bench, topic_for(aggregate_type))
            browser.get(console.url + "/events")
            field = browser.find_element(By.ID, "event-id")
            field.send_keys(str(placed.event_id))
            # CDC delivered it and the relay deleted its row; no lake here: its partition is
            # unknown, so every outbox topic is searched (as `outbox trace --scan-kafka`).
            browser.find_element(By.ID, "scan").click()
            field.submit()
            wait_for(
                browser,
                lambda b: (
                    b.find_elements(By.CSS_SELECTOR, "#lineage h2.found")
                    and topic_for(aggregate_type) in b.find_element(By.ID, "lineage").text
                ),
                timeout=90,
                what="the event's lineage, with its copy on Kafka",
            )
            screenshot(browser, "event")

            # Connect killed: its panel goes down, the relay takes over (no reload: htmx).
            browser.get(console.url + "/")
            start_connect = connect_down_then_back(cdc)
            huge = Event(aggregate_type, "order-2", "OrderPlaced", {"blob": "x" * 20_000})
            small = Event(aggregate_type, "order-3", "OrderPlaced", {"total": "1.00"})
            publish(relay_bench, [huge, small])
            wait_for(
                browser,
                lambda b: (
                    panel(b, "kafka-connect")[0] == "down"
                    and "relay" in delivery(b)
                    and "took over" in delivery(b)
                ),
                timeout=120,
                what="Connect's panel down and the relay delivering (took over)",
            )
            assert "cannot be reached" in panel(browser, "kafka-connect")[1]
            screenshot(browser, "overview-connect-down")

            # The row too large for the relay is a dead letter, on the dead letters' page, and
            # so is the record the consumer could not handle.
            consumer_row = f'tr.consumer-letter[data-event-id="{placed.event_id}"]'

            def listed(b: WebDriver) -> bool:
                b.get(console.url + "/dead-letters")
                return bool(
                    b.find_elements(
                        By.CSS_SELECTOR, f'tr.relay-letter[data-event-id="{huge.event_id}"]'
                    )
                    and b.find_elements(By.CSS_SELECTOR, consumer_row)
                )

            wait_for(browser, listed, timeout=60, what="both dead letters listed")
            refuser.close()
            assert (
                "RuntimeError: the handler refuses"
                in browser.find_element(By.CSS_SELECTOR, consumer_row).text
            )
            screenshot(browser, "dead-letters")

            # Connect back: the connector runs again, CDC delivers again.
            start_connect()
            browser.get(console.url + "/")
            wait_for(
                browser,
                lambda b: running(b) and "by: CDC (Debezium)" in delivery(b),
                timeout=240,
                what="the connector RUNNING again, and CDC delivering (the relay stepped back)",
            )

            # The cause gone (CDC has no 4 kB limit), the dead letter is replayed from the page.
            browser.get(console.url + "/dead-letters")
            row = browser.find_element(
                By.CSS_SELECTOR, f'tr.relay-letter[data-event-id="{huge.event_id}"]'
            )
            row.find_element(By.CSS_SELECTOR, "button.replay").click()
            wait_for(
                browser,
                lambda b: "back in the outbox" in outcome(b),
                timeout=60,
                what="the replay's outcome",
            )
            assert not browser.find_elements(
                By.CSS_SELECTOR, f'tr.relay-letter[data-event-id="{huge.event_id}"]'
            )
            records = read_until(
                kafka.bootstrap_servers,
                topic_for(aggregate_type),
                lambda found: huge.event_id in {event_id_of(r.headers) for r in found},
                timeout=120,
            )
            delivered = {event_id_of(record.headers) for record in records}
            assert {placed.event_id, huge.event_id, small.event_id} <= delivered

            # The consumer's dead letter, replayed from its page: its record is on the topic
            # again (the consumer gone, nothing dead-letters the copy).
            browser.get(console.url + "/dead-letters")
            browser.find_element(By.CSS_SELECTOR, f"{consumer_row} a").click()
            wait_for(
                browser,
                lambda b: b.find_elements(By.CSS_SELECTOR, "button.replay"),
                timeout=30,
                what="the consumer's dead letter on its own page",
            )
            assert "replay\npossible" in browser.find_element(By.CSS_SELECTOR, "dl.letter").text
            browser.find_element(By.CSS_SELECTOR, "button.replay").click()
            wait_for(
                browser,
                lambda b: "replayed as" in outcome(b),
                timeout=60,
                what="the consumer replay's outcome",
            )
            assert not browser.find_elements(By.CSS_SELECTOR, consumer_row)
            read_until(
                kafka.bootstrap_servers,
                topic_for(aggregate_type),
                lambda found: [event_id_of(r.headers) for r in found].count(placed.event_id) >= 2,
                timeout=60,
            )
        finally:
            if refuser is not None:
                refuser.close()
            console.stop()
            if start_connect is not None:
                start_connect()
                cdc.client.wait_running(cdc.connector.name, timeout=180)
            relay.kill()
        if console.log.exists():
            log = console.log.read_text()
            assert "Traceback" not in log, log
