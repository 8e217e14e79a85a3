"""Free TCP ports for engines that qmgui starts, and the address to reach an engine at.

Engines listen on the loopback interface unless the user asks for another address (an extra
`--host 0.0.0.0`): `reachable_from_network` says when one does, `connect_host` what to
connect to for it from this machine (the wildcard addresses are reached through loopback).
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil

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


def next_free_port(port: int, host: str = HOST, *, held: set[int] | None = None) -> int | None:
    """The first port after `port` that nothing listens on (and not in `held`), or None."""
    for candidate in range(port + 1, min(port + 1000, 65536)):
        if candidate not in (held or set()) and port_is_free(candidate, host):
            return candidate
    return None


def port_holder(port: int) -> str | None:
    """What listens on TCP `port`, as "NAME (pid N)", when this user may see it (best effort:
    None when psutil cannot tell)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        conns = []
    pids = {
        c.pid
        for c in conns
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid
    }
    if not pids and not conns:
        pids = _scan_processes(port)
    for pid in sorted(pids):
        try:
            name = psutil.Process(pid).name()
        except psutil.Error:
            name = "a process"
        own = " (this qmgui)" if pid == os.getpid() else ""
        return f"{name} (pid {pid}){own}"
    return None


def _scan_processes(port: int) -> set[int]:
    found: set[int] = set()
    for proc in psutil.process_iter():
        try:
            conns = proc.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            continue
        if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in conns):
            found.add(proc.pid)
    return found


def taken_sentence(name: str, port: int, host: str = HOST) -> str:
    """Why `name` cannot start on `port`, what holds it, and the next free port to use."""
    holder = port_holder(port)
    by = f" by {holder}" if holder else " by another program (qmgui cannot see which)"
    nxt = next_free_port(port, host)
    offer = (
        f"; stop it, or use the next free port, {nxt} (`--port {nxt}`, or set the model's port)"
        if nxt is not None
        else "; stop it or choose another port"
    )
    return f"{name} cannot start: port {port} on {host} is taken{by}{offer}."
