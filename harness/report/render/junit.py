"""junit.xml of one SoC's report, for CI systems that only read JUnit.

One testcase per check (classname = check, name = case id). Failures and known failures that now pass
are <failure>; infrastructure errors (the device or the lab failed) are <error>; skips, checks a device could
not measure and expected (known) failures are <skipped>, carrying their message.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from harness.report.document import checks_of
from harness.vocabulary import Verdict

# Characters XML 1.0 cannot hold at all (messages may carry terminal escapes from a runner's log), and
# lone surrogates, which no UTF-8 file can (one made writing junit.xml fail, leaving it empty).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


JUNIT = (("failure", "failures"), ("error", "errors"), ("skipped", "skipped"))  # element -> its testsuite count


def _text(value: object) -> str:
    """Any value as XML 1.0 text: what XML cannot hold is written as its escape (`\\x1b`, `\\udc80`)."""
    return _NOT_XML.sub(lambda match: match.group(0).encode("unicode_escape", "backslashreplace").decode(), str(value))


def _seconds(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "0"


def _testcase(suite: ET.Element, case: dict, name: str, check: dict) -> None:
    element = ET.SubElement(
        suite, "testcase", classname=_text(name), name=_text(case["case_id"]), time=_seconds(check["duration_s"])
    )
    verdict, message, reason = Verdict(check["verdict"]), _text(check["message"]), _text(check["known_failure"])
    if not verdict.junit:
        return
    if verdict is Verdict.XPASSED:
        message = f"known failure now passes: {reason}"
    elif verdict is Verdict.XFAILED:
        message = f"known failure: {reason}" + (f" ({message})" if message else "")
    elif verdict is Verdict.NOT_MEASURED:
        message = f"not measured: {message}"
    element = ET.SubElement(element, verdict.junit, type=verdict.value, message=message)
    if verdict is Verdict.FAILED:
        element.text = _text(json.dumps(check["evidence"], indent=1)) if check["evidence"] else message


def render(document: dict) -> str:
    """The whole junit.xml text, declaration included."""
    summary, environment = document["summary"], document["environment"]
    checks = checks_of(document)
    total_time = _seconds(sum(c["duration_s"] for _, _, c in checks if isinstance(c["duration_s"], (int, float))))
    counts = {
        "tests": str(summary["total"]),
        **{plural: str(sum(summary.get(v, 0) for v in Verdict if v.junit == element)) for element, plural in JUNIT},
        "time": total_time,
    }
    root = ET.Element("testsuites", name=_text(f"qnn-mutbuf {document['run_id']}"), **counts)
    suite = ET.SubElement(
        root,
        "testsuite",
        name=_text(f"qnn-mutbuf.{document['soc']}"),
        **counts,
        timestamp=_text(environment.get("started", "")),
        hostname=_text(environment.get("host", "")),
    )
    properties = ET.SubElement(suite, "properties")
    for key, value in environment.items():
        ET.SubElement(properties, "property", name=_text(key), value=_text(value))
    for case, name, check in checks:
        _testcase(suite, case, name, check)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
