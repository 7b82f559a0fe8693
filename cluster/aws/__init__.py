"""AWS backend: offline plan and cost, stack lifecycle via the Pulumi Automation API, MPIJob rendering
and submission (see docs/ARCHITECTURE.md). Modules import nothing AWS- or CLI-specific at import time,
so the offline parts work on a machine with neither."""
