"""systemd's readiness protocol (sd_notify(3)), spoken directly: no library needed.

Under a unit with ``Type=notify`` systemd sets ``NOTIFY_SOCKET`` (a path, or an
abstract name starting with "@") and ``WATCHDOG_USEC``; the daemon sends datagrams
of newline-separated ``KEY=VALUE`` lines: ``READY=1`` when it serves,
``STATUS=...`` for ``systemctl status``, ``WATCHDOG=1`` at least every
``WATCHDOG_USEC`` / 2, ``STOPPING=1`` when it shuts down. Outside systemd every
call does nothing. Both daemons (agent and collector) use this one module.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify messages to ``NOTIFY_SOCKET`` (from ``env``, os.environ by default)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 / 2 if usec.isdigit() and int(usec) > 0 and mine else None
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, **items: str | int) -> bool:
        """Send ``KEY=VALUE`` lines (``send(READY=1, STATUS="serving")``); False if not sent."""
        if not self.address:
            return False
        msg = "\n".join(f"{k}={v}" for k, v in items.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(msg, self.address)
            return True
        except OSError as e:
            log.warning("sd_notify failed socket=%s error=%s", self.address.lstrip("\0"), e)
            return False

    def ready(self, status: str = "") -> bool:
        return self.send(READY=1, STATUS=status) if status else self.send(READY=1)

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def stopping(self) -> bool:
        return self.send(STOPPING=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
