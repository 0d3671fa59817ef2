"""The lake's object-store settings without a store: what Spark and ``deltalake`` are given
(never a credential), which AWS variables are refused and how, and how a store's refusal is
told."""

from __future__ import annotations

import pytest

from outbox.core.errors import ConfigurationError, LakeStorageError
from outbox_cli._common import load
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import hadoop_conf, storage_error, storage_options

SECRET = "wJalrXUtnFEMI-not-a-real-secret"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-" + SECRET)
    return monkeypatch


def test_spark_and_deltalake_get_where_the_store_is_and_never_a_credential(
    aws: pytest.MonkeyPatch,
) -> None:
    aws.setenv("AWS_ENDPOINT_URL", "https://store.example:9000/")
    aws.setenv("AWS_REGION", "eu-west-3")
    settings = LakeSettings(root="s3://bucket/outbox", s3_path_style=True)
    conf = hadoop_conf(settings)
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://store.example:9000"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    options = storage_options(settings)
    assert options["AWS_S3_ALLOW_UNSAFE_RENAME"] == "false"
    assert options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert "AWS_ALLOW_HTTP" not in options
    given = " ".join(f"{k}={v}" for k, v in {**conf, **options}.items())
    assert SECRET not in given and "AKIAEXAMPLE" not in given
    assert not any("key" in name.lower() or "token" in name.lower() for name in conf)


def test_a_local_root_needs_no_store(aws: pytest.MonkeyPatch) -> None:
    settings = LakeSettings(root="/tmp/lake")
    assert storage_options(settings) == {}
    assert "spark.hadoop.fs.s3a.endpoint" not in hadoop_conf(settings)
    assert storage_error(OSError("403 Forbidden SignatureDoesNotMatch"), settings) is None


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, "AWS_ALLOW_HTTP=true"),
        ({"AWS_ENDPOINT_URL": "store.example:9000"}, "AWS_ENDPOINT_URL"),
        ({"AWS_ENDPOINT_URL": "https://store.example/bucket"}, "has a path"),
        ({"OUTBOX_LAKE_ROOT": "s3:///outbox"}, "OUTBOX_LAKE_ROOT"),
        ({"OUTBOX_LAKE_S3_PATH_STYLE": "perhaps"}, "OUTBOX_LAKE_S3_PATH_STYLE"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_variable(
    aws: pytest.MonkeyPatch, variables: dict[str, str], named: str
) -> None:
    aws.setenv("OUTBOX_LAKE_ROOT", "s3://bucket/outbox")
    for name, value in variables.items():
        aws.setenv(name, value)
    with pytest.raises(ConfigurationError) as refused:
        load(LakeSettings)
    assert named in str(refused.value)
    assert SECRET not in str(refused.value)


def test_an_http_endpoint_allowed_is_passed_on(aws: pytest.MonkeyPatch) -> None:
    aws.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    aws.setenv("AWS_ALLOW_HTTP", "true")
    settings = LakeSettings(root="s3a://bucket/outbox")
    assert storage_options(settings)["AWS_ALLOW_HTTP"] == "true"
    assert hadoop_conf(settings)["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ("403 Forbidden <Code>SignatureDoesNotMatch</Code>", "AWS_SECRET_ACCESS_KEY"),
        ("403 Forbidden <Code>InvalidAccessKeyId</Code>", "AWS_ACCESS_KEY_ID"),
        ("400 <Code>ExpiredToken</Code>", "AWS_SESSION_TOKEN"),
        ("404 <Code>NoSuchBucket</Code>", "OUTBOX_LAKE_ROOT"),
        ("403 Forbidden <Code>AccessDenied</Code>", "AWS_ACCESS_KEY_ID need list"),
        ("error sending request: Connection refused", "AWS_ENDPOINT_URL"),
    ],
)
def test_a_store_s_refusal_is_told_naming_what_to_check(
    aws: pytest.MonkeyPatch, answer: str, named: str
) -> None:
    settings = LakeSettings(root="s3://bucket/outbox")
    told = storage_error(OSError(f"Generic S3 error: {answer}"), settings)
    assert isinstance(told, LakeStorageError)
    assert named in str(told)
    assert storage_error(OSError("some other failure"), settings) is None
