"""The `gpusched` command's own surface: help and credentials, in process.

The commands against a running system are in tests/e2e/test_cli.py.
"""

import httpx
import pytest
from click.testing import CliRunner

from gpusched_client import Client, cli

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
    [["queue"], ["watch", "7"], ["cancel", "7"], ["why", "7"], ["submit", "/v1/chat/completions"]],
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
