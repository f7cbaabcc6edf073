"""A run's record: the figures collected, judged and written (tasks/run/README.md)."""
