"""The context-manager shape shared by the harness's peers (containerd, plugin processes, servers)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Lifecycle:
    """`with peer:` starts it, and closes it again if the start fails half-way; exit closes it."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
