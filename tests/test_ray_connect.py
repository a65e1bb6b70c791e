"""``--engine ray`` start-up: an address that does not answer, a refused join, Ctrl-C inside
``ray.init`` and ``RAY_ADDRESS``; ``ray.init`` stubbed (no cluster is needed)."""

from __future__ import annotations

import os
import signal
import socket

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from conftest import write_docs  # noqa: E402
from packtool.config import PackConfig  # noqa: E402
from packtool.engines import ray_engine  # noqa: E402
from packtool.engines.ray_engine import RayEngine  # noqa: E402
from packtool.errors import EngineError  # noqa: E402
from packtool.pipeline import run_pack  # noqa: E402


@pytest.fixture
def fake_ray(monkeypatch):
    """ray.init / is_initialized / shutdown stubbed; returns the calls made."""
    calls = {"init": [], "shutdown": 0, "raise": None}

    def init(**kw):
        kw["gcs_wait"] = os.environ.get("RAY_gcs_server_port_wait_time_s")
        calls["init"].append(kw)
        if calls["raise"] is not None:
            raise calls["raise"]
        if calls.get("ctrl_c"):  # Ctrl-C while Ray starts its processes
            signal.raise_signal(signal.SIGINT)
            calls["init_done"] = True

    def shutdown():
        calls["shutdown"] += 1

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    return calls


@pytest.fixture
def closed_port():
    """A local port nothing listens on (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def open_port():
    """A port that accepts connections on every address of this machine (as a GCS does)."""
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def test_unreachable_address_is_refused_at_once_naming_it(fake_ray, closed_port):
    """Ray retried an address that does not answer for good (only its 'Failed to connect to
    GCS' lines); now one EngineError names the address and the fix, and Ray is not called."""
    addr = f"127.0.0.1:{closed_port}"
    with pytest.raises(EngineError, match=rf"cannot reach the Ray cluster at {addr} \(.+\); "
                                          r"check --ray-address and that the cluster is up"):
        RayEngine(workers=1, address=addr).__enter__()
    assert fake_ray["init"] == [] and fake_ray["shutdown"] == 0


def test_address_that_does_not_answer_is_bounded(fake_ray, monkeypatch):
    """A host that drops the connection attempt is given up after CONNECT_TIMEOUT_S."""
    seen = []

    def silent(addr, timeout=None):
        seen.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(ray_engine.socket, "create_connection", silent)
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    with pytest.raises(EngineError, match=r"at 10\.1\.2\.3:6379 \(no answer within [\d.]+ s\); "
                                          r"check RAY_ADDRESS"):
        RayEngine(workers=1, address="10.1.2.3:6379").__enter__()
    assert seen == [ray_engine.CONNECT_TIMEOUT_S]
    assert fake_ray["init"] == []


def test_no_address_starts_a_local_ray_whatever_RAY_ADDRESS_says(fake_ray, monkeypatch):
    """Without an address ray.init read RAY_ADDRESS and joined that cluster; the engine now
    asks for a local Ray with --workers CPUs (the CLI reads RAY_ADDRESS as --ray-address)."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with RayEngine(workers=3):
        pass
    (kw,) = fake_ray["init"]
    assert kw["address"] == "local" and kw["num_cpus"] == 3 and kw["gcs_wait"] is None
    assert fake_ray["shutdown"] == 1


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("raylet died")])
def test_ray_started_here_is_shut_down_when_init_fails_or_is_interrupted(fake_ray, exc):
    """A Ctrl-C inside ray.init skipped ray.shutdown() (its agents kept running)."""
    fake_ray["raise"] = exc
    with pytest.raises((KeyboardInterrupt, EngineError)):
        RayEngine(workers=1).__enter__()
    assert fake_ray["shutdown"] == 1


def test_ctrl_c_while_a_local_ray_starts_waits_for_it_then_shuts_it_down(fake_ray):
    """A Ctrl-C inside ray.init's start of the local processes left the agents it had started
    running (unknown to ray.shutdown()); the start is finished first, then shut down whole."""
    fake_ray["ctrl_c"] = True
    with pytest.raises(KeyboardInterrupt):
        RayEngine(workers=1).__enter__()
    assert fake_ray.get("init_done") and fake_ray["shutdown"] == 1


def test_refused_join_is_an_engine_error_not_an_output_error(fake_ray, open_port, tmp_path):
    """ConnectionError (an OSError) raised by ray.init inside OUTPUT's context was worded
    'OUTPUT: cannot write (...)'; it is an EngineError naming Ray, the address and its cause."""
    addr = f"127.0.0.1:{open_port}"
    try:
        raise RuntimeError("Unauthenticated: InvalidAuthToken")
    except RuntimeError as cause:
        try:
            raise ConnectionError(f"Failed to connect to Ray cluster at {addr}") from cause
        except ConnectionError as exc:
            fake_ray["raise"] = exc
    rng = np.random.default_rng(0)
    write_docs(tmp_path / "in" / "a.parquet", [rng.integers(0, 100, 9).tolist()] * 5)
    cfg = PackConfig(inputs=(str(tmp_path / "in"),), output=str(tmp_path / "out"), capacity=16,
                     engine="ray", ray_address=addr)
    with pytest.raises(EngineError) as err:
        run_pack(cfg, progress=False)
    msg = str(err.value)
    assert msg.startswith(f"cannot join the Ray cluster at {addr}: ConnectionError: "
                          f"Failed to connect to Ray cluster at {addr} (RuntimeError: "
                          "Unauthenticated: InvalidAuthToken); check --ray-address"), msg
    assert "RAY_AUTH_TOKEN" in msg and "cannot write" not in msg and "OUTPUT" not in msg
    assert fake_ray["shutdown"] == 1
    # a GCS that never answers is given up after JOIN_ATTEMPTS (Ray: 20 of about 40 s each)
    assert fake_ray["init"][0]["gcs_wait"] == str(ray_engine.JOIN_ATTEMPTS)
    assert "RAY_gcs_server_port_wait_time_s" not in os.environ
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_ray_worker_messages_go_to_stderr_not_to_the_json_on_stdout(fake_ray, capsys):
    """Ray printed '(raylet) A worker died ...' on the driver's stdout (log_to_driver=False does
    not stop it), before the --json summary; they go to stderr while the engine holds Ray."""
    from ray._private import worker

    real = worker.print_to_stdstream
    line = "A worker died or was killed while executing a task by an unexpected system error."
    with RayEngine(workers=1):
        worker.print_to_stdstream({"lines": [line], "pid": "raylet", "is_err": False},
                                  ignore_prefix=False)
    out, err = capsys.readouterr()
    assert line not in out and line in err
    assert worker.print_to_stdstream is real
