"""`python -m cluster` is `python -m cluster.cli`."""

import sys

from cluster.cli import main

sys.exit(main())
