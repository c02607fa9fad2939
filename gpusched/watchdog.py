"""The processes `manage.py run_all` starts die with it, however it dies.

run_all starts each child in a session of its own, so that Ctrl-C reaches
only run_all, which then stops each child once, in order (a second signal in
the middle of django-q2's shutdown makes it hang). The price: nothing the
kernel does ties those children to run_all. When run_all is SIGKILLed, or
dies of a bug past its `finally`, they would keep running and keep the port.

So run_all first starts this watchdog, also in a session of its own, and
holds the only write end of a pipe whose read end is the watchdog's stdin.
run_all writes the process group of each child it starts; the kernel closes
the write end when run_all ends, however it ends, and the watchdog then reads
EOF: unless run_all said `released` first (its own clean stop went through),
it sends SIGTERM to every group it was told of, and SIGKILL to what is left
after a short grace. A group takes a django-q2 cluster's forked workers along
with their cluster, which a signal to the cluster's pid alone would not.

Each direct child also asks the kernel for SIGTERM when run_all dies
(PR_SET_PDEATHSIG, Linux): a second line should the watchdog be gone too.
SIGTERM rather than SIGKILL, so a cluster stops its workers itself.

This module imports only the standard library: it must start at once and
never touch the database.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# SIGTERM first; what still runs this long after is SIGKILLed, well within
# the 5 s in which everything must be gone.
GRACE_SECONDS = 2.0
RELEASED = b"released"
PR_SET_PDEATHSIG = 1


class Watchdog:
    """run_all's end of the pipe."""

    def __init__(self, process: subprocess.Popen, write_end: int) -> None:
        self.process = process
        self._write_end = write_end

    @classmethod
    def start(cls) -> Watchdog:
        # os.pipe()'s descriptors are not inherited: the write end stays in
        # this process alone, or a child holding a copy would keep the pipe
        # open after run_all died.
        read_end, write_end = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpusched.watchdog"],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_end)
        return cls(process, write_end)

    def guard(self, process_group: int) -> None:
        """Kill this process group should run_all die without releasing it."""
        os.write(self._write_end, b"%d\n" % process_group)

    def release(self) -> None:
        """Every child stopped cleanly: the watchdog ends without a signal."""
        with contextlib.suppress(OSError):  # the watchdog is gone already
            os.write(self._write_end, RELEASED + b"\n")
        os.close(self._write_end)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when its parent ends
    (Linux); None where the kernel has no such request."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def request() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent ended before the request counted
            os.kill(os.getpid(), signal.SIGTERM)

    return request


def running(process_groups: set[int]) -> set[int]:
    """Those of `process_groups` with a member that has not ended (a zombie
    has ended: it waits for a parent that, orphaned, may never reap it)."""
    proc = Path("/proc")
    if not proc.is_dir():
        left = set()
        for group in process_groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, 0)
                left.add(group)
        return left
    left = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        # After the command name, in parentheses: state, parent, process group.
        state, _, group_field = stat[stat.rindex(")") + 2 :].split()[:3]
        if state != "Z" and int(group_field) in process_groups:
            left.add(int(group_field))
    return left


def kill_all(process_groups: set[int], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to every group, then SIGKILL to what still runs after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in running(process_groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        deadline = time.monotonic() + grace
        while running(process_groups) and time.monotonic() < deadline:
            time.sleep(0.05)  # until every group is gone or the grace ends


def say(line: str) -> None:
    with contextlib.suppress(OSError):  # the terminal may be gone with run_all
        print(f"gpusched watchdog: {line}", file=sys.stderr, flush=True)


def main() -> None:
    # Not reached by Ctrl-C (a session of its own); ignored should it come anyway,
    # so that only the pipe decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    process_groups: set[int] = set()
    pending = b""
    while chunk := os.read(0, 4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == RELEASED:
                return
            process_groups.add(int(line))
    if process_groups:
        say("run_all ended without stopping its processes; stopping them")
        kill_all(process_groups)


if __name__ == "__main__":
    main()
