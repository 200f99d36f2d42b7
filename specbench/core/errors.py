"""The one exception type that the command line turns into a one-line error."""


class SpecbenchError(Exception):
    """A user-facing problem: the message names the problem and the fix."""
