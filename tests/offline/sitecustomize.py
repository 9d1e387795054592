"""Loaded by every Python process started with this folder on ``PYTHONPATH``: no network.

Name look-ups of anything but the local machine and connects to anything but loopback or a Unix
socket are recorded in ``$FMMETA_NETWORK_LOG`` (one line each) and refused, as on a machine whose
network is gone; a test then reads the log to prove nobody asked."""

from __future__ import annotations

import os
import socket

_LOG = os.environ.get("FMMETA_NETWORK_LOG")
_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", None, socket.gethostname()}


def _record(what: str) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {what}\n")


if _LOG:
    _getaddrinfo, _connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = host.decode() if isinstance(host, bytes) else host
        if name not in _LOCAL:
            _record(f"getaddrinfo {name}")
            raise socket.gaierror(socket.EAI_NONAME, "network guard: no network here")
        return _getaddrinfo(host, *args, **kwargs)

    def connect(self, address):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL:
            _record(f"connect {address}")
            raise OSError("network guard: no network here")
        return _connect(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect  # type: ignore[method-assign]
