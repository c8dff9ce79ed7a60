"""Issue 64 item 8: an environment root with a newline, `#` or a space was accepted, and `ftstack plan` printed it
over two lines. Probe: a cluster stack with `pipeline.environment.root: "/home/shared/env\nX"` (or `/home/shared/my
env`, `/home/shared/env#1`) parsed by `parse_stack_config` as `ftstack plan` loads it."""

from __future__ import annotations

import pytest

from infra.config import StackConfigError, parse_stack_config
from test_environment_config import cluster


@pytest.mark.parametrize(("root", "shown"), [
    ("/home/shared/env\nX", r"'\\n'"),
    ("/home/shared/my env", "' '"),
    ("/home/shared/env#1", "'#'"),
    ("/home/shared/env\t", r"'\\t'"),
    ("/home/shared/$HOME", "'\\$'"),
])
def test_an_environment_root_with_a_character_a_shell_or_a_script_reads_apart_is_refused(root: str, shown: str) -> None:
    with pytest.raises(StackConfigError, match=rf"environment.root .*{shown}"):
        parse_stack_config("c", cluster({"root": root}), "stacks/Pulumi.c.yaml")


def test_an_ordinary_environment_root_is_kept() -> None:
    stack = parse_stack_config("c", cluster({"root": "/home/shared/finetune_env-2.1/a_b+c@d"}), "stacks/Pulumi.c.yaml")
    assert stack.pipeline.environment.root == "/home/shared/finetune_env-2.1/a_b+c@d"
