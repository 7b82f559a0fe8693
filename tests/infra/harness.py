"""The infra tests' name for infra/offline.py: run the real Pulumi program under mocks, capture it.

The machinery lives in infra/offline.py because the operator's offline plan (`scripts/plan`) runs the
same program the same way outside the tests; add mock answers (INVOKES) and captured fields there.
"""

from infra.offline import *  # noqa: F401,F403  (re-export: tests import names from here)
from infra.offline import (  # noqa: F401  (explicit: the names the tests use)
    COMMITTED_STACKS,
    INVOKES,
    PROGRAM,
    PROJECT,
    REPO_ROOT,
    CapturedResource,
    HarnessError,
    ProgramResult,
    engine_config,
    run_program,
    stack_config,
)
