"""`python -m qmgui` and the `qmgui` command."""

from __future__ import annotations

import sys


def main() -> int:
    from qmgui.cli import main as cli_main  # noqa: PLC0415 - keeps `--help` fast

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
