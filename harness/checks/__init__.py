"""The built-in checks, by family, as functions of a case's shared outcome; importing this package registers
them all, in the report's column order (the order of registration, harness/check_registry.py).

Each is declared once with @check: its name, report column, whether it needs a device run and the failure
signatures it may raise. A check returns the numbers it looked at (for the report) or raises CheckFailure with
one line, its evidence and a signature, so the known-failures manifest matches the kind of failure, not just
the test id: a case that fails differently is a new failure. Comparisons with eager live in
harness/numerics.py and are computed once per case.

The families (one module each; common.py holds what they all read from the outcome):
- lowering: export, annotation, partitions (the lowering's facts alone);
- device_state: address_sharing, state, initial_state (a device run);
- meta_llama_partitions: partitions through executorch's Meta llama export flow;
- runner_parity: the compiled runner against the reference runner;
- cross_method: state crossing the methods of a multi-method program;
- driving: driver_invariance and horizon, the card's state driven as users drive it (docs/DRIVERS.md).
A new family is one module here and one import line below (after the others, so the columns keep their order).
"""

# The order of these imports is the report's column order.
# isort: off
from harness.checks import lowering  # noqa: F401  (importing a family registers its checks)
from harness.checks import device_state  # noqa: F401
from harness.checks import meta_llama_partitions  # noqa: F401
from harness.checks import runner_parity  # noqa: F401
from harness.checks import cross_method  # noqa: F401
from harness.checks import driving  # noqa: F401
# isort: on
