"""The pipeline as Pulumi resources: the workload bundle, then one SlurmJob per stage, chained by job ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi

from documents.evaluator_report import EvaluatorReport
from documents.stack_outputs import SIDES, EvalSide, Job
from documents.stack_outputs import Pipeline as PipelineOutputs
from infra.environment.plan import EnvironmentPlan
from infra.pipeline.environment_source import EnvironmentSource
from infra.pipeline.bundle import WorkloadBundle
from infra.pipeline.chain import JobSpec, job_arguments
from infra.pipeline.jobs import SlurmJob, job_report
from infra.output_sections import eval_sides


@dataclass
class PipelineArgs:
    source_dir: str
    """Folder holding the `workloads` package to ship."""
    code_root: str
    """Where bundles land on the Slurm machine (`<code_root>/<hash>`, `<code_root>/current`)."""
    transport: pulumi.Input[dict]
    """Transport spec (see infra.pipeline.connect.open_transport); secret when it holds a key."""
    jobs: list[JobSpec]
    """The chain from infra.pipeline.chain.pipeline_jobs, in submission order."""
    slurm_env: dict[str, str] = field(default_factory=dict)
    """Environment for Slurm's client commands (SLURM_CONF on the local stack)."""
    wait: bool = True
    """Wait for every job to finish during `pulumi up` (outputs then carry final states and the evaluation)."""
    depends_on: list[pulumi.Resource] = field(default_factory=list)
    """What must be ready before anything is shipped (the Slurm cluster's releases on cloud stacks)."""
    environment: EnvironmentPlan | None = None
    """The environment the chain's first job builds (its lock is shipped first); None on the local stack."""
    repo_root: str = "."
    """The repository (the lock, the wheelhouse cache)."""


class Pipeline(pulumi.ComponentResource):
    """prepare -> readiness -> train -> eval (+ serve) as SlurmJob resources under one bundle."""

    bundle_hash: pulumi.Output[str]
    jobs: dict[str, SlurmJob]

    def __init__(self, name: str, args: PipelineArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("soperator-finetune:pipeline:Pipeline", name, None, opts)
        bundle = WorkloadBundle(
            f"{name}-bundle", source_dir=args.source_dir, code_root=args.code_root, transport=args.transport,
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.depends_on),
        )
        self.bundle_hash = bundle.content_hash
        shipped = [EnvironmentSource(
            f"{name}-environment-source", plan=args.environment, repo_root=args.repo_root, transport=args.transport,
            serve=any(job.stage == "serve" for job in args.jobs),
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.depends_on),
        )] if args.environment is not None else []
        self.jobs = {}
        for job in args.jobs:
            upstream = [self.jobs[stage] for stage in job.depends_on]
            after = shipped if job.stage == "environment" else []
            self.jobs[job.stage] = SlurmJob(
                f"{name}-{job.stage}",
                **job_arguments(job, bundle_path=bundle.path, dependencies=[u.job_id for u in upstream],
                                transport=args.transport, slurm_env=args.slurm_env,
                                wait=args.wait and job.stage != "serve"),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[bundle, *after, *upstream]),
            )
        self.register_outputs({"bundle_hash": self.bundle_hash})

    @property
    def evaluation(self) -> pulumi.Output[EvaluatorReport | None]:
        """The eval job's report once the waited job finished (None before, or without an eval stage)."""
        if "eval" not in self.jobs:
            return pulumi.Output.from_input(None)
        return self.jobs["eval"].result.apply(job_report)

    def section(self) -> PipelineOutputs:
        """The pipeline part of the stack outputs: bundle hash, each job's id, state and elapsed time, and the
        evaluation figures (Outputs, known once the waited jobs finished)."""
        evaluation = None
        if "eval" in self.jobs:
            sides = self.evaluation.apply(eval_sides)
            evaluation = {side: EvalSide.model_construct(**{
                figure: sides.apply(lambda s, side=side, figure=figure: getattr(s[side], figure))
                for figure in EvalSide.model_fields}) for side in SIDES}
        return PipelineOutputs.model_construct(
            bundle_hash=self.bundle_hash,
            jobs={stage: Job.model_construct(job_id=job.job_id, state=job.state, elapsed_s=job.elapsed_s)
                  for stage, job in self.jobs.items()},
            evaluation=evaluation,
        )
