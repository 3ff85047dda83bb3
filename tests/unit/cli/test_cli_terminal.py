"""The `dra-guard` command line as a person meets it: "did you mean" for commands, flags and
config keys, each subcommand's own errors, help and examples, every config error at once, wrapped
messages and a progress display on a terminal (a real pseudo-terminal from the stdlib pty
module), and pipes that get the output byte for byte as before."""

from __future__ import annotations

import os
import pathlib
import pty
import subprocess
import sys
import tempfile

import pytest

from webhook.cli import terminal
from webhook.cli.parser import build_parser
from webhook.cli.suggest import Parser
from webhook.config import ConfigError, from_mapping

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
CLI = [sys.executable, "-m", "webhook.cli"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, stdout and stderr pipes."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def cli_on_tty(*args: str, tty: str, columns: int = 60, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The real CLI with `tty` ("stdout" or "stderr") on a pseudo-terminal COLUMNS wide and the other
    stream a pipe: (exit code, what the terminal got, what the pipe got)."""
    leader, follower = pty.openpty()
    # the other stream goes to a file: a pipe nobody reads while the terminal is read could fill up
    with tempfile.TemporaryFile() as other:
        proc = subprocess.Popen(
            [*CLI, *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=follower if tty == "stdout" else other,
            stderr=follower if tty == "stderr" else other,
            env={**os.environ, "COLUMNS": str(columns), **(env or {})},
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        proc.wait(timeout=120)
        other.seek(0)
        piped = other.read().decode()
    seen = b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal's ONLCR
    return proc.returncode, seen, piped


# ---------------------------------------------------------------- suggestions and per-subcommand errors
def test_an_unknown_command_gets_the_closest_one():
    run = cli("adit", "-f", "examples/")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == "dra-guard: error: unknown command 'adit'; did you mean 'audit'? (see dra-guard --help)\n"


def test_an_unknown_action_of_a_command_group_is_reported_by_that_group():
    run = cli("config", "valdate", "x.yaml")
    assert run.returncode == 2
    assert run.stderr == (
        "dra-guard config: error: unknown action 'valdate'; did you mean 'validate'? (see dra-guard config --help)\n"
    )


def test_an_unknown_flag_is_reported_by_its_subcommand_with_a_suggestion():
    run = cli("audit", "-f", "examples/", "--clustr")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (
        "dra-guard audit: error: unrecognized arguments: --clustr (did you mean --cluster?) (see dra-guard audit --help)\n"
    )
    run = cli("certs", "generate", "--service", "s", "--namespace", "n", "--out", "o", "--forse")
    assert run.stderr.startswith("dra-guard certs generate: error: unrecognized arguments: --forse (did you mean --force?)")


@pytest.mark.parametrize(
    "args, error",
    [
        (["audit", "-o", "xml"], "argument -o/--output: invalid choice: 'xml'"),
        (["audit", "--expires"], "argument --expires: expected one argument"),
        (["audit", "--qps", "x"], "argument --qps: invalid"),
        (["drain-plan"], "the following arguments are required: NODE"),
    ],
    ids=["bad-choice", "missing-value", "bad-type", "missing-positional"],
)
def test_a_flag_error_is_one_line_not_the_usage(args, error):
    """argparse prints the whole usage (seven lines for audit) above the error; the error alone says
    what is wrong and where the usage is."""
    run = cli(*args)
    assert run.returncode == 2 and run.stdout == ""
    [line] = run.stderr.splitlines()
    command = f"dra-guard {args[0]}"
    assert line.startswith(f"{command}: error: {error}") and line.endswith(f" (see {command} --help)"), line
    assert "usage:" not in run.stderr and "Traceback" not in run.stderr


def test_a_subcommand_flag_before_the_subcommand_says_where_it_goes():
    run = cli("--cluster", "audit")
    assert run.returncode == 2
    assert "unrecognized arguments: --cluster (a flag of audit: give it after the command)" in run.stderr


# ---------------------------------------------------------------- help
def _parsers(parser: Parser, prog: str = "dra-guard"):
    yield prog, parser
    for name, sub in parser.commands.items():
        assert isinstance(sub, Parser)
        yield from _parsers(sub, f"{prog} {name}")


def test_every_flag_and_argument_of_every_subcommand_has_help():
    parser = build_parser()
    assert isinstance(parser, Parser)
    missing = [
        f"{prog}: {a.option_strings or a.dest}"
        for prog, p in _parsers(parser)
        for a in p.arguments
        if not a.help or a.help == "==SUPPRESS=="
    ]
    assert missing == []
    assert "--log-level" in build_parser().commands["serve"].flags
    # Parser reads the first word that is not a flag as the command: a group may take no flag with a value
    assert [(prog, a.option_strings) for prog, p in _parsers(parser) if p.commands for a in p.arguments if a.nargs != 0] == []


@pytest.mark.parametrize(
    "command, own, foreign",
    [
        ("serve", "dra-guard serve --self-signed /tmp/dra-guard --no-cluster --log-level debug", "dra-guard audit -f"),
        ("audit", "helm template CHART | dra-guard audit -f -", "dra-guard serve"),
        ("config", "dra-guard config validate config.yaml", "dra-guard audit -f"),
        ("certs", "dra-guard certs inspect --cert-file ./tls/tls.crt --cluster", "dra-guard audit -f"),
        ("completion", "source <(dra-guard completion bash)", "dra-guard audit -f"),
    ],
)
def test_each_subcommand_help_has_its_own_examples(command, own, foreign):
    run = cli(command, "--help")
    assert run.returncode == 0
    assert "examples:" in run.stdout and own in run.stdout
    assert foreign not in run.stdout, f"{command} --help shows another command's examples"


def test_log_level_help_is_in_serve_help():
    run = cli("serve", "--help")
    assert "--log-level {debug,info,warning,error}" in run.stdout
    assert "the least severe JSON log lines" in run.stdout


# ---------------------------------------------------------------- every config error at once
BAD_CONFIG = """\
mode: enforse
probes:
  periodseconds: 10
  timeoutSeconds: 0
server:
  port: "8443"
"""


def test_every_config_error_is_reported_at_once_naming_its_key():
    with pytest.raises(ConfigError) as err:
        from_mapping({"mode": "enforse", "probes": {"periodseconds": 10, "timeoutSeconds": 0}, "server": {"port": "8443"}})
    keys = [p.split(":")[0] for p in err.value.problems]
    assert keys == ["mode", "probes.timeoutSeconds", "probes.periodseconds", "server.port"]
    assert "probes.periodseconds: unknown key; did you mean 'periodSeconds'?" in str(err.value)


@pytest.mark.parametrize("command", [["config", "validate"], ["serve", "--no-cluster", "--self-signed", "DIR", "--config"]])
def test_config_validate_and_start_up_print_every_error(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_CONFIG)
    run = cli(*[str(tmp_path / "tls") if a == "DIR" else a for a in command], str(bad))
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.splitlines()
    assert lines == [
        f"dra-guard: error: {bad}: mode: must be one of enforce, warn, audit; got 'enforse'",
        f"dra-guard: error: {bad}: probes.timeoutSeconds: must be between 1 and 3600; got 0",
        f"dra-guard: error: {bad}: probes.periodseconds: unknown key; did you mean 'periodSeconds'? (known here: "
        "assumeDefaultPort, defaultPort, failureThreshold, periodSeconds, service, startupProbe, timeoutSeconds)",
        f"dra-guard: error: {bad}: server.port: expected int, got str '8443'",
    ], run.stderr


def test_every_error_of_a_configuration_among_the_manifests_names_where_it_came_from(tmp_path):
    manifest = tmp_path / "config.yaml"
    manifest.write_text("apiVersion: dra-guard.io/v1alpha1\nkind: DraGuardConfiguration\n" + BAD_CONFIG)
    run = cli("audit", "-f", str(manifest))
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("dra-guard: error: ")]
    assert len(errors) == 4 and all(
        e.startswith("dra-guard: error: DraGuardConfiguration among the manifests: ") for e in errors
    ), run.stderr


# ---------------------------------------------------------------- wrapping on a terminal
def test_long_messages_are_wrapped_and_indented_on_a_terminal_and_unchanged_in_a_pipe():
    code, tty, _ = cli_on_tty("audit", "-f", "examples/", tty="stdout", columns=60)
    piped = cli("audit", "-f", "examples/", env={"COLUMNS": "60"})
    assert code == piped.returncode == 1
    # the pipe: the renderer's text as it always was, a message on one long line
    assert max(len(line) for line in piped.stdout.splitlines()) > 300
    assert all(line.startswith("    ") for line in piped.stdout.splitlines() if len(line) > 300)
    # the terminal: the same words; prose lines fit in 60 columns (a longer line is a table row or a
    # single word), and a message's continuation lines stay indented under its row
    assert tty.split() == piped.stdout.split()
    lines = tty.splitlines()
    long = [line for line in lines if len(line) > 60]
    assert long and all("  " in line.lstrip(" ") or " " not in line.strip() for line in long), long
    message = next(i for i, line in enumerate(lines) if line.startswith("    ClusterRoleBinding ci-deployer-everything"))
    assert lines[message + 1].startswith("      ") and not lines[message + 1].startswith("       ")


def test_error_lines_are_wrapped_on_a_terminal(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_CONFIG)
    code, tty, out = cli_on_tty("config", "validate", str(bad), tty="stderr", columns=60)
    assert code == 2 and out == ""
    lines = tty.splitlines()
    assert all(len(line) <= 60 or " " not in line.strip() for line in lines), lines
    assert sum(line.startswith("dra-guard: error:") for line in lines) == 4
    assert any(line.startswith("  ") for line in lines)


def test_wrap_keeps_table_rows_and_long_words():
    row = "rbac      rbac-write  enforce  ClusterRoleBinding  -  " + "n" * 40
    text = f"{row}\n    {'word ' * 30}https://example.com/{'x' * 80}\n"
    wrapped = terminal.wrap(text, 40)
    assert wrapped.splitlines()[0] == row
    assert all(line.startswith("    ") for line in wrapped.splitlines()[1:] if line)
    assert f"https://example.com/{'x' * 80}" in wrapped
    assert terminal.wrap("short\n", 40) == "short\n"


# ---------------------------------------------------------------- progress on a terminal's stderr
@pytest.fixture(scope="module")
def large_input(tmp_path_factory) -> pathlib.Path:
    """About 1 MB of manifests: the non-compliant examples, renamed copies."""
    text = "".join(p.read_text() + "\n---\n" for p in sorted((EXAMPLES / "non-compliant").glob("*.yaml")))
    path = tmp_path_factory.mktemp("large") / "manifests.yaml"
    path.write_text("".join(text.replace("name: ", f"name: copy{i}-") for i in range(100)))
    return path


def test_progress_shows_on_a_terminals_stderr_and_never_on_stdout(large_input):
    # 0 s: shown at once, so the test does not depend on how long the audit takes
    code, tty, out = cli_on_tty(
        "audit", "-f", str(large_input), "-o", "json", tty="stderr", env={terminal.PROGRESS_DELAY_ENV: "0"}
    )
    assert code == 1
    assert "dra-guard audit: reading " in tty and "dra-guard audit: judging " in tty
    assert "\x1b" not in out and out.startswith("{")  # stdout: the JSON, nothing else


def test_no_progress_in_a_pipe_or_with_quiet(large_input):
    piped = cli("audit", "-f", str(large_input), "-o", "json", env={terminal.PROGRESS_DELAY_ENV: "0"})
    assert piped.returncode == 1
    assert "dra-guard audit:" not in piped.stderr and "\x1b" not in piped.stderr
    _, tty, _ = cli_on_tty(
        "audit", "-q", "-f", str(large_input), "-o", "json", tty="stderr", env={terminal.PROGRESS_DELAY_ENV: "0"}
    )
    assert "dra-guard audit:" not in tty and "\x1b" not in tty


def test_a_bad_progress_delay_is_an_error_naming_the_variable():
    code, tty, _ = cli_on_tty("audit", "-f", "examples/", tty="stderr", env={terminal.PROGRESS_DELAY_ENV: "soon"})
    assert code == 2
    assert "DRA_GUARD_PROGRESS_DELAY: must be a number of seconds >= 0; got 'soon'" in " ".join(tty.split())
