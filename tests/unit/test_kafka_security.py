"""Kafka security settings: one block, checked at start-up, secrets never shown; and every
client's options (kafka-python, Connect's Java clients, Spark) built from it in one place."""

from __future__ import annotations

import logging
import re
import ssl
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from outbox.core.errors import BrokerAuthorizationError, ConfigurationError
from outbox.kafka_clients import authorization_error
from outbox.kafka_java import JAVA_SECRET_VARIABLES, java_client_config
from outbox.kafka_options import client_options, ssl_context
from outbox.settings import KafkaSettings, describe_validation_error
from outbox_cli._common import load
from outbox_lake.kafka_options import spark_options
from outbox_stack.broker import properties_text
from outbox_stack.connect import CLIENT_PREFIXES, ConnectWorker, secrets_pattern
from outbox_stack.local import LocalStack
from outbox_stack.postgres import PostgresCluster
from outbox_stack.settings import StackSettings
from tests.fix_postgres import ROOT
from tests.tls import Authority, Issued

PASSWORD = "s3cret-Pa55word"
KEY_PASSWORD = "key-Pa55word"


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("tls"), "unit-ca")


@pytest.fixture(scope="module")
def client(authority: Authority) -> Issued:
    return authority.issue("relay")


@pytest.fixture(scope="module")
def locked_client(authority: Authority) -> Issued:
    return authority.issue("locked", key_password=KEY_PASSWORD)


def sasl(authority: Authority, **more: object) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers="kafka-1:9093,kafka-2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="relay",
        sasl_password=PASSWORD,
        ssl_cafile=authority.certfile,
        **more,  # type: ignore[arg-type]
    )


def mtls(authority: Authority, issued: Issued, **more: object) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers="kafka-1:9094",
        security_protocol="SSL",
        ssl_cafile=authority.certfile,
        ssl_certfile=issued.certfile,
        ssl_keyfile=issued.keyfile,
        **more,  # type: ignore[arg-type]
    )


# -- the settings --------------------------------------------------------------------------


def test_the_security_settings_come_from_kafkas_client_names(
    monkeypatch: pytest.MonkeyPatch, authority: Authority
) -> None:
    monkeypatch.setenv("OUTBOX_KAFKA_BOOTSTRAP_SERVERS", "kafka:9093")
    monkeypatch.setenv("OUTBOX_KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_MECHANISM", "scram-sha-256")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_USERNAME", "relay")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("OUTBOX_KAFKA_SSL_CAFILE", str(authority.certfile))
    monkeypatch.setenv("OUTBOX_KAFKA_SSL_CHECK_HOSTNAME", "false")
    settings = KafkaSettings()
    assert settings.security_protocol == "SASL_SSL" and settings.sasl_mechanism == "SCRAM-SHA-256"
    assert settings.sasl_password is not None
    assert settings.sasl_password.get_secret_value() == PASSWORD
    assert settings.ssl_check_hostname is False and settings.uses_tls and settings.uses_sasl


def test_the_default_is_plaintext_as_before() -> None:
    settings = KafkaSettings(bootstrap_servers="kafka:9092")
    options = client_options(settings, client_id="x")
    assert options["security_protocol"] == "PLAINTEXT"
    assert not {"ssl_context", "sasl_mechanism", "sasl_plain_password"} & set(options)


def test_a_password_never_shows_in_a_repr_a_log_or_a_description(
    authority: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    settings = sasl(authority)
    logging.getLogger("outbox.test").warning("kafka settings: %s %r", settings, settings)
    shown = [
        repr(settings),
        str(settings),
        settings.describe(),
        settings.model_dump_json(),
        caplog.text,
    ]
    assert all(PASSWORD not in text for text in shown), shown
    assert "SCRAM-SHA-512 as relay" in settings.describe()


def test_a_password_file_is_read_once_and_exclusive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, authority: Authority
) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    monkeypatch.setenv("OUTBOX_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_USERNAME", "relay")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_PASSWORD_FILE", str(secret))
    password = KafkaSettings().sasl_password
    assert password is not None and password.get_secret_value() == PASSWORD
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_PASSWORD", "other")
    with pytest.raises(ConfigurationError) as both:
        load(KafkaSettings)
    assert "OUTBOX_KAFKA_SASL_PASSWORD and OUTBOX_KAFKA_SASL_PASSWORD_FILE" in str(both.value)
    monkeypatch.delenv("OUTBOX_KAFKA_SASL_PASSWORD")
    monkeypatch.setenv("OUTBOX_KAFKA_SASL_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(
        ConfigurationError, match=r"OUTBOX_KAFKA_SASL_PASSWORD_FILE=.*cannot be read"
    ):
        load(KafkaSettings)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (
            {"security_protocol": "SASL_SSL", "sasl_password": PASSWORD},
            "set OUTBOX_KAFKA_SASL_MECHANISM, OUTBOX_KAFKA_SASL_USERNAME too",
        ),
        (
            {"security_protocol": "SSL", "sasl_username": "relay", "sasl_password": PASSWORD},
            "OUTBOX_KAFKA_SASL_USERNAME, OUTBOX_KAFKA_SASL_PASSWORD set but "
            "OUTBOX_KAFKA_SECURITY_PROTOCOL is SSL",
        ),
        (
            {"security_protocol": "PLAINTEXT", "ssl_cafile": "/"},
            "OUTBOX_KAFKA_SSL_CAFILE set but OUTBOX_KAFKA_SECURITY_PROTOCOL is PLAINTEXT",
        ),
        ({"security_protocol": "TLS"}, "SECURITY_PROTOCOL"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "SASL_MECHANISM"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent.pem"}, "not a readable file"),
    ],
)
def test_a_bad_combination_is_refused_naming_the_variables_and_the_fix(
    given: dict[str, object], named: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        KafkaSettings(**given)  # type: ignore[arg-type]
    message = describe_validation_error(raised.value, env_prefix="OUTBOX_KAFKA_")
    assert named in message, message
    assert PASSWORD not in str(raised.value) and PASSWORD not in message
    assert "OUTBOX_KAFKA_:" not in message  # a rule over several settings names them itself


def test_a_client_certificate_needs_its_key(authority: Authority, client: Issued) -> None:
    with pytest.raises(ValidationError, match="both OUTBOX_KAFKA_SSL_CERTFILE and"):
        KafkaSettings(security_protocol="SSL", ssl_certfile=client.certfile)


# -- kafka-python's options ------------------------------------------------------------------


def test_sasl_ssl_options_carry_the_login_and_one_tls_context(authority: Authority) -> None:
    options = client_options(sasl(authority), client_id="outbox-relay")
    assert options["bootstrap_servers"] == ["kafka-1:9093", "kafka-2:9093"]
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "relay"
    assert options["sasl_plain_password"] == PASSWORD
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_without_host_name_checks_the_chain_is_still_verified(authority: Authority) -> None:
    context = ssl_context(sasl(authority, ssl_check_hostname=False))
    assert context is not None
    assert context.check_hostname is False and context.verify_mode == ssl.CERT_REQUIRED


def test_an_encrypted_client_key_loads_with_its_password_only(
    authority: Authority, locked_client: Issued
) -> None:
    assert ssl_context(mtls(authority, locked_client, ssl_key_password=KEY_PASSWORD))
    with pytest.raises(ConfigurationError, match="OUTBOX_KAFKA_SSL_KEY_PASSWORD") as raised:
        ssl_context(mtls(authority, locked_client, ssl_key_password="wrong"))
    assert KEY_PASSWORD not in str(raised.value)
    # Without one: an error, never OpenSSL's prompt on the terminal (a service would hang).
    with pytest.raises(ConfigurationError, match="give its password in"):
        ssl_context(mtls(authority, locked_client))


def test_a_file_that_is_no_certificate_is_refused_naming_it(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigurationError, match=r"OUTBOX_KAFKA_SSL_CAFILE=.*no usable PEM"):
        ssl_context(KafkaSettings(security_protocol="SSL", ssl_cafile=junk))


def test_an_authorization_error_names_what_was_refused_and_whom() -> None:
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    settings = KafkaSettings(
        bootstrap_servers="k:1",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="lake",
        sasl_password=PASSWORD,
    )
    topic = authorization_error(TopicAuthorizationFailedError({"payments"}), settings)
    assert isinstance(topic, BrokerAuthorizationError)
    assert (topic.resource, topic.names) == ("topic", "payments")
    assert "User:lake" in str(topic) and "topic payments" in str(topic)
    group = authorization_error(GroupAuthorizationFailedError("billing"), settings)
    assert (group.resource, group.names) == ("group", "billing")


# -- Java clients: Connect and Spark ---------------------------------------------------------


def test_java_properties_reference_secrets_and_never_hold_them(
    authority: Authority, client: Issued
) -> None:
    config = java_client_config(
        sasl(authority, ssl_certfile=client.certfile, ssl_keyfile=client.keyfile)
    )
    properties = config.properties
    assert properties["security.protocol"] == "SASL_SSL"
    assert properties["sasl.mechanism"] == "SCRAM-SHA-512"
    assert properties["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="relay" password="${env:OUTBOX_KAFKA_SASL_PASSWORD}";'
    )
    assert properties["ssl.truststore.type"] == "PEM"
    assert properties["ssl.truststore.certificates"].startswith("-----BEGIN CERTIFICATE-----")
    assert properties["ssl.keystore.key"] == "${env:OUTBOX_KAFKA_SSL_KEY}"
    assert properties["ssl.endpoint.identification.algorithm"] == "https"
    text = properties_text(properties)
    key = client.keyfile.read_text()
    assert PASSWORD not in text and "PRIVATE KEY" not in text
    assert config.environment["OUTBOX_KAFKA_SASL_PASSWORD"] == PASSWORD
    assert config.environment["OUTBOX_KAFKA_SSL_KEY"].strip() == key.strip()
    assert PASSWORD not in repr(config)
    assert set(config.environment) <= set(JAVA_SECRET_VARIABLES)


def test_a_pkcs1_key_is_refused_for_java_clients_with_the_conversion(
    authority: Authority, client: Issued, tmp_path: Path
) -> None:
    old = tmp_path / "old.key.pem"
    old.write_text("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n")
    settings = mtls(authority, Issued("old", client.certfile, old))
    with pytest.raises(ConfigurationError, match="openssl pkcs8 -topk8"):
        java_client_config(settings)


def test_spark_options_map_every_setting_to_kafka_prefixed_options(
    authority: Authority, client: Issued
) -> None:
    options = spark_options(sasl(authority, ssl_check_hostname=False))
    assert options["kafka.bootstrap.servers"] == "kafka-1:9093,kafka-2:9093"
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="relay" password="{PASSWORD}";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.certificates"] == authority.pem.strip()
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert all(name.startswith("kafka.") for name in options)
    plain = spark_options(
        KafkaSettings(
            bootstrap_servers="k:1",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="lake",
            sasl_password=PASSWORD,
        )
    )
    assert plain["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    assert "kafka.ssl.truststore.type" not in plain  # the JVM's own authorities
    mutual = spark_options(mtls(authority, client))
    assert mutual["kafka.security.protocol"] == "SSL"
    assert mutual["kafka.ssl.keystore.type"] == "PEM"
    assert mutual["kafka.ssl.keystore.certificate.chain"].startswith("-----BEGIN CERTIFICATE")
    assert "PRIVATE KEY" in mutual["kafka.ssl.keystore.key"]
    assert spark_options(KafkaSettings(bootstrap_servers="k:1")) == {
        "kafka.bootstrap.servers": "k:1",
        "kafka.security.protocol": "PLAINTEXT",
    }


def test_a_password_java_cannot_quote_is_refused() -> None:
    settings = KafkaSettings(
        bootstrap_servers="k:1",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="lake",
        sasl_password='a"b',
    )
    with pytest.raises(ConfigurationError, match="OUTBOX_KAFKA_SASL_PASSWORD holds a double"):
        spark_options(settings)


def test_connects_worker_secures_every_client_prefix_without_a_secret_on_disk(
    tmp_path: Path, authority: Authority, client: Issued
) -> None:
    kafka = sasl(authority, ssl_certfile=client.certfile, ssl_keyfile=client.keyfile)
    worker = ConnectWorker(StackSettings(dir=tmp_path), bootstrap_servers="k:1", kafka=kafka)
    properties = worker.worker_properties()
    assert properties["bootstrap.servers"] == "k:1"
    for prefix in ("", "producer.", "consumer.", "admin."):
        assert properties[f"{prefix}security.protocol"] == "SASL_SSL"
        assert "${env:OUTBOX_KAFKA_SASL_PASSWORD}" in properties[f"{prefix}sasl.jaas.config"]
        assert properties[f"{prefix}ssl.keystore.key"] == "${env:OUTBOX_KAFKA_SSL_KEY}"
    text = properties_text(properties)
    assert PASSWORD not in text and "PRIVATE KEY" not in text
    environment = worker.worker_environment({"OUTBOX_CONNECT_DATABASE_PASSWORD": "db"})
    assert environment["OUTBOX_KAFKA_SASL_PASSWORD"] == PASSWORD
    pattern = secrets_pattern()
    assert all(name in pattern for name in JAVA_SECRET_VARIABLES)
    plain = ConnectWorker(StackSettings(dir=tmp_path), bootstrap_servers="k:1")
    assert not any("security" in key for key in plain.worker_properties())


def test_stack_env_never_prints_kafka_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, authority: Authority
) -> None:
    stack = LocalStack(StackSettings(dir=tmp_path), sasl(authority))
    monkeypatch.setattr(LocalStack, "cdc_password", lambda self: "generated")
    monkeypatch.setattr(PostgresCluster, "url", lambda self: "postgresql://stack")
    exported = stack.environment()
    assert exported["OUTBOX_KAFKA_BOOTSTRAP_SERVERS"] == "kafka-1:9093,kafka-2:9093"
    assert PASSWORD not in " ".join(exported.values())
    assert stack.connect.kafka.security_protocol == "SASL_SSL"  # the external cluster's


# -- docs/production.md ---------------------------------------------------------------------


def _override() -> dict[str, Any]:
    """The compose override of docs/production.md, parsed (compose's tags taken as values)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node)
        return loader.construct_scalar(node)  # type: ignore[arg-type]

    Loader.add_constructor("!reset", tagged)
    Loader.add_constructor("!override", tagged)
    text = (ROOT / "docs" / "production.md").read_text()
    block = re.search(r"```yaml\n(# docker-compose.secured.yml\n.*?)```", text, re.DOTALL)
    assert block, "the compose override example is gone from docs/production.md"
    return dict(yaml.load(block.group(1), Loader=Loader))  # a SafeLoader, with two tags


def test_the_docs_compose_override_uses_our_settings_and_connects_properties(
    authority: Authority,
) -> None:
    services = _override()["services"]
    known = {f"OUTBOX_KAFKA_{name.upper()}" for name in KafkaSettings.model_fields}
    for name in ("relay", "lake"):
        environment = services[name]["environment"]
        kafka = {key for key in environment if key.startswith("OUTBOX_KAFKA_")}
        assert kafka <= known, kafka - known
        assert environment["OUTBOX_KAFKA_SASL_USERNAME"] == name
    connect = {
        key: str(value).replace("$$", "$")
        for key, value in services["connect"]["environment"].items()
    }
    settings = KafkaSettings(
        bootstrap_servers="k:1",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="connect",
        sasl_password=PASSWORD,
        ssl_cafile=authority.certfile,
    )
    expected = java_client_config(settings).properties
    for prefix in CLIENT_PREFIXES:
        variable = "CONNECT_" + prefix.replace(".", "_").upper()
        for name in ("security.protocol", "sasl.mechanism", "sasl.jaas.config"):
            assert connect[variable + name.replace(".", "_").upper()] == expected[name]
        assert connect[variable + "SSL_TRUSTSTORE_TYPE"] == "PEM"
        assert connect[variable + "SSL_TRUSTSTORE_LOCATION"] == "/run/secrets/kafka_ca"
    assert "OUTBOX_KAFKA_SASL_PASSWORD" in secrets_pattern()


def test_each_tls_failure_is_told_apart_with_its_fix(authority: Authority) -> None:
    from outbox.kafka_login import _tls_refusal

    settings = sasl(authority)
    wrong_name = ssl.SSLCertVerificationError("certificate verify failed")
    wrong_name.verify_code = 62
    wrong_name.verify_message = "Hostname mismatch, certificate is not valid for 'kafka-1'."
    refusal = _tls_refusal(wrong_name, "kafka-1:9093", settings)
    assert refusal.reason == "hostname" and "OUTBOX_KAFKA_SSL_CHECK_HOSTNAME" in refusal.message
    untrusted = ssl.SSLCertVerificationError("certificate verify failed")
    untrusted.verify_code = 20
    untrusted.verify_message = "unable to get local issuer certificate"
    refusal = _tls_refusal(untrusted, "kafka-1:9093", settings)
    assert refusal.reason == "untrusted_certificate"
    assert f"OUTBOX_KAFKA_SSL_CAFILE={authority.certfile}" in refusal.message
    required = ssl.SSLError(
        "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required"
    )
    assert _tls_refusal(required, "k:1", settings).reason == "client_certificate"
    other = ssl.SSLError("[SSL: WRONG_VERSION_NUMBER] wrong version number")
    refusal = _tls_refusal(other, "k:1", settings)
    assert refusal.reason == "tls" and "does that listener speak TLS?" in refusal.message
