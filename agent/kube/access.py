"""Who may read /metrics and /status: the bearer-token decision, pure (the reviews are a shell).

What kube-rbac-proxy and controller-runtime's secure metrics filter do: the request's bearer
token is checked with a TokenReview (who is it?), then a SubjectAccessReview on the
non-resource URL (may that user `get` this path?). /healthz and /readyz stay open, because
the kubelet's probes carry no token. Answers:

- 401 without a token, or with one the TokenReview does not authenticate;
- 403 when the SubjectAccessReview does not allow `get` on the path;
- 503 when a review could not be made (the apiserver is unreachable): the scraper retries,
  and no answer is cached;
- the path's own answer otherwise.

`ReviewCache` keeps review results for a short while, so a scrape every 15 s costs two API
calls per token per TTL rather than per scrape. Tokens are cached by their SHA-256, never in
clear; denials are cached for less time than grants, so a newly granted reader is let in
soon; the cache is bounded, so a flood of random tokens cannot grow it without limit.
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
PROTECTED_PATHS = frozenset({"/metrics", "/status"})
VERB = "get"

ALLOW_TTL = 60.0  # s a successful review is reused
DENY_TTL = 10.0  # s a refusal is reused
MAX_ENTRIES = 1024


class Verdict(enum.StrEnum):
    """What the gate decided about one request."""

    OPEN = "Open"  # a probe path: no token needed
    ALLOWED = "Allowed"
    NO_TOKEN = "NoToken"  # 401
    UNAUTHENTICATED = "Unauthenticated"  # 401: the TokenReview did not authenticate it
    FORBIDDEN = "Forbidden"  # 403: the SubjectAccessReview did not allow it
    REVIEW_FAILED = "ReviewFailed"  # 503: no review could be made

    @property
    def status(self) -> int:
        """Return the HTTP status this verdict answers with (200 for the two that pass)."""
        return _STATUS[self]


_STATUS = {
    Verdict.OPEN: 200,
    Verdict.ALLOWED: 200,
    Verdict.NO_TOKEN: 401,
    Verdict.UNAUTHENTICATED: 401,
    Verdict.FORBIDDEN: 403,
    Verdict.REVIEW_FAILED: 503,
}


@dataclass(frozen=True, slots=True)
class Identity:
    """The user a TokenReview found, as a SubjectAccessReview takes it back."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def extra_dict(self) -> dict[str, list[str]]:
        """Return `extra` as the API's map of lists."""
        return {k: list(v) for k, v in self.extra}


@dataclass(frozen=True, slots=True)
class TokenResult:
    """A TokenReview's answer: the identity when authenticated (None: it was not)."""

    identity: Identity | None
    error: str = ""  # the review's status.error, when the apiserver gave one


@dataclass(frozen=True, slots=True)
class AccessResult:
    """A SubjectAccessReview's answer."""

    allowed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict and the text answered with it (empty for the two that pass)."""

    verdict: Verdict
    message: str = ""


def bearer_token(header: str | None) -> str | None:
    """Return the token of an `Authorization: Bearer <token>` header (None: absent or another
    scheme). The scheme is case-insensitive (RFC 9110 section 11.1)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def token_key(token: str) -> str:
    """Return the cache key of a token (its SHA-256, so no token is kept in clear)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class ReviewCache:
    """Review results by key until they expire; the oldest entry goes when it is full.

    Time is an argument (monotonic seconds); nothing here reads a clock.
    """

    max_entries: int = MAX_ENTRIES
    _entries: OrderedDict[tuple[str, ...], tuple[float, TokenResult | AccessResult]] = field(
        default_factory=OrderedDict
    )

    def get(self, key: tuple[str, ...], now: float) -> TokenResult | AccessResult | None:
        """Return the cached result of `key`, None when absent or expired (then dropped)."""
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= now:
            del self._entries[key]
            return None
        return found[1]

    def put(self, key: tuple[str, ...], result: TokenResult | AccessResult, now: float) -> None:
        """Remember `result` for ALLOW_TTL when it passes, DENY_TTL when it refuses."""
        passed = result.identity is not None if isinstance(result, TokenResult) else result.allowed
        self._entries[key] = (now + (ALLOW_TTL if passed else DENY_TTL), result)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def needs_token(path: str) -> bool:
    """Return whether `path` is served only to an authorized bearer (False: open to probes)."""
    return path not in OPEN_PATHS


def decide(token: TokenResult | None, access: AccessResult | None) -> Decision:
    """Return the decision for a protected path from the two review results.

    `token` None means there was no bearer token; `access` None means none was asked (the
    token was not authenticated).
    """
    if token is None:
        return Decision(Verdict.NO_TOKEN, "Unauthorized: a bearer token is required\n")
    if token.identity is None:
        return Decision(Verdict.UNAUTHENTICATED, "Unauthorized: the token is not valid\n")
    if access is None or not access.allowed:
        user = token.identity.username
        return Decision(Verdict.FORBIDDEN, f"Forbidden: {user} may not get this path\n")
    return Decision(Verdict.ALLOWED)


def identity_from_review(status: Mapping[str, object]) -> TokenResult:
    """Return the TokenResult of a TokenReview's raw `status` (never raises)."""
    user = status.get("user")
    error = str(status.get("error") or "")
    if status.get("authenticated") is not True or not isinstance(user, Mapping):
        return TokenResult(None, error)
    extra = user.get("extra")
    pairs: list[tuple[str, tuple[str, ...]]] = []
    if isinstance(extra, Mapping):
        for k, v in sorted(extra.items()):
            pairs.append((str(k), tuple(str(x) for x in v) if isinstance(v, list) else ()))
    groups = user.get("groups")
    return TokenResult(
        Identity(
            username=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
            extra=tuple(pairs),
        ),
        error,
    )
