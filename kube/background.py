"""One named daemon thread that a component starts and stops: the loop it runs waits on
`stopping` (instead of sleeping) so that `stop()` ends it at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class BackgroundThread:
    name: str
    target: Callable[[], None]
    join_timeout: float = 5.0
    stopping: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> None:
        """Start the thread unless it runs; after a `stop()`, a new one."""
        if self._thread is None:
            self.stopping.clear()
            self._thread = threading.Thread(target=self.target, name=self.name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(self.join_timeout)
            self._thread = None
