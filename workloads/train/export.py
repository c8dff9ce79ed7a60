"""Merge a LoRA adapter into a full-precision copy of its base for serving (never into 4-bit weights), or export
a full fine-tune's model folder, as a normal transformers model folder that eval and serve load.

    python -m workloads.train.export --adapter DIR --base DIR --out DIR [--dtype float32|bfloat16|float16]
    python -m workloads.train.export --model DIR --base DIR --out DIR [--dtype ...]   (a full fine-tune)
    python -m workloads.train.export --config RUN.json     (the run's adapter or model and base -> its merged folder)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

from documents.atomic import atomic_dir, sha256_file, utc_now
from documents.run_config import ConfigError, load_run_config
from documents.stage_manifest import MANIFEST_NAME, MergedManifest, write_manifest
from workloads.train.config import train_paths, trained_dir

log = logging.getLogger("workloads.train.export")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ExportError(ValueError):
    """Missing or mismatched adapter/base; the message names the folder."""


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ExportError(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")


def _save_servable(model: Any, folder: Path, base: Path, out: Path, dtype: str, **source: dict[str, str]) -> None:
    """`model` with its tokenizer (the trained `folder`'s, else the base's) and a MergedManifest naming `source`
    (adapter= or trained=) into `out` (atomic)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder if (folder / "tokenizer_config.json").is_file() else base)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp / MANIFEST_NAME, MergedManifest(**source, base=str(base.resolve()), dtype=dtype,
                                                           created=utc_now()))


def merge_adapter(adapter: Path, base: Path, out: Path, dtype: str = "float32") -> Path:
    """Load `base` unquantized in `dtype`, apply `adapter`, fold the LoRA deltas into the weights and save the
    merged model with the tokenizer to `out` (atomic)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if not (adapter / "adapter_config.json").is_file():
        raise ExportError(f"{adapter}: not a PEFT adapter folder (adapter_config.json missing)")
    if not (base / "config.json").is_file():
        raise ExportError(f"{base}: not a model folder (config.json missing)")
    _check_dtype(dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=DTYPES[dtype], quantization_config=None)
    if getattr(model.config, "quantization_config", None):
        raise ExportError(f"{base}: base is quantized; merge needs full-precision weights")
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    _save_servable(merged, adapter, base, out, dtype, adapter={
        "path": str(adapter.resolve()), "sha256": sha256_file(adapter / "adapter_model.safetensors")})
    log.info("merged %s into %s -> %s (%s)", adapter, base, out, dtype)
    return out


def export_full_model(model_dir: Path, base: Path, out: Path, dtype: str = "float32") -> Path:
    """Save a full fine-tune's model (fp32 masters) in `dtype` with its tokenizer to `out` (atomic)."""
    from transformers import AutoModelForCausalLM

    weights = sorted(model_dir.glob("*.safetensors"))
    if not (model_dir / "config.json").is_file() or not weights:
        raise ExportError(f"{model_dir}: not a trained model folder (config.json or *.safetensors missing)")
    _check_dtype(dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    _save_servable(model, model_dir, base, out, dtype,
                   trained={"path": str(model_dir.resolve()), "sha256": sha256_file(weights[0])})
    log.info("exported the full fine-tune %s -> %s (%s)", model_dir, out, dtype)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, help="run config: defaults for --adapter/--model, --base and --out")
    parser.add_argument("--adapter", type=Path)
    parser.add_argument("--model", type=Path, help="a full fine-tune's model folder (instead of --adapter)")
    parser.add_argument("--base", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        if options.config is not None:
            run = load_run_config(options.config)
            paths = train_paths(run)
            kind = "model" if run.train.method == "full" else "adapter"
            setattr(options, kind, getattr(options, kind) or trained_dir(paths, run.train))
            options.base = options.base or paths.model_dir
            options.out = options.out or run.merged_dir
        trained = "model" if options.model is not None else "adapter"
        missing = [f"--{name}" for name in (trained, "base", "out") if getattr(options, name) is None]
        if missing:
            parser.error(f"{', '.join(missing)} required without --config")
        if options.model is not None:
            export_full_model(options.model, options.base, options.out, options.dtype)
        else:
            merge_adapter(options.adapter, options.base, options.out, options.dtype)
    except (ExportError, ConfigError) as error:
        print(f"export: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"merged": str(options.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
