"""User-facing errors: bad input that the user can fix.

A ``UserError`` carries a one-paragraph message that names the key, file or root key at
fault and how to fix it. The CLI prints it without a traceback and exits with code 2.
"""


class UserError(Exception):
    """Bad input (spec, files, data) the user can fix; the message says how."""

    exit_code = 2
