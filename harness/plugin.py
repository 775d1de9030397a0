"""pytest wiring for the suite: options, fixtures and hooks (filled in by the devices and suites work)."""
