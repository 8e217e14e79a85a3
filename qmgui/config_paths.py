"""Where qmgui's settings file lives, without the settings machinery (pydantic, the lock):
`qmgui plan` looks there for a model's profile and imports `qmgui.settings` only when the file
may hold one (issue 13, "Fast start")."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ENV_CONFIG_DIR = "QMGUI_CONFIG_DIR"
APP_NAME = "qmgui"
SETTINGS_FILENAME = "settings.json"


def config_dir() -> Path:
    """The folder holding qmgui's settings: ``$QMGUI_CONFIG_DIR`` if set, else the platform's."""
    override = os.environ.get(ENV_CONFIG_DIR)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def settings_path() -> Path:
    """The settings file in ``config_dir()``."""
    return config_dir() / SETTINGS_FILENAME
