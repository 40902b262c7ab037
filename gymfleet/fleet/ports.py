"""Ports a fleet chose itself, held from the moment they are chosen until the server that listens on them has them.

Choosing a free port by binding it and closing the socket leaves a window: until the server binds again (after the
zygote imported everything, the config was validated and the child started, seconds under load) any other process
may take it, and the fleet then stops with "port already in use" for a port nobody set. So `find_free_port` keeps
the socket it probed with bound (`reserve`; bound, not listening: no connection is accepted on it, and neither
another process's `bind` nor the kernel's choice of ephemeral ports can take the port), the supervisor takes it
(`take`) and hands the bound socket itself to the server process (an inherited descriptor for a fresh interpreter,
`socket.send_fds` for a server forked by the zygote), which listens on it: no port is ever released between its
choice and its use. `LISTEN_FD_ENV` names the inherited descriptor for a fresh interpreter.

A process that chooses ports and starts no fleet (`ng_dump_config`, tests that parse configs) must not pile up
bound sockets: reservations are released after `RESERVATION_TTL_S` or when more than `MAX_RESERVATIONS` are held,
oldest first, and at exit.
"""

from __future__ import annotations

import atexit
import errno
import socket
import threading
import time

__all__ = ["LISTEN_FD_ENV", "MAX_RESERVATIONS", "RESERVATION_TTL_S", "bind_probe", "reserve", "take",
           "take_for_listening"]

LISTEN_FD_ENV = "GYMFLEET_LISTEN_FD"
"""Environment variable naming the inherited descriptor of the bound socket a fresh server interpreter listens on."""
RESERVATION_TTL_S = 900.0
"""A reservation not taken within this long is released (the zygote may take minutes to import a large fleet)."""
MAX_RESERVATIONS = 256

_lock = threading.Lock()
_held: dict[tuple[str, int], tuple[float, socket.socket]] = {}


def bind_probe(host: str, port: int) -> tuple[socket.socket, bool] | None:
    """A socket bound to `port` on `host` and True, or (where `host` is not local to this machine) one bound on all
    interfaces and False; None when the port is taken. Plain `bind`, no `SO_REUSEADDR`: a bound socket of another
    process keeps it out. Only a socket bound to `host` itself is one its server may listen on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for bind_host in (host, ""):  # a host that is not local (or not resolvable here) is checked on all interfaces
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((bind_host, port))
            return sock, bind_host == host
        except socket.gaierror:
            sock.close()
            continue
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRNOTAVAIL:
                return None
    return None


def reserve(host: str, sock: socket.socket) -> None:
    """Hold `sock` (bound by `bind_probe`) for the server of `host` and its port until `take` (or expiry)."""
    port = sock.getsockname()[1]
    now = time.monotonic()
    with _lock:
        _release_stale(now)
        old = _held.pop((host, port), None)
        if old is not None:
            old[1].close()
        _held[(host, port)] = (now, sock)
        while len(_held) > MAX_RESERVATIONS:
            _held.pop(next(iter(_held)))[1].close()


def take(host: str, port: int) -> socket.socket | None:
    """The bound socket reserved for `host:port` (now the caller's to close or hand over), or None."""
    with _lock:
        _release_stale(time.monotonic())
        held = _held.pop((host, port), None)
    return None if held is None else held[1]


def take_for_listening(host: str, port: int) -> socket.socket | None:
    """`take`, with `SO_REUSEADDR` set now that the socket is about to listen: the connections it accepts inherit
    it, so their TIME_WAIT does not keep the server's restart (`gymfleet.fleet.launch.bind_socket`) off its port.
    (Held without it, the reservation keeps out every other bind, `SO_REUSEADDR` or not.)"""
    sock = take(host, port)
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


@atexit.register
def _release_all() -> None:
    """At exit, release what nobody took (quietly: an unclosed socket would be a ResourceWarning)."""
    with _lock:
        while _held:
            _held.popitem()[1][1].close()


def _release_stale(now: float) -> None:
    for key in [key for key, (since, _) in _held.items() if now - since > RESERVATION_TTL_S]:
        _held.pop(key)[1].close()
