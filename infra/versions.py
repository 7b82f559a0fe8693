"""Kubernetes versions over a stack's life: warn before EKS upgrades the control plane on its own, and
never ask EKS for a downgrade after it did (pure functions; infra/__main__.py and the offline plan call
them).

With `supportType: STANDARD` (our default, infra/config.py), EKS upgrades the control plane to the next
version at the end of standard support (EKS user guide "Manage EKS extended support": STANDARD — "Your
EKS cluster eligible for automatic upgrade at the end of standard support"; read 2026-12-06). The
committed `cluster.kubernetesVersion` then names an older version than the cluster runs, and an `up`
would send UpdateClusterVersion to that older version, which EKS refuses (no downgrades).
"""

from __future__ import annotations

from datetime import date

# End of EKS standard support per version (UTC dates). 1.35: March 27, 2027 (EKS release calendar as
# listed by endoflife.date/amazon-eks and aws-samples sample-apex-skills cluster-lifecycle.md, both read
# 2026-12-06). 1.36: no source this project could reach lists it; None = unknown, and `plan`/`up` say
# so (`aws eks describe-cluster-versions --cluster-versions 1.36` gives endOfStandardSupportDate).
END_OF_STANDARD_SUPPORT: dict[str, date | None] = {
    "1.35": date(2027, 3, 27),
    "1.36": None,
}
# EKS announces the end of standard support at least 60 days ahead (EKS user guide, "Amazon EKS version
# FAQs"); warn from then on.
WARN_DAYS_BEFORE = 60


class VersionError(Exception):
    """The running cluster's version cannot be served by this program (no pins for it)."""


def minor(version: str) -> tuple[int, int]:
    major, minor_ = version.split(".")[:2]
    return int(major), int(minor_)


def support_notice(version: str, support_type: str, today: date) -> str | None:
    """What the operator should know about `version`'s end of standard support today, or None."""
    if version not in END_OF_STANDARD_SUPPORT:
        return None
    end = END_OF_STANDARD_SUPPORT[version]
    if end is None:
        return (f"Kubernetes {version}: its end of EKS standard support is not recorded in "
                "infra/versions.py; `aws eks describe-cluster-versions --cluster-versions "
                f"{version}` shows it.")
    days = (end - today).days
    if days > WARN_DAYS_BEFORE:
        return None
    if support_type == "STANDARD":
        action = ("EKS then upgrades the control plane itself; upgrade first (set cluster.kubernetesVersion "
                  "to the next version and run `up`), so nodes and add-ons move with it")
    else:
        action = "the cluster then bills extended support ($0.60/h instead of $0.10/h); upgrade first"
    when = f"ends in {days} days ({end.isoformat()})" if days >= 0 else f"ended on {end.isoformat()}"
    return f"Kubernetes {version}: EKS standard support {when}; {action}."


def effective_version(declared: str, running: str | None, known: tuple[str, ...]) -> tuple[str, str | None]:
    """The version to declare: the committed one, or the running cluster's when EKS already upgraded it
    past the committed one (declaring the older one would ask for a downgrade). Returns (version,
    warning or None); raises VersionError when the running version has no pins here."""
    if running is None or minor(running) <= minor(declared):
        return declared, None
    if running not in known:
        raise VersionError(
            f"the cluster runs Kubernetes {running} (EKS upgraded it), newer than cluster.kubernetesVersion "
            f"{declared} and than any version this program pins add-ons for ({', '.join(known)}): update "
            "infra/cluster.py ADDON_VERSIONS and infra/config.py SUPPORTED_KUBERNETES first")
    return running, (f"the cluster runs Kubernetes {running}: EKS upgraded it past cluster.kubernetesVersion "
                     f"{declared} (end of standard support); this run keeps {running} and its add-on pins. "
                     f"Set cluster.kubernetesVersion to \"{running}\" in the stack file.")
