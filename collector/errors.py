"""Errors of the collector package.

Hierarchy (catch by class, never by message)::

    CollectorError(Exception)      .source (where: URL, file, "<page>"), .retryable, .message
    ├── ParseError                 one malformed exposition line: .lineno (1-based), .line (its text,
    │                              at most 200 characters), .message; retryable=False (the same page
    │                              will fail the same way)
    ├── ScrapeError                a target could not be read: connection refused, timeout, HTTP
    │                              status >= 400, or an answer that is not what the endpoint
    │                              promises (not JSON, Ray's ``result: false``); .url, .status
    │                              (HTTP status or None); retryable unless the answer is a 4xx
    │                              other than 408/429 or a malformed body
    ├── ConfigurationError         a target is configured so that it cannot work (no URL to
    │                              scrape, ...); retryable=False
    └── WatchError                 a Kubernetes list or watch failed: unreachable API server, HTTP
        │                          error, broken stream, an object that cannot be read; .cluster,
        │                          .resource ("pods", "pods/<ns>", "nodes"), .status (HTTP status
        │                          or None); source is the API server URL. Retryable unless the
        │                          server refused us (401/403/404) or the kubeconfig is unusable
        └── ResourceExpired        410 Gone: the resourceVersion is too old; the watcher relists

``retryable`` says whether trying the same operation again can help (a timeout can; a malformed
line cannot). Parse errors are not raised by :func:`collector.prometheus.parse`: they are collected
in ``Page.errors`` and the rest of the page is kept.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CollectorError", "ConfigurationError", "ParseError", "ResourceExpired", "ScrapeError",
           "WatchError"]

_MAX_LINE_CHARS = 200


class CollectorError(Exception):
    """Base class of every error the collector raises or reports."""

    retryable: bool = False

    def __init__(self, message: str, *, source: str = "", retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        if retryable is not None:
            self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments do not survive Exception's default pickling.
        return (_rebuild, (type(self), self.__dict__.copy()))


class ParseError(CollectorError):
    """A malformed line in a Prometheus text or OpenMetrics page (the line is skipped)."""

    retryable = False

    def __init__(self, message: str, *, lineno: int, line: str, source: str = "<page>") -> None:
        super().__init__(message, source=source)
        self.lineno = lineno
        self.line = line[:_MAX_LINE_CHARS]

    def __str__(self) -> str:
        return f"{self.source}: line {self.lineno}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"ParseError({self.message!r}, lineno={self.lineno}, line={self.line!r}, "
            f"source={self.source!r})"
        )


def _rebuild(cls: type[CollectorError], state: dict[str, Any]) -> CollectorError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


class ScrapeError(CollectorError):
    """A target could not be read; the message names the URL.

    ``status`` is the HTTP status when the server answered, else None (connection refused,
    timeout, DNS). Retryable by default; an HTTP 4xx other than 408 and 429 is not (asking again
    gets the same answer), nor is a body that cannot be decoded (pass ``retryable=False``).
    """

    retryable = True

    def __init__(self, message: str, *, url: str, status: int | None = None,
                 retryable: bool | None = None) -> None:
        if retryable is None and status is not None and 400 <= status < 500:
            retryable = status in (408, 429)
        super().__init__(message, source=url, retryable=retryable)
        self.url = url
        self.status = status

    def __str__(self) -> str:
        return self.message if self.url in self.message else f"{self.url}: {self.message}"


class ConfigurationError(CollectorError):
    """A source is configured so that it cannot work (e.g. a Ray cluster with no URL at all)."""

    retryable = False


class WatchError(CollectorError):
    """A Kubernetes list or watch failed; the message names the cluster and the API server."""

    retryable = True

    def __init__(self, message: str, *, source: str = "", cluster: str = "", resource: str = "",
                 status: int | None = None, retryable: bool | None = None) -> None:
        super().__init__(message, source=source, retryable=retryable)
        self.cluster = cluster
        self.resource = resource
        self.status = status


class ResourceExpired(WatchError):
    """410 Gone: the resourceVersion asked for is no longer available; the watcher relists."""

    retryable = True
