"""What every `ringtrain` subcommand shares: its usage error and exit codes."""

EXIT_FAILED = 1        # the job or a backend failed
EXIT_USAGE = 2         # bad arguments (the trainer's included)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM (torn down already)


class UsageError(Exception):
    """Arguments that parse but do not make sense together; the message names what and what is allowed."""
