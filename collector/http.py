"""HTTP and time helpers shared by the scrape targets."""
from __future__ import annotations

import datetime as dt

import httpx

from collector.errors import ConfigurationError, ScrapeError

PROMETHEUS_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


def utc(now: dt.datetime) -> dt.datetime:
    """``now`` as an aware UTC datetime; a naive one is refused (it has no defined instant)."""
    if now.tzinfo is None:
        raise ValueError(f"naive datetime {now!r}: pass a timezone-aware UTC time")
    return now.astimezone(dt.UTC)


def sample_time(timestamp_ms: int | None, now: dt.datetime) -> dt.datetime:
    if timestamp_ms is None:
        return now
    return dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)


async def fetch(client: httpx.AsyncClient, url: str, *, accept: str = PROMETHEUS_ACCEPT,
                check_status: bool = True) -> httpx.Response:
    """GET ``url``; a failure becomes a :class:`ScrapeError` naming the URL (an HTTP status >= 400
    too, unless ``check_status`` is off: then the caller inspects the answer)."""
    try:
        resp = await client.get(url, headers={"Accept": accept})
    except httpx.UnsupportedProtocol as exc:
        raise ConfigurationError(f"{url}: unsupported URL ({exc})", source=url) from exc
    except httpx.InvalidURL as exc:
        raise ConfigurationError(f"{url}: invalid URL ({exc})", source=url) from exc
    except httpx.TimeoutException as exc:
        raise ScrapeError(f"{url}: timed out ({type(exc).__name__})", url=url) from exc
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{url}: cannot connect: {exc or type(exc).__name__}", url=url) from exc
    if check_status and resp.status_code >= 400:
        raise status_error(resp, url)
    return resp


def status_error(resp: httpx.Response, url: str, detail: str = "") -> ScrapeError:
    """The error for an HTTP status >= 400: status, reason, and ``detail`` or the body's start."""
    detail = detail or " ".join(resp.text[:200].split())
    return ScrapeError(f"{url}: HTTP {resp.status_code} {resp.reason_phrase}"
                       + (f": {detail}" if detail else ""), url=url, status=resp.status_code)
