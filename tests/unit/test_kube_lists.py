"""The one paginated LIST: continue tokens, each page's resourceVersion, pages fetched lazily."""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from agent.kube.lists import list_all, list_pages
from agent.kube.reflector import Reflector
from agent.kube.store import Store
from tests.unit.test_kube_store import FakeResponse, FakeServer, listing, parse, svc


@dataclass(frozen=True, slots=True)
class PagingCase:
    pages: tuple[tuple[str, tuple[str, ...], str | None], ...]  # (rv, names, continue token)
    names: tuple[str, ...]
    rvs: tuple[str, ...]
    continues: tuple[str | None, ...]  # the _continue each call carried


PAGING_CASES = [
    pytest.param(
        PagingCase((("7", ("a", "b"), None),), ("a", "b"), ("7",), (None,)),
        id="a list that fits one page is one call without a continue token",
    ),
    pytest.param(
        PagingCase(
            (("7", ("a",), "t1"), ("8", ("b",), "t2"), ("9", ("c",), None)),
            ("a", "b", "c"),
            ("7", "8", "9"),
            (None, "t1", "t2"),
        ),
        id="three pages follow the continue tokens and keep every page's resourceVersion",
    ),
    pytest.param(
        PagingCase((("7", (), None),), (), ("7",), (None,)),
        id="an empty list is one page with no items",
    ),
]


@pytest.mark.parametrize("case", PAGING_CASES)
def test_list_pages_follows_continue_tokens(case: PagingCase) -> None:
    server = FakeServer(
        [listing(rv, *(svc(n, 80) for n in names), cont=cont) for rv, names, cont in case.pages]
    )
    pages = list(list_pages(server, limit=2, _request_timeout=60))
    assert tuple(p.resource_version for p in pages) == case.rvs
    assert tuple(i["metadata"]["name"] for p in pages for i in p.items) == case.names
    assert tuple(c.get("_continue") for c in server.calls) == case.continues
    # Every call is a raw one with the caller's parameters.
    assert all(
        c["limit"] == 2 and c["_preload_content"] is False and c["_request_timeout"] == 60
        for c in server.calls
    )


def test_the_next_page_is_fetched_only_once_the_last_was_consumed() -> None:
    server = FakeServer([listing("1", svc("a", 80), cont="t"), listing("2", svc("b", 81))])
    pages = list_pages(server)
    first = next(pages)
    assert [i["metadata"]["name"] for i in first.items] == ["a"]
    assert len(server.calls) == 1  # the reflector's store parses page 1 before page 2 is read
    second = next(pages)
    assert second.resource_version == "2" and len(server.calls) == 2
    assert next(pages, None) is None


def test_list_all_returns_every_item_in_list_order() -> None:
    server = FakeServer([listing("1", svc("a", 80), cont="t"), listing("2", svc("b", 81))])
    items: list[dict[str, Any]] = list_all(server)
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert server.calls[0]["limit"] == 500


def test_a_failing_page_raises_out_of_the_list() -> None:
    server = FakeServer([listing("1", svc("a", 80), cont="t"), ConnectionResetError("page 2")])
    with pytest.raises(ConnectionResetError, match="page 2"):
        list_all(server)


def test_the_reflector_frees_a_pages_raw_objects_before_it_fetches_the_next() -> None:
    """One page of raw dicts in memory at a time (docs/decisions.md, page by page)."""
    alive_at_page_2: list[int] = []
    script = [listing("1", *(svc(f"p1-{i}", 80) for i in range(50)), cont="t"), listing("2")]

    def list_fn(**kwargs: Any) -> Any:
        if kwargs.get("_continue"):
            gc.collect()
            alive_at_page_2.append(sum(1 for o in gc.get_objects() if _page_1_object(o)))
        if kwargs.get("watch"):
            stop.set()
            return FakeResponse(200)
        return script.pop(0)

    stop = threading.Event()
    store: Store[int] = Store(parse)
    reflector = Reflector(name="svc", list_fn=list_fn, store=store, on_changes=lambda cs: None)
    reflector.run(stop)
    assert len(store) == 50  # every item of page 1 was parsed and stored
    # At most the one item Store.replace's loop variable still names; keeping the page's list
    # until the next one arrived held all 50.
    assert alive_at_page_2 in ([0], [1])


def _page_1_object(obj: object) -> bool:
    if not isinstance(obj, dict):
        return False
    meta = obj.get("metadata")
    return isinstance(meta, dict) and str(meta.get("name", "")).startswith("p1-")
