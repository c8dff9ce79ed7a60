"""Pulumi entry point: the stack's config in, the program's flat outputs exported."""

import pulumi

from infra.config import from_pulumi_config
from infra.program import build_stack

for key, value in build_stack(from_pulumi_config()).items():
    pulumi.export(key, value)
