"""Free TCP ports on the loopback interface, for engines that qmgui starts."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port on `host` that nothing listens on right now (it may be taken before use:
    the supervisor retries when the engine reports the port taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether `port` on `host` can be bound now (SO_REUSEADDR, as servers bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
