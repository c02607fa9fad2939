"""What `make run` prints: its terminal, and a copy of every line in a log
file under the var folder, which outlives the terminal.

A terminal can go away before the processes it shows: `make run | tee
run.log` and a Ctrl-C end `tee` at once, so every later write to run_all's
standard output fails (BrokenPipeError). Were that error to end run_all in
the middle of its stop, the jobs running would be killed with it and run
again at the next start. So:

- run_all writes through `TerminalAndLog`, which gives up the terminal at
  its first failed write and goes on into the file, and points the
  process's own standard output and error at /dev/null then, so that
  nothing else (a logging handler, the interpreter's last flush) meets the
  closed pipe;
- its children print into pipes that run_all reads (`relay`), never into
  the terminal, so none of them ever writes to a closed one: what they
  print reaches the terminal while it is there and the file always.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, TextIO, cast


class TerminalAndLog:
    """Lines for the terminal (standard output or error), each also appended
    to `log_path`; the previous run's file is kept beside it (`.1`)."""

    def __init__(self, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if log_path.exists():
            log_path.replace(log_path.with_name(log_path.name + ".1"))
        self.log_path = log_path
        self._file = log_path.open("a", encoding="utf-8", errors="replace")
        self._lock = threading.Lock()
        self._relays: list[threading.Thread] = []
        self.terminal_open = True

    def write(self, text: str, *, error: bool = False) -> None:
        with self._lock:
            self._file.write(text)
            self._file.flush()
            if not self.terminal_open:
                return
            terminal = sys.stderr if error else sys.stdout
            try:
                terminal.write(text)
                terminal.flush()
            except (OSError, ValueError):  # closed: a broken pipe, a gone terminal
                self._give_up_terminal()

    def _give_up_terminal(self) -> None:
        self.terminal_open = False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)

    def stream(self, *, error: bool = False) -> TextIO:
        """A file-like writer for one of the two, as Django's command output wants."""
        return cast(TextIO, _Stream(self, error))  # the part of a TextIO that is written to

    def relay(self, pipe: IO[bytes], *, error: bool = False) -> threading.Thread:
        """Copy a child's output, line by line, until the child closes it."""

        def copy() -> None:
            with pipe:
                for line in iter(pipe.readline, b""):
                    self.write(line.decode(errors="replace"), error=error)

        thread = threading.Thread(target=copy, name="output relay", daemon=True)
        thread.start()
        self._relays.append(thread)
        return thread

    def wait_relayed(self, timeout: float) -> None:
        """Until every child's last line is copied (they have ended), at most `timeout` s."""
        deadline = time.monotonic() + timeout
        for thread in self._relays:
            thread.join(max(0.0, deadline - time.monotonic()))


class _Stream:
    def __init__(self, target: TerminalAndLog, error: bool) -> None:
        self._target = target
        self._error = error

    def write(self, text: str) -> None:
        self._target.write(text, error=self._error)

    def flush(self) -> None:
        pass  # each write is flushed

    def isatty(self) -> bool:
        terminal = sys.stderr if self._error else sys.stdout
        return self._target.terminal_open and terminal.isatty()
