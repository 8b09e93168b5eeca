"""Deployment plans: "plan this model on that GPU with these vLLM flags" as one call.

``plan`` (exported as ``pagedkv.plan``) reads the model, applies vLLM's defaults for
the device, sizes each worker's memory and asks the planner once; the CLI's ``plan``
and ``simulate``, the simulator and notebooks all go through it.
"""

from pagedkv.deployment.options import (
    DEFAULT_GPU,
    PlanRequest,
    SchedulerDefaults,
    VLLMFlagArgs,
    VLLMFlags,
    vllm_scheduler_defaults,
)
from pagedkv.deployment.plan_model import check_model_limit, plan, plan_model
from pagedkv.deployment.report import DeploymentPlan, SummaryRow

__all__ = [
    "DEFAULT_GPU",
    "DeploymentPlan",
    "PlanRequest",
    "SchedulerDefaults",
    "SummaryRow",
    "VLLMFlagArgs",
    "VLLMFlags",
    "check_model_limit",
    "plan",
    "plan_model",
    "vllm_scheduler_defaults",
]
