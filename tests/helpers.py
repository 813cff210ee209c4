"""Assertions shared by the test folders: the "bad input is one line, exit 2" rule in one place."""

from __future__ import annotations


def assert_one_line(capsys, *fragments: str) -> str:
    """stderr holds exactly one line, and it names every fragment (a file, key, flag or tensor)."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def assert_one_line_exit2(code: int, capsys, *fragments: str) -> str:
    """A command returned exit code 2 and wrote one line naming every fragment."""
    err = assert_one_line(capsys, *fragments)
    assert code == 2, (code, err)
    return err


def assert_one_line_message(message: str, *fragments: str) -> str:
    """An exception's message is one line (no traceback) naming every fragment."""
    assert "\n" not in message and "Traceback" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message
