"""Injecting the scheduled faults, and bringing back what they broke, as an operator would.

Each planned fault (:mod:`chaos.schedule`) runs in a thread of its own: it waits for its
time, takes its service's lock, breaks the service, waits its hold time, brings the service
back (and waits until it serves: the connector running, a relay leading, the lake job's query
started), and records when and what happened. A fault that cannot be injected or recovered
is recorded with its error, and the run fails.

What stops outside a fault is the watchdog's (:mod:`chaos.watchdog`): a halt, which fails
the run.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from chaos.schedule import RESOURCE, Kind, PlannedFault
from chaos.services import ChaosServices
from chaos.watchdog import Clock, exit_status
from tests.fix_relay import wait_until

__all__ = ["FaultInjector", "Injected"]


@dataclass
class Injected:
    planned: PlannedFault
    started: float | None = None
    recovered: float | None = None
    detail: str = ""
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.started is not None and self.recovered is not None and self.error is None


class FaultInjector:
    def __init__(
        self,
        services: ChaosServices,
        plan: list[PlannedFault],
        clock: Clock,
        stop: threading.Event,
    ) -> None:
        self._services = services
        self._clock = clock
        self._stop = stop
        self.injected = [Injected(fault) for fault in plan]
        self._threads = [
            threading.Thread(target=self._run, args=(record,), name=f"fault-{n}", daemon=True)
            for n, record in enumerate(self.injected)
        ]
        self._actions: dict[Kind, Callable[[PlannedFault], str]] = {
            Kind.CONNECT_KILL: self._kill_connect,
            Kind.RELAY_KILL: self._kill_leading_relay,
            Kind.LAKE_KILL: self._kill_lake_job,
            Kind.POSTGRES_KILL: self._kill_postgres,
            Kind.BROKER_KILL: self._kill_broker,
            Kind.BROKER_PAUSE: self._pause_broker,
            Kind.NETWORK_CUT: self._cut_relay_network,
            Kind.CONNECTOR_RECREATE: self._recreate_connector,
            Kind.CHECKPOINT_DELETE: self._delete_lake_checkpoint,
        }

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float) -> bool:
        """Wait until every fault was injected and recovered; False if some still run."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self, record: Injected) -> None:
        fault = record.planned
        if self._stop.wait(max(0.0, fault.at - self._clock.now())):
            return
        with self._services.locks[RESOURCE[fault.kind]]:
            if self._stop.is_set():
                return
            record.started = self._clock.now()
            try:
                record.detail = self._actions[fault.kind](fault)
            except Exception as error:  # recorded: the run reports it and fails
                record.error = f"{type(error).__name__}: {error}"
            record.recovered = self._clock.now()

    def _hold(self, fault: PlannedFault) -> None:
        self._stop.wait(fault.hold)  # the fault itself lasts this long

    def _connector_back(self) -> str:
        """After a fault elsewhere, the connector running again: under Connect's lock, so a
        fault on Connect (a deleted connector, a killed worker) finishes first."""
        with self._services.locks["connect"]:
            return self._services.ensure_connector()

    # --- the faults ------------------------------------------------------------------------

    def _kill_connect(self, fault: PlannedFault) -> str:
        process = self._services.stack.connect.process
        pid = process.pid()
        process.signal(signal.SIGKILL)
        wait_until(lambda: not process.is_running(), timeout=30, what="Connect gone")
        self._hold(fault)
        started = self._services.restart_connect()
        connector = self._services.ensure_connector()
        return f"pid {pid} killed; Connect {started}; connector: {connector}"

    def _kill_leading_relay(self, fault: PlannedFault) -> str:
        number = self._services.leader(timeout=30)
        if number is None:
            raise RuntimeError("no relay led within 30 s: nothing to kill")
        relay = self._services.relays[number]
        pid = relay.process.pid if relay.process is not None else None
        relay.kill()
        self._hold(fault)
        relay.start()
        leader = self._services.leader(timeout=30)
        return f"relay {number} (pid {pid}) killed and started again; relay {leader} leads"

    def _kill_lake_job(self, fault: PlannedFault) -> str:
        pid = self._services.kill_lake()
        self._hold(fault)
        self._services.start_lake()
        return f"process group {pid} killed; the job started again"

    def _kill_postgres(self, fault: PlannedFault) -> str:
        pid = self._services.kill_postgres()
        self._hold(fault)
        self._services.restart_postgres()
        connector = self._connector_back()
        return f"postmaster {pid} killed; restarted; connector: {connector}"

    def _kill_broker(self, fault: PlannedFault) -> str:
        """``kill -9`` of the broker, then ``up`` (Kafka recovers its logs); Connect, the
        relays and the lake job carry on by themselves (one that stops is a halt), only a
        failed connector task is restarted, as after any broker outage."""
        broker = self._services.stack.broker
        if broker is None:
            raise RuntimeError("the stack has no broker of its own to kill")
        pid = broker.process.pid()
        broker.process.signal(signal.SIGKILL)
        wait_until(lambda: not broker.process.is_running(), timeout=30, what="the broker gone")
        how = exit_status(pid)
        self._hold(fault)
        started = time.monotonic()
        broker.up()
        up = time.monotonic() - started
        connector = self._connector_back()
        return (
            f"{how}; started again (pid {broker.process.pid()}), answering after {up:.0f} s; "
            f"connector: {connector}"
        )

    def _pause_broker(self, fault: PlannedFault) -> str:
        broker = self._services.stack.broker
        if broker is None:
            raise RuntimeError("the stack has no broker of its own to pause")
        broker.process.signal(signal.SIGSTOP)
        try:
            self._hold(fault)
        finally:
            broker.process.signal(signal.SIGCONT)
        connector = self._connector_back()
        return f"SIGSTOP for {fault.hold:g} s, then SIGCONT; connector: {connector}"

    def _cut_relay_network(self, fault: PlannedFault) -> str:
        leader = self._services.leader(timeout=30)
        cut = 0 if leader is None else leader
        proxy = self._services.proxies[cut]
        proxy.freeze()
        try:
            self._hold(fault)
            during = self._services.claiming()
        finally:
            proxy.restore()
        after = self._services.leader(timeout=30)
        whose = "the leader's" if leader == cut else "no relay led: relay 0's"
        return (
            f"{whose} link (relay {cut}) frozen for {fault.hold:g} s; claiming the lease at "
            f"the end of the cut: relay {', '.join(map(str, during)) or 'none'}; "
            f"after: relay {after}"
        )

    def _recreate_connector(self, fault: PlannedFault) -> str:
        """Deleted and applied again under the same name: Connect keeps a deleted connector's
        source offsets and the slot stays (the connector never drops it), so the new one
        resumes from its offsets on its slot; ``ensure_connector`` waits until CDC confirms
        again. A slot gone while the connector was deleted fails the fault."""
        services = self._services
        services.connect_client.delete(services.connector.name)
        self._hold(fault)
        slot = _slot_while_deleted(services)
        connector = services.ensure_connector()  # applies it (again while refused)
        return f"deleted for {fault.hold:g} s ({slot}), applied again; connector: {connector}"

    def _delete_lake_checkpoint(self, fault: PlannedFault) -> str:
        lake = self._services.lake
        if fault.occurrence % 2:  # under the running job, by accident
            self._services.delete_lake_checkpoint()
            self._hold(fault)
            how = "under the running job, which " + (
                "kept running" if lake.is_running() else "stopped by itself"
            )
            lake.stop(timeout=60, group=True)
        else:  # the documented re-ingest: stop the job, delete, start
            lake.stop(timeout=60, group=True)
            self._services.delete_lake_checkpoint()
            self._hold(fault)
            how = "with the job stopped (a re-ingest)"
        self._services.start_lake()
        return f"deleted {how}; the job started again from no checkpoint"


def _slot_while_deleted(services: ChaosServices) -> str:
    """The slot, while its connector is deleted: still there (asked again while PostgreSQL
    restarts, up to a minute), or the fault fails."""
    deadline = time.monotonic() + 60
    while True:
        try:
            position = services.slot_position()
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
            continue
        if position is None:
            raise RuntimeError(
                f"slot {services.connector.slot_name} was dropped with the connector: the "
                "connector re-applied would refuse its stored offsets"
            )
        return f"slot {services.connector.slot_name} kept"
