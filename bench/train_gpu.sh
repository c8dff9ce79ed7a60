#!/usr/bin/env bash
# The GPU training benchmark as run on a lent single-GPU machine (figures in docs/training.md).
#
#   bench/train_gpu.sh smoke|14b|14b-naive|14b-upcast|14b-dropout0|14b-recompute OUT_DIR TOKENIZER_DIR DATASET_DIR
#
# smoke:     CUDA tests (varlen attention, fused loss), then every arm on a random SmolLM2-135M-shaped base.
# 14b:       random Qwen3-14B-shaped base, dev.json's QLoRA settings with `auto` sizing, global batch of
#            16 x 1,024 tokens: packed with the fused loss, packed, TRL SFTTrainer.
# 14b-naive: the same base and settings, the naive padded arm.
# 14b-upcast: the packed arms with peft's fp32 upcast of the frozen norms/embeddings/LM head (train.kbit_upcast,
#            what every arm ran with until 2026-11-23), for the side-by-side with `14b`.
# 14b-dropout0: the fused packed arm with LoRA dropout 0 (a recipe change: no dropout masks or dropped copies).
# 14b-recompute: the fused packed arm with checkpointing forced on (one 16,384-token micro-batch), for the
#            side-by-side with `14b`, whose `auto` plan trains without recomputation in smaller micro-batches.
# The data is the project's own: the synthetic generator, converted and tokenized (max_length 1,024).
# BENCH_DRY_RUN=1 prints the commands instead of running them (tests/test_bench_scripts.py checks their arguments).
set -euo pipefail
mode=$1 out=$2 tokenizer=$3 dataset=$4
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
run() { if [ "${BENCH_DRY_RUN:-}" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi; }
run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
run python3 -c "import torch, transformers, peft, trl, bitsandbytes as b; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'bitsandbytes', b.__version__)"
dev=(--config workloads/configs/dev.json --dataset-dir "$dataset" --tokenizer "$tokenizer")
case $mode in
  smoke)
    run python3 -m pytest --noconftest -q -p no:cacheprovider tests/test_train_attention.py || echo "CUDA tests failed"
    run python3 bench/train.py "${dev[@]}" --random-base HuggingFaceTB/SmolLM2-135M-Instruct --model-dir /tmp/base-135m \
      --steps 4 --warmup 2 --arms naive,auto,packed,grouped,packed_fused,trl \
      --train '{"micro_batch_tokens": "auto", "gradient_checkpointing": "auto"}' --out "$out/smoke.json" ;;
  14b|14b-naive|14b-upcast|14b-dropout0|14b-recompute)
    arms=packed_fused,packed,trl upcast=false lora= ckpt='"auto"'
    [ "$mode" = 14b-naive ] && arms=naive
    [ "$mode" = 14b-upcast ] && arms=packed_fused,packed upcast=true
    [ "$mode" = 14b-recompute ] && arms=packed_fused ckpt=true
    [ "$mode" = 14b-dropout0 ] && arms=packed_fused lora=', "lora": {"dropout": 0.0}'
    run python3 bench/train.py "${dev[@]}" --random-base Qwen/Qwen3-14B --model-dir /tmp/base-14b --steps 5 --warmup 2 --datasets dense \
      --arms "$arms" --out "$out/$mode.json" \
      --train '{"micro_batch_tokens": "auto", "gradient_checkpointing": '"$ckpt"', "gradient_accumulation_steps": 16, "kbit_upcast": '"$upcast$lora"'}' ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
