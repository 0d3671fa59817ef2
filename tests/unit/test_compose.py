"""docker-compose.yml parses and stays consistent with the native stack's configuration.

No Docker engine here: this checks the file itself against the code it must agree with.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from outbox_connect.settings import ConnectorSettings
from outbox_lake.settings import LakeSettings
from outbox_relay.settings import RelaySettings
from outbox_stack.artifacts import java_versions
from outbox_stack.connect import CONNECT_GROUP, ConnectWorker
from outbox_stack.settings import StackSettings

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(TEXT)
SERVICES = COMPOSE["services"]


def host_port(service: str) -> int:
    (mapping,) = SERVICES[service]["ports"]
    return int(mapping.split(":")[1])


def test_the_pipeline_services_are_there() -> None:
    assert {"postgres", "kafka", "connect", "migrate", "connector", "relay", "lake"} <= set(
        SERVICES
    )
    assert SERVICES["connector"]["command"] == ["connect", "apply"]
    assert SERVICES["connector"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )


def test_images_match_the_native_stack_versions() -> None:
    """The pinned Java versions (stack/outbox_stack/java/pom.xml) are the images' tags."""
    versions = java_versions()
    assert SERVICES["connect"]["image"] == (
        f"quay.io/debezium/connect:{versions['debezium.version']}"
    )
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{versions['kafka.version']}"


def test_host_ports_are_the_native_stacks() -> None:
    defaults = StackSettings()
    assert host_port("postgres") == defaults.postgres_port
    assert host_port("connect") == defaults.connect_port
    assert (
        f"127.0.0.1:{defaults.broker_port}"
        in SERVICES["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert "wal_level=logical" in SERVICES["postgres"]["command"]


def test_connect_worker_settings_match() -> None:
    environment = SERVICES["connect"]["environment"]
    worker = ConnectWorker(StackSettings(), bootstrap_servers="x:1").worker_properties()
    assert environment["GROUP_ID"] == CONNECT_GROUP == worker["group.id"]
    for variable, key in (
        ("CONFIG_STORAGE_TOPIC", "config.storage.topic"),
        ("OFFSET_STORAGE_TOPIC", "offset.storage.topic"),
        ("STATUS_STORAGE_TOPIC", "status.storage.topic"),
    ):
        assert environment[variable] == worker[key]
    assert (
        environment["CONNECT_EXACTLY_ONCE_SOURCE_SUPPORT"]
        == (worker["exactly.once.source.support"])
    )
    assert environment["CONNECT_CONFIG_PROVIDERS_ENV_CLASS"] == worker["config.providers.env.class"]
    # compose reads `$$` as one `$`; the same allow-list as the native worker's.
    assert (
        environment["CONNECT_CONFIG_PROVIDERS_ENV_PARAM_ALLOWLIST_PATTERN"].replace("$$", "$")
        == worker["config.providers.env.param.allowlist.pattern"]
    )
    assert "OUTBOX_CONNECT_DATABASE_PASSWORD" in environment, "the connector's ${env:...} secret"


def test_the_relay_service_matches_its_settings() -> None:
    relay = SERVICES["relay"]
    assert relay["command"] == ["relay", "run"]
    environment = relay["environment"]
    known = {f"OUTBOX_RELAY_{name.upper()}" for name in RelaySettings.model_fields}
    known |= {"OUTBOX_DATABASE_URL", "OUTBOX_KAFKA_BOOTSTRAP_SERVERS"}
    assert set(environment) <= known, set(environment) - known
    settings = RelaySettings(
        **{  # the values validate
            name.removeprefix("OUTBOX_RELAY_").lower(): value
            for name, value in environment.items()
            if name.startswith("OUTBOX_RELAY_")
        }
    )
    assert settings.mode.value == "auto"
    assert relay["ports"] == [f"127.0.0.1:58090:{settings.http_port}"]
    assert environment["OUTBOX_DATABASE_URL"].startswith("postgresql+psycopg://outbox_relay:")
    # The heartbeat topic is derived, as the connector's, from settings compose leaves alone.
    assert "OUTBOX_RELAY_CDC_HEARTBEAT_TOPIC" not in environment
    assert not {"OUTBOX_CONNECT_TOPIC_PREFIX", "OUTBOX_SCHEMA_NAME", "OUTBOX_TABLE"} & (
        set(environment) | set(SERVICES["connector"]["environment"])
    )
    assert relay["healthcheck"]["test"] == ["CMD", "outbox", "relay", "health"]
    assert "relay-role" in " ".join(SERVICES["migrate"]["entrypoint"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "USER outbox" in dockerfile and "HEALTHCHECK" in dockerfile


def test_outbox_variables_are_real_settings() -> None:
    known = {f"OUTBOX_CONNECT_{name.upper()}" for name in ConnectorSettings.model_fields}
    known |= {"OUTBOX_DATABASE_URL"}
    known |= {f"OUTBOX_RELAY_{name.upper()}" for name in RelaySettings.model_fields}
    for service in ("migrate", "connector"):
        names = set(SERVICES[service]["environment"])
        assert names <= known, names - known
    connector_file = (ROOT / "connect" / "outbox_connect" / "outbox-connector.json").read_text()
    assert "${env:OUTBOX_CONNECT_DATABASE_PASSWORD}" in connector_file
    assert re.findall(r"\{\{(\w+)\}\}", connector_file), "the file is the shared template"


def test_the_lake_service_matches_its_settings() -> None:
    lake = SERVICES["lake"]
    assert lake["command"] == ["lake", "ingest"]
    environment = lake["environment"]
    known = {f"OUTBOX_LAKE_{name.upper()}" for name in LakeSettings.model_fields}
    known.add("OUTBOX_KAFKA_BOOTSTRAP_SERVERS")
    assert set(environment) <= known, set(environment) - known
    settings = LakeSettings(
        **{
            name.removeprefix("OUTBOX_LAKE_").lower(): value
            for name, value in environment.items()
            if name.startswith("OUTBOX_LAKE_")
        }
    )
    assert f"lake-data:{settings.root}" in lake["volumes"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "openjdk-17" in dockerfile and "COPY lake" in dockerfile
    # Spark's Kafka source and Delta's writer are fetched into the image at build time.
    assert "outbox lake packages --jars" in dockerfile


def test_secrets_have_no_default_and_a_message_when_missing() -> None:
    """No `change-me` fallback: every variable compose interpolates is `${VAR:?message}`."""
    assert "change-me" not in TEXT.lower()
    uncommented = re.sub(r"(^|\s)#.*", "", TEXT, flags=re.MULTILINE)
    references = re.findall(r"(?<!\$)\$\{(\w+)([^}]*)\}", uncommented)
    assert {name for name, _ in references} == {
        "POSTGRES_PASSWORD",
        "CDC_PASSWORD",
        "RELAY_PASSWORD",
    }
    for name, rest in references:
        assert rest.startswith(":?") and name in rest, f"${{{name}{rest}}}: use ${{{name}:?…}}"
