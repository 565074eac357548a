"""Errors a user can cause. The CLI prints their message on one line and exits with code 2."""


class UserError(Exception):
    """A problem with what the user gave preclint (path, model, inputs, weights, config).

    The message is one self-contained line; the CLI prints it as ``preclint: error: <message>``.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none): what a one-line report of it keeps."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    first = first_line(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
