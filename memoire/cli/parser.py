"""The argument parser of every memoire entry point, and the help text it shows.

Help is written once, in docstrings and help strings that may hold Sphinx markup;
:func:`plain_text` turns them into what ``--help`` prints, and :class:`HelpFormatter` adds an
option's default unless its text already says it.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import re

from memoire.cli.errors import EXIT_USAGE, one_line
from memoire.cli.log_setup import LOG_LEVEL_ENV, LOG_LEVELS, configure_logging

# An option's help that says its default itself: "(default 2000)", "(default: never)",
# "(default here: 4)", "(default 0: the same band every time)".
_SAYS_DEFAULT = re.compile(r"\(default\b", re.I)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and appends ``(default: X)`` to an option's help when the
    default says something (not None, False or an empty list) and the help does not say its
    default already."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or _SAYS_DEFAULT.search(text)
            or default in (None, False, [], argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


# Sphinx/reST markup in docstrings: :role:`~a.b.c` / :role:`title <target>` / :role:`x`,
# ``literal``, `interpreted`.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)\s*(?:<([^`>]*)>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.S)
_INTERPRETED = re.compile(r"(?<![\w`])`([^`\n]+)`(?![\w`])")


def plain_text(text: str | None) -> str | None:
    """``text`` (a docstring) as plain text for ``--help``, dedented (a function's docstring
    as a module's): Sphinx roles become their text
    (``:func:`~a.b.run``` -> ``run``, ``:mod:`a.b``` -> ``a.b``, ``:data:`t <x>``` -> ``t``),
    double and single backquotes go, and a literal block's ``::`` becomes ``:``. The one place
    a docstring turns into help (:class:`ArgumentParser` applies it to the description, the
    epilog and every option's help)."""
    if not text:
        return text

    def role(m: re.Match) -> str:
        tilde, shown, _target = m.groups()
        return shown.rsplit(".", 1)[-1] if tilde else shown

    text = _ROLE.sub(role, inspect.cleandoc(text))
    text = _LITERAL.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    return re.sub(r"(\S)::(\s*)$", r"\1:\2", text, flags=re.M)


class ArgumentParser(argparse.ArgumentParser):
    """argparse for every memoire entry point: a parse error is one line on stderr (argparse
    prints the whole usage block first) and exit status 2; help keeps the description's layout,
    in plain text (:func:`plain_text`), and shows defaults. Sub-parsers made by
    ``add_subparsers`` are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        # No prefixes: argparse would take --gin_file for --gin_files (or any unique start of an
        # option) without a word; an option is spelled out or refused (see error()).
        kwargs.setdefault("allow_abbrev", False)
        for key in ("description", "epilog"):
            kwargs[key] = plain_text(kwargs.get(key))
        super().__init__(*args, **kwargs)
        # Every parser (sub-parsers too) takes the global --log-level. Its default is SUPPRESS,
        # so a sub-parser's absent option does not undo the parent's, and the parsed value is
        # applied (configure_logging) and dropped from the namespace, leaving mains as they are.
        self.add_argument(
            "--log-level",
            dest="log_level",
            default=argparse.SUPPRESS,
            type=str.lower,
            choices=LOG_LEVELS,
            metavar="LEVEL",
            help="level of memoire's log messages on stderr: "
            f"{', '.join(LOG_LEVELS)} (default: info; also "
            f"${LOG_LEVEL_ENV})",
        )

    def add_argument(self, *args, **kwargs):
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain_text(kwargs["help"])
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        level = vars(namespace).pop("log_level", None)
        if level is not None:
            configure_logging(level)
        return namespace, rest

    def error(self, message):
        self.exit(
            EXIT_USAGE,
            f"{self.prog}: error: {one_line(message)}{self._did_you_mean(message)} "
            f"(see {self.prog} --help)\n",
        )

    def _did_you_mean(self, message: str) -> str:
        """``; did you mean --gin_files?`` for an unrecognized option close to one of ours
        (a prefix, or a letter or two off); '' otherwise."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        ours = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for word in message[len(prefix) :].split():
            given = word.partition("=")[0]
            if not given.startswith("--"):
                continue
            close = [o for o in ours if o.startswith(given)] or difflib.get_close_matches(
                given, ours, n=1, cutoff=0.8
            )
            if close:
                hints.append(f"{given}: did you mean {' or '.join(sorted(close))}?")
        return "; " + "; ".join(hints) if hints else ""
