import os
import socket

from firstfault.common.sdnotify import Notifier


def _listener(tmp_path):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    return s, path


def test_sends_datagrams_to_the_notify_socket(tmp_path):
    s, path = _listener(tmp_path)
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
    assert n.enabled and n.watchdog_s == 2.0
    assert n.ready("serving on 127.0.0.1:7140")
    assert s.recv(4096) == b"READY=1\nSTATUS=serving on 127.0.0.1:7140"
    assert n.watchdog() and s.recv(4096) == b"WATCHDOG=1"
    assert n.stopping() and s.recv(4096) == b"STOPPING=1"
    n.close()
    s.close()


def test_abstract_socket_names():
    name = f"firstfault-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(2)
    n = Notifier({"NOTIFY_SOCKET": "@" + name})
    assert n.status("x") and s.recv(100) == b"STATUS=x"
    s.close()


def test_outside_systemd_nothing_is_sent_and_no_watchdog():
    n = Notifier({})
    assert not n.enabled and n.watchdog_s is None and not n.ready()


def test_watchdog_meant_for_another_pid_is_ignored(tmp_path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "x"), "WATCHDOG_USEC": "1000000",
                  "WATCHDOG_PID": str(os.getpid() + 1)})
    assert n.watchdog_s is None


def test_a_gone_socket_is_a_warning_not_an_error(tmp_path):
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing")}).ready() is False
