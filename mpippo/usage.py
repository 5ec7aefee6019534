"""Bad input, one rule at every entry point: a UsageError carries one-line messages naming the bad
value and what is allowed; the entry point prints them as one `mpippo: error: ...` line (`refusal`) and
exits 2.

`Parser` is argparse whose mistakes are such a line (no usage wall, the same on every rank): the
trainer, the launcher, evaluate, the suite and the tools all parse with it.
"""
from __future__ import annotations

import argparse
import reprlib
import stat

EXIT_USAGE = 2
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = 6
_REPR.maxlevel = 2


def show(value) -> str:
    """A value for an error message: short, whatever the user sent (a megabyte string, a deep list)."""
    return _REPR.repr(value)


def reason(e: BaseException, limit: int = 200) -> str:
    """What third-party code raised, for a message: its type and its text's first line, cut short."""
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0][:limit]}" if text else type(e).__name__


_KINDS = ((stat.S_ISREG, "a file"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a file-system entry is, in a message's words ('a FIFO', 'a folder'), from its st_mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def refusal(errors: list[str], prefix: str = "") -> str:
    """The one line an entry point prints for its bad input (or a run for its failure): every problem,
    '; ' between them (a config's all at once), line breaks escaped, so a value holding one cannot make
    two lines."""
    return one_line(f"mpippo: error: {prefix}{'; '.join(errors)}") + "\n"


def one_line(text: str) -> str:
    """`text` with its line breaks escaped: a name holding one (a run folder's) cannot split a line in two."""
    return str(text).replace("\r", "\\r").replace("\n", "\\n")


class UsageError(ValueError):
    """Bad user input (a command line, a config, a file we wrote earlier, a folder, a device that is
    not there). Carries one or more one-line messages."""

    def __init__(self, errors: list[str] | str):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one UsageError line: '<what>: <argparse's message> (see <prog> --help)'.
    Subparsers made with `add_subparsers(parser_class=Parser)` say the same of their options."""

    def __init__(self, *args, what: str = "command line", **kwargs):
        super().__init__(*args, **kwargs)
        self.what = what

    def error(self, message):
        where = f"{self.what}: " if self.what else ""  # (the tools' lines already start with the tool's name)
        raise UsageError(f"{where}{message} (see {self.prog} --help)")
