"""The planner and what it needs: the catalog and prices, model shapes, the memory estimate, placement and batch
sizing, the time model, the throughput estimate, the fit on a stack's workers, the run's size and duration, and
`planner.plan_run`, which turns (the stack as `planning.stack.PlanStack`, the run config, what a run measured) into the
`documents.run_plan.RunPlan` that is priced, submitted, trained and served. Below `infra/` and `workloads/`, above
`documents/` only (it ships to the cluster in the bundle: the trainer checks the plan, or makes one, with it)."""
