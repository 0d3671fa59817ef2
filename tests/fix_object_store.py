"""An S3-compatible object store of the suite's own: SeaweedFS on loopback, one ``lake`` bucket.

``object_store`` (session) starts it in a folder of its own (``.stack/test-s3``) on a free
block of ports, and stops it at the end. Each test takes a root of its own in the bucket
(:meth:`ObjectStore.new_root`). Clients get the store's keys through the standard AWS
variables of the environment a test passes them (:attr:`ObjectStore.env`); the test process
itself never exports them, so no other test meets them.
"""

from __future__ import annotations

import random
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from outbox_stack.object_store import BUCKET, SeaweedStore
from outbox_stack.settings import StackSettings
from tests.fix_postgres import ROOT, STACK_ROOT, all_free


def free_object_store_port() -> int:
    """A base port for the store: it and the next four free, and each plus 10000; all below
    Linux's ephemeral range (32768 and up), where a client's connection may take one."""
    for _ in range(200):
        base = random.randint(20000, 22760)
        if all_free([base + i + grpc for i in range(5) for grpc in (0, 10000)]):
            return base
    raise RuntimeError("no free block of ports for the object store")


@dataclass(frozen=True)
class ObjectStore:
    store: SeaweedStore

    @property
    def env(self) -> dict[str, str]:
        """The AWS variables (and path style) a lake client of this store needs."""
        return self.store.client_environment()

    def new_root(self) -> str:
        return f"s3://{BUCKET}/test-{uuid.uuid4().hex[:10]}"

    @property
    def storage_options(self) -> dict[str, str]:
        """For the tests' own reads with ``deltalake`` (credentials passed explicitly here,
        as the product never does: it leaves them to the environment)."""
        env = self.env
        return {
            "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": env["AWS_REGION"],
            "AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
            "AWS_ALLOW_HTTP": "true",
        }

    def rows(self, root: str, table: str) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        found = DeltaTable(f"{root}/{table}", storage_options=self.storage_options)
        return found.to_pyarrow_table().to_pylist()  # type: ignore[no-any-return]

    def has_table(self, root: str, table: str) -> bool:
        from deltalake import DeltaTable

        return bool(
            DeltaTable.is_deltatable(f"{root}/{table}", storage_options=self.storage_options)
        )


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    settings = StackSettings(
        dir=STACK_ROOT / "test-s3",
        object_store_port=free_object_store_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    store = SeaweedStore(settings)
    store.down()  # left running by an interrupted run, perhaps on other ports
    shutil.rmtree(store.data_dir, ignore_errors=True)  # a fresh bucket for each run
    store.up()
    try:
        yield ObjectStore(store)
    finally:
        store.down()
