"""HTTP and time helpers shared by the scrape targets.

The collector's HTTP client is :class:`HttpClient`, a thin wrapper over one aiohttp session.
aiohttp, not httpx, on this path: fetching 200 Ray node pages (256 KB each) took 0.10-0.16 s
with aiohttp and 1.3-3.5 s with httpx's AsyncClient on the same machine and server
(``docs/PERFORMANCE.md``), and a round of 1,000 nodes has to fit in a 15 s interval.
Targets only see :func:`fetch` and :class:`Response`.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from collector.errors import ConfigurationError, ScrapeError

PROMETHEUS_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
MAX_BODY_BYTES = 64 * 2**20       # collector.max_page_bytes: a larger answer is refused, not read


class BodyTooLarge(Exception):
    """Internal: the answer is larger than the client's limit (reported as a ScrapeError)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes" + (f" ({size} announced)" if size else ""))
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Response:
    url: str
    status_code: int
    reason_phrase: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class HttpClient:
    """One connection pool for a collector's round; use as ``async with HttpClient(...) as c``."""

    def __init__(self, timeout_s: float = 5.0, max_connections: int = 256,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.max_body_bytes = max_body_bytes
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, url: str, headers: dict[str, str] | None = None) -> Response:
        if self._session is None:
            raise RuntimeError("HttpClient used outside 'async with'")
        async with self._session.get(url, headers=headers) as resp:
            # a hostile or broken target must not make us hold an unbounded answer in memory
            limit = self.max_body_bytes
            if resp.content_length is not None and resp.content_length > limit:
                raise BodyTooLarge(resp.content_length, limit)
            chunks, size = [], 0
            async for chunk in resp.content.iter_chunked(1 << 18):   # decompressed bytes
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(0, limit)
                chunks.append(chunk)
            raw = b"".join(chunks)
            text = raw.decode(resp.charset or "utf-8", errors="replace")
            return Response(url, resp.status, resp.reason or "", text)


def utc(now: dt.datetime) -> dt.datetime:
    """``now`` as an aware UTC datetime; a naive one is refused (it has no defined instant)."""
    if now.tzinfo is None:
        raise ValueError(f"naive datetime {now!r}: pass a timezone-aware UTC time")
    return now.astimezone(dt.UTC)


def sample_time(timestamp_ms: int | None, now: dt.datetime) -> dt.datetime:
    if timestamp_ms is None:
        return now
    return dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)


async def fetch(client: HttpClient, url: str, *, accept: str = PROMETHEUS_ACCEPT,
                check_status: bool = True) -> Response:
    """GET ``url``; a failure becomes a :class:`ScrapeError` naming the URL (an HTTP status >= 400
    too, unless ``check_status`` is off: then the caller inspects the answer)."""
    try:
        resp = await client.get(url, headers={"Accept": accept})
    except aiohttp.InvalidURL as exc:
        raise ConfigurationError(f"{url}: invalid URL ({exc})", source=url) from exc
    except (aiohttp.NonHttpUrlClientError, ValueError) as exc:
        raise ConfigurationError(f"{url}: unsupported URL ({exc})", source=url) from exc
    except asyncio.TimeoutError as exc:
        raise ScrapeError(f"{url}: timed out after {client.timeout_s:g}s", url=url) from exc
    except BodyTooLarge as exc:
        raise ScrapeError(f"{url}: {exc} (collector.max_page_bytes): not read", url=url,
                          retryable=False) from exc
    except aiohttp.ClientError as exc:
        raise ScrapeError(f"{url}: cannot connect: {exc or type(exc).__name__}", url=url) from exc
    if check_status and resp.status_code >= 400:
        raise status_error(resp, url)
    return resp


def status_error(resp: Response, url: str, detail: str = "") -> ScrapeError:
    """The error for an HTTP status >= 400: status, reason, and ``detail`` or the body's start."""
    detail = detail or " ".join(resp.text[:200].split())
    return ScrapeError(f"{url}: HTTP {resp.status_code} {resp.reason_phrase}"
                       + (f": {detail}" if detail else ""), url=url, status=resp.status_code)
