"""The `gpusched` command's own surface: help and credentials, in process.

The commands against a running system are in tests/e2e/test_cli.py.
"""

import json

import httpx
import pytest
from click.testing import CliRunner
from rich.console import Console

from gpusched_client import Client, cli
from gpusched_client.bodies import body_for, path_for_model

NO_CREDENTIALS = {"GPUSCHED_TOKEN": None, "GPUSCHED_URL": None}


def every_command(command=cli.main, words=()):
    """The words that name each command and subcommand, a group before its own."""
    yield words
    for name, subcommand in getattr(command, "commands", {}).items():
        yield from every_command(subcommand, (*words, name))


COMMANDS = list(every_command())


def test_every_command_is_listed():
    assert {" ".join(words) for words in COMMANDS} >= {
        "",
        "submit",
        "watch",
        "cancel",
        "why",
        "queue",
        "gpus",
        "models",
        "preload",
        "chain",
        "chain run",
    }


@pytest.mark.parametrize("words", COMMANDS, ids=lambda words: " ".join(words) or "gpusched")
def test_help_works_without_a_token(words):
    runner = CliRunner(env=NO_CREDENTIALS)
    result = runner.invoke(cli.main, [*words, "--help"], prog_name="gpusched")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: {' '.join(('gpusched', *words))} ")


@pytest.mark.parametrize(
    "args",
    [
        ["queue"],
        ["watch", "7"],
        ["cancel", "7"],
        ["why", "7"],
        ["submit", "/v1/chat/completions"],
        ["submit", "--model", "chat-small", "--prompt", "hi"],
        ["gpus"],
        ["models"],
    ],
    ids=lambda args: args[0],
)
def test_a_command_without_a_token_fails_naming_the_option_and_the_variable(args):
    # An empty stdin: `submit` must refuse before it reads its body.
    result = CliRunner(env=NO_CREDENTIALS).invoke(cli.main, args, input="")
    assert result.exit_code == 2, result.output
    assert "--token" in result.output and "GPUSCHED_TOKEN" in result.output


def test_chain_run_without_a_token_fails_naming_the_option(tmp_path):
    units = tmp_path / "units.jsonl"
    units.write_text('{"prompt": "a"}\n')
    args = ["chain", "run", str(units), "--out", str(tmp_path / "out")]
    result = CliRunner(env=NO_CREDENTIALS).invoke(cli.main, args)
    assert result.exit_code == 2, result.output
    assert "--token" in result.output and "GPUSCHED_TOKEN" in result.output
    assert not (tmp_path / "out").exists()


def test_a_command_sends_the_token_from_the_option_or_the_environment(monkeypatch):
    seen = []

    def handler(request):
        seen.append((str(request.url), request.headers["Authorization"]))
        return httpx.Response(200, json={"running": None, "queued": [], "queued_total": 0})

    def client(url, token):
        return Client(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli, "Client", client)
    runner = CliRunner(env={**NO_CREDENTIALS, "GPUSCHED_TOKEN": "from-env"})
    assert runner.invoke(cli.main, ["queue"]).exit_code == 0
    given = ["--url", "http://given:1", "--token", "given", "queue"]
    assert runner.invoke(cli.main, given).exit_code == 0
    assert seen == [
        ("http://127.0.0.1:8000/api/queue/", "Bearer from-env"),
        ("http://given:1/api/queue/", "Bearer given"),
    ]


def test_submit_sends_max_wait_and_an_expired_job_prints_its_error(monkeypatch):
    sent = []

    def handler(request):
        sent.append(request.headers.get("X-Gpusched-Max-Wait"))
        return httpx.Response(
            201,
            json={
                "id": 7,
                "model": "m",
                "priority": 0,
                "status": "expired",
                "started_at": None,
                "finished_at": "2026-01-01T00:00:01+00:00",
                "error": "gpu0 held by job 3 (m, band 0) for 9.0 s",
            },
        )

    monkeypatch.setattr(
        cli, "Client", lambda url, token: Client(url, token, transport=httpx.MockTransport(handler))
    )
    runner = CliRunner(env={**NO_CREDENTIALS, "GPUSCHED_TOKEN": "t"})
    result = runner.invoke(
        cli.main, ["submit", "/v1/completions", "--max-wait", "90"], input='{"model": "m"}'
    )
    assert result.exit_code == 0, result.output
    assert sent == ["90"]
    assert "expired · gpu0 held by job 3" in result.output


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ("chat-small", "/v1/chat/completions"),
        ("qwen2.5-7b-instruct", "/v1/chat/completions"),
        ("image-xl", "/v1/images/generations"),
        ("sdxl-turbo", "/v1/images/generations"),
        ("flux1-dev", "/v1/images/generations"),
        ("video-wan", "/v1/images/generations"),
        ("kokoro", "/v1/audio/speech"),
        ("piper-tts-en", "/v1/audio/speech"),
        ("nomic-embed-text", "/v1/embeddings"),
    ],
)
def test_the_path_follows_the_models_kind(model, path):
    assert path_for_model(model) == path


def test_the_body_follows_the_path():
    assert body_for("/v1/chat/completions", model="m", prompt="hi") == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert body_for("/v1/images/generations", model="m", prompt="a fox") == {
        "model": "m",
        "prompt": "a fox",
    }
    assert body_for("/v1/audio/speech", model="m", prompt="hello", voice="af") == {
        "model": "m",
        "input": "hello",
        "voice": "af",
    }
    assert body_for("/v1/embeddings", model="m", prompt="x") == {"model": "m", "input": "x"}


def recording_client(monkeypatch, sent, answer):
    def handler(request):
        sent.append((request.url.path, json.loads(request.content) if request.content else None))
        return httpx.Response(201 if request.method == "POST" else 200, json=answer)

    monkeypatch.setattr(
        cli, "Client", lambda url, token: Client(url, token, transport=httpx.MockTransport(handler))
    )


JOB = {"id": 7, "model": "image-xl", "priority": 0, "status": "queued", "submitted_at": None}


@pytest.mark.parametrize(
    ("args", "stdin", "path", "body"),
    [
        (
            ["--model", "image-xl", "--prompt", "a fox"],
            None,
            "/v1/images/generations",
            {"model": "image-xl", "prompt": "a fox"},
        ),
        (
            ["--model", "image-xl", "--prompt", "a fox", "--path", "/v1/completions"],
            None,
            "/v1/completions",
            {"model": "image-xl", "prompt": "a fox"},
        ),
        (
            ["/v1/images/generations", "--model", "image-xl"],
            '{"model": "other", "prompt": "p", "n": 2}',
            "/v1/images/generations",
            {"model": "image-xl", "prompt": "p", "n": 2},
        ),
        (
            [],
            '{"model": "chat-small", "messages": []}',
            "/v1/chat/completions",
            {"model": "chat-small", "messages": []},
        ),
    ],
    ids=["built", "path-given", "body-model-set", "body-from-stdin"],
)
def test_submit_sends_the_path_and_body_its_options_describe(monkeypatch, args, stdin, path, body):
    sent = []
    recording_client(monkeypatch, sent, JOB)
    runner = CliRunner(env={**NO_CREDENTIALS, "GPUSCHED_TOKEN": "t"})
    if stdin is not None and "--model" in args:
        args = [*args, "--body", "-"]
    result = runner.invoke(cli.main, ["submit", *args], input=stdin)
    assert result.exit_code == 0, result.output
    assert sent == [("/api/jobs/", {"path": path, "body": body})]


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "chat-small"],
        ["--model", "chat-small", "--prompt", "hi", "--body", "-"],
        ["/v1/completions", "--path", "/v1/chat/completions", "--model", "m", "--prompt", "p"],
    ],
    ids=["no-prompt", "prompt-and-body", "two-paths"],
)
def test_submit_refuses_options_that_do_not_describe_one_body(monkeypatch, args):
    sent = []
    recording_client(monkeypatch, sent, JOB)
    runner = CliRunner(env={**NO_CREDENTIALS, "GPUSCHED_TOKEN": "t"})
    result = runner.invoke(cli.main, ["submit", *args], input="{}")
    assert result.exit_code == 2, result.output
    assert sent == []


def test_gpus_prints_each_gpus_resident_set_with_its_busy_models_on_its_line(monkeypatch):
    listed = [
        {
            "name": "gpu0",
            "enabled": True,
            "healthy": True,
            "resident_model": "tts-kokoro",
            "resident_models": ["chat-small", "embed-small", "tts-kokoro"],
            "loading_models": ["image-xl"],
            "foreign_in_flight": 2,
            "busy_models": {"chat-small": 2, "tts-kokoro": 1},
            "running_job": 7,
            "running_jobs": [7, 8, 9],
            "models": None,
        },
        {
            "name": "gpu1",
            "enabled": True,
            "healthy": True,
            "resident_model": None,
            "resident_models": [],
            "loading_models": [],
            "foreign_in_flight": 0,
            "busy_models": {},
            "running_job": None,
            "running_jobs": [],
            "models": ["chat-small"],
        },
        {
            "name": "gpu2",
            "enabled": True,
            "health": "no dispatcher",
            "healthy": False,
            "resident_model": None,
            "resident_models": [],
            "loading_models": [],
            "foreign_in_flight": 0,
            "busy_models": {},
            "running_job": None,
            "running_jobs": [],
            "models": ["chat-small"],
        },
    ]

    def client(url, token):
        handler = lambda request: httpx.Response(200, json=listed)  # noqa: E731
        return Client(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli, "Client", client)
    # Wide enough that a row stays on one line.
    monkeypatch.setattr(cli, "console", Console(width=220))
    result = CliRunner(env={"GPUSCHED_TOKEN": "t"}).invoke(cli.main, ["gpus"])

    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if "gpu" in line}
    assert (
        "chat-small (2 running), embed-small, tts-kokoro (1 running) · loading: image-xl"
        " · 2 requests from elsewhere" in rows["gpu0"]
    ), result.output
    assert "#7 #8 #9" in rows["gpu0"]
    assert "idle" in rows["gpu1"] and "running" not in rows["gpu1"], result.output
    # A server before `health` says it with `healthy`; a newer one in words.
    assert "healthy" in rows["gpu1"] and "no dispatcher" in rows["gpu2"], result.output


WHY = {
    "summary": "Waited 4.0 s: 2.5 s behind 1 job (a higher band); 1.5 s with the GPU idle.",
    "measured_wait_seconds": 4.0,
    "shown_wait_seconds": 4.0,
    "adds_up": True,
    "parts": [
        {
            "kind": "dispatched_ahead",
            "seconds": 1.549,
            "swap_seconds": 1.0,
            "shown_seconds": 2.5,
            "job": {"id": 3, "model": "chat-small", "band": 100},
            "reason": "a higher band",
        },
        {"kind": "gpu_idle", "seconds": 1.451, "shown_seconds": 1.5, "reason": "no job running"},
    ],
}


def why_rows(output: str) -> dict[str, str]:
    """The `why` table's rows: the part's words and its seconds cell."""
    rows = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 4 and cells[1]:
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.parametrize("adds_up", [True, False])
def test_why_prints_the_shown_tenths_the_measured_wait_and_a_warning_when_they_miss(
    monkeypatch, adds_up
):
    asked = []

    def handler(request):
        asked.append(dict(request.url.params))
        return httpx.Response(200, json={**WHY, "adds_up": adds_up})

    monkeypatch.setattr(
        cli, "Client", lambda url, token: Client(url, token, transport=httpx.MockTransport(handler))
    )
    monkeypatch.setattr(cli, "console", Console(width=220))
    result = CliRunner(env={"GPUSCHED_TOKEN": "t"}).invoke(cli.main, ["why", "7"])

    assert result.exit_code == 0, result.output
    assert asked == [{}]
    assert why_rows(result.output) == {
        "dispatched ahead": "2.5 (of which 1.0 swap)",
        "gpu idle": "1.5",
        "measured wait": "4.0",
    }
    warned = "warning: these parts do not add up to the wait" in result.output
    assert warned is not adds_up


def test_why_as_of_asks_for_the_wait_told_at_that_instant(monkeypatch):
    asked = []

    def handler(request):
        asked.append((request.url.path, dict(request.url.params)))
        return httpx.Response(200, json=WHY)

    monkeypatch.setattr(
        cli, "Client", lambda url, token: Client(url, token, transport=httpx.MockTransport(handler))
    )
    instant = "2026-01-01T12:00:00+01:00"
    result = CliRunner(env={"GPUSCHED_TOKEN": "t"}).invoke(
        cli.main, ["why", "7", "--as-of", instant]
    )

    assert result.exit_code == 0, result.output
    assert asked == [("/api/jobs/7/why/", {"as_of": instant})]
