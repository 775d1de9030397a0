"""A device kind is one unit (harness/device/kinds/): every kind keeps the whole contract, and no module
outside the package compares a kind's name: each asks its kind (a trait, a label, a hook) instead."""

from __future__ import annotations

import ast

import pytest

from harness.device import kinds
from harness.device.kinds.base import DeviceKind
from harness.outcome import DeviceTraits
from harness.paths import REPO_ROOT

KINDS_PACKAGE = REPO_ROOT / "harness" / "device" / "kinds"
SCANNED = ("harness", "fixtures", "suites")
# Names that hold a kind's name: a module's constant, or a kind class's `name` (EmulatedKind.name)
KIND_CONSTANTS = {"PHONE", "EMULATED", "PHONE_KIND", "EMULATED_KIND"}


def _names_a_kind(node: ast.AST) -> bool:
    """Whether an operand of a comparison is a kind's name: its string, a constant holding it, a kind class's
    `name`, or a tuple, list or set with one of those."""
    if isinstance(node, ast.Constant):
        return node.value in kinds.KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(element) for element in node.elts)
    if isinstance(node, ast.Name):
        return node.id in KIND_CONSTANTS
    if isinstance(node, ast.Attribute):
        if node.attr in KIND_CONSTANTS:
            return True
        owner = node.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        return node.attr == "name" and owner_name.endswith("Kind")
    return False


def kind_name_comparisons(source: str) -> list[int]:
    """Lines where an ==, !=, in or not in compares against a kind's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            kinded = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
            if any(isinstance(op, kinded) for op in node.ops) and any(_names_a_kind(o) for o in operands):
                found.append(node.lineno)
    return found


def test_no_module_outside_the_kinds_package_compares_a_kind_name():
    offenders = []
    for top in SCANNED:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            if "tests" in path.relative_to(REPO_ROOT).parts or path.is_relative_to(KINDS_PACKAGE):
                continue
            offenders += [f"{path.relative_to(REPO_ROOT)}:{line}" for line in kind_name_comparisons(path.read_text())]
    assert offenders == [], f"ask the device's kind (harness/device/kinds/) instead of its name: {offenders}"


@pytest.mark.parametrize(
    "source",
    [
        'kind == "phone"',
        'spec.kind != "emulated"',
        'name in ("phone", "x")',
        "timing.get('device_kind') != PHONE",
        "spec.kind == kinds.EmulatedKind.name",
        "device.name == EmulatedKind.name",
    ],
)
def test_the_scan_catches_each_way_of_comparing_a_kind_name(source: str):
    assert kind_name_comparisons(source) == [1]


@pytest.mark.parametrize(
    "source",
    [
        "kinds.of(spec.kind).emulated",
        'label = "phone"',  # naming is not comparing
        'before.get("device_kind") != after.get("device_kind")',  # two recorded kinds, whatever they are
        'verdict == "passed"',
        "device.name == other.name",
    ],
)
def test_the_scan_leaves_what_is_no_kind_comparison(source: str):
    assert kind_name_comparisons(source) == []


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_every_kind_keeps_the_whole_contract(name: str):
    """Each kind has every trait the protocol names (the checks' DeviceTraits among them) and its hooks."""
    kind = kinds.of(name)
    members = {*DeviceKind.__annotations__, *DeviceTraits.__annotations__, "payload", "host_libraries"}
    missing = sorted(member for member in members | {"heap_environment"} if not hasattr(kind, member))
    assert missing == [] and kind.name == name
    assert kinds.named(name) is kind and kinds.named("made_up") is None and kinds.named(None) is None
    environment = kind.heap_environment({"GLIBC_TUNABLES": "glibc.malloc.check=0", "X": "1"})
    assert environment["X"] == "1" and "glibc.malloc.check=0" in environment["GLIBC_TUNABLES"]
    assert (kind.heap_pattern is not None) == ("MALLOC_PERTURB_" in environment)


def test_reports_name_a_device_by_its_kinds_label_and_an_unknown_one_as_a_simulator():
    assert {name: kinds.report_label(name) for name in kinds.KINDS} == {"emulated": "simulator", "phone": "phone"}
    assert kinds.report_label(None) == "simulator" and kinds.simulated("made_up") and not kinds.simulated("phone")
