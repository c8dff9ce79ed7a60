"""`ftstack bootstrap-backend --stack NAME`: prepare where Pulumi keeps the stack's state, then print how to log in."""

from __future__ import annotations

import argparse
import os
import sys

from botocore.exceptions import BotoCoreError, ClientError

from infra.config import StackConfigError, find_repo_root, load_stack_config
from infra.program.backends import (
    LOCAL_STATE_DIR,
    S3_CREDENTIAL_ENV,
    StateError,
    bootstrap_state_bucket,
    cloud_backend_plan,
    local_backend_plan,
)
from infra.runs.store import make_s3_client


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bootstrap-backend",
        help="create the stack's Pulumi state backend once (local dir or versioned bucket) and print the login",
        description=(
            "Local stack: a file backend under .local/pulumi-state with a passphrase kept in a git-ignored file. "
            "Cloud stacks: a versioned Nebius Object Storage bucket (created if missing, versioning enabled and "
            "checked). Credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; nothing is written to "
            "a tracked file."
        ),
    )
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<stack>.yaml)")
    parser.add_argument("--config-dir", default="stacks", help="directory of the stack files (default: stacks)")
    parser.add_argument("--bucket", help="state bucket name (default: derived from nebius.parentId)")
    parser.add_argument(
        "--secrets-provider", help="'passphrase' (default) or a KMS URL, e.g. hashivault://ftstack"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan; create nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = find_repo_root()
    try:
        stack = load_stack_config(args.stack, args.config_dir)
        if stack.target != "nebius":
            plan = local_backend_plan(stack.stack, root, create_passphrase=not args.dry_run)
            if not args.dry_run:
                (root / LOCAL_STATE_DIR).mkdir(parents=True, exist_ok=True)
                print(f"state: {plan.backend_url} (file backend, passphrase secrets provider)")
        else:
            nebius = stack.nebius
            plan = cloud_backend_plan(stack.stack, nebius.parent_id, nebius.region, args.secrets_provider, args.bucket)
            if not args.dry_run:
                missing = [name for name in S3_CREDENTIAL_ENV if not os.environ.get(name)]
                if missing:
                    raise StateError(
                        f"set {' and '.join(missing)} to an access key of a service account that may create "
                        "buckets in the project (storage.editor); they are read from the environment only"
                    )
                client = make_s3_client(plan.endpoint, plan.region)
                result = bootstrap_state_bucket(client, plan.bucket, plan.region)
                action = "created" if result.created else "exists"
                print(f"state bucket {result.bucket}: {action}, versioning {result.versioning} ({plan.endpoint})")
    except (StackConfigError, StateError, BotoCoreError, ClientError) as exc:
        print(f"ftstack bootstrap-backend: {exc}", file=sys.stderr)
        return 2
    print("# point the Pulumi CLI at this stack's state:")
    for line in plan.shell_lines():
        print(line)
    return 0
