"""The one error hierarchy of qmgui.

    QmguiError                 anything qmgui reports to a user
     ├── ModelReadError        a model file or folder could not be read (names the file)
     ├── SizingError           a plan could not be computed from the inputs
     ├── EngineError           an engine could not be started, watched or stopped
     ├── SettingsError         the settings file could not be read or written
     └── DownloadError         a model could not be downloaded (names the URL or file)

Low-level errors (OSError, struct.error, json.JSONDecodeError) are wrapped at the boundary
with a sentence a user can act on; nothing else escapes a public function of qmgui.
"""

from __future__ import annotations

import os


class QmguiError(Exception):
    """Base of every error qmgui raises on purpose."""


class ModelReadError(QmguiError):
    """A model file could not be read; carries the path, the byte offset and the reason."""

    def __init__(self, path: str | os.PathLike[str], reason: str, *, offset: int | None = None):
        self.path = os.fspath(path)
        self.reason = reason
        self.offset = offset
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.path}: {reason}{where}")


class SizingError(QmguiError):
    """The inputs of a plan are inconsistent (not 'does not fit', which is a result)."""


class EngineError(QmguiError):
    """An engine process could not be started, watched or stopped."""


class SettingsError(QmguiError):
    """The settings file could not be read or written."""


class DownloadError(QmguiError):
    """A download could not start or finish; the message is one sentence a user can act on."""
