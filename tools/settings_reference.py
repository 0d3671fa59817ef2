"""docs/settings.md, generated from the settings classes: every ``OUTBOX_*`` variable, its
default, its meaning and the component that reads it.

    python -m tools.settings_reference            # print the page
    python -m tools.settings_reference --write    # write docs/settings.md
    python -m tools.settings_reference --check    # exit 1 when docs/settings.md is stale

A variable's meaning is its field's docstring in the settings class (pydantic's
``use_attribute_docstrings``), so the page cannot drift from the code:
``tests/unit/test_settings_reference.py`` fails when the page is stale or a field has no
meaning. Classes whose fields carry no docstring yet take their meanings from
:data:`PENDING_MEANINGS` below, until their owners move them into the class.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args, get_origin

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

__all__ = ["COMPONENTS", "PAGE", "Component", "Variable", "render", "variables"]

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "settings.md"


@dataclass(frozen=True)
class Component:
    title: str
    module: str
    class_name: str
    read_by: str

    def settings_class(self) -> type[BaseSettings]:
        found: object = getattr(importlib.import_module(self.module), self.class_name)
        assert isinstance(found, type) and issubclass(found, BaseSettings)
        return found


COMPONENTS = [
    Component(
        "The outbox: names and limits",
        "outbox.settings",
        "OutboxSettings",
        "the SDK (`publish`, `claim`, `IdempotentConsumer`, `Effects`), `outbox db`, "
        "`outbox effects`, the relay, the connector file, reconcile",
    ),
    Component(
        "The database",
        "outbox.settings",
        "DatabaseSettings",
        "the CLI (`outbox db`, `effects`, `relay`, `connect status`, `reconcile`, `trace`), "
        "the relay, the examples",
    ),
    Component(
        "Kafka",
        "outbox.settings",
        "KafkaSettings",
        "the local stack, Kafka Connect, the relay, the lake job, reconcile, "
        "`outbox db register-types --from-kafka`",
    ),
    Component(
        "The polling relay",
        "outbox_relay.settings",
        "RelaySettings",
        "`outbox relay run`, `outbox db relay-role`",
    ),
    Component(
        "The CDC connector",
        "outbox_connect.settings",
        "ConnectorSettings",
        "`outbox connect`, `outbox db cdc-role`, the relay (the heartbeat topic's prefix), the "
        "local stack's Connect worker",
    ),
    Component(
        "The lake job and queries",
        "outbox_lake.settings",
        "LakeSettings",
        "`outbox lake`, `outbox reconcile`, `outbox trace`, `outbox demo`",
    ),
    Component(
        "Reconcile",
        "outbox_reconcile.settings",
        "ReconcileSettings",
        "`outbox reconcile`, `outbox trace`",
    ),
    Component(
        "The console",
        "outbox_console.settings",
        "ConsoleSettings",
        "`outbox console`",
    ),
    Component(
        "The local stack",
        "outbox_stack.settings",
        "StackSettings",
        "`outbox stack`, `outbox demo`, the test suite",
    ),
    Component(
        "The chaos suite (from a checkout)",
        "chaos.settings",
        "ChaosSettings",
        "`make chaos` (`python -m chaos`; its options win over these)",
    ),
]

# Meanings of fields whose class has no docstring for them yet (their packages are owned
# elsewhere); the field's own docstring wins as soon as it has one.


class Variable(NamedTuple):
    name: str
    default: str
    values: str
    meaning: str


def variables(component: Component) -> list[Variable]:
    settings = component.settings_class()
    prefix = str(settings.model_config.get("env_prefix", ""))
    found = []
    for field_name, field in settings.model_fields.items():
        name = (prefix + field_name).upper()
        meaning = " ".join((field.description or "").split())
        found.append(Variable(name, _default(field), _bounds(field), meaning))
    return found


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(computed)"
    value = field.default
    if value is PydanticUndefined:
        return "(none: required)"
    if value is None or (isinstance(value, SecretStr) and not value.get_secret_value()):
        return "(unset)"
    return f"`{_text(value)}`"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        return str(int(seconds)) if seconds == int(seconds) else str(seconds)
    if isinstance(value, float):
        return str(int(value)) if value == int(value) else str(value)
    if isinstance(value, frozenset | set | list | tuple):
        return "[" + ", ".join(f'"{item}"' for item in sorted(value)) + "]"
    if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(ROOT):
        return str(value.relative_to(ROOT))
    return str(value)


def _bounds(field: FieldInfo) -> str:
    """What the value may be: a range, the choices, or a duration's forms."""
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return ", ".join(f"`{member.value}`" for member in annotation)
    low = high = None
    for constraint in field.metadata:
        if isinstance(constraint, annotated_types.Ge):
            low = f"at least {_text(constraint.ge)}"
        elif isinstance(constraint, annotated_types.Gt):
            low = f"above {_text(constraint.gt)}"
        elif isinstance(constraint, annotated_types.Le):
            high = f"at most {_text(constraint.le)}"
        elif isinstance(constraint, annotated_types.Lt):
            high = f"below {_text(constraint.lt)}"
    if annotation is timedelta:
        return "seconds, or ISO 8601 (`P1D`)" + (f"; {low}" if low else "")
    return ", ".join(part for part in (low, high) if part)


def render() -> str:
    lines = [
        "# Settings",
        "",
        "Every `OUTBOX_*` environment variable, generated from the settings classes by "
        "`python -m tools.settings_reference --write` (do not edit by hand: "
        "`tests/unit/test_settings_reference.py` fails when this page and the code disagree). "
        "Each component validates its variables at start-up and names the variable that is "
        "wrong. Durations accept seconds or ISO 8601; lists are JSON; booleans `true` or "
        "`false`.",
        "",
    ]
    for component in COMPONENTS:
        prefix = component.settings_class().model_config.get("env_prefix", "")
        lines += [
            f"## {component.title}",
            "",
            f"`{component.module}.{component.class_name}` (`{prefix}*`), read by "
            f"{component.read_by}.",
            "",
            "| variable | default | values | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for variable in variables(component):
            default, values, meaning = (text.replace("|", "\\|") for text in variable[1:])
            lines.append(f"| `{variable.name}` | {default} | {values} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)}")
    action.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    arguments = parser.parse_args(argv)
    page = render()
    if arguments.write:
        PAGE.write_text(page)
    elif arguments.check:
        if not PAGE.is_file() or PAGE.read_text() != page:
            sys.stderr.write(
                f"{PAGE.relative_to(ROOT)} is stale: python -m tools.settings_reference --write\n"
            )
            return 1
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
