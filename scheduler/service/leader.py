"""Leader election through a ``coordination.k8s.io/v1`` Lease, so that of several ``gpuq serve``
replicas exactly one acts.

The rules are client-go's (``k8s.io/client-go/tools/leaderelection``), with the real ``kubernetes``
client:

* a candidate reads the Lease every ``retry_period_s``. It takes it when there is none (create),
  when it is free (no holder: a leader released it) or when it has expired: the record (holder,
  renew time, transitions) has not changed for ``lease_duration_s`` **as this candidate observed
  it** (its own monotonic clock, not the holder's timestamps, so clocks that disagree do not
  matter). Taking and renewing are replaces carrying the ``resourceVersion`` read, so of two
  candidates racing for one Lease the API server lets one win (409 Conflict for the other);
* the leader renews every ``retry_period_s``. When it could not renew for ``renew_deadline_s``
  (shorter than the lease duration) it stops leading: it has lost the right to act *before*
  anyone else may take the Lease;
* :meth:`LeaderElector.release` (at SIGTERM, after the leader has stopped acting and closed its
  store) clears the holder and sets a 1 s duration, so a standby takes over at its next try
  instead of waiting for the expiry.

So after a leader is killed a standby leads within ``lease_duration_s`` plus two retry periods
(one to notice the record has stopped changing, one to take it), and within one retry period after
a leader stopped on SIGTERM.

**Fencing** (issue 17, finding 5). Stopping the loops is not enough: actions already queued on the
actuator's workers, and retries with backoff, would go on for up to ``actuator_budget_s`` (60 s)
while another replica may lead after ``lease_duration_s`` (15 s). So every actuator call asks
:meth:`LeaderElector.holds_lease` just before it acts (each attempt, and each mutating request
after the reads that precede it): True while the last successful take or renew, **as timed on
this process's monotonic clock at the start of that request**, is younger than
``renew_deadline_s``. No API call per action. The margin is explicit: another candidate may take
the Lease only ``lease_duration_s`` after it *observed* that renewal, which it can observe no
earlier than the request started, so this replica is fenced at least ``lease_duration_s -
renew_deadline_s`` (5 s by default) before anyone else may lead. That margin is also what covers a
request that passed the check just before the deadline and is on its way (a request already sent
cannot be recalled); its answer is recorded as what happened. The Lease records the duration
rounded *up* to whole seconds, so the others never wait less than this replica assumes.

The loss is counted (``gpuq_scheduler_lease_lost_total``, once per leadership that ends other
than by :meth:`LeaderElector.release`), and so is how this replica took the Lease
(``gpuq_scheduler_lease_acquired_total{how}``: ``created``, ``released`` by its holder, ``expired``
in another holder's hands, or held by this identity's own ``earlier`` process). A replica that
loses the Lease exits within seconds, often before a scrape; the replica that takes over after an
expiry runs on, and stood by with the counter at 0, so ``how="expired"`` is the dependable signal
of a lost Lease (alert ``GpuqLeaseLost``).
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not (self.lease_duration_s > self.renew_deadline_s > self.retry_period_s > 0):
            raise ValueError("leader election needs lease_duration_s > renew_deadline_s > retry_period_s > 0 "
                             f"(got {self.lease_duration_s}, {self.renew_deadline_s}, {self.retry_period_s})")


ACQUIRED_HOW = ("created", "released", "expired", "earlier")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElector:
    """One candidate. :meth:`try_once` is one step (tests drive it); :meth:`run` loops it on a
    thread and calls ``on_started`` / ``on_stopped`` when leadership begins and ends."""

    def __init__(self, api: Any, cfg: LeaseConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.cfg, self.clock = api, cfg, clock        # api: kubernetes.client.CoordinationV1Api
        self._observed: tuple[Any, ...] | None = None           # the record as last read
        self._observed_at = 0.0                                 # when it last changed, as we saw it
        self._renewed_at: float | None = None                   # our last successful take or renew
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._count = threading.Lock()
        self._leading = False                                   # a leadership not yet ended
        self._deposed = False                                   # lost one: never leads again
        self.transitions = 0
        self.lost = 0                                           # leaderships ended without a release
        self.acquired: dict[str, int] = dict.fromkeys(ACQUIRED_HOW, 0)
        self.last_error = ""

    # -- state ------------------------------------------------------------------------------------
    def holds_lease(self) -> bool:
        """The fence: True while the last successful take or renew (timed at the start of its
        request) is younger than ``renew_deadline_s`` on this process's monotonic clock. No API
        call: every actuator call asks this just before it acts. The first False after leading
        counts the loss (once), and from then on it stays False: this candidate is deposed (a renewal
        that succeeds late does not reopen the fence; the process exits and stands by afresh)."""
        at = self._renewed_at
        held = not self._deposed and at is not None and self.clock() - at < self.cfg.renew_deadline_s
        if not held and self._leading:
            self._ended(lost=True)
        return held

    @property
    def is_leader(self) -> bool:
        """True while the last take or renew is younger than the renew deadline (:meth:`holds_lease`)."""
        return self.holds_lease()

    def _ended(self, lost: bool, why: str = "") -> None:
        with self._count:
            if not self._leading:
                return
            self._leading = False
            if lost:
                self.lost += 1
                self._deposed = True
        if lost:
            at = self._renewed_at
            since = "never renewed" if at is None else f"last renewed {self.clock() - at:.1f} s ago"
            log.error("fenced: lease %s/%s no longer held (%s%s; renew deadline %g s, lease duration %g s): "
                      "acting stops now", self.cfg.namespace, self.cfg.name, since, f", {why}" if why else "",
                      self.cfg.renew_deadline_s, self.cfg.lease_duration_s)

    def holder(self) -> str:
        return str(self._observed[0]) if self._observed else ""

    # -- one step -----------------------------------------------------------------------------------
    def try_once(self) -> bool:
        """Take or renew the Lease if the rules allow; True when this candidate leads after it."""
        from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        if self._deposed:                                       # it lost the Lease: it neither renews
            return False                                        # nor takes it again (see holds_lease)
        cfg, now = self.cfg, self.clock()
        where, timeout = f"lease {cfg.namespace}/{cfg.name}", cfg.retry_period_s * 2
        try:
            lease = self.api.read_namespaced_lease(cfg.name, cfg.namespace, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 404:
                return self._failed(f"read {where}: {_why(exc)}")
            lease = None
        except Exception as exc:  # noqa: BLE001 - connection errors of every kind: try again later
            return self._failed(f"read {where}: {_why(exc)}")
        if lease is None:                                        # none yet: create it, holding it
            body = V1Lease(api_version="coordination.k8s.io/v1", kind="Lease",
                           metadata=V1ObjectMeta(name=cfg.name, namespace=cfg.namespace),
                           spec=self._spec(V1LeaseSpec, transitions=0))
            try:
                self.api.create_namespaced_lease(cfg.namespace, body, _request_timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - a 409 (another candidate created it) included
                return self._failed(f"create {where}: {_why(exc)}")
            return self._took(now, acquired=True, how="created")

        spec = lease.spec or V1LeaseSpec()
        record = (spec.holder_identity or "", spec.renew_time, spec.lease_transitions, spec.lease_duration_seconds)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = record[0]
        mine = holder == cfg.identity
        duration = float(spec.lease_duration_seconds or cfg.lease_duration_s)
        if not mine and holder and now < self._observed_at + duration:
            self._ended(lost=True, why=f"held by {holder!r}")    # someone else leads
            self._renewed_at = None
            return False
        transitions = int(spec.lease_transitions or 0) + (0 if mine else 1)
        lease.spec = self._spec(V1LeaseSpec, transitions=transitions, acquired_at=spec.acquire_time if mine else None)
        try:
            self.api.replace_namespaced_lease(cfg.name, cfg.namespace, lease, _request_timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a 409 (lost a race) included
            return self._failed(f"{'renew' if mine else 'take'} {where}: {_why(exc)}")
        if not mine:
            log.info("took the lease %s/%s from %r (transition %d)", cfg.namespace, cfg.name, holder or "nobody",
                     transitions)
        return self._took(now, acquired=not mine, how="released" if not holder else "earlier" if mine else "expired")

    def _spec(self, cls: Any, *, transitions: int, acquired_at: Any = None) -> Any:
        """This candidate's record, renewed now; acquired now unless ``acquired_at`` is kept. The
        duration is rounded up: the others must never wait less than this replica's fence assumes."""
        t = _now()
        return cls(holder_identity=self.cfg.identity, lease_duration_seconds=max(1, math.ceil(self.cfg.lease_duration_s)),
                   acquire_time=acquired_at or t, renew_time=t, lease_transitions=transitions)

    def _took(self, now: float, acquired: bool, how: str) -> bool:
        if self._leading and not self.holds_lease():       # a renewal that came after the deadline: the
            return False                                    # fence closed meanwhile (deposed), too late
        if acquired:
            self.transitions += 1
        self._renewed_at = now
        self.last_error = ""
        with self._count:
            if not self._leading:                            # a leadership begins
                self._leading = True
                self.acquired[how] += 1
        return True

    def _failed(self, why: str) -> bool:
        if why != self.last_error:
            log.warning("leader election: %s", why)
        self.last_error = why
        return self.is_leader                                   # still leading until the renew deadline

    # -- release ------------------------------------------------------------------------------------
    def release(self) -> bool:
        """Give the Lease up (holder cleared, 1 s duration) if this candidate holds it; True when
        released. Call after this process has stopped acting."""
        self.stop()
        self._ended(lost=False)                              # a leadership given up is not lost
        cfg = self.cfg
        try:
            lease = self.api.read_namespaced_lease(cfg.name, cfg.namespace, _request_timeout=2)
            if lease.spec is None or lease.spec.holder_identity != cfg.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = _now()
            self.api.replace_namespaced_lease(cfg.name, cfg.namespace, lease, _request_timeout=2)
        except Exception as exc:  # noqa: BLE001 - API and connection errors: the lease then expires by itself
            log.warning("leader election: could not release lease %s/%s: %s", cfg.namespace, cfg.name, _why(exc))
            return False
        finally:
            self._renewed_at = None
        log.info("released the lease %s/%s", cfg.namespace, cfg.name)
        return True

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> threading.Thread:
        """Try every retry period on a daemon thread; ``on_started`` when this candidate starts
        leading, ``on_stopped`` (once) when it stops (it could not renew in time, or lost the
        Lease). After ``on_stopped`` the loop ends: a process that lost the lead must not act
        again (``gpuq serve`` exits and starts as a standby)."""
        def loop() -> None:
            leading = False
            while not self._stop.is_set():
                now_leading = self.try_once()
                if now_leading and not leading:
                    leading = True
                    on_started()
                elif leading and not now_leading:
                    log.error("lost the lease %s/%s: %s", self.cfg.namespace, self.cfg.name,
                              self.last_error or f"held by {self.holder()!r}")
                    on_stopped()
                    return
                self._stop.wait(self.cfg.retry_period_s)

        self._thread = threading.Thread(target=loop, name="gpuq-leader", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.cfg.retry_period_s * 3 + 5)


class LeaderCollector(Collector):
    """The elector's metrics, on the standby's ``/metrics`` and the leader's alike (the same series
    across a takeover)::

        gpuq_leader                                  1 while this replica holds the Lease and acts
        gpuq_scheduler_lease_lost_total              leaderships that ended without a release (fenced)
        gpuq_scheduler_lease_acquired_total{how}     leaderships begun: created, released, expired, earlier
    """

    def __init__(self, elector: LeaderElector) -> None:
        self._elector = elector

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        e = self._elector
        yield GaugeMetricFamily("gpuq_leader", "1 when this replica holds the Lease and acts",
                                value=1.0 if e.holds_lease() else 0.0)
        yield CounterMetricFamily("gpuq_scheduler_lease_lost",
                                  "Leaderships of this process that ended without releasing the Lease (it "
                                  "could not renew in time, or another holder took it): acting stopped at once.",
                                  value=e.lost)
        acquired = CounterMetricFamily("gpuq_scheduler_lease_acquired",
                                       "Leaderships of this process begun, by how the Lease was taken: created, "
                                       "released by its holder, expired in another holder's hands (that holder "
                                       "lost it), or held by this identity's earlier process.", labels=["how"])
        for how in ACQUIRED_HOW:
            acquired.add_metric([how], e.acquired[how])
        yield acquired


def _why(exc: Exception) -> str:
    """An API error as its status and reason (not the whole response), anything else as itself."""
    status = getattr(exc, "status", None)
    return f"HTTP {status} {getattr(exc, 'reason', '')}".rstrip() if status else str(exc)


def coordination_api(kubeconfig: str = "", context: str | None = None, in_cluster: bool = False) -> Any:
    """A ``CoordinationV1Api`` on the kubeconfig (or the in-cluster service account)."""
    from kubernetes.client import ApiClient, CoordinationV1Api

    from gpuq.kube import load_configuration
    from gpuq.settings import KubernetesTarget

    target = KubernetesTarget(cluster="leader-election", kubeconfig=kubeconfig, context=context,
                              in_cluster=in_cluster)
    return CoordinationV1Api(ApiClient(load_configuration(target)))
