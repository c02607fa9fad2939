"""gpusched/terminal.py: a process whose standard output closes (the reader
of its pipe gone, as `tee` after a Ctrl-C) goes on writing into its log
file and exits as it would have, code 0, with nothing lost from the file."""

import subprocess
import sys

import pytest

from gpusched.stack import ROOT

# Writes a line, waits until told (the test has closed the pipe by then),
# writes again through TerminalAndLog, then prints as any code would and
# exits normally, when the interpreter flushes its standard output.
WRITER = """
import sys
from pathlib import Path
from gpusched.terminal import TerminalAndLog
output = TerminalAndLog(Path(sys.argv[1]))
output.write("first\\n")
sys.stdin.readline()
output.write("second\\n", error=True)
output.write("third\\n")
print("printed after the terminal has gone")
"""


@pytest.mark.e2e  # starts a process
def test_a_closed_standard_output_moves_the_lines_to_the_log_file_alone(tmp_path):
    log = tmp_path / "run.log"
    (tmp_path / "run.log").write_text("the previous run\n")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(log)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline() == "first\n"
    writer.stdout.close()  # the reader goes away
    writer.stderr.close()
    writer.stdin.write("go\n")
    writer.stdin.close()

    assert writer.wait(timeout=30) == 0
    assert log.read_text() == "first\nsecond\nthird\n"
    assert (tmp_path / "run.log.1").read_text() == "the previous run\n"
