"""Entry point of the ringtrain policy pack: `pulumi preview --policy-pack infra/policy`.

Building a PolicyPack starts its gRPC server and blocks, so this is the only place that builds it;
the policies themselves live in infra/policy/policies.py, which tests import.
"""

import sys
from pathlib import Path

# The pack runs from this directory; make `import infra.*` work without the editable install.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from infra.policy.policies import ALL_POLICIES  # noqa: E402

PolicyPack(
    name="ringtrain-baseline",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=list(ALL_POLICIES),
)
