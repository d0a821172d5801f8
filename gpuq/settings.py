"""One settings tree for every gpuq command, read once at start.

Sources, strongest first: ``GPUQ_*`` environment variables (nested with ``__``, e.g.
``GPUQ_STORE__DSN``), then the YAML file given with ``--config``, then the defaults below.
This is the only module that reads the environment; everything else gets a ``Settings``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from gpuq.errors import ConfigError
from gpuq.yamlsafe import safe_load

DEFAULT_DSN = "chdb://.gpuq/data"
QUEUES_FROM_NAMES = {"kueue": "Kueue", "yunikorn": "YuniKorn"}   # queues_from -> the scheduler that acts


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The longest retention accepted, in days (100 years). The TTL expressions compute on DateTime64
# (range to 2299), so now + this stays far inside it; DateTime (to 2106) wrapped to 1990 and
# expired every row at insert (issue 9).
MAX_RETENTION_DAYS = 36_500


class RetentionSettings(_Section):
    """How long each kind of row is kept (``store.retention``); the TTL follows at every start."""

    raw_days: int = Field(default=90, ge=1, le=MAX_RETENTION_DAYS)       # raw series, per-minute rollups
    rollup_days: int = Field(default=800, ge=1, le=MAX_RETENTION_DAYS)   # hourly billing rollups (> 2 years)
    events_days: int = Field(default=400, ge=1, le=MAX_RETENTION_DAYS)   # scheduler_events (the audit trail)


class StoreSettings(_Section):
    dsn: str = DEFAULT_DSN
    database: str = "gpuq"                # used when the DSN names none
    # a ClickHouse cluster of remote_servers: Replicated tables ON CLUSTER + Distributed ones
    # (gpuq.store.cluster); needs an http(s) DSN. Empty: one server (or chDB)
    cluster: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_.-]{0,99})?$")
    ttl_days: int = Field(default=90, ge=1, le=MAX_RETENTION_DAYS)   # alias of retention.raw_days
    retention: RetentionSettings = RetentionSettings()
    batch_rows: int = Field(default=50_000, ge=1)
    batch_interval_s: float = Field(default=2.0, gt=0)
    retry_attempts: int = Field(default=3, ge=1)
    retry_backoff_s: float = Field(default=0.5, ge=0)
    spill_dir: str = ".gpuq/spill"         # batches the database refused, replayed later
    # rows in memory (buffered + held when a spill fails); past it the newest are dropped, counted
    max_buffered_rows: int = Field(default=1_000_000, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _ttl_days_alias(cls, data: Any) -> Any:
        """``store.ttl_days`` (the old single setting) is ``store.retention.raw_days``: either may be
        given, both only with the same value; afterwards both read the same."""
        if not isinstance(data, dict):
            return data
        ret = data.get("retention")
        ret = ret.model_dump(exclude_unset=True) if isinstance(ret, BaseModel) else ret
        if ret is None:
            ret = {}
        if not isinstance(ret, dict):
            return data                       # pydantic names the bad type
        if "ttl_days" in data:
            old, new = data["ttl_days"], ret.get("raw_days", data["ttl_days"])
            if str(old).strip() != str(new).strip():
                raise ValueError(f"store.ttl_days ({old}) is the old name of store.retention.raw_days "
                                 f"({new}): give one of them")
            return {**data, "retention": {**ret, "raw_days": old}}
        return data

    @model_validator(mode="after")
    def _ttl_days_follows(self) -> StoreSettings:
        if self.ttl_days != self.retention.raw_days:          # only retention.raw_days was given
            object.__setattr__(self, "ttl_days", self.retention.raw_days)
        return self


class RayTarget(_Section):
    cluster: str
    dashboard_url: str | None = None     # the State API
    metrics_urls: list[str] = []         # else found through the State API
    metrics_port: int | None = None      # port of each node's metrics endpoint when discovered
    # bill the GPUs of Ray tasks and actors outside placement groups as source ray_job
    # (collector.ray_alloc); default: on, unless a collector.kubernetes target has this cluster
    # name (the Ray nodes are then pods, billed as pods: their tasks must not be billed again)
    ray_job_allocations: bool | None = None


class DcgmTarget(_Section):
    cluster: str
    urls: list[str] = []
    # discover dcgm-exporter pods through this Kubernetes target's cluster name
    discover_kubernetes: bool = False
    discover_label_selector: str = "app.kubernetes.io/name=dcgm-exporter"
    port: int = 9400


class KubernetesTarget(_Section):
    cluster: str
    kubeconfig: str | None = None
    in_cluster: bool = False
    context: str | None = None
    namespaces: list[str] = []           # empty = all namespaces
    watch_timeout_s: int = Field(default=300, ge=1)
    # queues_from: kueue: how often Kueue's visibility API is asked for each ClusterQueue's pending
    # Workloads (their positions in Kueue's order; collector/k8s_kueue_visibility.py); 0: never
    kueue_visibility_interval_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)


class NvmlSettings(_Section):
    enabled: bool = False
    cluster: str = "local"
    node: str | None = None              # defaults to the host name


class CollectorSettings(_Section):
    interval_s: float = Field(default=15.0, gt=0)
    timeout_s: float = Field(default=5.0, gt=0)
    jitter_s: float = Field(default=1.0, ge=0)
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # distinct series (label sets) kept per scrape target; new series past it are refused, counted
    max_series_per_target: int = Field(default=20_000, ge=1)
    series_forget_rounds: int = Field(default=20, ge=1)   # a series unseen this many scrapes frees its slot
    max_page_bytes: int = Field(default=64 * 2**20, ge=1024)   # a larger answer fails the scrape unread
    ray: list[RayTarget] = []
    dcgm: list[DcgmTarget] = []
    kubernetes: list[KubernetesTarget] = []
    nvml: NvmlSettings = NvmlSettings()
    # spans of scrapes, scheduler cycles and actuator calls: otlp reads OTEL_EXPORTER_OTLP_* (gpuq.tracing)
    otel_exporter: Literal["none", "console", "memory", "otlp"] = "none"


class YuniKornSettings(_Section):
    """Where YuniKorn keeps its queue configuration (``queues_from: yunikorn``, docs/YUNIKORN.md)."""

    namespace: str = Field(default="yunikorn", min_length=1)   # of the yunikorn-configs/-defaults ConfigMaps
    partition: str = Field(default="default", min_length=1)    # the partition whose queues are the tree


class AccountingSettings(_Section):
    interval_s: float = Field(default=30.0, gt=0)
    idle_threshold_pct: float = Field(default=5.0, ge=0, le=100)
    idle_window_s: float = Field(default=1800.0, gt=0)
    starvation_s: float = Field(default=600.0, gt=0)


class SchedulerKubernetes(_Section):
    """The ``kubernetes`` actuator (Kueue-style suspend/unsuspend of KubeRay objects)."""

    cluster: str | None = None           # which collector.kubernetes target; default the first
    node_label_key: str = "nvidia.com/gpu.product"
    node_labels: dict[str, str] = {}     # GPU type -> node label value; default: the queue file's


class SchedulerRay(_Section):
    """The ``ray`` actuator (Ray Job Submission API)."""

    dashboard_url: str | None = None     # default: the first collector.ray dashboard_url
    timeout_s: float = Field(default=10.0, gt=0)
    pin_accelerator_type: bool = True    # add accelerator_type:<TYPE> to the job's resources
    accelerator_resources: dict[str, str] = {}   # GPU type -> Ray resource name, where they differ


class PreemptionLimit(_Section):
    """The brake on preemption: at most this many workloads preempted in any sliding hour, per
    victim queue and over the cluster (None: no limit). Counted from ``scheduler_events`` at start,
    so a restart does not release the brake."""

    per_queue_per_hour: int | None = Field(default=20, ge=0)
    cluster_per_hour: int | None = Field(default=60, ge=0)


class SchedulerSettings(_Section):
    actuator: Literal["dry-run", "kubernetes", "ray"] = "dry-run"
    cluster: str = "default"             # the name the scheduler's events carry
    nodes_file: str | None = None        # static node list; default: the accounting's view of capacity
    cycle_interval_s: float = Field(default=1.0, gt=0)
    preemption: bool = True
    preemption_delay_s: float = Field(default=30.0, ge=0)
    # what a preemption may restore (issue 21): a queue's guarantee only (YuniKorn's rule), or also its
    # entitlement, the GPUs beyond the guarantees divided by queue weight (docs/SCENARIOS.md)
    reclaim: Literal["guarantee", "fair_share"] = "guarantee"
    # fair share over time (issue 21): a queue's GPU use decayed with this half-life lowers its place
    # in the order of queues (scheduler/ordering.py); 0: off, today's order
    usage_half_life_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    retry_attempts: int = Field(default=4, ge=1)        # actuator calls, with backoff
    retry_backoff_s: float = Field(default=0.2, ge=0)
    actuator_timeout_s: float = Field(default=10.0, gt=0)   # one actuator request (kubernetes)
    actuator_budget_s: float = Field(default=60.0, gt=0)    # one action, retries included
    actuator_workers: int = Field(default=4, ge=1)          # actions run outside the lock, one per workload at a time
    preemption_limit: PreemptionLimit = PreemptionLimit()
    refused_backoff_s: float = Field(default=30.0, gt=0)    # first wait after a PodDisruptionBudget refusal (doubles)
    kubernetes: SchedulerKubernetes = SchedulerKubernetes()
    ray: SchedulerRay = SchedulerRay()


class ApiToken(_Section):
    """A bearer token. An operator's actions are scoped: ``namespaces`` (Kubernetes namespaces of
    its targets) and ``queues`` (queue subtree roots: ``research`` allows ``research.vision``);
    ``"*"`` allows all. Both must be set on an operator token. A viewer reads everything, or with
    ``queues`` only those queues' subtrees (a tenant's token, issue 21: docs/SECURITY.md); admins
    are unscoped (see docs/API.md). ``max_priority`` and
    ``non_preemptible`` narrow what the operator's workloads may ask below their queue's policy
    (docs/SECURITY.md); every caller, admins included, is bounded by the queue's."""

    token: str = Field(min_length=1)
    role: Literal["viewer", "operator", "admin"] = "viewer"
    name: str = ""
    namespaces: list[str] | None = None
    queues: list[str] | None = None
    # narrower than the queues' policy (issue 17): the highest priority this operator may submit,
    # and whether it may submit non-preemptible workloads at all; unset: as the queue allows
    max_priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    non_preemptible: bool | None = None

    @model_validator(mode="after")
    def _scoped(self) -> ApiToken:
        scoped = self.namespaces is not None or self.queues is not None
        if self.role == "operator" and (not self.namespaces or not self.queues):
            raise ValueError("an operator token needs both namespaces and queues (its scope; "
                             "['*'] allows all)")
        if self.role == "viewer" and self.namespaces is not None:
            raise ValueError("a viewer token takes queues (the queues it reads), not namespaces")
        if self.role == "viewer" and self.queues is not None and not self.queues:
            raise ValueError("a viewer token's queues is not empty (leave it out to read every queue)")
        if self.role == "admin" and scoped:
            raise ValueError("namespaces and queues scope an operator's actions or a viewer's reads; admin tokens "
                             "take none")
        if self.role != "operator" and (self.max_priority is not None or self.non_preemptible is not None):
            raise ValueError(f"max_priority and non_preemptible narrow an operator's submits; {self.role} "
                             "tokens take none (the queue file's policy bounds every caller)")
        return self


class ApiSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8377, ge=0, le=65535)
    tokens: list[ApiToken] = []
    insecure: bool = False               # allow a non-loopback host without tokens (auth off)
    allowed_hosts: list[str] = []        # with auth off, Host/Origin names a mutating request may carry
                                         # besides localhost, 127.0.0.1, ::1 and api.host (issue 17)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)   # larger request bodies: 413
    max_spec_bytes: int = Field(default=65_536, ge=1024)      # a submitted workload's spec as stored
    # slow clients (issue 17; scheduler/api/server.py): a request's headers complete within
    # header_timeout_s; its body at body_min_bytes_per_s after a grace of body_timeout_s (which also
    # bounds an answer the client does not read); at most max_connections open, one more gets 503
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_min_bytes_per_s: int = Field(default=1024, ge=1, le=2**30)
    max_connections: int = Field(default=512, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _unique(self) -> ApiSettings:
        seen = [t.token for t in self.tokens]
        if len(set(seen)) != len(seen):
            raise ValueError("two api.tokens have the same token")
        return self


class DashboardSettings(_Section):
    """``gpuq dashboard``: the Streamlit app reads the API at ``api_url`` with a viewer ``token``."""

    api_url: str = "http://127.0.0.1:8377"
    token: str = ""                      # a viewer token of api.tokens (empty: the API has auth off)
    host: str = "127.0.0.1"
    port: int = Field(default=8501, ge=0, le=65535)
    refresh_s: float = Field(default=30.0, gt=0)       # auto-refresh of each page
    cache_ttl_s: float = Field(default=15.0, ge=0)     # API answers shared by every viewer this long


def _env(name: str, default: str = "") -> str:
    import os

    return os.environ.get(name, "") or default


def _host() -> str:
    import socket

    return socket.gethostname()


class LeaderSettings(_Section):
    """Leader election among ``gpuq serve`` replicas (a ``coordination.k8s.io/v1`` Lease): only the
    leader acts; the others stand by with ``/readyz`` 503. ``namespace`` defaults to the pod's
    (``POD_NAMESPACE`` from the downward API), ``identity`` to ``POD_NAME``, else the host name."""
    enabled: bool = False
    lease_name: str = "gpuq"
    namespace: str = Field(default_factory=lambda: _env("POD_NAMESPACE", "default"))
    identity: str = Field(default_factory=lambda: _env("POD_NAME") or _host())
    lease_duration_s: float = Field(default=15.0, gt=0, le=3600)
    renew_deadline_s: float = Field(default=10.0, gt=0, le=3600)
    retry_period_s: float = Field(default=2.0, gt=0, le=600)
    kubeconfig: str | None = None        # the Lease's API server; in_cluster in a pod
    context: str | None = None
    in_cluster: bool = False

    @model_validator(mode="after")
    def _order(self) -> LeaderSettings:
        if not (self.lease_duration_s > self.renew_deadline_s > self.retry_period_s):
            raise ValueError("needs lease_duration_s > renew_deadline_s > retry_period_s (got "
                             f"{self.lease_duration_s}, {self.renew_deadline_s}, {self.retry_period_s})")
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GPUQ_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    store: StoreSettings = StoreSettings()
    collector: CollectorSettings = CollectorSettings()
    accounting: AccountingSettings = AccountingSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    api: ApiSettings = ApiSettings()
    dashboard: DashboardSettings = DashboardSettings()
    leader: LeaderSettings = LeaderSettings()
    queues_file: str | None = None
    # where the queue tree comes from: the queue file (gpuq schedules), or the objects of the scheduler the
    # cluster already runs, followed live (Kueue's ClusterQueues, YuniKorn's ConfigMap): gpuq then advises and
    # that scheduler acts, so only the dry-run actuator is accepted (docs/KUEUE.md)
    queues_from: Literal["file", "kueue", "yunikorn"] = "file"
    yunikorn: YuniKornSettings = YuniKornSettings()

    @model_validator(mode="after")
    def _advises_only(self) -> Settings:
        if self.queues_from == "file":
            return self
        name = QUEUES_FROM_NAMES[self.queues_from]
        if self.scheduler.actuator != "dry-run":
            raise ValueError(f"queues_from: {self.queues_from} needs scheduler.actuator: dry-run (gpuq advises; "
                             f"{name} acts), got scheduler.actuator: {self.scheduler.actuator}")
        if self.queues_file:
            raise ValueError(f"queues_from: {self.queues_from} takes the queue tree from {name}'s objects: "
                             f"queues_file ({self.queues_file}) would be ignored; leave it unset")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # environment beats the file (passed as init kwargs by load_settings)
        return (env_settings, init_settings)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read config file: {exc.strerror or exc}") from exc
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def _env_names(message: str) -> str:
    """The ``GPUQ_*`` variables of the section pydantic-settings names in ``message``."""
    section = message.split('"')[1] if message.count('"') >= 2 else ""
    prefix = f"GPUQ_{section}".upper()
    names = sorted(k for k in os.environ if k.upper() == prefix or k.upper().startswith(prefix + "__"))
    return "environment " + (", ".join(names) or "GPUQ_*")


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read the YAML file (if any) and the environment; raise ConfigError naming the bad key."""
    data: dict[str, Any] = _read_yaml(Path(path).expanduser()) if path else {}
    data.update(overrides)
    try:
        settings = Settings(**data)
    except SettingsError as exc:          # a GPUQ_* variable that is not valid JSON where JSON is needed
        raise ConfigError(_env_names(str(exc)), f"cannot parse it: {exc.__cause__ or exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        origin = f"{path}: " if path else ""
        value = err.get("input")
        shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
        if not key:                       # a check across sections (a model validator): its message names the keys
            raise ConfigError(str(path) if path else "settings",
                              str(err["msg"]).removeprefix("Value error, ")) from exc
        raise ConfigError(f"{origin}{key}", f"{err['msg']}{shown}") from exc
    if settings.queues_file and path and not Path(settings.queues_file).is_absolute():
        # absolute, not resolved: a Kubernetes ConfigMap mount is a symlink into a directory the
        # kubelet replaces at each update (accounting/watcher.py), so the link must stay in the path
        rel = os.path.abspath(Path(path).expanduser().parent / settings.queues_file)
        settings = settings.model_copy(update={"queues_file": str(rel)})
    return settings
