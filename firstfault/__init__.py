"""The ``firstfault`` command: one entry point for the agent's and the collector's commands."""
