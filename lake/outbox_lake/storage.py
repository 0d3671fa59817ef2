"""Where the lake's tables live, for the readers and the driver's writes (``deltalake``): a
local folder, or a bucket of an S3-compatible object store (``s3://`` or ``s3a://`` roots).

On object storage, ``deltalake`` gets the store's endpoint, region and addressing style from
the settings (:func:`storage_options`) and its credentials from the standard AWS variables of
the environment only (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``): we never pass, log or store a secret. Its commits are conditional
writes (``If-None-Match``: the store refuses a second commit of the same version), so two
``deltalake`` writers never overwrite each other's commit; ``AWS_S3_ALLOW_UNSAFE_RENAME`` is
forced off here, so a stray variable cannot turn that into a blind overwrite. Spark's Delta
writer does not make conditional commits on S3: see docs/production.md, "The lake on object
storage", for the one-writer rule this leaves.

A refusal by the store (a wrong secret key, an unknown key id, no permission, no such
bucket) or a store that does not answer is raised as :class:`LakeStorageError` naming the
setting to check (:func:`storage_error`).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from outbox.core.errors import LakeStorageError
from outbox_lake.settings import LakeSettings

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "check_access",
    "hadoop_conf",
    "has_folder",
    "is_table",
    "move_aside",
    "open_table",
    "storage_error",
    "storage_options",
    "table_names",
]


def move_aside(folder: Path, label: str) -> Path:
    """Rename a local ``folder`` (a checkpoint the job will not start from) to
    ``<folder>.<label>-<unix time>`` beside it, kept for inspection; the new name."""
    aside = folder.with_name(f"{folder.name}.{label}-{int(time.time())}")
    shutil.move(str(folder), str(aside))
    return aside


def storage_options(settings: LakeSettings) -> dict[str, str]:
    """``deltalake``'s storage options for the lake's root: none for a folder; on S3, where
    and how to reach the store (no credential: the client reads those from the
    environment itself)."""
    if not settings.is_s3:
        return {}
    aws = settings.aws()
    options = {
        # Commits stay conditional writes, whatever the environment says.
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if settings.s3_path_style else "true",
    }
    if aws.endpoint_url:
        options["AWS_ENDPOINT_URL"] = aws.endpoint_url
        if aws.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"  # AwsEnvironment checked AWS_ALLOW_HTTP
    if aws.region_name:
        options["AWS_REGION"] = aws.region_name
    return options


def hadoop_conf(settings: LakeSettings) -> dict[str, str]:
    """Spark's settings (``spark.hadoop.*``) for the root's store: ``s3://`` served by S3A as
    ``s3a://`` is, and, on S3, the store's endpoint, region and addressing style.

    No credential: S3A's default chain reads ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` from the JVM's environment (then the
    instance's role). A secret in Spark's conf would be on the spark-submit command line
    pyspark runs, visible in the process list."""
    conf = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    if not settings.is_s3:
        return conf
    aws = settings.aws()
    conf["spark.hadoop.fs.s3a.path.style.access"] = str(settings.s3_path_style).lower()
    if aws.endpoint_url:
        conf["spark.hadoop.fs.s3a.endpoint"] = aws.endpoint_url
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            aws.endpoint_url.startswith("https://")
        ).lower()
    if aws.region_name:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = aws.region_name
    return conf


_REFUSALS = (
    (
        ("SignatureDoesNotMatch",),
        "the object store refused the lake's credentials ({code}): check "
        "AWS_SECRET_ACCESS_KEY (it does not match AWS_ACCESS_KEY_ID)",
    ),
    (
        ("InvalidAccessKeyId", "InvalidClientTokenId"),
        "the object store does not know the lake's access key ({code}): check AWS_ACCESS_KEY_ID",
    ),
    (
        ("ExpiredToken", "InvalidToken", "TokenRefreshRequired"),
        "the object store refused the lake's session token ({code}): renew "
        "AWS_SESSION_TOKEN (with its AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
    ),
    (
        ("NoSuchBucket",),
        "the bucket of OUTBOX_LAKE_ROOT={root} does not exist ({code}): create it, or fix the root",
    ),
    (
        ("AccessDenied", "403 Forbidden", "lacked the necessary privileges"),
        "the object store denied the lake access to {root} ({code}): the credentials of "
        "AWS_ACCESS_KEY_ID need list, read and write there (docs/production.md)",
    ),
    (
        ("Connection refused", "error sending request", "dns error", "timed out"),
        "the lake's object store did not answer at {endpoint} ({code}): check "
        "AWS_ENDPOINT_URL, and that the store runs",
    ),
)


def storage_error(error: BaseException, settings: LakeSettings) -> LakeStorageError | None:
    """``error`` (a ``deltalake`` or ``pyarrow`` one) as the store's refusal in one line,
    naming what to check; None when it is not one."""
    if not settings.is_s3:
        return None
    text = str(error)
    for markers, message in _REFUSALS:
        found = next((m for m in markers if m.lower() in text.lower()), None)
        if found is None:
            continue
        code = re.search(r"<Code>([^<]+)</Code>", text)
        endpoint = settings.aws().endpoint_url or "AWS S3's endpoint for the region"
        return LakeStorageError(
            message.format(code=code[1] if code else found, root=settings.root, endpoint=endpoint)
        )
    return None


def open_table(settings: LakeSettings, uri: str, version: int | None = None) -> DeltaTable | None:
    """The table at ``uri`` (at ``version``), or None when there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        options = storage_options(settings)
        if version is None:
            return DeltaTable(uri, storage_options=options)
        return DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError:
        return None
    except OSError as error:
        refused = storage_error(error, settings)
        if refused is not None:
            raise refused from error
        raise


def is_table(settings: LakeSettings, uri: str) -> bool:
    from deltalake import DeltaTable

    try:
        return bool(DeltaTable.is_deltatable(uri, storage_options=storage_options(settings)))
    except OSError as error:
        refused = storage_error(error, settings)
        if refused is not None:
            raise refused from error
        raise


def _children(settings: LakeSettings) -> list[str]:
    """The names of the folders (prefixes) right under the root."""
    if settings.is_local:
        root = Path(settings.root)
        return [child.name for child in root.iterdir() if child.is_dir()] if root.exists() else []
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import FileSelector, FileType, PyFileSystem

    handler = DeltaStorageHandler(settings.root.rstrip("/"), storage_options(settings))
    filesystem = PyFileSystem(handler)
    try:
        found = filesystem.get_file_info(FileSelector("", recursive=False, allow_not_found=True))
    except OSError as error:
        refused = storage_error(error, settings)
        if refused is not None:
            raise refused from error
        raise
    return [info.base_name for info in found if info.type == FileType.Directory]


def has_folder(settings: LakeSettings, name: str) -> bool:
    """Whether anything is stored under ``name`` (a path below the root)."""
    if settings.is_local:
        return (Path(settings.root) / name).exists()
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import FileSelector, PyFileSystem

    handler = DeltaStorageHandler(settings.root.rstrip("/"), storage_options(settings))
    try:
        found = PyFileSystem(handler).get_file_info(
            FileSelector(name, recursive=False, allow_not_found=True)
        )
    except OSError as error:
        refused = storage_error(error, settings)
        if refused is not None:
            raise refused from error
        raise
    return bool(found)


def table_names(settings: LakeSettings) -> list[str]:
    """The lake's tables (``events``, ``quarantine``, ``aggregate_<type>``): each folder
    under the root that holds a Delta log, except ``_progress`` and ``_checkpoints``."""
    names = [name for name in _children(settings) if not name.startswith("_")]
    if settings.is_local:
        root = Path(settings.root)
        return sorted(name for name in names if (root / name / "_delta_log").exists())
    return sorted(name for name in names if is_table(settings, settings.table_uri(name)))


def check_access(settings: LakeSettings) -> None:
    """On object storage, one listing of the root: a refusal or a store that does not answer
    is said now, naming the setting, rather than deep inside a Spark job."""
    if settings.is_s3:
        _children(settings)
