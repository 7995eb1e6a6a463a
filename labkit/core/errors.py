"""The one error type for mistakes a user can make (bad file, impossible configuration).

The message names the input and what is wrong with it. The CLI turns it into exit status 2
and one line on stderr; anything else is a bug and stays a traceback.
"""


class LabkitError(Exception):
    """A user-caused error: bad input, impossible configuration, missing file."""
