"""The composition layer: a run's steps put together (tasks/run/README.md)."""
