"""The `dra-guard` command: serve | audit | drain-plan | drain | uncordon | certs | hook | config | completion | cleanup.

Exit codes: 0 success (audit: no finding), 1 audit found something enforce mode would refuse
(drain-plan: some driver pod must wait; drain: stopped before done), 2 usage, configuration or input errors (the message names
the file, line or config key) and a Kubernetes API that cannot be reached or refuses (one line
naming the server and the cause, webhook.kube.errors): 1 never means an outage.
Parsing and exit codes only: webhook.cli.parser builds the parser, webhook.cli.commands runs the
commands over the layers below.
"""

from __future__ import annotations

import sys
import traceback

from webhook.cli import commands, terminal
from webhook.cli.parser import build_parser
from webhook.config import ConfigError
from webhook.kube.errors import ClusterError


def main(argv: list[str] | None = None, prog: str = "dra-guard") -> int:
    """Entry point of the `dra-guard` console script (and, with `prog` "kubectl dra-guard", of the
    kubectl plugin: webhook.cli.kubectl); returns the exit code."""
    parser = build_parser(prog)
    if argv is None:
        import argcomplete

        argcomplete.autocomplete(parser)  # answers a shell's completion request and exits; else nothing
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return commands.COMMANDS[args.command](args)
    except (ConfigError, ClusterError) as exc:
        return terminal.fail(str(exc))
    except ValueError as exc:  # certs.CertificateError and bad --ip values
        return terminal.fail(str(exc))
    except Exception:
        # a failure nobody foresaw is a bug to report, and must not exit 1 as Python would:
        # 1 means "would refuse" (audit) or "must wait" (drain-plan)
        traceback.print_exc()
        return terminal.fail("internal error (the traceback above); please report it")


if __name__ == "__main__":
    sys.exit(main())
