"""The stack's monthly cost budget: declared with the data layer, so it stays while compute is off.

The data layer (buckets, KMS key, ECR images, the VPC's endpoints) costs money with compute off too,
so the budget is part of every stack, not of the compute layer. It counts only spend tagged with BOTH
`project=<project>` AND `stack=<stack>` (the provider's default tags, infra/tags.py): another
project's `stack=prod` does not count. AWS Budgets' FilterExpression (Cost Explorer Expression
syntax) takes an `And` of tag filters; the legacy CostFilters `TagKeyValue` list would OR its values.
Both keys must be active cost-allocation tags, otherwise the budget sees no spend, and it counts
tagged spend only from activation on: `up` activates them after each deployment where the account
may (cluster/aws/stack.py activate_cost_allocation_tags; not a CostAllocationTag resource, which fails
until billing has seen the key), and `plan` says so.

E-mail to `costGuard.notificationEmail` at 80 % and 100 % of actual spend and 100 % of forecast.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.config import CostGuardConfig

# The cost a budget with a FilterExpression aggregates (`metrics` is required with it).
BUDGET_METRIC = "UnblendedCost"


def budget_notifications(email: str) -> list[dict]:
    """Budget notifications: 80% and 100% of actual spend, 100% of forecast."""
    def note(kind: str, percent: float) -> dict:
        return {"comparison_operator": "GREATER_THAN", "notification_type": kind, "threshold": percent,
                "threshold_type": "PERCENTAGE", "subscriber_email_addresses": [email]}
    return [note("ACTUAL", 80.0), note("ACTUAL", 100.0), note("FORECASTED", 100.0)]


def budget_tag_filter(tags: dict[str, str]) -> aws.budgets.BudgetFilterExpressionArgs:
    """Spend whose cost-allocation tags carry every (key, value) of `tags` (an And of tag filters)."""
    return aws.budgets.BudgetFilterExpressionArgs(ands=[
        aws.budgets.BudgetFilterExpressionAndArgs(tags=aws.budgets.BudgetFilterExpressionAndTagsArgs(
            key=key, values=[value], match_options=["EQUALS"]))
        for key, value in tags.items()
    ])


class StackBudget(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: CostGuardConfig, *, project: str, stack: str,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:cost:StackBudget", name, None, opts)
        self.budget = aws.budgets.Budget(
            f"{name}-monthly",
            # A prefix (unique per account): a replacement creates the new budget before deleting the old.
            name_prefix=f"{project}-{stack}-monthly-",
            budget_type="COST",
            time_unit="MONTHLY",
            limit_amount=f"{cfg.monthly_budget_usd:.2f}",
            limit_unit="USD",
            metrics=BUDGET_METRIC,
            filter_expression=budget_tag_filter({"project": project, "stack": stack}),
            notifications=[aws.budgets.BudgetNotificationArgs(**n)
                           for n in budget_notifications(cfg.notification_email)],
            opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
