"""The CDC heartbeat topic has one owner, ``outbox.core.tables.cdc_heartbeat_topic``: the
connector file's predicate (which keeps heartbeats from the Event Router) and the relay's
default (which watches them in auto mode) agree with it for any names and topic prefix."""

from __future__ import annotations

import re

import pytest

from outbox import OutboxSettings
from outbox.core.tables import cdc_heartbeat_topic
from outbox_connect.config import render_connector_config
from outbox_connect.settings import ConnectorSettings
from outbox_relay.service import Relay
from outbox_relay.settings import RelayMode, RelaySettings

NAMES = [
    ("outbox", OutboxSettings()),
    ("dc-1.cdc_v2", OutboxSettings(schema_name="shop", table="order_events")),
    ("x", OutboxSettings(schema_name="s2", table="o")),
]


def heartbeat_predicate(config: dict[str, str]) -> re.Pattern[str]:
    """The Event Router skips what this matches (Kafka's TopicNameMatches: a full match)."""
    assert config["transforms.outbox.predicate"] == "isHeartbeat"
    assert config["transforms.outbox.negate"] == "true"
    return re.compile(config["predicates.isHeartbeat.pattern"])


@pytest.mark.parametrize(("prefix", "outbox"), NAMES, ids=[prefix for prefix, _ in NAMES])
def test_the_connector_skips_exactly_the_heartbeat_topic_of_its_names(
    prefix: str, outbox: OutboxSettings
) -> None:
    config = render_connector_config(ConnectorSettings(topic_prefix=prefix), outbox)
    tables = outbox.tables
    topic = cdc_heartbeat_topic(prefix, tables)
    predicate = heartbeat_predicate(config)
    assert predicate.fullmatch(topic)
    assert predicate.fullmatch(f"__debezium-heartbeat.{prefix}")  # Debezium's own beats
    # The outbox table's change events are events: routed, never skipped.
    assert not predicate.fullmatch(f"{prefix}.{tables.schema}.{tables.outbox}")
    assert not predicate.fullmatch(f"other.{tables.schema}.{tables.heartbeat}")
    # The heartbeat query writes the table whose changes become that topic.
    assert f"{tables.schema}.{tables.heartbeat}" in config["table.include.list"].split(",")
    assert f"INTO {tables.schema}.{tables.heartbeat} " in config["heartbeat.action.query"]


@pytest.mark.parametrize(("prefix", "outbox"), NAMES, ids=[prefix for prefix, _ in NAMES])
def test_the_relay_watches_the_heartbeat_topic_the_connector_writes(
    prefix: str, outbox: OutboxSettings
) -> None:
    relay = Relay(
        RelaySettings(mode=RelayMode.AUTO),
        database_url="postgresql+psycopg://user@127.0.0.1:1/db",  # never connected here
        kafka="127.0.0.1:1",
        tables=outbox.tables,
        cdc_topic_prefix=prefix,
    )
    assert relay.cdc_heartbeat_topic == cdc_heartbeat_topic(prefix, outbox.tables)
    config = render_connector_config(ConnectorSettings(topic_prefix=prefix), outbox)
    assert heartbeat_predicate(config).fullmatch(relay.cdc_heartbeat_topic)


def test_a_heartbeat_topic_set_for_the_relay_wins() -> None:
    relay = Relay(
        RelaySettings(cdc_heartbeat_topic="elsewhere.hb"),
        database_url="postgresql+psycopg://user@127.0.0.1:1/db",
        kafka="127.0.0.1:1",
        tables=OutboxSettings().tables,
    )
    assert relay.cdc_heartbeat_topic == "elsewhere.hb"


def test_the_defaults_name_the_documented_topic() -> None:
    assert cdc_heartbeat_topic(ConnectorSettings().topic_prefix, OutboxSettings().tables) == (
        "outbox.outbox.outbox_heartbeat"
    )
