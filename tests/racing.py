"""Writers racing with readers in threads, for tests of what readers may see while rows move.

:func:`race` runs ``write`` once in a thread and ``read`` over and over in ``readers`` threads
until the writer is done, then raises the first error any thread met (a reader's failed
assertion stops the others too), so a test states only what it writes and what each read must
hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def race(write: Callable[[], None], read: Callable[[], None], readers: int = 2) -> None:
    """Run ``write`` once while ``readers`` threads call ``read`` until it returns; raise the
    first error of any thread."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            write()
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)
        finally:
            stop.set()

    def reader() -> None:
        try:
            while not stop.is_set():
                read()
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=writer),
               *(threading.Thread(target=reader) for _ in range(readers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


__all__ = ["race"]
