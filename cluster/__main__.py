"""`python -m cluster` is the `ringtrain` command (for where the console script is not on PATH)."""

import sys

from cluster.cli import main

sys.exit(main())
