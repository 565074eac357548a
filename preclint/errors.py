"""Errors a user can cause. The CLI prints their message on one line and exits with code 2."""


class UserError(Exception):
    """A problem with what the user gave preclint (path, model, inputs, weights, config).

    The message is one self-contained line; the CLI prints it as ``preclint: error: <message>``.
    """
