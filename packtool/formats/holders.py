"""Who holds an OUTPUT's lock and whether that process lives: the lock object a run writes into
a store prefix names its run id, host, boot id, pid and start time (:func:`holder`), and a
reader or a later run asks :func:`holder_is_gone` / :func:`holder_is_here`. No packtool module
is imported here, so the manifest's readers and the store writer both use it."""

from __future__ import annotations

import json
import os
import socket
import uuid

import pyarrow as pa

__all__ = ["holder", "holder_is_gone", "holder_is_here", "read_json"]


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux), None when unknown."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            stat = f.read()
    except (OSError, ValueError):
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22 of proc(5), after the command


def holder() -> dict:
    """Who this process is, for a lock: run id, host, boot id, pid and process start time."""
    pid = os.getpid()
    return {"run": uuid.uuid4().hex, "host": socket.gethostname(), "boot_id": _boot_id(),
            "pid": pid, "started": _start_time(pid)}


def holder_is_gone(lock: dict) -> bool:
    """True when the process a lock names is known to be gone: on this host, after a reboot
    (another boot id), or no process with its pid, or one with its pid that started at another
    time (the pid was reused). A holder on another host cannot be told dead from alive."""
    if lock.get("host") != socket.gethostname():
        return False
    boot = _boot_id()
    if lock.get("boot_id") and boot and lock["boot_id"] != boot:
        return True
    try:
        pid = int(lock.get("pid", -1))
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    except (OSError, ValueError, OverflowError):
        return True
    started = lock.get("started")
    now = _start_time(pid)
    return bool(started and now and started != now)


def holder_is_here(lock: dict) -> bool:
    """True when the process a lock names runs on this host (so :func:`holder_is_gone` can
    tell whether it lives); a holder on another host cannot be asked."""
    return lock.get("host") == socket.gethostname()


def read_json(loc) -> dict | None:
    """The JSON object stored at location ``loc``; None when it is missing, unreadable or not
    a JSON object."""
    try:
        doc = json.loads(loc.read_bytes())
    except (OSError, pa.ArrowException, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
