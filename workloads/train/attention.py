"""Which attention kernel a training run uses, chosen explicitly and recorded in the run manifest.

On CUDA, packed micro-batches go through PyTorch's variable-length flash attention (`varlen_attn`): the
collator's sequence boundaries (`cu_seq_lens_q`) replace a (tokens x tokens) block-diagonal mask, so nothing is
built per batch on the host and no token attends across a boundary. Padded batches (`grouped`, the benchmark's
naive arm) and CPU runs use transformers' SDPA with PyTorch's own kernel choice (`default`): with
`train.kbit_upcast` the frozen norms are fp32, so queries and keys reach SDPA in fp32 beside bf16 values, which
the memory-efficient kernel refuses (seen on an H100: "No available kernel"); on CPU the packed mask is built
from the restarting position ids.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from documents.train_plan import AttentionChoice

if TYPE_CHECKING:
    import torch

VARLEN = "ft_varlen"  # no "flash" in the name: transformers would look for a flash-attn package


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def choose(cuda: bool, packed: bool) -> AttentionChoice:
    if cuda and packed and varlen_available():
        return AttentionChoice(implementation=VARLEN, backend="flash")
    return AttentionChoice(implementation="sdpa", backend="default")


def varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     cu_seq_lens_q: torch.Tensor | None = None, max_length_q: int | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function over one packed row: (1, heads, tokens, dim) in, (1, tokens, heads, dim)
    out. Without sequence boundaries (generation, a padded batch) it falls back to SDPA."""
    import torch
    from torch.nn.attention.varlen import varlen_attn
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if dropout:
        raise ValueError("varlen flash attention is used for training without attention dropout")
    dtype = query.dtype if query.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))
    params = inspect.signature(varlen_attn).parameters
    extra: dict[str, Any] = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            extra["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu = cu_seq_lens_q.to(device=q.device, dtype=torch.int32)
    longest = int(max_length_q) if max_length_q is not None else int((cu[1:] - cu[:-1]).max())
    out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scaling, **extra)
    return out.unsqueeze(0), None


def register() -> None:
    """Make `VARLEN` a valid `attn_implementation` (no mask is built for it)."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention)
