"""`with` support for things that are brought up and torn down (the lab, the lab cluster)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class UpDown:
    """`with x:` runs `x.up()` and always `x.down()`; subclasses define both.

    When the body raised, that exception stays the one raised and a teardown failure is added
    to it as a note, so the cause is never hidden by a cleanup error.
    """

    def up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.down()
            return
        try:
            self.down()
        except Exception as teardown_error:
            exc.add_note(f"{type(self).__name__} teardown also failed: {teardown_error!r}")
