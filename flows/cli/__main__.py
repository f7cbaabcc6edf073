"""``python -m flows.cli``: the same entry as the ``relflow-bench`` script."""

from flows.cli.app import main

main()
