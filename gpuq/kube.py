"""Kubernetes client configuration for one ``KubernetesTarget``, shared by the collector's watcher
and the scheduler's actuator (kubeconfig path and context, or the in-cluster service account)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuq.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes.client import Configuration

    from gpuq.settings import KubernetesTarget


def load_configuration(target: KubernetesTarget) -> Configuration:
    """The client configuration; ConfigError names the target, the file and the context.

    ``retries`` is 0: callers retry with their own backoff."""
    from kubernetes import config as k8s_config
    from kubernetes.client import Configuration

    cfg = Configuration()
    where = "in-cluster service account" if target.in_cluster else (target.kubeconfig or "default kubeconfig")
    try:
        if target.in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            path = str(Path(target.kubeconfig).expanduser()) if target.kubeconfig else None
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=target.context, client_configuration=cfg, persist_config=False)
    except (k8s_config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        ctx = f" (context {target.context!r})" if target.context else ""
        raise ConfigError(f"kubernetes cluster {target.cluster!r}", f"cannot load {where}{ctx}: {exc}") from exc
    cfg.retries = 0
    return cfg
