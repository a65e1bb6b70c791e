"""A local S3-compatible server (moto's server mode) on 127.0.0.1, for the tests and benchmarks.

Nothing leaves the machine. Needs the ``dev`` extra (``moto[server]``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

__all__ = ["local_s3"]


@contextmanager
def local_s3(timeout_s: float = 20.0, env: dict | None = None):
    """Start moto's S3 server on a free port of 127.0.0.1 and yield its URL; stopped on exit.

    ``env``: variables added to the server's environment (``INITIAL_NO_AUTH_ACTION_COUNT=0``:
    every request needs credentials the server knows, so any other is refused as on S3).

    Raises:
        RuntimeError: the server exited or did not answer within ``timeout_s`` seconds.
    """
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except urllib.error.HTTPError:  # it answered (403 when it checks credentials)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("moto_server exited at start") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on {url}") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
