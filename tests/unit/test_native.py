"""Which settings the native Kafka reader can read with (offsetlake.read.native), and how they are passed.
The reads themselves are compared with confluent-kafka's on a real broker (tests/integration/test_native_reader.py)."""

from offsetlake.read import native


def test_a_python_callback_other_than_the_reader_s_own_keeps_the_native_reader_out(monkeypatch):
    monkeypatch.setattr(native, "library", lambda: object())
    plain = {"bootstrap.servers": "k:9092", "enable.auto.commit": False, "logger": object(), "error_cb": print}
    assert native.usable(plain)
    assert not native.usable({**plain, "oauth_cb": lambda config: ("token", 0.0)})
    assert not native.usable({**plain, "stats_cb": print})


def test_nothing_is_native_where_the_library_is_not(monkeypatch):
    monkeypatch.setattr(native, "library", lambda: None)
    assert not native.usable({"bootstrap.servers": "k:9092"})


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(native.ENABLED_ENV, "0")
    native.library.cache_clear()
    try:
        assert native.library() is None
    finally:
        native.library.cache_clear()


def test_settings_reach_librdkafka_as_its_strings():
    assert [native._setting(v) for v in (True, False, 10, 0.5, "read_committed")] == [
        "true",
        "false",
        "10",
        "0.5",
        "read_committed",
    ]
