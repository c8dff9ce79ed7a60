"""Compare the base and the fine-tuned model on the test split; JSON on stdout and in <results>/evaluator_<jobid>.json.

    python -m workloads.eval.evaluate --config workloads/configs/local.json | jq .comparison

A report measured on the same inputs (workloads/eval/reuse.py) is reused, not measured again; --force measures.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import Any

import torch

from documents.evaluator_report import Comparison, EvalSettings, EvaluatorReport, SideReport, write_report
from documents.prepare_summary import TokenizeLosses
from documents.run_config import ConfigError, RunConfig, load_run_config
from documents.sections.eval import EvalConfig
from documents.stage_manifest import MANIFEST_NAME, load_stage_manifest
from workloads.common.bf16 import cpu_bf16_supported
from workloads.common.job_metrics import JobFigures, JobMetricsFile, ProcessSampler
from workloads.data.tokenize import tokenize_losses
from workloads.eval.chart import write_chart
from workloads.eval.generation import Prompt, generate_all, read_prompts
from workloads.eval.metrics import answer_scores, compare, perplexity, text_scores
from workloads.eval.perplexity import assistant_nll, load_tokenized
from workloads.eval.prefill import NllSum
from workloads.eval.reuse import current_report, inputs_sha256

log = logging.getLogger("workloads.eval")


def resolve_device_dtype(eval_config: EvalConfig) -> tuple[str, torch.dtype]:
    """The configured device and dtype; auto: bfloat16 on a GPU or on a CPU that computes it natively
    (workloads.common.bf16), else float32."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if eval_config.device == "auto" else eval_config.device
    if eval_config.dtype != "auto":
        return device, getattr(torch, eval_config.dtype)
    return device, torch.bfloat16 if device == "cuda" or cpu_bf16_supported() else torch.float32


def finetuned_kind(run: RunConfig, choice: str) -> str:
    """`merged` or `adapter`; auto prefers the merged folder when it exists."""
    merged = (run.merged_dir / "config.json").exists()
    adapter = (run.adapter_dir / "adapter_config.json").exists()
    if choice == "merged" and not merged:
        raise FileNotFoundError(f"{run.merged_dir}: merged model not found (run the train stage's export)")
    if choice == "adapter" and not adapter:
        raise FileNotFoundError(f"{run.adapter_dir}: adapter not found (run the train stage)")
    if choice == "auto":
        if merged:
            return "merged"
        if adapter:
            return "adapter"
        raise FileNotFoundError(f"neither {run.merged_dir} nor {run.adapter_dir} holds a fine-tuned model")
    return choice


def load_model(run: RunConfig, side: str, kind: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    if side == "base" or kind == "adapter":
        if not (run.base_model_dir / "config.json").exists():
            raise FileNotFoundError(f"{run.base_model_dir}: base model not found (run the prepare stage)")
        model = AutoModelForCausalLM.from_pretrained(run.base_model_dir, dtype=dtype)
        if side == "finetuned":
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, run.adapter_dir)
    else:
        model = AutoModelForCausalLM.from_pretrained(run.merged_dir, dtype=dtype)
    return model.to(device)


def measure(model, tokenizer, dataset, prompts: list[Prompt], eval_config: EvalConfig, name: str) -> dict[str, Any]:
    """One side's figures. The generation batches score their own rows' perplexity as they prefill them; the rows
    they do not cover (the timed prompts, rows past num_prompts) are scored by a forward of their own."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scores = NllSum()
    outputs, total, timing = generate_all(model, tokenizer, prompts, eval_config.max_new_tokens,
                                          eval_config.generation_batch_size, eval_config.timing_runs,
                                          eval_config.seed, desc=f"{name}: generation",
                                          rows=[dataset[i] for i in range(len(prompts))], scores=scores)
    rest = [i for i in range(len(dataset)) if i not in scores.rows]
    assistant_nll(model, dataset.select(rest), eval_config.batch_size, pad_id, f"{name}: perplexity", scores)
    ppl, scored = perplexity(scores.nll, scores.tokens), scores.tokens
    n = len(outputs)
    references, replies = [p.reference for p in prompts], [o.text for o in outputs]
    return {
        "perplexity": ppl,
        "perplexity_tokens": scored,
        "time_to_first_token": timing.ttft_s,
        "tokens_per_second": timing.tokens_per_second,
        "decode_tokens_per_second": timing.decode_tokens_per_second,
        "timing_runs": timing.runs,
        "total_time": total,
        "message_length_avg": sum(len(o.text) for o in outputs) / n,
        "message_tokens_avg": sum(o.tokens for o in outputs) / n,
        **text_scores(references, replies),
        **answer_scores(references, replies, eval_config.numeric_tolerance),
        "sample_generations": [
            {"input": p.input, "reference": p.reference, "generated": o.text}
            for p, o in zip(prompts[: eval_config.num_samples], outputs)
        ],
    }


def data_losses(run: RunConfig) -> dict[str, TokenizeLosses] | None:
    """The tokenize manifests' loss accounting for both splits (None if a manifest is missing)."""
    losses = {}
    for side, folder in (("train", run.train_tokenized_dir), ("test", run.test_tokenized_dir)):
        manifest = load_stage_manifest(folder / MANIFEST_NAME)
        if manifest is None:
            return None
        losses[side] = tokenize_losses(manifest)
    return losses


def evaluate(run: RunConfig, job_id: str, job_metrics: JobMetricsFile | None = None,
             force: bool = False) -> EvaluatorReport:
    """Both sides measured, each side's generation speed going to `job_metrics` as it is known; or, unless `force`,
    the figures of the newest report measured on the same inputs, under this job's id."""
    eval_config = run.eval or EvalConfig()
    kind = finetuned_kind(run, eval_config.finetuned)
    device, dtype = resolve_device_dtype(eval_config)
    digest = inputs_sha256(run, kind, device, dtype_name(dtype))
    earlier = None if force else current_report(run.results_dir, digest)
    if earlier is not None:
        measured_by = earlier.measured_by_job or earlier.job_id
        log.info("inputs unchanged since job %s's evaluation: its figures reused (--force measures again)", measured_by)
        return earlier.model_copy(update={"job_id": job_id, "measured_by_job": measured_by})
    return measured_report(run, job_id, kind, device, dtype, digest, job_metrics)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def measured_report(run: RunConfig, job_id: str, kind: str, device: str, dtype: torch.dtype, digest: str,
                    job_metrics: JobMetricsFile | None) -> EvaluatorReport:
    from transformers import AutoTokenizer

    eval_config = run.eval or EvalConfig()
    tokenizer = AutoTokenizer.from_pretrained(run.base_model_dir)
    dataset = load_tokenized(run.test_tokenized_dir, eval_config.perplexity_rows)
    prompts = read_prompts(dataset, run.test_jsonl, eval_config.num_prompts)
    sides: dict[str, dict[str, Any]] = {}
    for side in ("base", "finetuned"):
        log.info("evaluating %s model (%s)", side, kind if side == "finetuned" else run.base_model_dir)
        model = load_model(run, side, kind, device, dtype)
        sides[side] = measure(model, tokenizer, dataset, prompts, eval_config, side)
        if job_metrics is not None:
            job_metrics.update(JobFigures(tokens_per_second=sides[side]["tokens_per_second"]))
        del model
        gc.collect()
    return EvaluatorReport(
        job_id=job_id,
        run=run.name,
        finetuned_kind=kind,
        base_model=SideReport.model_validate(sides["base"]),
        finetuned_model=SideReport.model_validate(sides["finetuned"]),
        comparison=Comparison.model_validate(compare(sides["base"], sides["finetuned"])),
        settings=EvalSettings(
            device=device,
            dtype=dtype_name(dtype),
            test_rows_perplexity=len(dataset),
            prompts=len(prompts),
            max_new_tokens=eval_config.max_new_tokens,
            seed=eval_config.seed,
            decoding="greedy",
            generation_batch_size=eval_config.generation_batch_size,
            numeric_tolerance=eval_config.numeric_tolerance,
        ),
        data=data_losses(run),
        inputs_sha256=digest,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.environ.get("FT_CONFIG"), required="FT_CONFIG" not in os.environ)
    parser.add_argument("--force", action="store_true", help="measure even when a report of the same inputs exists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    try:
        run = load_run_config(args.config)
        job_metrics = JobMetricsFile.from_env("eval", run.name)
        with ProcessSampler(job_metrics):
            report = evaluate(run, os.environ.get("SLURM_JOB_ID") or "local", job_metrics, args.force)
        path = write_report(report, run.results_dir)
        if (run.eval or EvalConfig()).chart:
            write_chart(report, path.with_suffix(".png"))
    except (ConfigError, FileNotFoundError, ValueError) as error:
        print(f"evaluate: {error}", file=sys.stderr)
        return 2
    log.info("wrote %s", path)
    sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
