"""Where model weights come from and how trainers load them: one resolver, one training loader.

Two jobs, each used by every caller so that all of them accept the same names and fail the same way:

* :func:`resolve_model_dir` turns what a user wrote (a local directory, or a Hub id such as ``Qwen/Qwen2.5-0.5B``
  with an optional ``@revision``) into a local directory. Hub ids are looked up in the local Hugging Face cache
  only (``local_files_only``): agentgym never downloads, so a run behaves the same with or without internet.
  The cache location is read from the environment at call time (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
  the default), because ``huggingface_hub`` reads it once at import and a later change would be ignored.
* :func:`load_model` loads a model for training with the trainer's precision, attention implementation,
  gradient checkpointing, LoRA (``peft``) and 4-bit quantisation (QLoRA, ``bitsandbytes``) settings, and
  :func:`save_trained_model` writes what a run produced: the merged model (loadable like any model directory)
  and, for LoRA, the adapter alone.

torch, transformers, peft and huggingface_hub are imported inside the functions, so importing this module
stays light.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, DependencyNotInstalled

__all__ = [
    "DTYPES", "ATTN_IMPLEMENTATIONS", "LORA_DEFAULTS", "LoadOptions", "check_runtime", "hub_cache_dir",
    "is_checkpointing", "is_hub_id", "is_peft_model",
    "load_model", "lora_settings", "merged_state_dict", "parse_hub_id", "resolve_model_dir", "save_trained_model",
]

DTYPES = ("float32", "bfloat16", "float16", "auto")
"""Precisions a trainer may load its model in (``auto``: the dtype the checkpoint's config.json names)."""
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
"""Attention kernels transformers offers (None: its own default, sdpa where supported)."""
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
"""LoRA settings used for keys a config leaves out. Dropout defaults to 0 because the PPO ratio compares
log-probs from a training-mode forward with the old ones from an eval-mode forward: dropout would make the
ratio differ from 1 at the first update for no reason."""

# A Hub repo id: ``namespace/name`` with letters, digits, '-', '_' and '.', plus an optional ``@revision``.
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_HUB_ID = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[^\s@]+))?$")


# ---- resolving names -------------------------------------------------------------------------------------------
def parse_hub_id(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``name`` is shaped like a Hub id (``org/name`` or ``org/name@rev``), else None."""
    match = _HUB_ID.match(name)
    if match is None or ".." in match["repo"] or "--" in match["repo"] or match["repo"].endswith((".", "-")):
        return None
    return match["repo"], match["rev"]


def is_hub_id(name: str | Path) -> bool:
    """Whether ``name`` could be a Hub model id (a string, not a path object; see :func:`parse_hub_id`)."""
    return isinstance(name, str) and parse_hub_id(name) is not None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment names it now: ``HF_HUB_CACHE`` (or the older
    ``HUGGINGFACE_HUB_CACHE``), else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache``)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(xdg).expanduser() / "huggingface" / "hub"


def resolve_model_dir(name_or_path: str | Path, *, what: str = "model") -> Path:
    """The local Hugging Face model directory that ``name_or_path`` names.

    Args:
        name_or_path: A local directory (with ``config.json``), or a Hub id (``org/name[@revision]``) that is
            in the local Hugging Face cache. A local directory of that name wins over the Hub id.
        what: How error messages name the thing (``"model"``, ``"reference model"``).

    Returns:
        The directory (for a Hub id: the cached snapshot of that revision, default ``main``).

    Raises:
        ConfigError: If nothing is found; the message says how to get it (nothing is ever downloaded).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{what} {text!r} has no config.json, so it is not a Hugging Face model directory. Point "
                              "at the directory that save_pretrained wrote (config.json, weights and tokenizer files).")
        return path
    if path.exists():
        raise ConfigError(f"{what} {text!r} is a file, not a Hugging Face model directory (one with config.json).")
    hub = parse_hub_id(text) if isinstance(name_or_path, str) else None
    if hub is None:
        raise ConfigError(f"{what} directory {text!r} does not exist. Pass a local Hugging Face model directory (one "
                          "saved with save_pretrained; build the tiny model with 'make quickstart' or "
                          "agentgym.models.tiny.build_tiny_model) or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct that "
                          "is in the local Hugging Face cache.")
    return _snapshot(*hub, text=text, what=what)


def _snapshot(repo_id: str, revision: str | None, *, text: str, what: str) -> Path:
    """The cached snapshot of a Hub repo (never downloads)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - transformers depends on it
        raise DependencyNotInstalled("huggingface_hub", "train", "loading Hub ids from the local cache") from exc
    cache = hub_cache_dir()
    try:
        found = snapshot_download(repo_id, revision=revision, cache_dir=str(cache), local_files_only=True)
    except Exception as exc:  # LocalEntryNotFoundError, IncompleteSnapshotError, HFValidationError, OSError
        rev = f" at revision {revision!r}" if revision else ""
        raise ConfigError(
            f"{what} {text!r} does not exist as a local directory, and the Hub model {repo_id!r}{rev} is not in the "
            f"local Hugging Face cache ({cache}); agentgym never downloads. Download it where there is internet with "
            f"'hf download {repo_id}' (or 'huggingface-cli download {repo_id}'), point HF_HOME (or HF_HUB_CACHE) at "
            f"a cache that holds it, or pass a local model directory. ({type(exc).__name__})"
        ) from exc
    directory = Path(str(found))
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{what} {text!r}: the cached snapshot {directory} has no config.json (an incomplete "
                          f"download, or not a transformers model). Run 'hf download {repo_id}' again where there is "
                          "internet, or pass a local model directory.")
    return directory


# ---- loading for training -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadOptions:
    """How a trainer loads its model (the fields of the same names in ``TrainerConfig``)."""

    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    lora: Mapping[str, Any] | None = None
    load_in_4bit: bool = False

    @classmethod
    def from_config(cls, config: Any) -> LoadOptions:
        """Read the fields from a trainer config (those it lacks keep their defaults)."""
        names = ("device", "dtype", "attn_implementation", "gradient_checkpointing", "lora", "load_in_4bit")
        return cls(**{n: getattr(config, n) for n in names if hasattr(config, n)})


def lora_settings(lora: Mapping[str, Any]) -> dict[str, Any]:
    """``lora`` completed with :data:`LORA_DEFAULTS` and checked; ConfigError names the key and the fix."""
    unknown = set(lora) - set(LORA_DEFAULTS)
    if unknown:
        raise ConfigError(f"lora has unknown keys {sorted(unknown)}; use {sorted(LORA_DEFAULTS)}.")
    out = {**LORA_DEFAULTS, **dict(lora)}
    if not isinstance(out["r"], int) or isinstance(out["r"], bool) or out["r"] < 1:
        raise ConfigError(f"lora.r (the adapter rank) must be an integer >= 1 (typical 8-64), got {out['r']!r}.")
    if not isinstance(out["alpha"], (int, float)) or isinstance(out["alpha"], bool) or not out["alpha"] > 0:
        raise ConfigError(f"lora.alpha (the scale numerator, scale = alpha / r) must be > 0 (typical 2 * r), "
                          f"got {out['alpha']!r}.")
    dropout = out["dropout"]
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise ConfigError(f"lora.dropout must be in [0, 1) (0 recommended for PPO-style ratios), got {dropout!r}.")
    targets = out["target_modules"]
    if isinstance(targets, str):
        if not targets:
            raise ConfigError("lora.target_modules is empty; use 'all-linear' or a list such as [q_proj, v_proj].")
    elif not (isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets)):
        raise ConfigError(f"lora.target_modules must be 'all-linear' or a non-empty list of module names such as "
                          f"[q_proj, k_proj, v_proj, o_proj], got {targets!r}.")
    else:
        out["target_modules"] = list(targets)
    return out


def check_runtime(options: LoadOptions) -> None:
    """Fail with the fix when the machine cannot honour ``options`` (CUDA, flash_attn, bitsandbytes, peft).

    Trainers call this in their constructor, so a config asking for a GPU-only feature fails before any
    rollout, not when the model loads.
    """
    needs_cuda = options.attn_implementation == "flash_attention_2" or options.load_in_4bit
    if needs_cuda:
        import torch

        if not options.device.startswith("cuda") or not torch.cuda.is_available():
            feature = "load_in_4bit (bitsandbytes)" if options.load_in_4bit else "attn_implementation flash_attention_2"
            raise ConfigError(f"{feature} needs a CUDA GPU (device: cuda); this run has device {options.device!r} and "
                              f"CUDA available = {torch.cuda.is_available()}. Use attn_implementation: sdpa and "
                              "load_in_4bit: false on a CPU.")
    if options.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("attn_implementation flash_attention_2 needs the flash_attn package: pip install flash-attn "
                          "--no-build-isolation (CUDA only), or use attn_implementation: sdpa.")
    if options.load_in_4bit and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("load_in_4bit needs the bitsandbytes package: pip install bitsandbytes (CUDA only), or "
                          "set load_in_4bit: false.")
    if options.lora is not None and importlib.util.find_spec("peft") is None:
        raise DependencyNotInstalled("peft", "train", "LoRA training")


def _torch_dtype(name: str) -> Any:
    import torch

    if name == "auto":
        return "auto"
    if name not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}.")
    return getattr(torch, name)


def load_model(path: str | Path, options: LoadOptions = LoadOptions(), *, adapter_dir: str | Path | None = None,
               trainable: bool = True) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for training, loaded as ``options`` say, on ``options.device``.

    Args:
        path: A model directory or cached Hub id (see :func:`resolve_model_dir`): the base weights.
        options: Precision, attention kernel, gradient checkpointing, LoRA and 4-bit settings.
        adapter_dir: A LoRA adapter saved by ``PeftModel.save_pretrained`` (a checkpoint) to continue training
            instead of starting fresh adapters; its tokenizer is used when it holds one.
        trainable: False for a frozen model (a KL reference): no LoRA, no checkpointing, no gradients, eval mode.

    Returns:
        The model (a ``peft`` ``PeftModel`` when LoRA is on and ``trainable``: only adapter weights require
        grad) and its tokenizer.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.models.tiny import quiet_progress_bars
    from agentgym.models.vision import is_vision_model_dir

    directory = resolve_model_dir(path)
    model_class = AutoModelForCausalLM
    if is_vision_model_dir(directory):  # a VLM: its image-text-to-text class (the tokenizer loads as usual)
        from transformers import AutoModelForImageTextToText

        model_class = AutoModelForImageTextToText
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": _torch_dtype(options.dtype)}
    if options.attn_implementation is not None:
        kwargs["attn_implementation"] = options.attn_implementation
    if options.load_in_4bit:
        from transformers import BitsAndBytesConfig

        compute = torch.bfloat16 if options.dtype in ("float32", "auto") else _torch_dtype(options.dtype)
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True,
                                                           bnb_4bit_compute_dtype=compute)
        kwargs["device_map"] = {"": options.device}
        kwargs["dtype"] = compute
    tokenizer_dir = adapter_dir if adapter_dir is not None and _has_tokenizer(Path(adapter_dir)) else directory
    with quiet_progress_bars():
        model = model_class.from_pretrained(directory, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    if not options.load_in_4bit:
        model = model.to(options.device)
    if not trainable:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model, tokenizer
    checkpointing = {"use_reentrant": False}  # the reentrant variant needs inputs that require grad
    if options.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=options.gradient_checkpointing,
                                                gradient_checkpointing_kwargs=checkpointing)
    elif options.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x name
        if callable(enable):
            enable(activation_checkpointing_kwargs=checkpointing)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
    if options.lora is not None:
        model = _with_lora(model, options.lora, adapter_dir)
    model.eval()
    return model, tokenizer


def load_processor(path: str | Path) -> Any:
    """The Hugging Face processor saved with a vision-language model (``None`` for a text model): what turns its
    images into pixel values and expands their placeholder tokens, for sampling and for the training forward."""
    from agentgym.models.vision import is_vision_model_dir

    directory = resolve_model_dir(path)
    if not is_vision_model_dir(directory):
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(directory, local_files_only=True)


def _has_tokenizer(directory: Path) -> bool:
    return (directory / "tokenizer_config.json").is_file()


def _with_lora(model: Any, lora: Mapping[str, Any], adapter_dir: str | Path | None) -> Any:
    """Wrap ``model`` with fresh LoRA adapters, or with the trainable adapters saved in ``adapter_dir``."""
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError as exc:  # pragma: no cover - peft is in agentgym[train]
        raise DependencyNotInstalled("peft", "train", "LoRA training") from exc
    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    s = lora_settings(lora)
    config = LoraConfig(r=s["r"], lora_alpha=s["alpha"], lora_dropout=s["dropout"], target_modules=s["target_modules"],
                        bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_checkpointing(model: Any) -> bool:
    """Whether activation (gradient) checkpointing is on for ``model`` (or the base under its adapters)."""
    base = model.get_base_model() if is_peft_model(model) else model
    flag = getattr(type(base), "is_activation_checkpointing", None)
    if flag is not None:
        return bool(base.is_activation_checkpointing)
    return bool(getattr(base, "is_gradient_checkpointing", False))


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a peft model (LoRA adapters on a frozen base)."""
    if importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def merged_state_dict(model: Any) -> dict[str, Any]:
    """The base model's state dict with the active LoRA deltas added, under the base model's own names.

    For syncing weights into an inference engine (vLLM) after each update without touching the training model:
    ``W + scale * B @ A`` per adapted layer, computed in float32 and cast back. Not for 4-bit bases (their
    weights are quantised; merge by reloading the base, as :func:`save_trained_model` does).
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, Any] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight_name = f"{name}.base_layer.weight"
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    delta = module.get_delta_weight(adapter).float()
                    deltas[weight_name] = deltas[weight_name] + delta if weight_name in deltas else delta
    merged: dict[str, Any] = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        if key in deltas:
            value = (value.float() + deltas[key].to(value.device)).to(value.dtype)
        merged[key.replace(".base_layer.", ".")] = value.detach()
    return merged


def save_trained_model(model: Any, tokenizer: Any, output_dir: str | Path, *, base: str | Path,
                       options: LoadOptions = LoadOptions(), state_dict: Mapping[str, Any] | None = None) -> Path:
    """Write ``output_dir/model``: a complete model directory that ``HFPolicy.from_pretrained`` and
    ``agentgym serve`` load as is. For LoRA, also ``output_dir/adapter`` (the adapter alone, with the tokenizer),
    and ``model`` is the base with the adapter merged in (base reloaded unquantised on the CPU, so QLoRA merges
    cleanly). Returns the model directory (the caller adds ``agentgym.json``). ``state_dict``: the full weights
    gathered from a model sharded across ranks (FSDP), written instead of ``model``'s own shards.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(output_dir)
    model_dir = out / "model"
    weights = {} if state_dict is None else {"state_dict": dict(state_dict)}
    if not is_peft_model(model):
        model.save_pretrained(model_dir, **weights)
        tokenizer.save_pretrained(model_dir)
        return model_dir
    adapter_dir = out / "adapter"
    model.save_pretrained(adapter_dir, **weights)
    tokenizer.save_pretrained(adapter_dir)
    from peft import PeftModel

    merge_dtype = "bfloat16" if options.load_in_4bit and options.dtype in ("float32", "auto") else options.dtype
    reloaded, _ = load_model(base, LoadOptions(device="cpu", dtype=merge_dtype), trainable=False)
    merged = PeftModel.from_pretrained(reloaded, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir
