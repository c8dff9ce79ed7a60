"""The publish stage: once a run's eval passes the gate, store the run's adapter in the serving run store and load it
into the server running on the reserved serving workers, without restarting it.

    python -m workloads.serve.publish --config CONFIG.json --stack NAME --runs-store DIR --api-key-file FILE
        [--eval-job ID] [--wait-s 600]

The eval job is the stage's one dependency (FT_AFTER_JOBS, set at submission) unless --eval-job names it. The gate:
the report's perplexity improvement over the base is at least serve.publish_min_perplexity_improvement_pct; below
it nothing is loaded and the job ends 0 saying so. The run is stored as `runs/<stack>/<run>-<eval job>/` (the
adapter files, the run manifest, `run.json` written last with the adapter's hash), the layout every server's
registry reads, and loaded under that id through the gateway's vLLM route (`/v1/load_lora_adapter`, the gateway's
key from the file the serve job made). The gateway's address comes from the served set the server reports. What was
done (or why not) is printed and written to `<results_dir>/publication_<job id>.json`, which `ftstack run --wait`
reports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import httpx

from documents.adapter_registry import ADAPTER_FILES, SERVED_SET_NAME, adapter_sha256, read_served_set
from documents.atomic import atomic_file, utc_now
from documents.base import DocumentError
from documents.evaluator_report import EvaluatorReport, read_evaluator_report, report_name
from documents.publication import LoadOutcome, Publication, write_publication
from documents.run_config import ConfigError, RunConfig, load_run_config
from documents.run_manifest import RUN_MANIFEST_NAME
from documents.run_record import RunIndex
from documents.run_store import ADAPTER_DIR, MANIFEST_KEY, adapter_folder, run_folder, write_run
from documents.sections.serve import ServeConfig
from workloads.serve.auth import AccessError, api_key_from_file

AFTER_JOBS_ENV = "FT_AFTER_JOBS"


class PublishError(RuntimeError):
    """The fine-tune could not be stored or loaded; the message says which step and why."""


def eval_job_id(given: str | None) -> str:
    """The eval job: as given, else the stage's one dependency."""
    if given:
        return given
    after = [job for job in os.environ.get(AFTER_JOBS_ENV, "").split(",") if job]
    if len(after) != 1:
        raise PublishError(f"give --eval-job: {AFTER_JOBS_ENV} names {len(after)} jobs ({after}), not the one eval job")
    return after[0]


def gate(report: EvaluatorReport, serve_config: ServeConfig) -> str | None:
    """Why the fine-tune is not published (None: it passes)."""
    improvement, floor = report.comparison.perplexity, serve_config.publish_min_perplexity_improvement_pct
    if improvement is None:
        return "the eval report has no perplexity comparison"
    if improvement < floor:
        return (f"perplexity improvement {improvement:.2f}% is below serve.publish_min_perplexity_improvement_pct "
                f"{floor:g}%")
    return None


def store_run(run: RunConfig, report: EvaluatorReport, store: Path, stack_name: str, run_id: str,
              eval_job: str) -> Path:
    """The run's adapter and manifest in its folder of the store, then its index with the adapter's hash, last
    (documents.run_store.write_run); the run's folder."""

    def put_file(key: str, source: Path) -> None:
        with atomic_file(store / key) as tmp:
            shutil.copyfile(source, tmp)

    def put_bytes(key: str, data: bytes) -> None:
        with atomic_file(store / key) as tmp:
            tmp.write_bytes(data)

    def index(files: list[str]) -> RunIndex:
        return RunIndex(
            stack=stack_name, run_id=run_id, run_name=run.name,
            uploaded_at=utc_now(), job_ids={"eval": eval_job},
            perplexity_base=report.base_model.perplexity, perplexity_finetuned=report.finetuned_model.perplexity,
            perplexity_improvement_pct=report.comparison.perplexity, files=sorted(files),
            adapter_sha256=adapter_sha256(adapter_folder(store, stack_name, run_id)),
        )

    files = {**{f"{ADAPTER_DIR}/{name}": run.adapter_dir / name for name in ADAPTER_FILES},
             MANIFEST_KEY: run.train_run_dir / RUN_MANIFEST_NAME}
    write_run(put_file, put_bytes, stack_name, run_id, files, index)
    return run_folder(store, stack_name, run_id)


def gateway_url(run: RunConfig, wait_s: float) -> str:
    """The running server's address from its served set, waiting up to `wait_s` for it to report one."""
    path = run.results_dir / SERVED_SET_NAME
    deadline = time.monotonic() + wait_s
    while True:
        try:
            served = read_served_set(path.read_bytes(), str(path))
            if served.url:
                return served.url
        except (OSError, DocumentError):
            pass
        if time.monotonic() > deadline:
            raise PublishError(f"no server reported an address in {path} within {wait_s:g} s (is the serve job running "
                               "on the serving partition, listening beyond loopback?)")
        time.sleep(2.0)


def load(url: str, key: str, run_id: str) -> LoadOutcome:
    """Load the stored run under its id; a second publish of the same run finds it loaded already."""
    headers = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": run_id, "lora_path": run_id},
                       headers=headers, timeout=300)
    if reply.status_code == 200:
        return "loaded"
    try:
        message = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = reply.text[:300]
    if reply.status_code == 400 and "already been loaded" in message:
        return "already loaded"
    raise PublishError(f"{url}/v1/load_lora_adapter: HTTP {reply.status_code}: {message}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--stack", required=True, help="the stack the stored run belongs to")
    parser.add_argument("--runs-store", required=True, type=Path, help="the run store the server reads")
    parser.add_argument("--api-key-file", required=True, type=Path, help="the gateway's key, as the serve job made it")
    parser.add_argument("--eval-job", help=f"the eval job's id (default: {AFTER_JOBS_ENV})")
    parser.add_argument("--wait-s", type=float, default=600.0, help="how long to wait for the server's address")
    args = parser.parse_args(argv)
    try:
        run = load_run_config(args.config)
        serve_config = run.serve or ServeConfig()
        job = eval_job_id(args.eval_job)
        path = run.results_dir / report_name(job)
        report = read_evaluator_report(path.read_bytes(), str(path))
        if (refused := gate(report, serve_config)) is not None:
            publication = Publication(published=False, eval_job=job, reason=refused)
        else:
            run_id = f"{run.name}-{job}"
            stored = store_run(run, report, args.runs_store, args.stack, run_id, job)
            url = gateway_url(run, args.wait_s)
            outcome = load(url, api_key_from_file(args.api_key_file, create=False), run_id)
            publication = Publication(published=True, eval_job=job, model=run_id, stored=str(stored), server=url,
                                      outcome=outcome)
        write_publication(publication, run.results_dir, os.environ.get("SLURM_JOB_ID") or "local")
    except (ConfigError, DocumentError, OSError, PublishError, AccessError, httpx.HTTPError) as error:
        print(f"publish: {error}", file=sys.stderr)
        return 1
    print(publication.model_dump_json(exclude_none=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
