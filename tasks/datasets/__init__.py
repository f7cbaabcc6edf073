"""The datasets the harness ships, generated on this machine (tasks/datasets/README.md)."""
