"""The only code that talks to libnftables: run a transaction, read a table back as JSON.

libnftables (1.0.6) opens its netlink socket when the context is created (`nft_ctx_new`, i.e.
`nftables.Nftables()`), and every later command goes through that socket, so a context is bound
to the network namespace its creating thread was in at that moment (verified with strace: the
`socket(AF_NETLINK, …, NETLINK_NETFILTER)` call happens inside `Nftables()`, and a context
created in namespace A keeps programming A after its thread moves to B).

`LibNftRunner` programs the namespace of the thread that constructs it (on a node that is the
host namespace, the agent runs with hostNetwork). `NetnsNftRunner` is for tests and tools: it
owns one worker thread that enters `/run/netns/<name>` once, never leaves, refuses to go on if
it still sees the namespace it started in, and creates its LibNftRunner there; every call is
marshalled to that thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import threading
from typing import Any, Protocol, cast

import nftables
import orjson

from agent import netns
from rules.transaction import Transaction


class NftError(RuntimeError):
    """nft refused a command; `text` is nft's own error output (empty if it printed none)."""

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        self.text = text


class NftRunner(Protocol):
    """Runs transactions and reads tables back, in one fixed network namespace."""

    def run(self, tx: Transaction) -> None:
        """Run `tx` (printed as `nft -f` reads it) as one atomic batch; raise NftError if
        refused."""
        ...

    def list_table(self, family: str, name: str) -> dict[str, Any] | None:
        """Return `nft -j list table family name` parsed, or None if the table does not exist."""
        ...

    def list_declarations(self, family: str, name: str) -> str | None:
        """Return `nft -t list table family name` (no set elements), or None if it is absent."""
        ...


TRIM_AFTER_BYTES = 1 << 20
"""After a command or listing this large, return freed heap to the OS (glibc malloc_trim).

libnftables parses a full 10k-Service table (5.6 MB of text) into ~250 MB of heap that it
frees afterwards, but glibc keeps it mapped; trimming brings the agent back to its baseline."""


def release_memory() -> None:
    """Return free heap pages to the kernel (glibc `malloc_trim`), after a large, short-lived
    allocation: libnftables parsing a full transaction, or a table read back."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class LibNftRunner:
    """An NftRunner over libnftables in the namespace of the thread that constructs it.

    Constructing it opens the netlink sockets (that is how libnftables 1.0.6 works), so build
    it in the thread and namespace that it must program. Transactions share one context;
    each listing gets a context of its own, created in the calling thread (which must be in
    the same namespace) and freed afterwards, so a slow `list_table` (seconds for a
    10k-Service table) does not delay a transaction run from another thread, and the cache
    a listing fills (every element of the table, ~200 MB at 10k Services x 10 endpoints:
    libnftables keeps it in the context) does not stay resident.
    """

    def __init__(self) -> None:
        self._nft: Any = nftables.Nftables()
        self._nft.set_json_output(False)
        self._nft.set_handle_output(False)
        self._netns = netns.netns_inode()
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()

    def _list(self, family: str, name: str, *, json_output: bool) -> str | None:
        """Return `list table` output from a fresh context (freed, with its cache, after),
        or None if the table is absent. Raises NftError for any other failure."""
        if netns.netns_inode() != self._netns:
            raise NftError("a listing was asked from a thread in another network namespace")
        with self._read_lock:
            ctx: Any = nftables.Nftables()
            ctx.set_json_output(json_output)
            ctx.set_terse_output(not json_output)
            rc, out, err = ctx.cmd(f"list table {family} {name}")
            del ctx
            release_memory()
        if rc == 0:
            return str(out)
        err = str(err).strip()
        if "No such file or directory" in err:
            return None
        flag = "-j" if json_output else "-t"
        raise NftError(f"nft {flag} list table {family} {name} failed (rc={rc}): {err}", err)

    def run(self, tx: Transaction) -> None:
        """Run `tx` as one batch; raise NftError with nft's error text if it is refused."""
        self.run_text(tx.text())

    def run_text(self, text: str) -> None:
        """Run an nft script (`nft -f` input, any table: tools and tests) as one batch; raise
        NftError with nft's error text if it is refused."""
        with self._lock:
            rc, _out, err = self._nft.cmd(text)
            if len(text) >= TRIM_AFTER_BYTES:
                release_memory()
        if rc != 0:
            err = str(err).strip()
            raise NftError(f"nft refused the transaction (rc={rc}): {err}", err)

    def list_table(self, family: str, name: str) -> dict[str, Any] | None:
        """Return the table as parsed `nft -j list table` output, or None if it is absent."""
        out = self._list(family, name, json_output=True)
        return None if out is None else cast(dict[str, Any], orjson.loads(out))

    def list_declarations(self, family: str, name: str) -> str | None:
        """Return the table as terse text (no set elements), or None if it is absent.

        What a full sync needs to know of an existing table. The output is small, but nft
        still fetches every element from the kernel: about 3.7 s for 10k Services.
        """
        return self._list(family, name, json_output=False)


class NetnsNftRunner:
    """An NftRunner that runs libnftables inside the named namespace, from its own thread.

    Calls are serialized through that one thread (a long listing delays a run); it is meant
    for tests and tools. Construction only records the name; `start()` (also called by the
    first `run` or `list_table`) starts the worker thread, which enters `/run/netns/<ns_name>`
    and checks that it is no longer in a root namespace before creating the contexts.
    `close()` stops the thread (it is never returned to the original namespace; it just ends).
    """

    def __init__(self, ns_name: str) -> None:
        self.ns_name = ns_name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._runner: LibNftRunner | None = None
        self._lock = threading.Lock()

    def _enter(self) -> None:
        try:
            netns.enter(self.ns_name)
        except netns.NetnsError as exc:
            raise NftError(f"refusing to program {self.ns_name}: {exc}") from exc
        self._runner = LibNftRunner()

    def start(self) -> None:
        """Start the worker thread and enter the namespace (idempotent)."""
        with self._lock:
            if self._pool is not None:
                return
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"nft-{self.ns_name}"
            )
            try:
                pool.submit(self._enter).result()
            except BaseException:
                pool.shutdown(wait=True)
                raise
            self._pool = pool

    def _call(self, fn: Any, *args: Any) -> Any:
        self.start()
        assert self._pool is not None
        return self._pool.submit(fn, *args).result()

    def run(self, tx: Transaction) -> None:
        """Run `tx` inside the namespace as one batch; raise NftError if refused."""
        self._call(self._run, tx.text())

    def run_text(self, text: str) -> None:
        """Run an nft script inside the namespace as one batch; raise NftError if refused."""
        self._call(self._run, text)

    def list_table(self, family: str, name: str) -> dict[str, Any] | None:
        """Return the table in the namespace as parsed JSON, or None if it is absent."""
        return cast(dict[str, Any] | None, self._call(self._list, family, name))

    def list_declarations(self, family: str, name: str) -> str | None:
        """Return the table in the namespace as terse text, or None if it is absent."""
        return cast(str | None, self._call(self._list_declarations, family, name))

    def _list_declarations(self, family: str, name: str) -> str | None:
        assert self._runner is not None
        return self._runner.list_declarations(family, name)

    def _run(self, text: str) -> None:
        assert self._runner is not None
        self._runner.run_text(text)

    def _list(self, family: str, name: str) -> dict[str, Any] | None:
        assert self._runner is not None
        return self._runner.list_table(family, name)

    def close(self) -> None:
        """Stop the worker thread (idempotent); the context is freed with it."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.submit(self._drop).result()
            pool.shutdown(wait=True)

    def _drop(self) -> None:
        self._runner = None

    def __enter__(self) -> NetnsNftRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
