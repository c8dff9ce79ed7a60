"""Start the engine processes (supervised) and the gateway in front of them; stops the engines when the gateway exits.

    FT_API_KEY=... python -m workloads.serve.launcher.launch --config workloads/configs/local.json [--host 0.0.0.0]
        [--adapter NAME=RUN_ID ...] [--runs-store .local/artifacts] [--stack local] [--resume] [--start-empty]

With no adapter named (flags or serve.adapters) it serves the base and the run's own fine-tune; with --start-empty
(a server on reserved serving workers, started before training) the base alone, fine-tunes arriving later through
/v1/load_lora_adapter. With --resume (the default in a requeued Slurm job) it serves the set the last launcher of
this run persisted instead. Stored runs are read from the store's runs of the served stack only (--stack, or
serve.stack).
Engines get a fresh key per launch and answer only the gateway (workloads.serve.engine_key).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from documents.adapter_registry import SERVED_SET_NAME, AdapterEntry
from documents.names import checked_name
from documents.run_config import ConfigError, RunConfig, load_run_config
from documents.sections.serve import ServeConfig
from workloads.serve.adapter_files import engine_copy
from workloads.serve.auth import (AccessError, api_key_from_env, api_key_from_file, is_loopback,
                                  require_key_beyond_loopback)
from workloads.serve.engine_key import engine_env, new_engine_key
from workloads.serve.gateway.app import build_gateway
from workloads.serve.gateway.served_report import ServedReporter
from workloads.serve.gateway.served_restore import persisted_set, recheck, resync
from workloads.serve.gateway.state import AdapterHost, Gateway, Limits
from planning.serving import rank_limit, served_ranks
from workloads.serve.launcher.engine_plan import (EnginePlan, adapter_rank, adapter_route, check_rank, choose_engine,
                                                  plan_peft, plan_transformers, plan_vllm, stored_folder, vllm_python)
from workloads.serve.launcher.supervise import EngineError, Supervisor
from workloads.serve.launcher.vllm_install import find_vllm
from workloads.serve.registry import (
    RegistryError,
    parse_adapter_flags,
    recheck_served,
    resolve_adapters,
    run_of_path,
    served_base,
    stored_adapter,
    stored_ranks,
    stored_runs,
)


@contextmanager
def supervised_engines(plans: list[EnginePlan], serve_config: ServeConfig, on_give_up, engine_key: str,
                       on_restarted) -> Iterator[Supervisor]:
    """Start every plan under a supervisor, wait until healthy, yield it; stop every engine after."""
    public_key_env = serve_config.api_key_env  # the engines never see the gateway's key
    inherited = {name: value for name, value in os.environ.items() if name != public_key_env}
    env = {**inherited, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), **engine_env(engine_key)}
    supervisor = Supervisor(plans, env, serve_config.startup_timeout_s, serve_config.max_engine_restarts,
                            serve_config.shutdown_grace_s, on_give_up, on_restarted)
    try:
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()


def make_plans(run: RunConfig, serve_config: ServeConfig, engine: str, finetuned: str, work_dir: Path,
               adapters: list[AdapterEntry]) -> list[EnginePlan]:
    if engine == "vllm":
        return plan_vllm(run, serve_config, adapters, find_vllm(vllm_python(serve_config)),
                         lambda entry: engine_copy(entry, work_dir))
    if engine == "peft":
        return plan_peft(run, serve_config, adapters)
    if serve_config.adapters:
        raise RegistryError("engine transformers serves the run's own merged model only; stored adapters "
                            f"({sorted(serve_config.adapters)}) need engine peft (CPU) or vllm (GPU)")
    return plan_transformers(run, serve_config, finetuned=finetuned, work_dir=work_dir)


def adapter_host(run: RunConfig, serve_config: ServeConfig, engine: str, plans: list[EnginePlan],
                 work_dir: Path) -> AdapterHost | None:
    """Runtime adapter loading for the one-process engines: stored runs, checked against the served base; vLLM
    loads a private copy in `work_dir` of the files read."""
    if engine not in ("peft", "vllm"):
        return None
    store_dir, (base_sha, base_path) = Path(serve_config.runs_store), served_base(run)
    url, stack_name = plans[0].url, serve_config.stack

    def resolve(name: str, run_id: str) -> AdapterEntry:
        entry = stored_adapter(stored_runs(store_dir, stack_name), store_dir, stack_name, name, run_id, base_sha, base_path)
        if engine == "vllm":
            check_rank(entry, serve_config.max_lora_rank)
        return entry

    return AdapterHost(url, resolve, lambda entry: adapter_route(entry, url, run.base_model_dir, serve_config, engine),
                       lambda path: run_of_path(stored_runs(store_dir, stack_name), store_dir, stack_name, path),
                       (lambda entry: engine_copy(entry, work_dir)) if engine == "vllm" else stored_folder)


def served_adapters(run: RunConfig, serve_config: ServeConfig, engine: str, resume: bool,
                    start_empty: bool = False) -> list[AdapterEntry]:
    """What to serve at start: the persisted set when resuming and one exists for this base and engine, else the
    named adapters (or the run's own, unless `start_empty`)."""
    if engine == "transformers":
        return []
    store_dir = Path(serve_config.runs_store)
    persisted = persisted_set(run.results_dir / SERVED_SET_NAME, served_base(run)[0], engine) if resume else None
    if persisted is not None:
        return recheck(persisted.adapters, lambda entry: recheck_served(run, entry, store_dir, serve_config.stack))
    if start_empty and not serve_config.adapters:
        return []
    return resolve_adapters(run, serve_config.adapters, store_dir, serve_config.stack, serve_config.finetuned_name)


def reach_hint(host: str, port: int, node: str) -> str:
    """How to reach the gateway from a laptop through the login node."""
    if is_loopback(host):
        tunnel = f"ssh -N -L {port}:127.0.0.1:{port} -J <user>@<login-node> <user>@{node}"
    else:
        tunnel = f"ssh -N -L {port}:{node}:{port} <user>@<login-node>"
    return f"gateway on {node}:{port} ({host}); from your machine: {tunnel}  then use http://127.0.0.1:{port}/v1"


ENDING_S = 2.0
"""after the grace period, how long requests in flight have to send their error ending before uvicorn cancels them."""


def gateway_server(config: Any, gateway: Gateway, grace_s: float) -> Any:
    """A uvicorn server that, as it begins to stop, gives the requests in flight `grace_s` seconds and then ends
    them the gateway's way (a JSON 503; a stream's error event and `data: [DONE]`), before uvicorn's own timeout
    would cancel them (a plain-text 500, a cut stream)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            gateway.close_after(grace_s)
            await super().shutdown(sockets)

    return Server(config)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.environ.get("FT_CONFIG"), required="FT_CONFIG" not in os.environ)
    parser.add_argument("--host", help="override serve.host")
    parser.add_argument("--port", type=int, help="override serve.port")
    parser.add_argument("--backend-port", type=int, help="override serve.backend_port")
    parser.add_argument("--finetuned", choices=("merged", "adapter-4bit"), default="merged",
                        help="transformers engine: merged model (default) or base in NF4 + unmerged adapter")
    parser.add_argument("--no-base", action="store_true", help="serve only the fine-tuned model")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=RUN_ID",
                        help="serve a stored run's adapter under NAME (repeat; adds to serve.adapters)")
    parser.add_argument("--runs-store", help="override serve.runs_store (the run store folder)")
    parser.add_argument("--stack", help="override serve.stack: the stack served (stored runs of other stacks are refused)")
    parser.add_argument("--vllm-python", default=os.environ.get("FT_VLLM_PYTHON"),
                        help="override serve.vllm_python: the serving environment's interpreter (default $FT_VLLM_PYTHON)")
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction,
                        default=int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0,
                        help="serve the set the last launcher of this run persisted (default: in a requeued job)")
    parser.add_argument("--api-key-file", type=Path,
                        help="the API key from this file, made (mode 0600) with a fresh key when absent; instead "
                             "of serve.api_key_env (the publish job reads the same file)")
    parser.add_argument("--start-empty", action="store_true",
                        help="with no adapter named, serve the base alone (not the run's own fine-tune)")
    return parser.parse_args(argv)


def served_rank_limit(run: RunConfig, serve_config: ServeConfig, adapters: list[AdapterEntry]) -> int:
    """vLLM's --max-lora-rank where serve.max_lora_rank is unset: the smallest rank vLLM takes that holds the run's
    own train.lora.r, the adapters served at start and every stored run of the stack the server may load later
    (planning.serving, as `ftstack plan` plans it); runtime loads are checked against the same figure."""
    stored = stored_ranks(stored_runs(Path(serve_config.runs_store), serve_config.stack)) if serve_config.stack else []
    return rank_limit(None, served_ranks(run, [*(adapter_rank(e) for e in adapters), *stored]))


def merged_serve_config(run: RunConfig, args: argparse.Namespace) -> ServeConfig:
    """The run config's serve section with the command line's overrides."""
    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "backend_port": args.backend_port,
                                   "runs_store": args.runs_store, "vllm_python": args.vllm_python,
                                   "stack": None if args.stack is None else checked_name(args.stack, "--stack")}.items()
                 if v is not None}
    if args.no_base:
        overrides["serve_base"] = False
    serve_config = (run.serve or ServeConfig()).model_copy(update=overrides)
    return serve_config.model_copy(update={"adapters": {**serve_config.adapters, **parse_adapter_flags(args.adapter)}})


@dataclass(frozen=True)
class Launch:
    """Everything decided before an engine starts."""

    run: RunConfig
    serve_config: ServeConfig
    api_key: str | None
    engine: str
    plans: list[EnginePlan]
    host: AdapterHost | None
    base: tuple[str, str]
    """the served base's hash and folder"""


def decide(args: argparse.Namespace) -> Launch:
    """Config, key, engine, adapters and plans; raises what main reports as a usage error."""
    run = load_run_config(args.config)
    serve_config = merged_serve_config(run, args)
    api_key = (api_key_from_file(args.api_key_file, create=True) if args.api_key_file
               else api_key_from_env(serve_config.api_key_env))
    require_key_beyond_loopback(serve_config.host, api_key)
    work_dir = Path(tempfile.mkdtemp(prefix="ft-serve-"))
    atexit.register(shutil.rmtree, work_dir, ignore_errors=True)  # on every exit but SIGKILL (SIGTERM: sys.exit)
    engine = choose_engine(serve_config)
    adapters = served_adapters(run, serve_config, engine, args.resume, args.start_empty)
    if engine == "vllm" and serve_config.max_lora_rank is None:
        serve_config = serve_config.model_copy(update={"max_lora_rank": served_rank_limit(run, serve_config, adapters)})
    plans = make_plans(run, serve_config, engine, args.finetuned, work_dir, adapters)
    host = adapter_host(run, serve_config, engine, plans, work_dir)
    return Launch(run, serve_config, api_key, engine, plans, host, served_base(run))


class Serving:
    """The running launcher's shared state: the gateway once built, the server once made, why it gave up."""

    def __init__(self, launch: Launch) -> None:
        self.launch, self.engine_key = launch, new_engine_key()
        self.gateway: Gateway | None = None
        self.server: Any = None
        self.gave_up: list[str] = []

    def reload_served(self, plan: EnginePlan) -> None:
        """Only an engine that holds adapters (peft, vLLM) has a served set to load back."""
        host, serve_config = self.launch.host, self.launch.serve_config
        if self.gateway is not None and host is not None and plan.url == host.url:
            for name in resync(self.gateway, plan.url, serve_config.base_name, self.engine_key):
                print(f"serve: {name}: its files changed since it was loaded; no longer served", file=sys.stderr)

    def give_up(self, reason: str) -> None:
        self.gave_up.append(reason)
        if self.server is not None:
            self.server.should_exit = True

    def run_gateway(self, supervisor: Supervisor) -> None:
        """Build the gateway over the healthy engines and serve until stopped."""
        import uvicorn

        launch, serve_config = self.launch, self.launch.serve_config
        routes = [route for plan in launch.plans for route in plan.routes]
        limits = Limits(max_tokens=serve_config.max_tokens_limit, max_body_bytes=serve_config.max_body_bytes)
        app = build_gateway(routes, launch.api_key, limits, engine_state=supervisor.state, adapter_host=launch.host,
                            engine_key=self.engine_key)
        gateway = self.gateway = app.state.gateway
        print(reach_hint(serve_config.host, serve_config.port, os.uname().nodename), flush=True)
        print(f"engine {launch.engine}; models: {[r.name for r in routes]}; API key "
              f"{'required' if launch.api_key else 'not set (loopback only; admin routes closed)'}", flush=True)
        self.server = gateway_server(uvicorn.Config(app, host=serve_config.host, port=serve_config.port,
                                                    log_level="warning",
                                                    timeout_graceful_shutdown=serve_config.shutdown_grace_s + ENDING_S),
                                     gateway, serve_config.shutdown_grace_s)
        url = None if is_loopback(serve_config.host) else f"http://{os.uname().nodename}:{serve_config.port}"
        with ServedReporter(gateway, launch.run.results_dir, (serve_config.base_name, *launch.base), launch.engine,
                            url=url) as reporter:
            gateway.on_change = reporter.report
            if not self.gave_up:
                self.server.run()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        launch = decide(args)
    except (ConfigError, AccessError, FileNotFoundError, ValueError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit lets the engines be stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    serving = Serving(launch)
    try:
        with supervised_engines(launch.plans, launch.serve_config, serving.give_up, serving.engine_key,
                                serving.reload_served) as supervisor:
            serving.run_gateway(supervisor)
    except EngineError as error:
        print(f"serve: {error}", file=sys.stderr)
        return 1
    if serving.gave_up:
        print(f"serve: stopped: {serving.gave_up[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
