"""A paginated raw LIST, in one place: pages parsed with orjson, never the client's models.

Every list of the API goes through `list_pages`: the reflectors' (page by page, so a store
parses each page and frees its raw dicts before the next one is fetched), the controller's
fresh read of every Service when it takes over (`list_all`), and the benchmarks'. A paginated
LIST with continue tokens is one consistent read: every page comes from the snapshot of the
first (the apiserver answers 410 Gone when that snapshot has been compacted meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from agent.kube.store import resource_version

PAGE_SIZE = 500


class RawResponse(Protocol):
    """The part of urllib3's HTTPResponse that lists and watches use."""

    status: int
    data: bytes

    def stream(self, amt: int) -> Iterator[bytes]: ...

    def release_conn(self) -> None: ...

    def shutdown(self) -> None: ...


# A list call of the official client (e.g. CoreV1Api.list_service_for_all_namespaces); called
# with _preload_content=False it returns the raw HTTP response.
ListFn = Callable[..., RawResponse]


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a LIST: its raw items and the resourceVersion the page was read at.

    The caller owns `items`: a consumer that streams them clears the list once done, so the
    page's raw dicts are freed before the next page is fetched.
    """

    items: list[dict[str, Any]]
    resource_version: str


def list_pages(list_fn: ListFn, *, limit: int = PAGE_SIZE, **params: Any) -> Iterator[Page]:
    """Yield the pages of a paginated raw LIST, fetching each only when the last was consumed.

    `params` go to every call (a timeout, a label selector); `limit`, `_continue` and
    ``_preload_content=False`` are added here. Errors of `list_fn` propagate unchanged.
    """
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": limit, "_preload_content": False, **params}
        if token:
            kwargs["_continue"] = token
        body = orjson.loads(list_fn(**kwargs).data)
        token = (body.get("metadata") or {}).get("continue")
        page = Page(body.get("items") or [], resource_version(body))
        del body  # the page holds the items; the rest of the response is not kept
        yield page
        del page  # not held while the next page is fetched
        if not token:
            return


def list_all(list_fn: ListFn, *, limit: int = PAGE_SIZE, **params: Any) -> list[dict[str, Any]]:
    """Return every raw object of a paginated LIST (one consistent read), in list order."""
    return [item for page in list_pages(list_fn, limit=limit, **params) for item in page.items]
