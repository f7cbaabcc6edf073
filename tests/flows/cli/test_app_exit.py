"""The CLI's exit: after every other exit handler (Prefect's server stop, MLflow's, those of
libraries imported during the command), the objects left are frozen so the interpreter's
teardown does not walk them (4.2 s of a tiny run's wall time after its last exit handler).
A subprocess, so the real ``atexit`` order is what is checked.

Named ``test_app_exit.py`` (tests/README.md): test_app.py holds the app's own tests; this file is
one aspect (flows/cli/app.py's exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_cli_freezes_what_is_left_after_every_other_exit_handler():
    script = textwrap.dedent(
        """
        import atexit, gc
        import flows.cli.app as cli

        real_freeze = gc.freeze
        def spy():
            print("freeze", flush=True)
            real_freeze()
        gc.freeze = spy

        def command():  # stands in for a command that imports a library with an exit handler
            atexit.register(lambda: print("library handler", flush=True))
        cli.app = command
        cli.main()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["library handler", "freeze"]
