"""Thin on purpose: the suite's pytest wiring lives in harness/plugin.py."""
pytest_plugins = ["harness.plugin"]
