"""The base of every error audiopipe raises on purpose: `except audiopipe.AudiopipeError` catches what a user can
fix (bad input, a refused file, a mismatched configuration), and lets programming errors through.

Each class below also subclasses the builtin it stands for, so `except FileNotFoundError` (or ValueError, ...)
keeps working. Messages name Python parameters as `name=value`; the command line shows them as its flags
(`--name value`, in_flags), so one message serves both.
"""

import re

_PARAM = re.compile(r"\b([a-z][a-z0-9_]*)=(True|False|'[^']*'|\"[^\"]*\"|[^\s,;:()]+)?")


def in_flags(message: str, flags: set[str]) -> str:
    """A library message in a command's words: `name=value` becomes `--name value` (`--name` for True,
    `--no-name` for False) where `flags` (the command's option strings) has that flag; the rest stays."""

    def one(m: re.Match[str]) -> str:
        flag, value = "--" + m.group(1).replace("_", "-"), m.group(2)
        if value == "False" and "--no-" + flag[2:] in flags:
            return "--no-" + flag[2:]
        if flag not in flags:
            return m.group(0)
        if value in (None, "True"):
            return flag
        return f"{flag} {value.strip(chr(39) + chr(34))}"

    return _PARAM.sub(one, message)


class AudiopipeError(Exception):
    """An error audiopipe raises on purpose; its message is one line that says what is wrong and what to do."""


class InvalidValue(AudiopipeError, ValueError):
    """An argument, option or stored value that audiopipe cannot use."""


class WrongType(AudiopipeError, TypeError):
    """An argument of the wrong type."""


class NotFound(AudiopipeError, FileNotFoundError):
    """A file, folder or object that does not exist."""


class NotAFolder(AudiopipeError, NotADirectoryError):
    """A path that should be a folder and is not."""


class AlreadyExists(AudiopipeError, FileExistsError):
    """A path that would be overwritten."""


class StorageError(AudiopipeError, OSError):
    """A file or object store that refused an operation."""


class Failed(AudiopipeError, RuntimeError):
    """A step that could not finish (a worker, a child process, an inconsistent input)."""


class MissingKey(AudiopipeError, KeyError):
    """A column, feature or entry that is not there."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0]) if self.args else ""


class OutOfRange(AudiopipeError, IndexError):
    """An index past the end."""


class AudiopipeWarning(UserWarning):
    """Something audiopipe did that the user may not expect (an alias it translated, rows it will train on
    without a transcript); the command line prints it as one `audiopipe: note: ...` line."""


class MissingExtra(AudiopipeError, ImportError):
    """An optional package (an extra of audiopipe) that this feature needs; the message names the pip command."""
