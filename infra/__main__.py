"""Pulumi entry point: the stack's config in, the program's typed outputs exported as flat keys."""

import pulumi

from infra.config import from_pulumi_config
from infra.program.build import build_stack

for key, value in build_stack(from_pulumi_config()).flat().items():
    pulumi.export(key, value)
