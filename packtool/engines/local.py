"""The local engine: tasks on a pool of threads of this process.

The kernels and Parquet encoding release the GIL, so threads use every core without copying
arrays between processes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

from packtool.signals import STOP, check, result as task_result

__all__ = ["LocalEngine"]


class LocalEngine:
    """Map tasks over ``workers`` threads; results come back in task order.

    Args:
        workers: threads (>= 1).
    """

    name = "local"

    def __init__(self, *, workers: int):
        self.workers = max(1, int(workers))

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def map(self, fn: Callable, items: Sequence[tuple]) -> Iterator:
        """Yield ``fn(*item)`` for each item, in order.

        The first task that fails sets :data:`STOP`: tasks not started yet do not start, running
        ones stop at their next check, and that first failure is what the caller gets (not the
        ``KeyboardInterrupt`` of a task it stopped). Ctrl-C or an exception in the consumer also
        sets :data:`STOP`; queued tasks are cancelled and the running ones waited for.
        """
        failures: list[BaseException] = []

        def run(item):
            check()
            try:
                return fn(*item)
            except KeyboardInterrupt:
                STOP.set()  # no task starts after an interrupted one
                raise
            except BaseException as exc:
                failures.append(exc)
                STOP.set()
                raise

        pool = ThreadPoolExecutor(max_workers=min(self.workers, max(1, len(items))))
        try:
            futures = [pool.submit(run, item) for item in items]
            for fut in futures:
                try:
                    result = task_result(fut)
                except KeyboardInterrupt:
                    if failures:  # stopped because another task failed: report that failure
                        raise failures[0] from None
                    raise
                yield result
        except BaseException:
            STOP.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
