"""The stack's alert topic and its e-mail subscription: declared with the data layer, on every run.

An e-mail subscription delivers nothing until its owner confirms it (SNS Subscribe: "If the endpoint
type is HTTP/S or email ... the endpoint owner must run the ConfirmSubscription action"; SNS API
reference, read 2026-12-06). Declared with the compute layer, every `up` after a `down` made a new
topic and a new unconfirmed subscription, and alerts went nowhere until someone confirmed again.
Here they are made once, confirmed once, and kept; the cost guard (infra/costguard.py) publishes to
the topic while compute is up. Aliases keep the URNs they had under the CostGuard component.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.logs import old_urn

OLD_PARENT_TYPE = "ringtrain:compute:CostGuard"
TOPIC_TYPE = "aws:sns/topic:Topic"
SUBSCRIPTION_TYPE = "aws:sns/topicSubscription:TopicSubscription"


class StackAlerts(pulumi.ComponentResource):
    def __init__(self, name: str, *, email: str, project: str, stack: str, protect: bool,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:cost:StackAlerts", name, None, opts)

        def kept(child_type: str, logical: str) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(
                parent=self, protect=protect,
                aliases=[old_urn(project, stack, OLD_PARENT_TYPE, child_type, logical)])

        self.topic = aws.sns.Topic("costguard-alerts", opts=kept(TOPIC_TYPE, "costguard-alerts"))
        self.subscription = aws.sns.TopicSubscription(
            "costguard-alerts-email", topic=self.topic.arn, protocol="email", endpoint=email,
            opts=kept(SUBSCRIPTION_TYPE, "costguard-alerts-email"))
        self.register_outputs({"alertTopicArn": self.topic.arn})
