"""One training process per work directory: an OS-level lock on `<workdir>/.lock`.

`train_and_evaluate` holds the lock from before it touches the work
directory until it returns. A second training process on the same directory
is refused at once with `WorkdirBusyError`, whose message names the
directory and the holder (pid, host, start time, command); it changes
nothing there.

The lock is `fcntl.flock` on an open file, not the file's existence: the
kernel releases it when the holding process ends in any way (`kill -9`, a
crash, power loss), so a lock left behind never blocks the next run. The
file itself stays and only says who held the lock last. Reading a run
(export, figures, `predict.py`) takes no lock: every checkpoint is written
atomically (`capsnet_tf.checkpoints`), so a reader sees either the old or
the new complete file.

On a network file system `flock` may be local to one machine (NFS before
Linux 2.6.12 and some FUSE mounts); two hosts sharing a directory there are
not stopped from each other. Where `fcntl` does not exist (Windows) the lock
is skipped with a warning.
"""

import contextlib
import datetime
import json
import os
import socket
import sys

from absl import logging

__all__ = ["LOCK_FILE", "WorkdirBusyError", "lock_workdir", "lock_holder"]

LOCK_FILE = ".lock"


class WorkdirBusyError(RuntimeError):
    """Another live process is training in this work directory."""


def _holder_record():
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }


def lock_holder(workdir):
    """The record (`pid`, `host`, `started`, `command`) of the last lock holder, or None."""
    path = os.path.join(os.fspath(workdir), LOCK_FILE)
    try:
        with open(path) as file:
            return json.loads(file.read() or "null")
    except (OSError, ValueError):
        return None


def _busy_message(workdir, holder):
    if holder:
        who = (
            f"process {holder.get('pid')} on host {holder.get('host')}, started "
            f"{holder.get('started')} ({holder.get('command')})"
        )
    else:
        who = "another process (its record could not be read)"
    return (
        f"The work directory {workdir!r} is in use: {who} is training in it. Nothing was "
        "changed. Wait for it to finish, stop it (Ctrl-C or SIGTERM saves its state, and its "
        "command continues the run), or use another --workdir."
    )


@contextlib.contextmanager
def lock_workdir(workdir):
    """Holds the training lock of `workdir` for the `with` block.

    Args:
        workdir: the run's work directory (created if needed).

    Raises:
        WorkdirBusyError: another live process holds the lock; nothing in
            `workdir` was changed (the directory itself may have been created).
    """
    try:
        import fcntl
    except ImportError:  # Windows
        logging.warning("No fcntl here: %s is not locked against a second run.", workdir)
        yield
        return
    workdir = os.fspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK_FILE)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkdirBusyError(_busy_message(workdir, lock_holder(workdir))) from None
        record = json.dumps(_holder_record()).encode()
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, record, 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock
