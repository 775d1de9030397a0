"""The suite's own compiled runner: its C++ source, its build against the executorch under test,
and running a step plan with it on the HTP simulator."""
