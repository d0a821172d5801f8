"""The dashboards' one way to the data: GET the gpuq HTTP API with the viewer token, answers
shared by every viewer of this Streamlit process for ``dashboard.cache_ttl_s`` seconds
(``st.cache_data``), so a dozen admins on the same page ask the API once per TTL.

Errors become :class:`ApiError` with the URL and why (unreachable, HTTP status and the problem's
``detail``); pages show them as an empty state instead of a traceback.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import streamlit as st

from gpuq.settings import DashboardSettings, load_settings

TIMEOUT_S = 10.0


class ApiError(Exception):
    def __init__(self, url: str, why: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {why}")
        self.url, self.why, self.status = url, why, status


@dataclass(frozen=True, slots=True)
class Conf:
    api_url: str
    token: str
    refresh_s: float
    cache_ttl_s: float


def conf(argv: list[str] | None = None) -> Conf:
    """The ``dashboard`` settings: ``--config FILE`` after ``--`` on the ``streamlit run`` line
    (``gpuq dashboard`` puts it there and passes the URL and token it resolved to the child
    explicitly, see :mod:`gpuq.settings`)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--config")
    args, _ = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    d: DashboardSettings = load_settings(args.config).dashboard
    return Conf(d.api_url.rstrip("/"), d.token, d.refresh_s, d.cache_ttl_s)


def _why(exc: Exception) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc})"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {TIMEOUT_S:.0f} s"
    return f"{type(exc).__name__}: {exc}"


def _request(method: str, base: str, token: str, path: str, params: tuple[tuple[str, str], ...],
             body: Any = None) -> Any:
    url = base + path
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, url, params=list(params), json=body, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ApiError(url, _why(exc)) from exc
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail") or r.text
        except ValueError:
            detail = r.text[:200]
        raise ApiError(url, f"HTTP {r.status_code}: {detail}", r.status_code)
    return r.json()


_cached: dict[float, Callable[..., Any]] = {}


def _fetcher(ttl_s: float) -> Callable[..., Any]:
    fn = _cached.get(ttl_s)
    if fn is None:
        def fetch(base: str, token: str, path: str, params: tuple[tuple[str, str], ...]) -> Any:
            return _request("GET", base, token, path, params)
        fn = _cached[ttl_s] = st.cache_data(ttl=ttl_s, show_spinner=False, max_entries=512)(fetch)
    return fn


class Client:
    def __init__(self, c: Conf) -> None:
        self.conf = c

    @property
    def url(self) -> str:
        return self.conf.api_url

    def get(self, path: str, **params: Any) -> Any:
        items = tuple(sorted((k, str(v)) for k, v in params.items() if v is not None))
        return _fetcher(self.conf.cache_ttl_s)(self.conf.api_url, self.conf.token, path, items)

    def post(self, path: str, body: Any, token: str | None = None) -> Any:
        return _request("POST", self.conf.api_url, token or self.conf.token, path, (), body)

    def get_now(self, path: str, token: str | None = None) -> Any:
        """A GET that is never cached, with ``token`` (a job's state, read as it changes)."""
        return _request("GET", self.conf.api_url, token or self.conf.token, path, ())
