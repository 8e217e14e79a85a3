"""Free TCP ports for engines that qmgui starts, and the address to reach an engine at.

Engines listen on the loopback interface unless the user asks for another address (an extra
`--host 0.0.0.0`): `reachable_from_network` says when one does, `connect_host` what to
connect to for it from this machine (the wildcard addresses are reached through loopback).
"""

from __future__ import annotations

import ipaddress
import socket

HOST = "127.0.0.1"
_WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1", "*": "127.0.0.1"}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def connect_host(host: str) -> str:
    """Where to connect to reach something that listens on `host`: loopback for a wildcard
    address (0.0.0.0, ::), else `host` itself."""
    return _WILDCARD.get(host.strip("[]"), host)


def reachable_from_network(host: str) -> bool:
    """Whether listening on `host` accepts connections from other machines: anything but a
    loopback address or `localhost`."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return True  # a host name: whatever it resolves to, it is not known to be loopback


def url_host(host: str) -> str:
    """`host` as it goes in a URL (an IPv6 address in brackets)."""
    bare = host.strip("[]")
    return f"[{bare}]" if ":" in bare else bare


def free_port(host: str = HOST) -> int:
    """A TCP port on `host` that nothing listens on right now (it may be taken before use:
    the supervisor retries when the engine reports the port taken)."""
    bare = host.strip("[]") or HOST
    with socket.socket(_family(bare), socket.SOCK_STREAM) as s:
        s.bind((bare, 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether `port` on `host` can be bound now (SO_REUSEADDR, as servers bind it)."""
    bare = host.strip("[]") or HOST
    with socket.socket(_family(bare), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bare, port))
        except OSError:
            return False
        return True
