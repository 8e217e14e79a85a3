"""The bundle's entry point (PyInstaller runs a script, not a console-script entry point)."""

import sys

from qmgui.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
