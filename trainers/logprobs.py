"""Per-token log-probs of a causal LM without materialising the full ``[N, L, V]`` logits.

Why: the plain way (``model(...).logits`` -> float32 -> ``log_softmax`` -> gather) holds several
``N x L x V`` float32 tensors at once, and the backward pass adds more of the same size. At a Qwen
vocabulary (``V = 151,936``) one 4,096-token sequence needs 2.5 GB per such tensor, so a GPU runs out of
memory on the log-probs long before it does on the transformer.

Here the model's backbone gives the last hidden states ``[N, L, H]`` (small: ``H`` is thousands, ``V``
is a hundred thousand) and the output projection (``lm_head``) is applied to ``chunk_size`` token
positions at a time. Each chunk's logits are upcast to float32, divided by the temperature, reduced to
the chosen tokens' log-probs with the same ``log_softmax`` + gather as the plain path, and dropped.
During training every chunk runs under :func:`torch.utils.checkpoint.checkpoint`, so backward recomputes
one chunk's logits at a time instead of keeping all of them: at most ``chunk_size x V`` float32 logits
(and their gradient) exist at once, for one extra ``lm_head`` matmul per chunk.

Models split into backbone + head when they expose ``get_output_embeddings()`` and a ``base_model``
backbone returning ``last_hidden_state`` (every Hugging Face ``*ForCausalLM``, also under ``peft`` LoRA
adapters). Logit post-processing in
their ``forward`` is reproduced: Gemma 2/3 final soft-capping (``config.final_logit_softcapping``),
Cohere's ``logit_scale`` and Granite's ``logits_scaling``. The split is checked once per model object
against a plain forward on a few tokens; a model that does something else to its logits (or cannot be
split) falls back to the plain path with a warning, so the values are always the model's own.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from agentgym.errors import ConfigError

__all__ = ["DEFAULT_CHUNK_SIZE", "check_chunk_size", "full_token_logprobs", "token_logprobs"]

#: Token positions per ``lm_head`` chunk, over all rows of the batch together. Backward holds about three
#: ``chunk x V`` float32 buffers at its peak: 0.9 GB at 512 positions and ``V = 151,936`` (against 7.5 GB
#: for one 4,096-token sequence unchunked), and a ``512 x H x V`` matmul still keeps a GPU busy.
DEFAULT_CHUNK_SIZE = 512

#: Tokens of the one-off check that the backbone + head split reproduces the model's logits.
_PROBE_TOKENS = 16

#: model -> whether its backbone + head split reproduces its logits (checked once per model object).
_SPLIT_VERIFIED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def check_chunk_size(chunk_size: Any) -> int | None:
    """Return ``chunk_size`` if valid (a positive int, or ``None`` for the plain full-logits path).

    Raises:
        ConfigError: for anything else, saying what to pass.
    """
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(
            f"chunk_size must be a positive integer (token positions per lm_head chunk, e.g. "
            f"{DEFAULT_CHUNK_SIZE}) or None for the unchunked full-logits path, got {chunk_size!r}."
        )
    return chunk_size


def token_logprobs(model: Any, input_ids: torch.Tensor, *, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int | None = DEFAULT_CHUNK_SIZE,
                   extra_inputs: Mapping[str, Any] | None = None) -> torch.Tensor:
    """``[N, L]`` float32 log-prob of ``input_ids[:, t]`` given the model's output at ``t - 1``; 0 at ``t = 0``.

    Args:
        model: A causal LM called as ``model(input_ids=, attention_mask=, position_ids=, use_cache=False)``.
        input_ids: ``[N, L]`` token ids.
        attention_mask: Passed through unchanged: ``[N, L]`` padding mask or a ``[N, 1, L, L]`` packed mask.
        position_ids: ``[N, L]`` positions, passed through.
        temperature: Logits are divided by it (in float32) before the softmax, as at sampling time.
        chunk_size: Token positions (over all rows together) per ``lm_head`` chunk; ``None`` computes the
            full logits at once (the plain path, also used for models that cannot be split).
        extra_inputs: More forward inputs, passed to the model (or its backbone) as they are: a vision-language
            model's ``pixel_values`` for the image tokens of ``input_ids``.

    Returns:
        ``[N, L]`` float32 log-probs, differentiable w.r.t. the model's parameters when grad is enabled.

    Raises:
        ConfigError: if ``chunk_size`` is not a positive int or ``None``.
    """
    chunk_size = check_chunk_size(chunk_size)
    kwargs = {"attention_mask": attention_mask, "position_ids": position_ids, **(extra_inputs or {})}
    n, length = input_ids.shape
    if chunk_size is None or length < 2 or not _splits(model, input_ids):
        return full_token_logprobs(model, input_ids, temperature=temperature, **kwargs)
    backbone, head, transform = _split(model)
    hidden = backbone(input_ids=input_ids, use_cache=False, **kwargs).last_hidden_state
    flat_hidden = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    flat_targets = input_ids[:, 1:].reshape(-1)

    def chunk_logprobs(h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = transform(head(h)).float()
        if temperature != 1.0:
            logits = logits / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    positions = flat_targets.shape[0]
    recompute = torch.is_grad_enabled() and positions > chunk_size
    pieces = []
    for start in range(0, positions, chunk_size):
        h, targets = flat_hidden[start:start + chunk_size], flat_targets[start:start + chunk_size]
        if recompute:
            pieces.append(checkpoint(chunk_logprobs, h, targets, use_reentrant=False))
        else:
            pieces.append(chunk_logprobs(h, targets))
    logp = torch.cat(pieces).view(n, length - 1)
    return torch.cat([logp.new_zeros((n, 1)), logp], dim=1)


def full_token_logprobs(model: Any, input_ids: torch.Tensor, *, attention_mask: torch.Tensor,
                        position_ids: torch.Tensor, temperature: float = 1.0, **extra_inputs: Any) -> torch.Tensor:
    """The plain path of :func:`token_logprobs`: full ``[N, L, V]`` logits, float32 ``log_softmax``, gather.
    ``extra_inputs`` (a VLM's pixel values) go to the model's forward."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False, **extra_inputs).logits
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([logp.new_zeros((logp.shape[0], 1)), logp], dim=1)


# ---- splitting a model into backbone + head --------------------------------------------------------
def _split(model: Any) -> tuple[Any, Any, Callable[[torch.Tensor], torch.Tensor]]:
    """``(backbone, lm_head, logit transform)``; raises ``LookupError`` when the model has no such split.

    A ``peft`` model is split through the model under its adapters (``get_base_model()``): LoRA layers sit
    inside that model's modules, so its backbone and head run with the adapters (or without them under
    ``disable_adapter()``), exactly as the wrapper's own forward does.
    """
    unwrap = getattr(model, "get_base_model", None)
    model = unwrap() if callable(unwrap) else model
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    backbone = getattr(model, "base_model", None)
    if head is None or backbone is None or backbone is model:
        raise LookupError(f"{type(model).__name__} has no output embeddings or no separate base model")
    return backbone, head, _logit_transform(model)


def _logit_transform(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the model's ``forward`` does to ``lm_head``'s output before returning ``logits``."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config

    def setting(name: str) -> Any:
        return getattr(text_config, name, None) if getattr(text_config, name, None) is not None \
            else getattr(config, name, None)

    scale = getattr(model, "logit_scale", None)  # Cohere: logits * logit_scale
    scale = scale if isinstance(scale, (int, float)) and not isinstance(scale, bool) else None
    divisor = setting("logits_scaling")  # Granite: logits / logits_scaling
    softcap = setting("final_logit_softcapping")  # Gemma 2/3: cap * tanh(logits / cap)

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale is not None:
            logits = logits * scale
        if divisor is not None:
            logits = logits / divisor
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    return transform


def _splits(model: Any, input_ids: torch.Tensor) -> bool:
    """Whether the backbone + head split of ``model`` gives its own logits (checked once per model object).

    The check runs both on the first few tokens of ``input_ids`` in eval mode (so dropout cannot make them
    differ) without grad, and restores every module's train/eval mode afterwards.
    """
    try:
        return _SPLIT_VERIFIED[model]
    except (KeyError, TypeError):
        pass
    reason = ""
    try:
        backbone, head, transform = _split(model)
        probe = input_ids[:1, :_PROBE_TOKENS]
        kwargs = {"attention_mask": torch.ones_like(probe),
                  "position_ids": torch.arange(probe.shape[1], device=probe.device)[None], "use_cache": False}
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                want = model(input_ids=probe, **kwargs).logits.float()
                got = transform(head(backbone(input_ids=probe, **kwargs).last_hidden_state)).float()
        finally:
            for module, mode in modes:
                module.training = mode
        error = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        ok = error <= 1e-4 * max(1.0, float(want.abs().max()))
        reason = "" if ok else f"its backbone + lm_head differ from its logits by up to {error:.3g}"
    except Exception as exc:  # any model that cannot be split this way takes the plain path
        ok, reason = False, f"{type(exc).__name__}: {exc}"
    if not ok:
        warnings.warn(f"{type(model).__name__}: chunked log-probs unavailable ({reason}); computing the full "
                      "[N, L, V] logits instead, which needs much more memory at large vocabularies.",
                      RuntimeWarning, stacklevel=3)
    try:
        _SPLIT_VERIFIED[model] = ok
    except TypeError:  # not weak-referenceable: check again next time
        pass
    return ok
