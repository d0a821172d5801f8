"""dcgm-exporter pages -> ``gpu_samples`` rows (source ``dcgm``).

Labels read from each series (everything else, e.g. ``device``, ``pci_bus_id``,
``DCGM_FI_DRIVER_VERSION``, is ignored):

=========================  =============================================================
column                     label(s), first present wins
=========================  =============================================================
node                       ``Hostname``, ``hostname`` (newer exporters); else the target's
                           ``node`` (the Kubernetes node when discovered), else the URL host
gpu_uuid / gpu_index       ``UUID`` / ``gpu`` (an index that is not an integer reads as 0)
gpu_model                  ``modelName``
mig_instance / mig_profile ``GPU_I_ID`` / ``GPU_I_PROFILE`` (empty on a whole GPU)
pod, namespace, container  ``pod``/``namespace``/``container`` or the older
                           ``pod_name``/``pod_namespace``/``container_name``
=========================  =============================================================

Every ``DCGM_FI_*`` (and the exporter's own per-GPU ``DCGM_EXP_*``) series is kept with its name
as-is, counters and gauges alike (counter resets are the accounting's business). Skipped, and
counted in :attr:`DcgmRows.skipped`, not reported as errors:

* series with neither ``UUID`` nor ``gpu``: they belong to no GPU (test pages carry such
  label-less dummy lines, e.g. ``DCGM_FI_DEV_FAN_SPEED 0``);
* non-finite values (NaN, +-Inf): they carry no reading and would poison sums in the rollups.

A sample's own timestamp is used when the page has one (dcgm-exporter writes none), else ``now``.

Per-process fields (dcgm-exporter #594, with ``--kubernetes-virtual-gpus``): on a GPU that pods
share, ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` come once for the device (no pod) and once
per pod with the pod's own processes' SM utilization and memory (0 for a pod with no process);
every other field is the device's value copied to each pod. A device whose page has both a
device-level and per-pod series of one of those two fields is read in that mode
(:func:`per_process_devices`): the per-pod series are stored with source ``dcgm-process`` (the
accounting's ``idle_method`` ``per_process``), and the per-pod copies of
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` become one device-level row (no pod), the others dropped
(counted in :attr:`DcgmRows.copies`): they are the device's activity, and would otherwise stand
for each pod's own (the accounting prefers that field to ``DCGM_FI_DEV_GPU_UTIL``). On a MIG
instance NVML has no per-process utilization, so dcgm-exporter writes 0 for every pod there: those
``DCGM_FI_DEV_GPU_UTIL`` series are dropped too (they measure nothing, and would make every pod
look idle), and the instance's own fields stay each pod's.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from collector.base import ScrapeResult, ScrapeTarget
from collector.errors import ConfigurationError, ScrapeError
from collector.http import HttpClient, fetch, sample_time, utc
from collector.prometheus import Sample, parse
from gpuq.settings import DcgmTarget as DcgmSettings
from gpuq.settings import KubernetesTarget

__all__ = [
    "DcgmDiscoverer",
    "DcgmRows",
    "DcgmTarget",
    "gpu_sample_rows",
    "keep_metric",
    "targets_from_pods",
]

SOURCE = "dcgm"
PER_PROCESS_SOURCE = "dcgm-process"
PER_PROCESS_METRICS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"})
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
PROF_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
KEEP_PREFIXES = ("DCGM_FI_", "DCGM_EXP_")
Row = tuple[Any, ...]
Device = tuple[str, str, str]          # (UUID, gpu index, GPU_I_ID)


def keep_metric(name: str) -> bool:
    return name.startswith(KEEP_PREFIXES)


def _first(labels: Mapping[str, str], *names: str) -> str:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return ""


def _index(text: str) -> int:
    return int(text) if text.isdigit() and int(text) < 65536 else 0   # gpu_index is UInt16


@dataclass(frozen=True, slots=True)
class DcgmRows:
    rows: list[Row]
    skipped: int          # series with no GPU identity or a non-finite value
    copies: int = 0       # per-pod copies of device values dropped on per-process devices (see above)


def _device(labels: Mapping[str, str]) -> Device:
    return (_first(labels, "UUID", "uuid"), labels.get("gpu", ""), labels.get("GPU_I_ID", ""))


def _pod(labels: Mapping[str, str]) -> str:
    return _first(labels, "pod", "pod_name")


def per_process_devices(samples: Iterable[Sample]) -> frozenset[Device]:
    """The devices a page reports with dcgm-exporter's per-process fields: a device-level and a
    per-pod series of ``DCGM_FI_DEV_GPU_UTIL`` or ``DCGM_FI_DEV_FB_USED`` both on the page (without
    per-process fields, pod series replace the device's)."""
    device_level: set[tuple[str, Device]] = set()
    per_pod: set[tuple[str, Device]] = set()
    for s in samples:
        if s.name in PER_PROCESS_METRICS:
            (per_pod if _pod(s.labels) else device_level).add((s.name, _device(s.labels)))
    return frozenset(d for _, d in device_level & per_pod)


def gpu_sample_rows(samples: Iterable[Sample], *, cluster: str, default_node: str,
                    now: dt.datetime) -> DcgmRows:
    """Pure: dcgm-exporter samples -> gpu_samples tuples in ``COLUMNS['gpu_samples']`` order."""
    now = utc(now)
    samples = list(samples)
    per_process = per_process_devices(samples)
    rows: list[Row] = []
    skipped = copies = 0
    device_rows: set[tuple[str, Device]] = set()       # device-level rows made of per-pod copies
    for s in samples:
        lab = s.labels
        uuid = _first(lab, "UUID", "uuid")
        gpu = lab.get("gpu", "")
        if not (uuid or gpu) or not math.isfinite(s.value):
            skipped += 1
            continue
        pod, namespace, container, source = _pod(lab), _first(lab, "namespace", "pod_namespace"), \
            _first(lab, "container", "container_name"), SOURCE
        if pod and per_process and (device := _device(lab)) in per_process:
            mig = bool(lab.get("GPU_I_ID"))
            if s.name == PROF_ACTIVE and not mig:
                if (s.name, device) in device_rows:
                    copies += 1
                    continue
                device_rows.add((s.name, device))
                pod = namespace = container = ""
            elif s.name == GPU_UTIL and mig:
                copies += 1
                continue
            elif s.name in PER_PROCESS_METRICS:
                source = PER_PROCESS_SOURCE
        rows.append((
            sample_time(s.timestamp_ms, now), cluster,
            _first(lab, "Hostname", "hostname") or default_node,
            uuid, _index(gpu), lab.get("modelName", ""),
            lab.get("GPU_I_PROFILE", ""), lab.get("GPU_I_ID", ""),
            pod, namespace, container,
            s.name, s.value, source,
        ))
    return DcgmRows(rows, skipped, copies)


@dataclass(frozen=True, slots=True)
class DcgmTarget:
    """One dcgm-exporter ``/metrics`` endpoint. ``node`` overrides the URL host as fallback node."""

    cluster: str
    url: str
    node: str = ""
    source: str = field(default=SOURCE, init=False)

    @property
    def name(self) -> str:
        return self.url

    async def scrape(self, client: HttpClient, now: dt.datetime) -> ScrapeResult:
        resp = await fetch(client, self.url)
        page = parse(resp.text, keep=keep_metric, source=self.url)
        mapped = gpu_sample_rows(page, cluster=self.cluster,
                                 default_node=self.node or urlsplit(self.url).hostname or "", now=now)
        result = ScrapeResult(samples=len(page), errors=list(page.errors))
        result.add("gpu_samples", mapped.rows)
        return result


def targets_from_pods(pod_list: Mapping[str, Any], *, cluster: str, port: int) -> list[DcgmTarget]:
    """Pure: a Kubernetes PodList (JSON) of dcgm-exporter pods -> one target per running pod,
    named after its node (``spec.nodeName``), so rows carry the Kubernetes node name."""
    out = []
    for pod in pod_list.get("items") or []:
        status, spec = pod.get("status") or {}, pod.get("spec") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        out.append(DcgmTarget(cluster, f"http://{host}:{port}/metrics", node=spec.get("nodeName") or ""))
    return sorted(out, key=lambda t: t.url)


class DcgmDiscoverer:
    """The listed URLs, plus (with ``discover_kubernetes``) every running pod matching
    ``discover_label_selector`` in the Kubernetes cluster ``kubernetes`` points at."""

    def __init__(self, settings: DcgmSettings, kubernetes: KubernetesTarget | None = None) -> None:
        self.settings = settings
        self.kubernetes = kubernetes
        self.name = f"dcgm:{settings.cluster}"

    async def targets(self, client: HttpClient) -> list[ScrapeTarget]:
        s = self.settings
        found: list[ScrapeTarget] = [DcgmTarget(s.cluster, u) for u in s.urls]
        if s.discover_kubernetes:
            if self.kubernetes is None:
                raise ConfigurationError(
                    f"collector.dcgm[cluster={s.cluster}]: discover_kubernetes is set but no "
                    f"collector.kubernetes entry names cluster {s.cluster!r}", source=self.name)
            pods = await asyncio.to_thread(_list_pods, self.kubernetes, s.discover_label_selector)
            found.extend(targets_from_pods(pods, cluster=s.cluster, port=s.port))
        elif not s.urls:
            raise ConfigurationError(
                f"collector.dcgm[cluster={s.cluster}]: no urls and discover_kubernetes is off",
                source=self.name)
        return found


def _list_pods(k: KubernetesTarget, selector: str) -> dict[str, Any]:
    """Blocking: list pods by label selector (all namespaces) as raw JSON."""
    import json
    import os

    from kubernetes import client, config

    where = "in-cluster config" if k.in_cluster else (k.kubeconfig or "the default kubeconfig")
    try:
        if k.in_cluster:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api = client.ApiClient()
        else:
            api = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=os.path.expanduser(k.kubeconfig) if k.kubeconfig else None, context=k.context)
    except Exception as exc:  # the client raises ConfigException, OSError, YAML errors ...
        raise ConfigurationError(f"collector.kubernetes[cluster={k.cluster}]: cannot load {where}: {exc}",
                                 source=where) from exc
    try:
        resp: Any = client.CoreV1Api(api).list_pod_for_all_namespaces(
            label_selector=selector, _preload_content=False, _request_timeout=10)
        data: dict[str, Any] = json.loads(resp.data)    # the raw answer: no model decoding
        return data
    except Exception as exc:  # ApiException, urllib3 errors, bad JSON: a failed discovery
        where = api.configuration.host
        raise ScrapeError(f"{where}: listing dcgm-exporter pods ({selector}) failed: {exc}",
                          url=where) from exc
    finally:
        api.close()  # type: ignore[no-untyped-call]
