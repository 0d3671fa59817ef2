"""Settings of a chaos run: ``OUTBOX_CHAOS_*`` environment variables, or the options of
``python -m chaos`` (``--seed``, ``--duration`` for ``DURATION_SECONDS``, ``--short``...),
options first.

Two profiles: the default (about ten minutes in all, every fault kind twice, over 50,000
committed events) and ``--short`` (three to four minutes, every kind once, fewer events: what
CI runs). An option given explicitly wins over the profile.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ROOT", "ChaosSettings"]

ROOT = Path(__file__).resolve().parents[1]

_SHORT = {"duration_seconds": 100.0, "events_per_second": 60.0, "faults_per_kind": 1}


class ChaosSettings(BaseSettings):
    """What one chaos run does.

    ``seed``: the seed of the fault schedule and of the writers' choices (random when unset,
    and always printed, so a failing run can be replayed with ``--seed``).
    ``duration_seconds``: how long the writers write while faults are injected (start-up,
    drain and checks come on top). ``events_per_second``: the writers' combined target rate.
    ``faults_per_kind``: how many times each kind of fault is injected.
    ``drain_timeout_seconds``: how long the outbox may take to empty and the lake to catch up
    once the writers stopped. ``stack_dir``: the chaos stack's own folder (deleted and made
    again at each run).
    ``keep``: keep the stack's data after a passing run (a failing run always keeps it).
    """

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_CHAOS_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    seed: int = Field(default_factory=lambda: secrets.randbelow(1_000_000), ge=0)
    """Seed of the fault schedule and the writers' choices (unset: random, and printed, so a
    failing run can be replayed)."""
    duration_seconds: float = Field(default=420.0, ge=30, le=86_400)
    """How long the writers write while faults are injected."""
    events_per_second: float = Field(default=150.0, gt=0, le=5_000)
    """The writers' combined target rate."""
    faults_per_kind: int = Field(default=2, ge=1, le=50)
    """How many times each kind of fault is injected."""
    drain_timeout_seconds: float = Field(default=420.0, ge=30, le=7_200)
    """How long the outbox may take to empty and the lake to catch up once the writers stopped.
    """
    stack_dir: Path = ROOT / ".stack" / "chaos"
    """The chaos stack's own folder (deleted and made again at each run)."""
    keep: bool = False
    """Keep the stack's data after a passing run (a failing run always keeps it)."""
    short: bool = False
    """The short profile (`--short`, as CI runs it)."""

    @classmethod
    def for_run(cls, *, short: bool, **given: object) -> ChaosSettings:
        """The settings of a run: the environment, then the profile, then the options
        ``given`` (None: not given)."""
        chosen = {name: value for name, value in given.items() if value is not None}
        if short:
            from_env = cls()
            profile = {
                name: value
                for name, value in _SHORT.items()
                if name not in from_env.model_fields_set
            }
            chosen = {**profile, **chosen}
        return cls.model_validate({"short": short, **chosen})

    @property
    def run_dir(self) -> Path:
        """Logs, the lake, the ground truth and the report of this run."""
        return self.stack_dir / "run"

    @property
    def least_per_kind(self) -> int:
        """How many faults of each kind the run must have injected to count."""
        return self.faults_per_kind
