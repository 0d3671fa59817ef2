"""The broker formats its storage whatever cluster id it draws: a KRaft id is URL-safe base64,
so about one in 64 begins with "-", which Kafka's storage tool once read as an option of its
own (``--cluster-id: expected one argument``) and ``outbox stack up`` failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox_stack import broker
from outbox_stack.settings import StackSettings
from tests.fix_postgres import ROOT, free_port

pytestmark = pytest.mark.timeout(180)


def test_a_cluster_id_beginning_with_a_dash_is_formatted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = StackSettings(
        dir=tmp_path,
        downloads=ROOT / ".cache" / "stack",
        postgres_port=free_port(),
        broker_port=free_port(),
        broker_controller_port=free_port(),
        connect_port=free_port(),
    )
    monkeypatch.setattr(broker, "new_cluster_id", lambda: "-AbCdEfGhIjKlMnOpQrStU")
    kafka = broker.KafkaBroker(settings)
    try:
        kafka.up()
        assert (
            "cluster.id=-AbCdEfGhIjKlMnOpQrStU" in (kafka.data_dir / "meta.properties").read_text()
        )
    finally:
        kafka.down()
