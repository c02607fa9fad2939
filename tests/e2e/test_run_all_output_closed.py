"""`make run 2>&1 | tee run.log`, then Ctrl-C: the terminal's Ctrl-C reaches
the whole pipeline, so `tee` ends at once and every later write to
run_all's standard output fails. The stop must go on all the same: each
running job ends with its answer, none runs again at the next start, and
what run_all and its processes print from then on goes on into the log
under the var folder (GPUSCHED_VAR_DIR)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import httpx
import psycopg
import pytest

from gpusched import embedded_db
from gpusched.stack import ROOT, free_consecutive_ports, free_port, wait_for
from tests.e2e.run_all_processes import (
    RUN_ALL_STOP_SECONDS,
    STOP_GRACE_SECONDS,
    alive,
    banner,
    command_line,
    demo_token,
    in_flight,
    process_tree,
    server_tree,
    submit_chat,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOB_SECONDS = 4  # each GPU's job, still running at the Ctrl-C


def run_all_pid(pipeline: int) -> int | None:
    """The run_all process below the shell's pipeline (make's child)."""
    for pid, _ in process_tree(pipeline):
        if "manage.py run_all" in command_line(pid):
            return pid
    return None


def test_a_ctrl_c_to_make_run_piped_into_tee_ends_every_running_job_once(own_data_dir, tmp_path):
    simulator_port, port = free_consecutive_ports(2), free_port()
    tee_copy, var_dir = tmp_path / "run.log", tmp_path / "var"
    env = dict(
        os.environ,
        GPUSCHED_PGDATA=str(own_data_dir),
        GPUSCHED_VAR_DIR=str(var_dir),
        PORT=str(port),
        SIMULATOR_PORT=str(simulator_port),
        SIMULATED_GPUS="2",
        GPUSCHED_DEMO_TOKEN_FILE=str(tmp_path / "demo-token"),
        GPUSCHED_STOP_SECONDS=str(STOP_GRACE_SECONDS),
    )
    env.pop("DATABASE_URL", None)
    env.pop("LLAMA_SWAP_URL", None)
    tee_copy.touch()  # read for the banner before tee has written
    # make's own rule, run by the test's interpreter (its venv is made already).
    command = f"make -o .venv/.installed run PY={sys.executable} 2>&1 | tee {tee_copy}"
    # A process group of its own, as a terminal's foreground job: the shell,
    # make, run_all and tee.
    pipeline = subprocess.Popen(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    started = process_tree(pipeline.pid)
    run_all: int | None = None
    try:
        token = demo_token(banner(tee_copy, pipeline))
        run_all = wait_for(lambda: run_all_pid(pipeline.pid), message="run_all below make")
        base = f"http://127.0.0.1:{port}"
        jobs = [submit_chat(base, token, f"running-{n}", seconds=JOB_SECONDS) for n in range(2)]
        for n, gpu_port in enumerate((simulator_port, simulator_port + 1)):
            wait_for(
                lambda gpu_port=gpu_port: any(
                    in_flight(gpu_port, f"running-{m}") for m in range(2)
                ),
                timeout=60,
                message=f"a job to run on GPU {n}",
            )
        started |= process_tree(pipeline.pid) | server_tree(own_data_dir)

        os.killpg(pipeline.pid, signal.SIGINT)  # Ctrl-C: the whole foreground job
        wait_for(
            lambda: not alive(process_tree(run_all) & started) and pipeline.poll() is not None,
            timeout=RUN_ALL_STOP_SECONDS,
            message="run_all and the pipeline to end",
        )
    finally:
        for pid in alive(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    log = (var_dir / "run.log").read_text()
    assert "stopping: each dispatcher" in log and log.rstrip().endswith("stopped"), log[-3000:]
    assert "killing" not in log and "Traceback" not in log, log[-3000:]
    assert "stopping" not in tee_copy.read_text()  # tee had gone: the file kept the rest
    # Each job ran once, to its end, in this run: read from the database
    # run_all left (the embedded server it stopped, started again).
    with psycopg.connect(embedded_db.ensure_running(), autocommit=True) as database:
        rows = database.execute(
            "SELECT status, attempts, error FROM queueapp_job WHERE id = ANY(%s) ORDER BY id",
            [[int(url.rstrip("/").rsplit("/", 1)[1]) for url in jobs]],
        ).fetchall()
    assert rows == [("succeeded", 1, "")] * 2, rows
    with contextlib.suppress(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{simulator_port}/health", timeout=1)
        pytest.fail("the simulator still answers after the stop")
