"""The documents one process writes and another reads: one pydantic model, one reader and one writer each.

| document | file | module | writer | readers |
| --- | --- | --- | --- | --- |
| run config | ``workloads/configs/<stack>.json`` | ``run_config`` | a person | every stage, ``ftstack``, the program |
| stage manifest | ``<output>/manifest.json`` | ``stage_manifest`` | convert, split, tokenize | the same stages (skip when current), evaluation |
| prepare summary | ``<results>/prepare.json`` | ``prepare_summary`` | prepare job | ``ftstack run``, evaluation |
| metrics record | ``<train_run>/metrics.jsonl`` (a line) | ``metrics`` | train job | resume, charts, cost, ``ftstack status`` |
| run manifest | ``<train_run>/run_manifest.json`` | ``run_manifest`` | train job | resume, ``ftstack run``, stored runs |
| readiness report | ``<results>/readiness-<job>.json`` | ``readiness_report`` | readiness job | ``ftstack run`` |
| evaluator report | ``<results>/evaluator_<job>.json`` | ``evaluator_report`` | eval job | the program, ``ftstack``, dashboard |
| measured throughput | ``documents/training_throughput.json``, stored runs | ``throughput`` | bench, ``ftstack run`` | cost model |
| stack outputs | Pulumi outputs, ``pulumi stack output --json`` | ``stack_outputs`` | the program, ``ftstack run`` | report, dashboard, policies |
| served adapter set | ``<results>/served_adapters.json`` | ``adapter_registry`` | serve launcher (every 5 s) | ``ftstack run`` (stack outputs), dashboard |

Every reader takes the text and where it came from (a path, an SSH path, an artifact key) and raises
``DocumentError`` naming that origin and the field at fault. Writers write beside the target and rename.
Text from outside is decoded and parsed by ``text_input`` (UTF-8 errors with their byte offset, JSON nesting
bounded); figures are finite (``base.Figures``); stack names and run ids follow ``names``.
"""
