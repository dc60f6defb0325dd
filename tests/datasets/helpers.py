"""Helpers for the dataset tests."""
import threading


def loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("minilms-loader")]


def assert_one_line(error, *fragments) -> str:
    """The exception's message is one line and mentions every fragment (a file name, a key)."""
    message = str(error.value if hasattr(error, "value") else error)
    assert "\n" not in message, message
    for fragment in fragments:
        assert str(fragment) in message, (fragment, message)
    return message
