"""The notifier: posting, subscribing, the bounded history and thread safety."""

from __future__ import annotations

import logging
import threading
from dataclasses import FrozenInstanceError
from datetime import datetime, timezone

import pytest

from qmgui import notify
from qmgui.notify import HISTORY_SIZE, Level, Message, Notifier


def test_levels_post_messages_with_fields() -> None:
    notifier = Notifier()
    before = datetime.now(timezone.utc)
    info = notifier.info("Scanned 3 folders.")
    warning = notifier.warning("Skipped a file.", detail="/m/x.gguf: truncated", source="scan")
    error = notifier.error("llama-server exited with status 1.", source="engines")
    assert [m.level for m in notifier.history] == [Level.INFO, Level.WARNING, Level.ERROR]
    assert notifier.history == (info, warning, error)
    assert warning == Message(
        Level.WARNING, "Skipped a file.", "/m/x.gguf: truncated", "scan", warning.time
    )
    assert info.detail is None
    assert info.source is None
    assert before <= info.time <= datetime.now(timezone.utc)
    assert info.time.tzinfo is not None
    assert str(error) == "error: [engines] llama-server exited with status 1."


def test_message_is_frozen() -> None:
    message = Notifier().info("x")
    with pytest.raises(FrozenInstanceError):
        message.text = "y"  # type: ignore[misc]


def test_subscribe_and_unsubscribe() -> None:
    notifier = Notifier()
    got: list[str] = []
    unsubscribe = notifier.subscribe(lambda m: got.append(m.text))
    notifier.info("one")
    unsubscribe()
    notifier.info("two")
    unsubscribe()  # twice is harmless
    assert got == ["one"]
    assert notifier.subscriber_count == 0
    assert [m.text for m in notifier.history] == ["one", "two"]


def test_the_same_callback_may_subscribe_twice() -> None:
    notifier = Notifier()
    got: list[Message] = []
    first = notifier.subscribe(got.append)
    notifier.subscribe(got.append)
    notifier.info("x")
    first()
    notifier.info("y")
    assert [m.text for m in got] == ["x", "x", "y"]


def test_history_keeps_the_last_200() -> None:
    notifier = Notifier()
    for n in range(HISTORY_SIZE + 50):
        notifier.info(f"m{n}")
    history = notifier.history
    assert HISTORY_SIZE == 200
    assert len(history) == 200
    assert history[0].text == "m50"
    assert history[-1].text == "m249"


def test_history_size_is_configurable_and_checked() -> None:
    notifier = Notifier(history_size=2)
    for text in "abc":
        notifier.info(text)
    assert [m.text for m in notifier.history] == ["b", "c"]
    with pytest.raises(ValueError, match="at least 1"):
        Notifier(history_size=0)


def test_clear_history_keeps_subscribers_and_clear_resets_all() -> None:
    notifier = Notifier()
    got: list[Message] = []
    notifier.subscribe(got.append)
    notifier.info("a")
    notifier.clear_history()
    assert notifier.history == ()
    notifier.info("b")
    assert len(got) == 2
    notifier.clear()
    assert notifier.history == ()
    assert notifier.subscriber_count == 0
    notifier.info("c")
    assert len(got) == 2


def test_a_failing_subscriber_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier()
    got: list[Message] = []

    def broken(message: Message) -> None:
        raise RuntimeError("boom")

    notifier.subscribe(broken)
    notifier.subscribe(got.append)
    with caplog.at_level(logging.ERROR, logger="qmgui.notify"):
        message = notifier.warning("careful")
    assert got == [message]
    assert "subscriber" in caplog.text
    assert "boom" in caplog.text


def test_callbacks_run_outside_the_lock() -> None:
    """A subscriber may post, subscribe and unsubscribe from its callback without deadlock."""
    notifier = Notifier()
    seen: list[str] = []

    def echo(message: Message) -> None:
        seen.append(message.text)
        if message.text == "ping":
            notifier.subscribe(lambda m: None)()
            notifier.info("pong")

    notifier.subscribe(echo)
    notifier.info("ping")
    assert seen == ["ping", "pong"]
    assert [m.text for m in notifier.history] == ["ping", "pong"]


def test_messages_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="qmgui.notify"):
        Notifier().warning("disk nearly full", source="cache")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "warning: [cache] disk nearly full")
    ]


def test_threads_post_and_subscribe_concurrently() -> None:
    notifier = Notifier(history_size=10_000)
    threads_n, per_thread = 8, 250
    received: list[Message] = []
    received_lock = threading.Lock()

    def collect(message: Message) -> None:
        with received_lock:
            received.append(message)

    notifier.subscribe(collect)
    start = threading.Barrier(threads_n + 1)

    def poster(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            notifier.info(f"{n}:{i}")
            if i % 25 == 0:  # churn the subscriber table while others post
                notifier.subscribe(lambda m: None)()
                assert len(notifier.history) <= 10_000

    threads = [threading.Thread(target=poster, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    start.wait()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    total = threads_n * per_thread
    assert len(notifier.history) == total
    assert len(received) == total
    assert {m.text for m in received} == {f"{n}:{i}" for n in range(8) for i in range(250)}
    for n in range(threads_n):  # each thread's own messages stay in its order
        mine = [m.text for m in notifier.history if m.text.startswith(f"{n}:")]
        assert mine == [f"{n}:{i}" for i in range(per_thread)]
    assert notifier.subscriber_count == 1


def test_module_functions_use_the_current_default(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = Notifier()
    monkeypatch.setattr(notify, "notifier", fresh)
    notify.info("i")
    notify.warning("w", detail="d")
    notify.error("e", source="s")
    assert [(m.level, m.text) for m in fresh.history] == [
        (Level.INFO, "i"),
        (Level.WARNING, "w"),
        (Level.ERROR, "e"),
    ]


def test_the_default_notifier_can_be_cleared() -> None:
    notify.notifier.clear()
    notify.notifier.subscribe(lambda m: None)
    notify.info("x")
    notify.notifier.clear()
    assert notify.notifier.history == ()
    assert notify.notifier.subscriber_count == 0


def test_control_characters_in_messages_are_escaped() -> None:
    n = Notifier()
    m = n.warning("bad\x1b[2J\nname.gguf", detail="line1\n\tline2\x1b]0;x\x07", source="scan")
    assert m.text == "bad\\x1b[2J\\nname.gguf"
    assert m.detail == "line1\n\tline2\\x1b]0;x\\x07"
    assert n.history[-1] is m
