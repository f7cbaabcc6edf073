"""The ``relflow-bench`` command line (``app``: the Typer app and ``main``)."""
