"""``--engine ray``: one Ray task per item, on a local Ray instance or a cluster.

The driver (the ``packtool`` process) maps the same functions as the local engine: one task
per window (read, spill, plan), then one task per output shard (lay out, encode, write). Tasks
read and write OUTPUT and its scratch on a filesystem every node sees at the same path, or in
an object store (an ``s3://`` OUTPUT: then the nodes share nothing else), and return only small
records (counts, names, sizes, hashes); no tokens go through the Ray object store. A task whose
worker dies is retried by Ray (:data:`MAX_RETRIES`); every task publishes whole files only (a
rename, or one upload to a store), so a retry beside a slow first attempt never exposes a
half-written file. Needs the ``ray`` extra (``pip install "packtool[ray] @ git+URL"``; the
same version on every node: every task checks that its worker imports the driver's packtool
before any work, :func:`_checked_task`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence

from packtool.errors import (EngineError, MissingDependencyError, PacktoolError, exc_line,
                             first_line, install_hint, raise_if_shortage)
from packtool.signals import TEST_ENVS, signals_held

__all__ = ["RayEngine", "import_ray", "MAX_RETRIES", "CANCEL_WAIT_S", "CONNECT_TIMEOUT_S"]

log = logging.getLogger(__name__)

#: Ray retries of a task whose worker died (a raised PacktoolError is not retried).
MAX_RETRIES = 3

#: Seconds the driver waits, after a failure, for the cancelled tasks' workers to be gone.
CANCEL_WAIT_S = 30.0

#: Seconds the driver waits for a cluster's address to accept a connection before ``ray.init``
#: (Ray itself retries an address that does not answer for minutes, printing as it goes).
CONNECT_TIMEOUT_S = 10.0

#: Attempts ``ray.init`` makes to join a cluster whose address answers but whose GCS does not
#: (each about 40 s; Ray's default is 20), unless ``RAY_gcs_server_port_wait_time_s`` is set.
JOIN_ATTEMPTS = 2


def import_ray():
    """Import Ray, or raise :class:`MissingDependencyError` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "--engine ray needs Ray: " + install_hint("ray")) from None
    return ray


class RayEngine:
    """Map tasks as Ray tasks (1 CPU each); results come back in task order.

    Joins ``address`` when given, else starts a local Ray with ``workers`` CPUs (whatever
    ``RAY_ADDRESS`` says: the command line reads that variable as ``--ray-address``); a Ray
    already initialised in this process (a test, a notebook) is used as is. A Ray started here
    is shut down on exit, and also when its start fails or is interrupted (Ctrl-C inside
    ``ray.init``). Start-up happens in ``__enter__``, inside the run's measured wall time. The
    test hooks' variables (:data:`packtool.signals.TEST_ENVS`), when set in the driver, are
    handed to every task through the job's ``runtime_env`` (workers on other nodes do not
    inherit the driver's environment).

    Raises:
        MissingDependencyError: Ray is not installed.
        EngineError: ``address`` cannot be reached within :data:`CONNECT_TIMEOUT_S` or Ray
            cannot join it (a wrong authentication token...), or a local Ray cannot start; one
            line naming the address and the fix (raised by ``__enter__``).
    """

    name = "ray"

    def __init__(self, *, workers: int, address: str | None = None):
        self.workers = workers
        self.address = address
        self.ray = import_ray()
        self._started = False
        self._restore_stdout: Callable[[], None] = lambda: None

    def __enter__(self) -> "RayEngine":
        ray = self.ray
        if not ray.is_initialized():
            kw = dict(logging_level=logging.WARNING, log_to_driver=False)
            hooks = {k: os.environ[k] for k in TEST_ENVS if os.environ.get(k)}
            if hooks:
                kw["runtime_env"] = {"env_vars": hooks}
            # ray.init replaces the driver's SIGTERM handler with one that exits at once (status
            # 15, OUTPUT left locked and unclean): packtool's own (packtool.signals) is put back
            main = threading.current_thread() is threading.main_thread()
            sigterm = signal.getsignal(signal.SIGTERM) if main else None
            if self.address:
                _probe(ray, self.address)
            # set before ray.init: a failure or a Ctrl-C inside it still shuts down what it
            # started (its agents and workers), and __exit__ is not called when __enter__ raises
            self._started = True
            self._restore_stdout = _ray_messages_to_stderr(ray)
            try:
                # a local start is not interrupted halfway: a Ctrl-C inside Node() left its
                # agents running, unknown to ray.shutdown(); it is held until ray.init returns
                # (seconds), then shuts the whole Ray down below. A join starts no process.
                with (nullcontext() if self.address else signals_held()), \
                        _no_failure_handler(ray), _join_attempts(bool(self.address)):
                    if self.address:
                        ray.init(address=self.address, **kw)
                    else:  # "local": never the cluster of RAY_ADDRESS (read by ray.init)
                        ray.init(address="local", num_cpus=self.workers,
                                 include_dashboard=False, **kw)
            except BaseException as exc:
                self.__exit__(None, None, None)
                if not isinstance(exc, Exception) or isinstance(exc, PacktoolError):
                    raise
                raise_if_shortage(exc)
                raise _init_error(self.address, exc) from None
            finally:
                if main:
                    signal.signal(signal.SIGTERM,
                                  signal.SIG_DFL if sigterm is None else sigterm)
        return self

    def __exit__(self, *exc) -> bool:
        if self._started:
            # Ray started here: shut it down whole, SIGINT and SIGTERM held (noted) meanwhile
            # and handed to packtool's handlers once it is done, like a signal at any other
            # moment (a KeyboardInterrupt raised inside ray.shutdown() left it half done).
            # Putting the handlers back also installs them again in the OS, should Ray have set
            # the default action meanwhile (see _no_failure_handler).
            self._started = False
            with signals_held():
                try:
                    self.ray.shutdown()
                finally:
                    self._restore_stdout()
        return False

    def map(self, fn: Callable, items: Sequence[tuple]) -> Iterator:
        """Yield ``fn(*item)`` for each item, in order; the first failure stops everything.

        Tasks are watched as they finish (not in order), so a failing task is seen at once even
        while earlier ones still run. A task whose worker or node died is retried by Ray
        (``max_retries``); an exception raised by ``fn`` is not. On the first failure (or when
        the consumer stops: Ctrl-C, its own error) every other task is cancelled and waited for
        (:meth:`_cancel`), so none of them still writes into OUTPUT's scratch directory while
        the driver cleans it up.

        Raises:
            PacktoolError: the one a task raised (bad input found inside a task).
            EngineError: a task's worker imports another packtool than the driver's, or none
                (:func:`_checked_task`: one line naming both and the node); a task failed for
                another reason (worker or node lost after its retries, unexpected exception),
                with Ray's first line.
        """
        from packtool.location import credentialed_roots

        ray = self.ray
        # store files found under a KEY:SECRET@ URI are named without the credentials; the
        # tasks, in other processes, must open them with those too (not the environment's)
        roots = credentialed_roots()
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_checked_task()).options(
            name=fn.__name__)
        driver = _driver_packtool()
        joined = bool(self.address)
        refs = [task.remote(driver, joined, roots, ray.cloudpickle.dumps((fn, item)))
                for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        done: dict[int, object] = {}
        pending = list(refs)
        nxt = 0
        try:
            while nxt < len(refs):
                if nxt not in done:
                    ready, pending = ray.wait(pending, num_returns=1)
                    for ref in ready:
                        done[index[ref]] = self._get(ray, ref, fn)
                    continue
                yield done.pop(nxt)
                nxt += 1
        except BaseException:
            self._cancel(ray, refs)
            raise

    @staticmethod
    def _get(ray, ref, fn):
        try:
            ran, value = ray.get(ref)
            if not ran:  # the worker's packtool is not the driver's (or none): one line
                raise EngineError(value)
            return value
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, PacktoolError):
                raise cause from None
            raise EngineError(f"a Ray task of {fn.__name__} failed: "
                              f"{exc_line(cause or exc)}") from None
        except ray.exceptions.RayError as exc:
            raise EngineError(f"a Ray task of {fn.__name__} failed: "
                              f"{exc_line(exc)}") from None

    @staticmethod
    def _cancel(ray, refs) -> None:
        """Cancel every task not finished and wait for them to end.

        Only tasks not finished are cancelled (cancelling one that is completing at that moment
        can trip an internal check of Ray's task manager). They are first interrupted
        (``KeyboardInterrupt`` in the task, which removes its partial files); those still
        running after :data:`CANCEL_WAIT_S` (inside a long native call) are force-cancelled:
        their workers are killed.
        """
        try:
            for force in (False, True):
                _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
                if not pending:
                    return
                for ref in pending:
                    try:
                        ray.cancel(ref, force=force)
                    except Exception:  # finished meanwhile, or gone
                        pass
                ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_S)
        except Exception:  # Ray itself going away (Ctrl-C during shutdown)
            pass


def _address_fix(address: str) -> str:
    """What to check about ``address``, naming ``RAY_ADDRESS`` when it came from there."""
    env = os.environ.get("RAY_ADDRESS")
    given = ("RAY_ADDRESS (read as --ray-address; unset it to start a local Ray)"
             if env and env == address else "--ray-address")
    return f"check {given} and that the cluster is up (`ray status` on its head node)"


def _probe(ray, address: str) -> None:
    """Refuse at once an ``address`` (``HOST:PORT``, or ``auto``) that accepts no connection
    within :data:`CONNECT_TIMEOUT_S` (Ray retries such an address for many minutes, printing
    "Failed to connect to GCS" lines); a ``ray://`` client address is left to Ray.

    Raises:
        EngineError: no Ray found for ``auto``, or the address does not answer.
    """
    if "://" in address:
        return
    # the address ray.init will connect to: "auto" looked up (RAY_ADDRESS, else the last Ray
    # started on this machine), a local host name turned into this node's IP address
    services = getattr(getattr(ray, "_private", None), "services", None)
    try:
        bootstrap = (services.canonicalize_bootstrap_address(address)
                     if hasattr(services, "canonicalize_bootstrap_address") else address)
    except Exception as exc:  # no running Ray found for "auto", a malformed address
        raise _init_error(address, exc, token=False) from None
    if not bootstrap or "://" in bootstrap:
        return
    host, _, port = bootstrap.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)),
                                 timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        why = (f"no answer within {CONNECT_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError)
               else getattr(exc, "strerror", None) or first_line(exc))
        raise EngineError(f"cannot reach the Ray cluster at {address} ({why}); "
                          f"{_address_fix(address)}") from None


def _init_error(address: str | None, exc: BaseException, token: bool = True) -> EngineError:
    """The one-line error for a ``ray.init`` (or an address look-up) that failed: Ray's first
    line and that of its cause (the token refused...), the address and the fix."""
    cause = exc.__cause__ or exc.__context__
    why = exc_line(exc) + (f" ({exc_line(cause).split('. Last connection error')[0]})"
                           if cause is not None and first_line(cause, "") not in str(exc)
                           else "")
    if address:
        tip = ("; with token authentication, give the cluster's token (RAY_AUTH_TOKEN or "
               "RAY_AUTH_TOKEN_PATH)" if token else "")
        return EngineError(f"cannot join the Ray cluster at {address}: {why}; "
                           f"{_address_fix(address)}{tip}")
    return EngineError(f"cannot start a local Ray: {why}")


def _ray_messages_to_stderr(ray) -> Callable[[], None]:
    """Send the messages Ray pushes to the driver ("(raylet) A worker died or was killed ...",
    printed even with ``log_to_driver=False``) to stderr rather than stdout, which holds only
    packtool's own output (the ``--json`` summary). Ray has no option for it: its printer
    (``ray._private.worker.print_to_stdstream``, looked up by name at each message) is wrapped
    to mark every message as an error line. Returns what puts Ray's printer back."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None:  # another Ray layout: nothing to redirect
        return lambda: None

    def to_stderr(data, *args, **kwargs):
        return printer({**data, "is_err": True}, *args, **kwargs)

    worker.print_to_stdstream = to_stderr

    def restore() -> None:
        if worker.print_to_stdstream is to_stderr:
            worker.print_to_stdstream = printer

    return restore


@contextmanager
def _join_attempts(joining: bool) -> Iterator[None]:
    """Inside: ``ray.init`` joining a cluster gives up after :data:`JOIN_ATTEMPTS` attempts
    to reach its GCS (``RAY_gcs_server_port_wait_time_s``, read by Ray's node as it connects),
    unless the variable is set already; put back as it was after."""
    name = "RAY_gcs_server_port_wait_time_s"
    if not joining or name in os.environ:
        yield
        return
    os.environ[name] = str(JOIN_ATTEMPTS)
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextmanager
def _no_failure_handler(ray) -> Iterator[None]:
    """Inside: a driver connected by ``ray.init`` does not install Ray's C++ failure-signal
    handler (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``, read by the driver's core worker as it is
    created; the nodes and workers Ray starts keep theirs). That handler takes SIGTERM too, and
    ``ray.shutdown()`` uninstalls it by setting the OS's default action: a SIGTERM during the
    shutdown then ended the driver at once, OUTPUT locked and no message, whatever handler
    Python had. Without it, packtool's SIGTERM handler stays in force throughout; a crash of
    the driver's native code loses only the C++ stack that handler would have printed."""
    ray_constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    name = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
    if not hasattr(ray_constants, name):  # another Ray layout: nothing to switch
        yield
        return
    was = getattr(ray_constants, name)
    setattr(ray_constants, name, True)
    try:
        yield
    finally:
        setattr(ray_constants, name, was)


def _driver_packtool() -> tuple[str, str, str]:
    """This process's packtool, as every task compares it with the one its worker imports:
    (version, :func:`~packtool._version.code_identity`, where it is)."""
    from packtool import _version

    return (_version.__version__, _version.code_identity(),
            os.path.dirname(os.path.abspath(_version.__file__)))


def _checked_task() -> Callable:
    """The function every Ray task runs: ``(ran, value)`` for ``(driver, joined, roots,
    payload)``.

    It is defined inside this function so that Ray ships it by value, not as a name to import:
    a worker whose packtool cannot be imported, or is another version (its ``PYTHONPATH`` or
    environment on ``ray start`` is not the driver's), still runs it. Before anything else it
    imports the worker's packtool and compares its version and code identity with the driver's
    (``driver``, from :func:`_driver_packtool`); when they differ (or the import fails) it
    returns ``(False, line)``, the one line naming both and the fix, and does no work. Otherwise
    it unpickles ``payload`` (the task's function and arguments, pickled by the driver: only
    now, by the same packtool) and returns ``(True, fn(*args))`` through :func:`_in_task`
    (``joined``: the cluster was joined, not started by the driver; ``roots``: the driver's
    credentialed store roots). Cost per task: one tuple compared; the identity is computed once
    per worker process."""

    def packtool_task(driver, joined, roots, payload):
        import os
        import socket

        def node() -> str:
            try:
                import ray

                ip = ray.util.get_node_ip_address()
            except Exception:  # no Ray API here: the host alone
                ip = None
            host = socket.gethostname()
            return f"{host} ({ip})" if ip and ip != host else host

        version, identity, at = driver
        fix = ("install the driver's packtool on every node of the cluster (one image, or the "
               "same commit), or start the nodes with a PYTHONPATH that holds it, then rerun")
        try:
            from packtool import _version

            mine = (_version.__version__,
                    getattr(_version, "code_identity", lambda: "unknown")(),
                    os.path.dirname(os.path.abspath(_version.__file__)))
        except Exception as exc:
            why = (str(exc).splitlines() or [""])[0]
            return False, (f"a Ray worker on node {node()} cannot import packtool "
                           f"({type(exc).__name__}: {why}), the driver runs packtool {version} "
                           f"from {at}; {fix}")
        if mine[:2] != (version, identity):
            what = (f"packtool {mine[0]} from {mine[2]}, the driver packtool {version} "
                    f"from {at}" if mine[0] != version else
                    f"packtool {version} from {mine[2]} with other code than the driver's, "
                    f"from {at} (source sha256 {mine[1][:12]} against {identity[:12]})")
            return False, f"a Ray worker on node {node()} imports {what}; {fix}"
        from packtool.engines.ray_engine import _in_task
        from ray import cloudpickle

        fn, args = cloudpickle.loads(payload)
        return True, _in_task(roots, node() if joined else None, fn, *args)

    return packtool_task


def _in_task(roots: dict, node: str | None, fn: Callable, *args):
    """Run ``fn(*args)`` in a Ray worker, with the driver's credentialed store roots; ``node``:
    this worker's node when the driver joined a cluster (else None), named by the tasks'
    messages about what this node does not see (:func:`packtool.location.task_node`)."""
    from packtool.location import remember_credentialed_roots, remember_task_node

    remember_credentialed_roots(roots)
    remember_task_node(node)
    return fn(*args)


