"""Start the engine processes (supervised) and the gateway in front of them; stops the engines when the gateway exits.

    FT_API_KEY=... python -m workloads.serve.launch --config workloads/configs/local.json [--host 0.0.0.0]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from documents.run_config import ConfigError, RunConfig, load_run_config
from workloads.serve.auth import AccessError, api_key_from_env, is_loopback, require_key_beyond_loopback
from documents.sections.serve import ServeConfig
from workloads.serve.engines import EnginePlan, choose_engine, plan_transformers, plan_vllm
from workloads.serve.gateway import Limits, build_gateway
from workloads.serve.supervise import EngineError, Supervisor


@contextmanager
def supervised_engines(plans: list[EnginePlan], cfg: ServeConfig, on_give_up) -> Iterator[Supervisor]:
    """Start every plan under a supervisor, wait until healthy, yield it; stop every engine after."""
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    supervisor = Supervisor(plans, env, cfg.startup_timeout_s, cfg.max_engine_restarts, cfg.shutdown_grace_s, on_give_up)
    try:
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()


def make_plans(run: RunConfig, cfg: ServeConfig, finetuned: str, work_dir: Path) -> list[EnginePlan]:
    if choose_engine(cfg) == "vllm":
        return plan_vllm(run, cfg)
    return plan_transformers(run, cfg, finetuned=finetuned, work_dir=work_dir)


def reach_hint(host: str, port: int, node: str) -> str:
    """How to reach the gateway from a laptop through the login node."""
    if is_loopback(host):
        tunnel = f"ssh -N -L {port}:127.0.0.1:{port} -J <user>@<login-node> <user>@{node}"
    else:
        tunnel = f"ssh -N -L {port}:{node}:{port} <user>@<login-node>"
    return f"gateway on {node}:{port} ({host}); from your machine: {tunnel}  then use http://127.0.0.1:{port}/v1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.environ.get("FT_CONFIG"), required="FT_CONFIG" not in os.environ)
    parser.add_argument("--host", help="override serve.host")
    parser.add_argument("--port", type=int, help="override serve.port")
    parser.add_argument("--backend-port", type=int, help="override serve.backend_port")
    parser.add_argument("--finetuned", choices=("merged", "adapter-4bit"), default="merged",
                        help="transformers engine: merged model (default) or base in NF4 + unmerged adapter")
    parser.add_argument("--no-base", action="store_true", help="serve only the fine-tuned model")
    args = parser.parse_args(argv)
    try:
        run = load_run_config(args.config)
        overrides = {k: v for k, v in {"host": args.host, "port": args.port, "backend_port": args.backend_port}.items() if v is not None}
        if args.no_base:
            overrides["serve_base"] = False
        cfg = (run.serve or ServeConfig()).model_copy(update=overrides)
        api_key = api_key_from_env(cfg.api_key_env)
        require_key_beyond_loopback(cfg.host, api_key)
        work_dir = Path(tempfile.mkdtemp(prefix="ft-serve-"))
        plans = make_plans(run, cfg, args.finetuned, work_dir)
    except (ConfigError, AccessError, FileNotFoundError, ValueError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    import uvicorn

    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit lets the engines be stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    server: uvicorn.Server | None = None
    gave_up: list[str] = []

    def give_up(reason: str) -> None:
        gave_up.append(reason)
        if server is not None:
            server.should_exit = True

    try:
        with supervised_engines(plans, cfg, give_up) as supervisor:
            routes = [route for plan in plans for route in plan.routes]
            limits = Limits(max_tokens=cfg.max_tokens_limit, max_body_bytes=cfg.max_body_bytes)
            app = build_gateway(routes, api_key, limits, engine_state=supervisor.state)
            print(reach_hint(cfg.host, cfg.port, os.uname().nodename), flush=True)
            print(f"models: {[r.name for r in routes]}; API key {'required' if api_key else 'not set (loopback only)'}", flush=True)
            server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                                   timeout_graceful_shutdown=cfg.shutdown_grace_s))
            if not gave_up:
                server.run()
    except EngineError as error:
        print(f"serve: {error}", file=sys.stderr)
        return 1
    if gave_up:
        print(f"serve: stopped: {gave_up[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
