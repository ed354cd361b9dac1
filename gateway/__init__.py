"""Gatehouse: the application (config, CLI, store, sessions, lanes, runner, web)."""

__version__ = "0.1.0"
