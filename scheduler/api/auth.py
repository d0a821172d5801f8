"""Bearer tokens with roles, from ``api.tokens`` in the settings.

Roles are ordered: ``viewer`` reads; ``operator`` also submits, cancels and runs dry runs;
``admin`` also changes the configuration (``POST /admin/reload-queues``). A request without a
token, or with one that is not configured, is answered 401 (with ``WWW-Authenticate: Bearer``);
a known token whose role is too low, 403.

With no token configured authentication is off: every caller acts as ``admin`` under the name
``anonymous``, and ``gpuq serve`` logs a warning at start. That keeps a laptop demo one command
long; a shared deployment must configure tokens (bind to 127.0.0.1 otherwise, the default).
Tokens are compared in constant time.
"""
# no "from __future__ import annotations": FastAPI reads the dependency's annotation at runtime
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler.api.problems import Problem

ROLES = {"viewer": 0, "operator": 1, "admin": 2}
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: str


class Auth:
    def __init__(self, tokens: Sequence[Any]) -> None:
        self._tokens = [(t.token.encode(), Caller(t.name or f"token-{i}", t.role)) for i, t in enumerate(tokens)]
        self.scheme = HTTPBearer(auto_error=False, description="A token from api.tokens in the settings.")

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def lookup(self, token: str) -> Caller | None:
        found = None
        raw = token.encode()
        for known, caller in self._tokens:        # no early exit: constant time over the list
            if hmac.compare_digest(known, raw):
                found = caller
        return found

    def require(self, role: str) -> Callable[..., Caller]:
        credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(self.scheme)]

        def dependency(cred: credentials) -> Caller:
            if not self._tokens:
                return Caller("anonymous", "admin")
            if cred is None or not cred.credentials:
                raise Problem(401, "a bearer token is required (Authorization: Bearer TOKEN)", headers=_CHALLENGE)
            caller = self.lookup(cred.credentials)
            if caller is None:
                raise Problem(401, "the bearer token is not valid", headers=_CHALLENGE)
            if ROLES[caller.role] < ROLES[role]:
                raise Problem(403, f"this needs the {role} role; token {caller.name!r} has {caller.role}")
            return caller
        return dependency
