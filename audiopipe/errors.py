"""The base of every error audiopipe raises on purpose: `except audiopipe.AudiopipeError` catches what a user can
fix (bad input, a refused file, a mismatched configuration), and lets programming errors through."""


class AudiopipeError(Exception):
    """An error audiopipe raises on purpose; its message is one line that says what is wrong and what to do."""
