"""Ray: each node's Prometheus page and the dashboard's State API -> gpuq rows.

Node pages (:class:`RayNodeMetricsTarget`, source ``ray``) keep only

* ``ray_resources{Name, State}`` -> ``ray_resources``: one row per (node, resource, state), the
  accelerator type resources (``accelerator_type:H100``) included. The node is the
  ``NodeAddress`` label, else ``instance`` (its port dropped), else the target's node (the URL
  host unless given). Should a page repeat a (node, resource, state), the last line wins.
* ``ray_node_gpus_*``, ``ray_node_gram_*``, ``ray_node_gpu_*`` (emitted only where Ray sees
  physical GPUs) -> ``gpu_samples`` with their Ray names and units (``gram`` in MiB, utilization
  in %, power in mW): node ``ip``, ``gpu_uuid`` ``GpuUuid``, ``gpu_index`` ``GpuIndex``,
  ``gpu_model`` ``GpuDeviceName``; no pod attribution.

The State API (:class:`RayStateTarget`, source ``ray-state``), as Ray 2.60's dashboard serves it:

* ``GET /api/v0/nodes?limit=N`` and ``GET /api/v0/placement_groups?limit=N&detail=true``
  answer ``{"result": true, "msg": "", "data": {"result": {"total", "num_after_truncation",
  "result": [...], "partial_failure_warning", ...}}}``; a refused request answers
  ``{"result": false, "msg": "...", "data": {"result": null}}`` (with HTTP 400/500).
  Node entries carry no metrics port; placement groups carry no strategy (left empty) and
  their ``bundles`` only with ``detail=true``.
* ``GET /api/jobs/`` (the Job Submission REST API) answers a bare JSON list of drivers and
  submitted jobs, with ``start_time``/``end_time`` (ms, 0 = not yet) and ``metadata``;
  ``/api/v0/jobs`` lacks those, so it is not used.
* With a job ledger, ``GET /api/v0/tasks?limit=N&detail=true&filter_keys=state&filter_predicates=%3D
  &filter_values=<S>`` for each running state S (the GCS filters by state, so only running tasks
  come back; ``detail`` brings ``required_resources`` and ``placement_group_id``) and
  ``GET /api/v0/actors?limit=N&detail=true&...&filter_values=ALIVE``, in the same envelope. A
  task list is truncated when it holds ``limit`` entries: its ``total`` adds Ray's count of task
  events dropped since the cluster started, which says nothing about this answer.

Timestamps: a page sample's own, else ``now``; State API rows get ``now``.

Ledger: the State API target also writes ``gpu_allocations`` rows with ``source='placement_group'``
for placed groups that hold GPUs, and with ``source='ray_job'`` for the GPUs of running tasks and
alive actors outside placement groups, per Ray job and node (:mod:`collector.ray_alloc`); the
discoverer keeps their open allocations between rounds. Ray nodes are named
:func:`ray_node_name` (12 hex characters of the node id) there and everywhere in gpuq;
``ray_nodes.resources_total`` holds each node's ``GPU`` total and its ``accelerator_type:<T>``
resource, which is all the accounting needs for capacity.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from collector.base import ScrapeResult, ScrapeTarget
from collector.errors import CollectorError, ConfigurationError, ScrapeError
from collector.http import HttpClient, fetch, sample_time, status_error, utc
from collector.prometheus import Sample, parse
from collector.ray_alloc import (
    RAY_UNITS,
    RUNNING_TASK_STATES,
    OpenAllocations,
    PlacementGroupLedger,
    RayJobLedger,
    gpu_holders,
    ray_units,
)
from gpuq.ray_names import ray_node_name
from gpuq.settings import RayTarget

__all__ = ["RayDiscoverer", "RayNodeMetricsTarget", "RayStateTarget", "job_rows", "keep_metric",
           "metrics_ports", "node_rows", "page_rows", "placement_group_rows", "ray_node_name",
           "state_api_items"]

log = logging.getLogger(__name__)
Row = tuple[Any, ...]
Entries = tuple[list[dict[str, Any]], list[CollectorError]]     # (entries, warnings)
GPU_PREFIXES = ("ray_node_gpus_", "ray_node_gram_", "ray_node_gpu_")
STATE_LIMIT = 10_000                      # Ray's RAY_MAX_LIMIT_FROM_API_SERVER default
JSON_ACCEPT = "application/json"


def keep_metric(name: str) -> bool:
    return name == "ray_resources" or name.startswith(GPU_PREFIXES)


def _host(text: str) -> str:
    """``instance``/URL host without its port (IPv6 brackets dropped)."""
    return urlsplit(f"//{text}").hostname or text


# -- node pages (pure) ------------------------------------------------------------------------

def page_rows(samples: Iterable[Sample], *, cluster: str, default_node: str,
              now: dt.datetime) -> dict[str, list[Row]]:
    """Ray node samples -> ``{"ray_resources": [...], "gpu_samples": [...]}`` tuples."""
    now = utc(now)
    resources: dict[tuple[str, str, str], Row] = {}
    gpus: list[Row] = []
    for s in samples:
        lab = s.labels
        if s.name == "ray_resources":
            node = lab.get("NodeAddress") or _host(lab.get("instance", "")) or default_node
            key = (node, lab.get("Name", ""), lab.get("State", ""))
            resources[key] = (sample_time(s.timestamp_ms, now), cluster, *key, s.value)
        elif s.name.startswith(GPU_PREFIXES):
            node = (lab.get("ip") or lab.get("NodeAddress") or _host(lab.get("instance", ""))
                    or default_node)
            idx = lab.get("GpuIndex", "")
            gpus.append((sample_time(s.timestamp_ms, now), cluster, node, lab.get("GpuUuid", ""),
                         int(idx) if idx.isdigit() else 0, lab.get("GpuDeviceName", ""), "", "",
                         "", "", "", s.name, s.value, "ray"))
    return {"ray_resources": list(resources.values()), "gpu_samples": gpus}


@dataclass(frozen=True, slots=True)
class RayNodeMetricsTarget:
    """One Ray node's metrics endpoint (``--metrics-export-port``)."""

    cluster: str
    url: str
    node: str = ""                       # fallback node name; default: the URL host
    source: str = field(default="ray", init=False)

    @property
    def name(self) -> str:
        return self.url

    async def scrape(self, client: HttpClient, now: dt.datetime) -> ScrapeResult:
        resp = await fetch(client, self.url)
        page = parse(resp.text, keep=keep_metric, source=self.url)
        rows = page_rows(page, cluster=self.cluster, now=now,
                         default_node=self.node or urlsplit(self.url).hostname or "")
        result = ScrapeResult(samples=len(page), errors=list(page.errors))
        for table, r in rows.items():
            result.add(table, r)
        return result


# -- State API (pure) -------------------------------------------------------------------------

def state_api_items(payload: Any, url: str, *, limit: int | None = None) -> Entries:
    """Unwrap a State API answer -> (entries, warnings). ``result: false`` or an unexpected
    shape raises :class:`ScrapeError`; truncation and partial failures are warnings. Truncation
    is ``num_after_truncation < total``, or with ``limit`` (the task lists), ``limit`` entries."""
    if not isinstance(payload, dict) or "result" not in payload:
        raise ScrapeError(f"{url}: not a Ray State API answer (no 'result' key)", url=url, retryable=False)
    if payload["result"] is not True:
        raise ScrapeError(f"{url}: Ray State API refused: {payload.get('msg') or 'no message'}", url=url)
    data = payload.get("data")
    inner: Any = data.get("result") if isinstance(data, dict) else None
    items = inner.get("result") if isinstance(inner, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ScrapeError(f"{url}: unexpected State API data (expected data.result.result: [...])",
                          url=url, retryable=False)
    warnings: list[CollectorError] = []
    total, kept = inner.get("total"), inner.get("num_after_truncation")
    if limit is not None:
        if len(items) >= limit:
            warnings.append(CollectorError(f"{url}: truncated: {len(items)} entries, the limit", source=url))
    elif isinstance(total, int) and isinstance(kept, int) and kept < total:
        warnings.append(CollectorError(f"{url}: truncated: {kept} of {total} entries", source=url))
    if inner.get("partial_failure_warning"):
        warnings.append(CollectorError(f"{url}: partial failure: {inner['partial_failure_warning']}",
                                       source=url, retryable=True))
    return items, warnings


def _floats(m: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (m or {}).items() if isinstance(v, (int, float))}


def _strings(m: Any) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in (m or {}).items()}


def _ms(value: Any) -> dt.datetime | None:
    """Ray's epoch milliseconds; 0/None mean "not yet"."""
    if not isinstance(value, (int, float)) or value <= 0:
        return None
    return dt.datetime.fromtimestamp(value / 1000, dt.UTC)


def node_rows(nodes: Iterable[Mapping[str, Any]], *, cluster: str, now: dt.datetime) -> list[Row]:
    now = utc(now)
    return [(now, cluster, n.get("node_id") or "", n.get("node_ip") or "", n.get("node_name") or "",
             1 if n.get("is_head_node") else 0, n.get("state") or "",
             _floats(n.get("resources_total")), _strings(n.get("labels"))) for n in nodes]


def job_rows(jobs: Iterable[Mapping[str, Any]], *, cluster: str, now: dt.datetime) -> list[Row]:
    now = utc(now)
    return [(now, cluster, j.get("job_id") or "", j.get("submission_id") or "", j.get("status") or "",
             j.get("entrypoint") or "", _ms(j.get("start_time")), _ms(j.get("end_time")),
             _strings(j.get("metadata"))) for j in jobs]


def placement_group_rows(pgs: Iterable[Mapping[str, Any]], *, cluster: str,
                         now: dt.datetime) -> list[Row]:
    """``gpus``: the GPU of all bundles, summed in Ray's unit (0.1 + 0.2 is 0.3)."""
    now = utc(now)
    rows = []
    for pg in pgs:
        bundles = pg.get("bundles") or []
        gpus = sum(_bundle_units(b) for b in bundles) / RAY_UNITS
        rows.append((now, cluster, pg.get("placement_group_id") or "", pg.get("name") or "",
                     pg.get("creator_job_id") or "", pg.get("state") or "", pg.get("strategy") or "",
                     len(bundles), gpus, json.dumps(bundles, sort_keys=True)))
    return rows


def _bundle_units(bundle: Mapping[str, Any]) -> int:
    try:
        return ray_units(_floats(bundle.get("unit_resources")).get("GPU", 0.0))
    except ValueError:
        return 0


# -- State API (I/O) --------------------------------------------------------------------------

async def get_json(client: HttpClient, url: str) -> Any:
    """GET and decode JSON. An HTTP error answered with Ray's envelope is reported with Ray's
    ``msg``; one without, with the start of the body."""
    resp = await fetch(client, url, accept=JSON_ACCEPT, check_status=False)
    try:
        payload = resp.json()
    except ValueError as exc:
        if resp.status_code >= 400:
            raise status_error(resp, url) from None
        raise ScrapeError(f"{url}: answer is not JSON ({exc})", url=url, retryable=False) from exc
    if resp.status_code >= 400:
        msg = payload.get("msg") if isinstance(payload, dict) else None
        raise status_error(resp, url, f"Ray refused: {msg}" if msg else "")
    return payload


async def list_state(client: HttpClient, url: str, *, limit: int | None = None) -> Entries:
    return state_api_items(await get_json(client, url), url, limit=limit)


async def list_jobs(client: HttpClient, url: str) -> Entries:
    payload = await get_json(client, url)
    if not isinstance(payload, list) or not all(isinstance(j, dict) for j in payload):
        raise ScrapeError(f"{url}: unexpected Jobs API answer (expected a JSON list of jobs)",
                          url=url, retryable=False)
    return payload, []


@dataclass(frozen=True, slots=True)
class RayStateTarget:
    """The dashboard's State API and Jobs API -> ray_nodes, ray_placement_groups, ray_jobs.

    The requests run concurrently; when some fail, the others' rows are kept and the failures go
    to ``ScrapeResult.errors``; when all of the three tables' requests fail, the first failure is
    raised. With a ``ledger``, placed groups also become ``gpu_allocations`` rows (nothing is
    closed in a round whose group list failed, was truncated or partial). With a ``job_ledger``,
    the running tasks and alive actors are listed too and their GPUs outside placement groups
    become ``ray_job`` rows; that round is skipped when a task list, the actor list or the jobs
    list failed (a job's name comes from the jobs list), and nothing ends or falls in it when a
    list was truncated or partial or an entry could not be read."""

    cluster: str
    dashboard_url: str
    limit: int = STATE_LIMIT
    ledger: PlacementGroupLedger | None = field(default=None, compare=False, repr=False)
    job_ledger: RayJobLedger | None = field(default=None, compare=False, repr=False)
    source: str = field(default="ray-state", init=False)

    @property
    def name(self) -> str:
        return self.dashboard_url

    def urls(self) -> dict[str, str]:
        base = self.dashboard_url.rstrip("/")
        return {
            "ray_nodes": f"{base}/api/v0/nodes?limit={self.limit}",
            "ray_placement_groups": f"{base}/api/v0/placement_groups?limit={self.limit}&detail=true",
            "ray_jobs": f"{base}/api/jobs/",
        }

    def holder_urls(self) -> tuple[list[str], str]:
        """(the running tasks' lists, one per running state; the alive actors' list)."""
        base = self.dashboard_url.rstrip("/")
        by_state = f"limit={self.limit}&detail=true&filter_keys=state&filter_predicates=%3D&filter_values="
        return ([f"{base}/api/v0/tasks?{by_state}{state}" for state in RUNNING_TASK_STATES],
                f"{base}/api/v0/actors?{by_state}ALIVE")

    async def scrape(self, client: HttpClient, now: dt.datetime) -> ScrapeResult:
        urls = self.urls()
        task_urls, actor_url = self.holder_urls() if self.job_ledger is not None else ([], "")
        holders = [*(list_state(client, u, limit=self.limit) for u in task_urls),
                   *([list_state(client, actor_url)] if actor_url else [])]
        got = await asyncio.gather(list_state(client, urls["ray_nodes"]),
                                   list_state(client, urls["ray_placement_groups"]),
                                   list_jobs(client, urls["ray_jobs"]), *holders, return_exceptions=True)
        failures: list[Exception] = []
        for g in got:
            if isinstance(g, BaseException):
                if not isinstance(g, CollectorError):
                    raise g                   # a bug, not a failed endpoint
                failures.append(g)
        if all(isinstance(g, BaseException) for g in got[:3]):
            raise next(g for g in got if isinstance(g, BaseException))
        result = ScrapeResult(errors=failures)
        mappers = (node_rows, placement_group_rows, job_rows)
        for table, one, mapper in zip(urls, got, mappers):
            if isinstance(one, BaseException):
                continue
            items, warnings = one
            result.errors.extend(warnings)
            result.samples += len(items)
            result.add(table, mapper(items, cluster=self.cluster, now=now))
        nodes = None if isinstance(got[0], BaseException) else got[0][0]
        pgs = got[1]
        if self.ledger is not None and not isinstance(pgs, BaseException):
            changes = self.ledger.round(pgs[0], nodes, now, complete=not pgs[1])
            result.add("gpu_allocations", [a.row() for a in changes])
        if self.job_ledger is not None:
            self._job_round(result, got[2], list(zip(task_urls, got[3:-1])), (actor_url, got[-1]), nodes, now)
        return result

    def _job_round(self, result: ScrapeResult, jobs: Entries | BaseException,
                   tasks: list[tuple[str, Entries | BaseException]], actors: tuple[str, Entries | BaseException],
                   nodes: list[dict[str, Any]] | None, now: dt.datetime) -> None:
        """The ``ray_job`` rows of this round (see the class docstring)."""
        assert self.job_ledger is not None
        lists = [*tasks, actors]
        if isinstance(jobs, BaseException) or any(isinstance(g, BaseException) for _, g in lists):
            return
        task_lists = [(u, g[0]) for u, g in tasks if not isinstance(g, BaseException)]
        actor_url, actor_got = actors
        assert not isinstance(actor_got, BaseException)
        found, bad = gpu_holders(task_lists, (actor_url, actor_got[0]), jobs[0])
        warned = any(g[1] for _, g in lists if not isinstance(g, BaseException))
        for _, g in lists:
            if not isinstance(g, BaseException):
                result.errors.extend(g[1])
                result.samples += len(g[0])
        result.errors.extend(bad)
        changes = self.job_ledger.round(found, nodes, utc(now), complete=not (warned or bad))
        result.add("gpu_allocations", [a.row() for a in changes])


# -- discovery --------------------------------------------------------------------------------

def metrics_ports(summary: Any) -> dict[str, int]:
    """Pure: the dashboard's ``/nodes?view=summary`` answer -> {node_id: metricsExportPort}."""
    data = summary.get("data") if isinstance(summary, dict) else None
    entries = data.get("summary") if isinstance(data, dict) else None
    out: dict[str, int] = {}
    for entry in entries if isinstance(entries, list) else []:
        raylet = entry.get("raylet") if isinstance(entry, dict) else None
        if not isinstance(raylet, dict):
            continue
        node_id, port = raylet.get("nodeId"), raylet.get("metricsExportPort")
        if isinstance(node_id, str) and node_id and isinstance(port, int):
            out[node_id] = port
    return out


def node_metrics_url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}/metrics" if ":" in ip else f"http://{ip}:{port}/metrics"


class RayDiscoverer:
    """The targets of one Ray cluster: the configured ``metrics_urls``, else every ALIVE node of
    the State API at ``http://{node_ip}:{port}/metrics``, plus the :class:`RayStateTarget`.

    The port is ``settings.metrics_port`` when set. Ray 2.60's State API does not report it, so
    otherwise it comes from the dashboard's ``/nodes?view=summary`` (``raylet.metricsExportPort``;
    a heavier answer, asked only when a node not seen before appears). Set ``metrics_port`` on
    large clusters (KubeRay uses 8080 on every node).

    If the State API cannot be read, the nodes found last time are returned with the State API
    target (whose own scrape then reports the failure), so node pages keep being collected.

    The ledgers (placement groups; with ``job_allocations``, Ray jobs: see
    :func:`collector.sources.ray_job_allocations`) live here, so their open rows outlast the
    targets, which are rebuilt every round.
    """

    def __init__(self, settings: RayTarget, open_allocations: OpenAllocations | None = None,
                 job_allocations: bool = True) -> None:
        self.settings = settings
        self.ledger = PlacementGroupLedger(settings.cluster, open_allocations)
        self.job_ledger = RayJobLedger(settings.cluster, open_allocations) if job_allocations else None
        self.name = f"ray:{settings.cluster}"
        self._ports: dict[str, int] = {}          # node_id -> metrics export port
        self._last: list[RayNodeMetricsTarget] = []

    async def targets(self, client: HttpClient) -> list[ScrapeTarget]:
        s = self.settings
        state = (RayStateTarget(s.cluster, s.dashboard_url, ledger=self.ledger, job_ledger=self.job_ledger)
                 if s.dashboard_url else None)
        found: list[ScrapeTarget] = [] if state is None else [state]
        if s.metrics_urls:
            found.extend(RayNodeMetricsTarget(s.cluster, u) for u in s.metrics_urls)
            return found
        if state is None:
            raise ConfigurationError(f"collector.ray[cluster={s.cluster}]: neither dashboard_url nor "
                                     "metrics_urls is set: nothing to scrape", source=self.name)
        try:
            self._last = await self._discover(client, state)
        except CollectorError as exc:
            log.warning("ray cluster %s: node discovery failed, keeping %d known nodes: %s",
                        s.cluster, len(self._last), exc)
        found.extend(self._last)
        return found

    async def _discover(self, client: HttpClient,
                        state: RayStateTarget) -> list[RayNodeMetricsTarget]:
        nodes, _ = await list_state(client, state.urls()["ray_nodes"])
        alive = [n for n in nodes if n.get("state") == "ALIVE" and n.get("node_ip")]
        port = self.settings.metrics_port
        if port is None and any(n.get("node_id") not in self._ports for n in alive):
            url = f"{state.dashboard_url.rstrip('/')}/nodes?view=summary"
            self._ports.update(metrics_ports(await get_json(client, url)))
        out = []
        for n in alive:
            p = port if port is not None else self._ports.get(n.get("node_id") or "")
            if p is None:
                log.warning("ray cluster %s: no metrics port known for node %s (%s)",
                            self.settings.cluster, n.get("node_id"), n["node_ip"])
                continue
            out.append(RayNodeMetricsTarget(self.settings.cluster, node_metrics_url(n["node_ip"], p),
                                            node=n["node_ip"]))
        return sorted(out, key=lambda t: t.url)
