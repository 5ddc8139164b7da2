"""A component's background thread stops at once and can be started again."""

from __future__ import annotations

import threading

from kube.background import BackgroundThread


def test_stop_ends_the_loop_at_once_and_start_runs_it_again() -> None:
    rounds: list[str] = []
    running = threading.Event()

    def loop() -> None:
        running.set()
        while not background.stopping.wait(3600):  # only stop() ends this wait
            pass
        rounds.append(threading.current_thread().name)

    background = BackgroundThread("test-loop", loop, join_timeout=5)
    for _ in range(2):
        background.start()
        background.start()  # already running: no second thread
        assert running.wait(5)
        running.clear()
        background.stop()
    assert rounds == ["test-loop", "test-loop"]
    assert not [t for t in threading.enumerate() if t.name == "test-loop"]
