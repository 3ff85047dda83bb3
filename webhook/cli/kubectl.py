"""dra-guard as a kubectl plugin: `kubectl dra-guard ...` and its completion through kubectl.

kubectl runs an executable named ``kubectl-<name>`` on PATH for ``kubectl <name>``, a dash in the
command mapped to an underscore in the file name: ``kubectl dra-guard audit`` runs
``kubectl-dra_guard audit`` (console script `plugin`).

For completion (kubectl >= 1.26, k8s.io/kubectl pkg/cmd/plugin_completion.go), kubectl runs
``kubectl_complete-dra_guard ARG... WORD`` (console script `complete`): the plugin's arguments
typed so far, then the word being completed ("" for a new word). It reads one candidate per line
(cobra's ``candidate<TAB>description``) and, when the last line is ``:<n>``, n as cobra's
ShellCompDirective. The candidates come from argcomplete over the same argparse parser that
`dra-guard completion bash` uses, so the two never disagree.
"""

from __future__ import annotations

import io
import os
import shlex
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from webhook.cli import main
from webhook.cli.parser import build_parser

PROG = "kubectl dra-guard"
# cobra's ShellCompDirective bits (github.com/spf13/cobra completions.go)
NO_SPACE = 2
NO_FILE_COMP = 4


def plugin() -> int:
    """Entry point of the `kubectl-dra_guard` console script: `dra-guard` named as kubectl's
    plugin in its usage lines and errors; returns the exit code.

    Run under a name starting ``kubectl_complete-`` it answers completion instead (`complete`): the
    krew archive ships one executable, and krew links only that one into its bin folder, so its
    users link the completion name to it (docs/install.md "kubectl plugin")."""
    if os.path.basename(sys.argv[0]).startswith("kubectl_complete-"):
        return complete()
    return main(prog=PROG)


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def completions(words: list[str]) -> str:
    """kubectl's plugin-completion answer for `words` (the plugin's arguments, the last one the
    word being completed, "" for a new word): the candidates, one ``name<TAB>help`` a line, then
    ``:<directive>`` (4, no file completion: argcomplete has already listed the files where a path
    is expected; plus 2, no space, after a directory or an ``--option=``)."""
    import argcomplete

    *before, current = words or [""]
    line = " ".join(shlex.quote(word) for word in ["dra-guard", *before]) + " "
    quoted = shlex.quote(current)
    # an unquoted word as typed; otherwise an opened quote, which argcomplete reads as a prefix
    line += current if quoted == current else quoted[:-1]
    out = io.StringIO()
    env = {
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        # one candidate a line, "name<TAB>description" (cobra's format); the fish shell's
        # convention makes argcomplete leave the quoting to the shell, as cobra does
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_DFS": "\t",
        "_ARGCOMPLETE_SHELL": "fish",
    }
    with _environ(env):
        argcomplete.autocomplete(
            build_parser(PROG),
            always_complete_options=False,
            append_space=False,
            output_stream=out,
            exit_method=lambda code: None,
        )
    candidates = [c for c in out.getvalue().split("\n") if c]
    directive = NO_FILE_COMP
    if any(c.split("\t")[0].endswith(("/", "=")) for c in candidates):
        directive |= NO_SPACE
    return "".join(f"{c}\n" for c in candidates) + f":{directive}\n"


def complete(argv: list[str] | None = None) -> int:
    """Entry point of the `kubectl_complete-dra_guard` console script: print the completions of
    `argv` (default: the command line) for kubectl; returns 0."""
    sys.stdout.write(completions(sys.argv[1:] if argv is None else argv))
    return 0
