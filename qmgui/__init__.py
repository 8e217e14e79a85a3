"""qmgui: find local AI models, size every launch per GPU, run and supervise the engine."""

__version__ = "0.1.0"
