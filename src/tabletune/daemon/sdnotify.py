"""systemd notifications (READY=1, WATCHDOG=1, STOPPING=1) without a dependency: one datagram
to ``$NOTIFY_SOCKET``. Outside systemd (no socket) every call is a no-op."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket: a leading NUL byte on Linux.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or (pid.isdigit() and int(pid) == os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and mine else None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, message: str) -> bool:
        """Send ``message``; False when not under systemd or the socket is gone."""
        if not self._address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(message.encode())
        except OSError:
            return False
        return True

    def ready(self) -> bool:
        return self.notify("READY=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")
