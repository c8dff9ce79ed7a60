"""`ftstack status --stack NAME`: the pipeline's recorded jobs with their live Slurm states, the unavailable nodes
(drained, down, failed, not responding) with their state and reason (Soperator's reason kinds named), and the nodes
in a power-saving state."""

from __future__ import annotations

import argparse
import json
import sys

from infra.commands.run import add_transport_arguments, open_spec
from infra.config import StackConfigError, load_stack_config
from infra.monitoring.live import live_line
from infra.pipeline.runner import node_states, status
from infra.pipeline.transport import TransportError
from infra.config import find_repo_root
from workloads.checks.node_states import power_saving_nodes, unavailable_nodes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("status", help="the pipeline's jobs (from the last ftstack run) and their states, "
                                                  "and the unavailable nodes with their states and reasons")
    add_transport_arguments(parser)
    parser.add_argument("--json", action="store_true", help='print {"jobs": ..., "unavailable_nodes": [...], "power_saving_nodes": [...]} as JSON')
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    repo = find_repo_root()
    try:
        stack = load_stack_config(args.stack, repo / args.config_dir)
        spec = open_spec(args, stack)
        jobs = status(stack, repo, spec)
        nodes = node_states(stack, repo, spec)
    except (StackConfigError, ValueError, TransportError, OSError) as error:
        print(f"ftstack status: {error}", file=sys.stderr)
        return 1
    unavailable, powered = unavailable_nodes(nodes), power_saving_nodes(nodes)
    if args.json:
        print(json.dumps({"jobs": jobs, "unavailable_nodes": [s.model_dump() for s in unavailable],
                          "power_saving_nodes": [s.model_dump() for s in powered]}, indent=2))
        return 0
    if not jobs:
        print(f"no pipeline run recorded for stack {stack.stack!r} (ftstack run --stack {stack.stack})")
    else:
        for stage, job in jobs.items():
            elapsed = f"{job['elapsed_s']}s" if job["elapsed_s"] is not None else "-"
            print(f"{stage:<10} job {job['job_id']:<8} {job['state']:<12} {elapsed}  {job['output'] or ''}")
            if job["state"] == "RUNNING":
                print(f"{'':<10} {live_line(stack.target, repo, str(job['job_id']))}")
    print("unavailable nodes: " + ("none" if not unavailable else f"{len(unavailable)}"))
    for state in unavailable:
        print(f"  {state.line()}")
    if powered:
        print(f"power saving: {len(powered)}")
        for state in powered:
            print(f"  {state.line()}")
    return 0
