"""An argparse.ArgumentParser that suggests: what argparse 3.11 lacks (3.14's suggest_on_error).

A mistyped command or flag gets "did you mean" (difflib's closest match), and a subcommand's
unknown flag is reported by that subcommand's parser, with its usage, instead of by the
top-level one.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the closest of `choices` to `word` (difflib, ratio >= 0.6), else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors suggest the closest command or flag.

    An unknown command (the first word that is not a flag, when the parser has subcommands: such a
    parser must take no flag with a value, or its value would be read as the command)
    stops with "unknown command 'adit'; did you mean 'audit'?"; words and flags left over after
    parsing stop this parser, not its parent, with "unrecognized arguments: --clustr (did you mean
    --cluster?)". Every usage error is one line on stderr, "PROG: error: ... (see PROG --help)",
    and exit 2 (error()).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: every option string of this parser ("-f", "--filename", ...); set first: __init__ adds -h
        self.flags: list[str] = []
        #: every argument of this parser, in the order added (its help is in --help)
        self.arguments: list[argparse.Action] = []
        #: subcommand name -> its parser (the dict add_subparsers' action fills)
        self.commands: dict[str, argparse.ArgumentParser] = {}
        self.command_word = "command"
        super().__init__(*args, **kwargs)
        # the arguments of `parents=` are copied in without add_argument: count them here too
        for action in self._actions:
            if action not in self.arguments:
                self.flags.extend(action.option_strings)
                self.arguments.append(action)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags.extend(action.option_strings)
        self.arguments.append(action)
        return action

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.commands = action.choices
        self.command_word = str(kwargs.get("metavar") or "command").lower()
        return action

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        tokens = list(sys.argv[1:] if args is None else args)
        if self.commands:
            word = next((t for t in tokens if not t.startswith("-")), None)
            if word is not None and word not in self.commands:
                self.error(f"unknown {self.command_word} {word!r}{did_you_mean(word, self.commands)}")
        parsed, extras = super().parse_known_args(tokens, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(self._explain(extra) for extra in extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print "PROG: error: MESSAGE (see PROG --help)" on stderr and exit 2: one line, where
        argparse prints the whole usage first (seven lines for audit) and the error under it."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _explain(self, extra: str) -> str:
        """A left-over argument, with the closest flag of this parser, or the subcommands that have it."""
        if not extra.startswith("-"):
            return extra
        name = extra.split("=", 1)[0]
        owners = [c for c, p in self.commands.items() if isinstance(p, Parser) and name in p.flags]
        if owners:
            return f"{extra} (a flag of {', '.join(owners)}: give it after the {self.command_word})"
        close = difflib.get_close_matches(name, self.flags, n=1, cutoff=0.6)
        return f"{extra} (did you mean {close[0]}?)" if close else extra
