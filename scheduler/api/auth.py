"""Bearer tokens with roles and scopes, from ``api.tokens`` in the settings.

Roles are ordered: ``viewer`` reads; ``operator`` also submits, cancels and runs dry runs;
``admin`` also changes the configuration (``POST /admin/reload-queues``). A request without a
token, or with one that is not configured, is answered 401 (with ``WWW-Authenticate: Bearer``);
a known token whose role is too low, 403. The 403 names the role needed, never the token's owner.

An operator token is scoped (:class:`Scope`): the Kubernetes namespaces of its targets and the
queue subtrees it may act in, both of which must allow a submit or a cancel (a Ray or target-less
workload has no namespace: its queue decides). Admins are unscoped; viewers read everything,
unless their token names ``queues`` (issue 21: a tenant's token, :attr:`Caller.reads`): then
they read only those queues' subtrees, on the routes that filter by queue (``scoped=True`` in
:meth:`Auth.require`: ``/queues``, ``/workloads``, ``/accounting/usage``, the tenant page) and
are refused (403) every other read. docs/SECURITY.md, "Queue-scoped viewer tokens".
What a submitted workload may ask (its priority, whether it is non-preemptible) is bounded for
every caller by its queue's policy, and for an operator also by its token's ``max_priority`` and
``non_preemptible`` (:meth:`Caller.check_policy`, :mod:`scheduler.policy`).

The check runs twice: :class:`scheduler.api.limits.Guard` answers 401/403 from the headers
before the body is read, and the route's dependency gives the route its :class:`Caller`.

With no token configured authentication is off: every caller acts as ``admin`` under the name
``anonymous``. :func:`check_exposure` refuses that on an address other than loopback unless
``api.insecure`` is set. Tokens are compared in constant time.
"""
# no "from __future__ import annotations": FastAPI reads the dependency's annotation at runtime
import hmac
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from accounting.queues import QueueConfig
from gpuq.errors import ConfigError
from scheduler.api.problems import Problem, invalid
from scheduler.model import Workload
from scheduler.policy import OPEN as NO_NARROWING
from scheduler.policy import POLICY, Narrowing, refusal

log = logging.getLogger(__name__)

ROLES = {"viewer": 0, "operator": 1, "admin": 2}
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
MISSING = "a bearer token is required (Authorization: Bearer TOKEN)"
NOT_VALID = "the bearer token is not valid"


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a token may act: ``None`` for a dimension means anywhere (admins); ``bounds``: what its
    workloads may ask, narrower than their queue's policy (:class:`scheduler.policy.Narrowing`)."""

    namespaces: frozenset[str] | None = None
    queues: tuple[str, ...] | None = None
    bounds: Narrowing = NO_NARROWING

    @classmethod
    def of(cls, namespaces: Sequence[str] | None, queues: Sequence[str] | None,
           max_priority: int | None = None, non_preemptible: bool | None = None) -> "Scope":
        ns = None if namespaces is None or "*" in namespaces else frozenset(namespaces)
        qs = None if queues is None or "*" in queues or "root" in queues else tuple(q.strip(".") for q in queues)
        return cls(ns, qs, Narrowing(max_priority, non_preemptible is not False))

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def allows_queue(self, queue: str) -> bool:
        return self.queues is None or any(queue == q or queue.startswith(q + ".") for q in self.queues)


EVERYWHERE = Scope()


SCOPED_READS = ("this token reads only its queues: GET /queues, /workloads, /accounting/usage (by queue) and "
                "/queues/{queue}/tenant")


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: str
    scope: Scope = EVERYWHERE
    # a queue-scoped viewer (a tenant): the queue subtrees it may read; None: every queue
    reads: tuple[str, ...] | None = None

    def may_read(self, queue: str) -> bool:
        """May this caller read ``queue``'s rows (it is in one of :attr:`reads`' subtrees)?"""
        return self.reads is None or any(queue == q or queue.startswith(q + ".") for q in self.reads)

    def check_read(self, queue: str) -> None:
        """403 unless the caller may read ``queue``."""
        if not self.may_read(queue):
            raise Problem(403, "this token may not read this queue")

    @property
    def actor(self) -> str:
        """How events and logs name the caller: ``name (role)``."""
        return f"{self.name} ({self.role})"

    def check_target(self, queue: str, namespace: str) -> None:
        """403 unless the scope allows ``queue`` and (when the target has one) ``namespace``. The
        message names what the caller asked for, never the token or other tenants' data."""
        if not self.scope.allows_queue(queue):
            raise Problem(403, "this token may not act in this queue")
        if namespace and not self.scope.allows_namespace(namespace):
            raise Problem(403, "this token may not act in this namespace")

    def check_policy(self, config: QueueConfig, workload: Workload) -> None:
        """422 naming the field (``body.priority``, ``body.preemptible``) and the bound when the
        workload asks more than its queue's policy, or this token's narrower bounds, allow."""
        over = refusal(config, workload, self.scope.bounds)
        if over is not None:
            raise invalid(f"body.{over.field}", over.message, type_=POLICY)


class Auth:
    def __init__(self, tokens: Sequence[Any]) -> None:
        self._tokens = [(t.token.encode(), Caller(t.name or f"token-{i}", t.role,
                                                  Scope.of(getattr(t, "namespaces", None), getattr(t, "queues", None),
                                                           getattr(t, "max_priority", None),
                                                           getattr(t, "non_preemptible", None))
                                                  if t.role == "operator" else EVERYWHERE,
                                                  _reads(t)))
                        for i, t in enumerate(tokens)]
        self.scheme = HTTPBearer(auto_error=False, description="A token from api.tokens in the settings.")

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def lookup(self, token: str) -> Caller | None:
        found = None
        raw = token.encode("utf-8", "surrogateescape")
        for known, caller in self._tokens:        # no early exit: constant time over the list
            if hmac.compare_digest(known, raw):
                found = caller
        return found

    def from_header(self, header: str | None) -> Caller | None:
        """The caller of an ``Authorization`` header value, None when absent or not valid."""
        if not self._tokens:
            return Caller("anonymous", "admin")
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.lookup(token.strip())

    def check(self, header: str | None, role: str) -> Caller:
        """The caller for ``role``; Problem 401 or 403 otherwise (also used before the body is read)."""
        if not self._tokens:
            return Caller("anonymous", "admin")
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(401, MISSING, headers=_CHALLENGE)
        caller = self.lookup(token.strip())
        if caller is None:
            raise Problem(401, NOT_VALID, headers=_CHALLENGE)
        if ROLES[caller.role] < ROLES[role]:
            raise Problem(403, f"this needs the {role} role; the token has the {caller.role} role")
        return caller

    def require(self, role: str, scoped: bool = False) -> Callable[..., Caller]:
        """The route's dependency for ``role``. A queue-scoped viewer (:attr:`Caller.reads`) passes
        only where ``scoped`` says the route filters what it answers by the caller's queues."""
        credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(self.scheme)]

        def dependency(cred: credentials) -> Caller:
            header = f"{cred.scheme} {cred.credentials}" if cred is not None else None
            caller = self.check(header, role)
            if caller.reads is not None and not scoped:
                raise Problem(403, SCOPED_READS)
            return caller
        dependency.gpuq_role = role  # type: ignore[attr-defined]  # read by limits.Guard
        return dependency


def _reads(token: Any) -> tuple[str, ...] | None:
    """A viewer token's ``queues``, the subtrees it reads (None: all, also for ``*`` or ``root``)."""
    queues = getattr(token, "queues", None)
    if token.role != "viewer" or queues is None or "*" in queues or "root" in queues:
        return None
    return tuple(q.strip(".") for q in queues)


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 and ::1 are loopback; ``0.0.0.0``, ``::``, names and others are not."""
    h = host.strip().strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_exposure(api: Any) -> None:
    """Refuse (ConfigError) to serve without tokens on an address other than loopback, unless
    ``api.insecure`` says so; warn when auth is off."""
    if api.tokens:
        return
    if not is_loopback(api.host):
        if not getattr(api, "insecure", False):
            raise ConfigError("api.host", f"{api.host!r} is not a loopback address and api.tokens is empty: "
                              "anyone who can reach it could submit, cancel and reconfigure. Configure "
                              "api.tokens, bind to 127.0.0.1, or set api.insecure: true to accept this")
        log.warning("api.insecure is set: authentication is OFF on %s:%s, every caller may submit, cancel "
                    "and reconfigure", api.host, api.port)
    else:
        log.warning("api.tokens is empty: authentication is OFF, every caller may submit, cancel and "
                    "reconfigure; configure tokens before exposing %s:%s", api.host, api.port)
