"""One-line error messages for logs and tables."""

from __future__ import annotations

from attnaudit.errors import AttnAuditError, InputError, error_line


def test_error_line_keeps_our_message_and_names_other_exception_types() -> None:
    assert error_line(AttnAuditError("bad option\nmore detail")) == "bad option"
    assert error_line(InputError("data.csv", "no label", line=3)) == "data.csv:3: no label"
    assert error_line(ValueError("  boom  \nsecond")) == "ValueError: boom"
    assert error_line(RuntimeError()) == "RuntimeError"


def test_input_error_escapes_control_characters_from_binary_files() -> None:
    message = str(InputError("junk.csv", "no text column 'text'; columns: \x00\x01garbage\x7f", 1))
    assert message == "junk.csv:1: no text column 'text'; columns: \\x00\\x01garbage\\x7f"
    assert message.isprintable()
