"""The Horovod trainer every worker runs: `python -m train --help`."""
