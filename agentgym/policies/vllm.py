"""VLLMPolicy: an in-process vLLM engine on a GPU as a token-level policy, with weight sync for trainers.

Why vLLM next to :class:`~agentgym.policies.hf.HFPolicy`: on a GPU, vLLM's paged attention and continuous
batching generate many times faster than a plain decoding loop, which is where RL on agents spends most
of its time. Training still happens in a torch model; after each update the trainer pushes the new
weights into the engine with :meth:`VLLMPolicy.load_weights`, so generation never runs a stale policy.

Outputs follow the same contract as HFPolicy, so trainers cannot tell the two apart:

* ``token_ids`` are the sampled ids, including the end-of-turn token when the turn stopped on one.
* ``logprobs`` are those of the sampled tokens under the temperature-scaled distribution (temperature 1
  for greedy requests). vLLM's default returns log-probs of the *raw* logits, before temperature, which
  would bias every importance ratio a trainer computes at temperature != 1; the engine is therefore
  built with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2, the version TRL also requires for
  this). One difference remains: vLLM's processed log-probs are taken *after* top-p truncation, so for
  ``top_p < 1`` they are log-probs of the truncated, renormalised distribution the token was actually
  drawn from, whereas HFPolicy reports them before truncation. With ``top_p == 1`` (the usual RL
  setting) both agree.
* ``entropies``: vLLM returns only the top-K log-probs per step, not the full distribution, so the
  entropy is estimated from those K (``entropy_top_k``, default 20) plus the sampled token, with all the
  remaining probability mass counted as one extra outcome. Merging outcomes never raises entropy, so the
  estimate is a lower bound on the true entropy; it is exact when K covers the whole support (the
  vocabulary, or the top-p nucleus) and tight when the distribution is peaked, which is where
  entropy-based branching (ARPO) makes its decisions. Raise ``entropy_top_k`` for a tighter bound.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller already set the
variable): weight sync then hands the trainer's tensors to the model directly, with no pickling of the
state dict through vLLM's engine-core socket, and the trainer and the engine share one GPU.

API followed: vLLM's ``LLM`` class as documented for v0.32 (the newest documented release when this was
written): ``LLM.generate(prompts=[{"prompt_token_ids": [...]}, ...], sampling_params=[...])`` (the
``TokensPrompt`` form), ``LLM.apply_model(func)`` ("run a function directly on the model inside each
worker") and ``LLM.reset_prefix_cache()``; see the fallback chain in :meth:`VLLMPolicy.load_weights`
for older releases.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentgym.errors import AgentGymError, ConfigError, DependencyNotInstalled
from agentgym.policies.base import Generation, InProcessTokenPolicy, SamplingParams
from agentgym.policies.hf import HFPolicy
from agentgym.policies.seeding import row_seeds

__all__ = ["VLLMPolicy"]

logger = logging.getLogger(__name__)

#: The oldest vLLM with ``logprobs_mode`` (added in 0.10.0; its processed modes settled in 0.10.2).
_MIN_VLLM = "0.10.2"


def _import_vllm() -> Any:
    """Import vLLM with its engine core in this process (see the module docstring for why).

    The environment variable is set before the import, since vLLM may cache its settings, and only when
    vLLM is installed, so a failed attempt leaves the environment alone. ``setdefault``: a caller who
    chose otherwise keeps the choice (weight sync then needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to
    send the weights to the engine process).
    """
    if importlib.util.find_spec("vllm") is None:
        raise DependencyNotInstalled("vllm", "vllm", "VLLMPolicy")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise DependencyNotInstalled("vllm", "vllm", "VLLMPolicy") from exc
    return vllm


def _vllm_version(vllm: Any) -> str:
    return str(getattr(vllm, "__version__", "unknown"))


# ---- pure helpers (no vLLM needed; unit-tested on CPU) ---------------------------------------------
def entropy_from_top_logprobs(logprobs: Iterable[float]) -> float:
    """Lower bound on the entropy of a distribution of which only some log-probs are known.

    The known outcomes (the top-K tokens and the sampled one, all distinct) keep their probabilities;
    all unknown outcomes are merged into one whose probability is the missing mass. Merging outcomes
    never increases entropy, so the result is <= the true entropy, with equality when nothing is
    missing. Non-finite log-probs (tokens cut by top-p) have probability 0 and add nothing.

    Args:
        logprobs: Natural-log probabilities of distinct outcomes.

    Returns:
        The entropy estimate in nats (>= 0).
    """
    entropy = 0.0
    mass = 0.0
    for lp in logprobs:
        if not math.isfinite(lp):
            continue
        p = math.exp(lp)
        mass += p
        entropy -= p * lp
    rest = 1.0 - mass
    if rest > 1e-12:
        entropy -= rest * math.log(rest)
    return max(entropy, 0.0)


def _logprob_value(entry: Any) -> float:
    """A log-prob from one vLLM ``Logprob`` record (or a bare float, as some versions give)."""
    value = getattr(entry, "logprob", entry)
    return float(value)


def completion_to_generation(completion: Any, stop_ids: Iterable[int], top_logprobs: int = 0) -> Generation:
    """Turn one vLLM ``CompletionOutput`` into a :class:`Generation` that meets the policy contract.

    vLLM (V0 and V1 alike) keeps the token that ended the turn (EOS or a stop token id) in
    ``token_ids`` and only leaves it out of ``text``; that is what trainers need. Should a version leave
    it out of ``token_ids`` but still report its log-prob entry, it is restored from that entry; if it
    cannot be restored, this raises rather than return a turn that silently lacks its end token (a
    trainer would then never learn to stop).

    vLLM checks the length limit before the stop tokens, so a turn whose last allowed token is the end
    token comes back as ``length``; HFPolicy calls that ``stop``, and so does this.

    Args:
        completion: A ``vllm.outputs.CompletionOutput`` (or any object with ``text``, ``token_ids``,
            ``logprobs``, ``finish_reason`` and ``stop_reason``), requested with ``logprobs >= 0``.
        stop_ids: Token ids that end a turn.
        top_logprobs: Fill ``Generation.top_logprobs`` with the k best log-probs per position (plus the
            sampled token's when it is not among them); needs ``logprobs >= k`` in the request.

    Raises:
        AgentGymError: If the log-probs are missing or do not line up with the tokens.
    """
    stops = set(stop_ids)
    ids = [int(t) for t in completion.token_ids]
    entries = list(completion.logprobs) if completion.logprobs is not None else None
    if entries is None:
        raise AgentGymError(
            "vLLM returned no log-probs; VLLMPolicy must request SamplingParams(logprobs=K). "
            "This is a bug in VLLMPolicy, please report it."
        )
    finish = completion.finish_reason
    stop_reason = getattr(completion, "stop_reason", None)
    ended_on_token = finish == "stop" and (stop_reason is None or isinstance(stop_reason, int))
    if ended_on_token and (not ids or ids[-1] not in stops):
        last = entries[-1] if len(entries) == len(ids) + 1 else None
        if last is not None and isinstance(stop_reason, int) and stop_reason in last:
            ids.append(stop_reason)
        elif last is not None and any(t in stops for t in last):
            ids.append(max((t for t in last if t in stops), key=lambda t: _logprob_value(last[t])))
        else:
            raise AgentGymError(
                f"vLLM stopped a turn on an end token (stop_reason={stop_reason!r}) but returned neither the "
                f"token (last ids {ids[-3:]}) nor its log-prob, so the turn cannot be recorded exactly. "
                f"End-token ids known to VLLMPolicy: {sorted(stops)}; check that the engine and "
                "policy.tokenizer are the same model's."
            )
    if len(entries) != len(ids):
        raise AgentGymError(
            f"vLLM returned {len(ids)} tokens but {len(entries)} log-prob entries (finish_reason="
            f"{finish!r}, stop_reason={stop_reason!r}); VLLMPolicy cannot line them up with this vLLM "
            "version. Use a vLLM release the policy was written for (see agentgym/policies/vllm.py)."
        )
    logprobs: list[float] = []
    entropies: list[float] = []
    top: list[tuple[float, ...]] = []
    top_ids: list[tuple[int, ...]] = []
    for pos, (token, entry) in enumerate(zip(ids, entries)):
        if entry is None or token not in entry:
            raise AgentGymError(
                f"vLLM gave no log-prob for sampled token {token} at position {pos}; it should always "
                "include the sampled token. Check the vLLM version."
            )
        logprobs.append(_logprob_value(entry[token]))
        entropies.append(entropy_from_top_logprobs(_logprob_value(v) for v in entry.values()))
        if top_logprobs:
            ranked = sorted(entry, key=lambda t: _logprob_value(entry[t]), reverse=True)[:top_logprobs]
            if token not in ranked:
                ranked.append(token)  # the sampled token's entry follows the k best (vLLM's convention)
            top.append(tuple(_logprob_value(entry[t]) for t in ranked))
            top_ids.append(tuple(int(t) for t in ranked))
    stopped = finish == "stop" or (bool(ids) and ids[-1] in stops)
    return Generation(
        text=completion.text,
        token_ids=tuple(ids),
        logprobs=tuple(logprobs),
        entropies=tuple(entropies),
        finish_reason="stop" if stopped else "length",
        top_logprobs=tuple(top) if top_logprobs else None,
        top_token_ids=tuple(top_ids) if top_logprobs else None,
    )


def _named_tensors(weights: Any) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` pairs from a torch module, a state dict, or pairs already.

    Names must be the Hugging Face checkpoint names (``model.layers.0.self_attn.q_proj.weight``): vLLM's
    ``load_weights`` maps them onto its fused layers (qkv, gate-up) itself. Tensors are detached so that
    no autograd graph is kept alive by the engine.
    """
    if hasattr(weights, "state_dict") and callable(weights.state_dict):
        weights = weights.state_dict()
    if isinstance(weights, Mapping):
        items: Iterable[Any] = weights.items()
    elif isinstance(weights, Iterable) and not isinstance(weights, (str, bytes)):
        items = weights
    else:
        raise ConfigError(
            "load_weights takes a torch model, a state dict or (name, tensor) pairs; got "
            f"{type(weights).__name__!r}."
        )
    for item in items:
        try:
            name, tensor = item
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                "load_weights takes a torch model, a state dict or (name, tensor) pairs; got an item "
                f"{type(item).__name__!r} that is not a (name, tensor) pair."
            ) from exc
        detach = getattr(tensor, "detach", None)
        yield str(name), (detach() if callable(detach) else tensor)


class VLLMPolicy(InProcessTokenPolicy):
    """A vLLM engine sampled in-process on a GPU, returning token ids, log-probs and entropies.

    Args:
        model_dir: A local Hugging Face model directory (``config.json``, weights, tokenizer), e.g. one
            written by :func:`agentgym.models.build_tiny_model` or a trainer checkpoint, or a Hub id
            (``org/name[@revision]``) in the local Hugging Face cache. Nothing is downloaded.
        tokenizer: The tokenizer the :class:`~agentgym.agent.ChatAgent` uses to build prompt ids: a
            loaded Hugging Face tokenizer (it must be the model's own), or a directory to load it from
            (vLLM then uses that directory too). Default: the tokenizer in ``model_dir``.
        gpu_memory_utilization: Fraction of the GPU vLLM may take for weights and KV cache; the default
            0.5 leaves the other half to a trainer on the same GPU.
        max_model_len: Longest prompt plus turn the engine accepts (default: the model's context).
        dtype: vLLM dtype (``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``). vLLM's ``"auto"``
            runs float32 checkpoints in half precision; pass ``"float32"`` to match a float32 trainer.
        seed: Engine seed (requests without a seed of their own draw from it).
        enforce_eager: Skip CUDA-graph capture: faster start-up and less memory, slower decoding.
        name: Shown in eval tables and stored in trajectories (default: the directory name).
        max_batch_size: Most requests per :meth:`act` call and most sequences vLLM schedules at once.
        entropy_top_k: How many top log-probs vLLM returns per step for the entropy estimate (see the
            module docstring: more is a tighter lower bound, at some speed cost).

    Raises:
        ConfigError: If an argument is out of range or ``model_dir`` is not a model directory.
        DependencyNotInstalled: If vLLM is not installed (``pip install 'agentgym[vllm]'``).
        AgentGymError: If no CUDA GPU is visible, or vLLM cannot load the model.
    """

    max_concurrency: int = 1

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer: Any = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        dtype: Any = "auto",
        seed: int = 0,
        enforce_eager: bool = True,
        name: str | None = None,
        max_batch_size: int = 256,
        entropy_top_k: int = 20,
    ) -> None:
        if not isinstance(gpu_memory_utilization, (int, float)) or not 0 < gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}; it is the "
                "fraction of GPU memory vLLM may use."
            )
        if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 1):
            raise ConfigError(f"max_model_len must be a positive integer or None, got {max_model_len!r}.")
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}.")
        if not isinstance(entropy_top_k, int) or isinstance(entropy_top_k, bool) or entropy_top_k < 1:
            raise ConfigError(
                f"entropy_top_k must be a positive integer, got {entropy_top_k!r}; it is how many top "
                "log-probs per step the entropy estimate uses (20 is vLLM's default maximum)."
            )

        vllm = _import_vllm()
        self._vllm = vllm

        from agentgym.models.loading import is_hub_id, resolve_model_dir

        directory = resolve_model_dir(model_dir)  # a local directory, or a Hub id's snapshot in the local cache
        torch = self._require_cuda()
        self._torch = torch

        tokenizer_dir: str | None = None
        if tokenizer is None or isinstance(tokenizer, (str, Path)):
            tokenizer_dir = str(tokenizer) if tokenizer is not None else None
            tokenizer = self._load_tokenizer(Path(tokenizer_dir) if tokenizer_dir else directory)
        self.tokenizer = tokenizer
        self.model_dir = directory
        from_hub = is_hub_id(model_dir) and not Path(str(model_dir)).expanduser().is_dir()
        self.name = name or (str(model_dir) if from_hub else directory.name)  # a snapshot's name is a commit hash
        from agentgym.policies.rollout_defaults import load_rollout_defaults

        self.default_system_prompt = load_rollout_defaults(directory).get("system_prompt")
        self.max_batch_size = max_batch_size
        self.max_concurrency = 1
        self.entropy_top_k = entropy_top_k
        self._stop_ids = self._find_stop_ids(directory, tokenizer)
        self._lock = threading.Lock()

        engine_kwargs: dict[str, Any] = {
            "model": str(directory),
            "tokenizer": tokenizer_dir,
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "max_model_len": max_model_len,
            "dtype": dtype,
            "seed": seed,
            "enforce_eager": enforce_eager,
            "max_num_seqs": max_batch_size,
            # Log-probs after temperature scaling, which is what trainers recompute (module docstring).
            "logprobs_mode": "processed_logprobs",
            "max_logprobs": max(entropy_top_k, 20),
        }
        try:
            self.llm = vllm.LLM(**engine_kwargs)
        except TypeError as exc:
            if "logprobs_mode" in str(exc):
                raise AgentGymError(
                    f"vLLM {_vllm_version(vllm)} has no logprobs_mode, so it can only return log-probs of "
                    f"the raw logits (before temperature). VLLMPolicy needs vLLM >= {_MIN_VLLM}: "
                    "pip install -U 'agentgym[vllm]'."
                ) from exc
            raise
        except Exception as exc:  # vLLM raises many types; add what was being loaded and how to fix it
            raise AgentGymError(
                f"vLLM {_vllm_version(vllm)} could not load {str(directory)!r}: {exc}. Check that vLLM "
                "supports the model's architecture, and lower gpu_memory_utilization or max_model_len if "
                "the GPU ran out of memory."
            ) from exc

    # ---- set-up helpers --------------------------------------------------------------------------
    @staticmethod
    def _require_cuda() -> Any:
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - vLLM depends on torch
            raise DependencyNotInstalled("torch", "vllm", "VLLMPolicy") from exc
        if not torch.cuda.is_available():
            raise AgentGymError(
                "VLLMPolicy needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False). "
                "On a CPU machine use HFPolicy (policy spec hf:MODEL_DIR) instead."
            )
        return torch

    @staticmethod
    def _load_tokenizer(directory: Path) -> Any:
        try:
            import transformers
        except ImportError as exc:  # pragma: no cover - vLLM depends on transformers
            raise DependencyNotInstalled("transformers", "vllm", "VLLMPolicy") from exc
        return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)

    @staticmethod
    def _find_stop_ids(directory: Path, tokenizer: Any) -> list[int]:
        """The same end-of-turn ids as HFPolicy: tokenizer EOS, ``<|im_end|>``, generation-config EOS.

        They are passed to vLLM as ``stop_token_ids`` explicitly rather than left to vLLM's reading of
        ``generation_config.json``, so both policies stop on exactly the same tokens.
        """
        generation_config = None
        if (directory / "generation_config.json").is_file():
            import transformers

            generation_config = transformers.GenerationConfig.from_pretrained(directory, local_files_only=True)
        return HFPolicy._find_stop_ids(tokenizer, SimpleNamespace(generation_config=generation_config))

    # ---- Policy API (act() and prompt_ids() come from InProcessTokenPolicy) -------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams] | SamplingParams,
    ) -> list[Generation]:
        """Continue each prompt; the synchronous core of :meth:`act`, also used directly by trainers.

        Same semantics as :meth:`HFPolicy.generate <agentgym.policies.hf.HFPolicy.generate>`: per-row
        temperature (0 = greedy), top-p, ``max_tokens`` and stop strings (the text is cut right after
        the stop string and keeps it; ``token_ids`` keep the whole last token). The batch is handed to
        vLLM in one call, which schedules it with continuous batching.

        Args:
            prompts: Prompt token ids, one sequence per row (each non-empty).
            sampling: One :class:`SamplingParams` for all rows or one per row.

        Returns:
            One :class:`Generation` per prompt, in order.

        Raises:
            ConfigError: If a prompt is empty or the number of sampling params does not match.
            AgentGymError: If the policy was closed.
        """
        llm = self.llm
        if llm is None:
            raise AgentGymError("This VLLMPolicy was closed; create a new one (VLLMPolicy(model_dir)).")
        rows, params = self.check_generate_inputs(prompts, sampling)
        if any(p.choices for p in params):
            raise ConfigError("VLLMPolicy cannot decode under SamplingParams.choices yet (vLLM's guided choice "
                              "allows any tokenisation of a choice and reports unconstrained log-probs); use "
                              "HFPolicy, or sample free text (no choices, constrain_actions off).")
        if not rows:
            return []
        seeds = row_seeds([p.seed for p in params])
        vllm_params = [self._sampling_params(p, s) for p, s in zip(params, seeds)]
        # A TokensPrompt is a TypedDict: this dict is exactly what vllm.inputs.TokensPrompt builds.
        inputs = [{"prompt_token_ids": row} for row in rows]
        with self._lock:
            outputs = llm.generate(inputs, sampling_params=vllm_params, use_tqdm=False)
        return [completion_to_generation(out.outputs[0], self._stop_ids, p.top_logprobs)
                for out, p in zip(outputs, params)]

    def _sampling_params(self, params: SamplingParams, seed: int | None) -> Any:
        limit = max(self.entropy_top_k, 20)
        if params.top_logprobs > limit:
            raise ConfigError(f"SamplingParams.top_logprobs={params.top_logprobs} exceeds the {limit} log-probs this vLLM "
                              f"engine returns per step; lower it or create the policy with entropy_top_k>={params.top_logprobs}.")
        return self._vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=list(self._stop_ids),
            seed=seed,
            logprobs=max(self.entropy_top_k, params.top_logprobs),
            # Keep the stop string in the text (the contract), and drop special tokens from it, as
            # HFPolicy's decode(skip_special_tokens=True) does.
            include_stop_str_in_output=True,
            skip_special_tokens=True,
        )

    # ---- weight sync -----------------------------------------------------------------------------
    def load_weights(self, weights: Any) -> None:
        """Copy new weights from the trainer into the engine, then drop the KV prefix cache.

        Called after every optimizer step so that the next rollout samples from the updated policy.
        The prefix cache must go too: cached prompt KV was computed by the old weights, and reusing it
        would mix two policies in one turn.

        Ways tried, newest first (the first that works is used; vLLM's ``load_weights`` copies each
        tensor into its own parameter, so a half-finished earlier attempt is simply overwritten):

        1. ``LLM.apply_model(lambda model: model.load_weights(weights))``: the documented API of
           current vLLM (v0.32 docs; present since 0.8). In-process it is a direct call; with the
           engine core in another process it needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.
        2. ``LLM.collective_rpc(fn)`` with ``fn(worker)`` loading into ``worker.get_model()``: what
           ``apply_model`` does, for releases that had the RPC but not the helper.
        3. The model object reached through the engine's attributes
           (``llm_engine.model_executor.driver_worker[.worker].model_runner.model``), the path older
           RL code used; works only in-process.

        Args:
            weights: A torch model (its ``state_dict()`` is used), a state dict, or ``(name, tensor)``
                pairs, with Hugging Face parameter names. Tensors may be on any device; vLLM copies
                them into its own parameters (casting to the engine dtype).

        Raises:
            AgentGymError: If the policy was closed or no way of loading works with this vLLM version.
            ConfigError: If ``weights`` is not one of the accepted forms.
        """
        llm = self.llm
        if llm is None:
            raise AgentGymError("This VLLMPolicy was closed; create a new one before loading weights.")
        named = list(_named_tensors(weights))
        if not named:
            raise ConfigError("load_weights got no tensors; pass the trainer's model or its state_dict().")

        def load_into(model: Any) -> int:
            loaded = model.load_weights(weights=iter(named))
            # Recent vLLM returns the names it loaded; report only the count (cheap to send back).
            return len(loaded) if isinstance(loaded, (set, list, tuple)) else -1

        attempts: list[tuple[str, Callable[[], Any]]] = []
        apply_model = getattr(llm, "apply_model", None)
        if callable(apply_model):
            attempts.append(("LLM.apply_model", lambda: apply_model(load_into)))
        collective_rpc = getattr(llm, "collective_rpc", None)
        if callable(collective_rpc):
            attempts.append(
                ("LLM.collective_rpc", lambda: collective_rpc(lambda worker: load_into(worker.get_model())))
            )
        attempts.append(("engine attributes", lambda: [load_into(self._find_local_model(llm))]))

        errors: list[str] = []
        with self._lock:
            for label, attempt in attempts:
                try:
                    counts = attempt()
                except Exception as exc:  # try the next way; all failures are reported together below
                    errors.append(f"{label}: {type(exc).__name__}: {exc}")
                    logger.debug("VLLMPolicy.load_weights: %s failed", label, exc_info=True)
                    continue
                if isinstance(counts, list) and any(c == 0 for c in counts):
                    raise AgentGymError(
                        f"vLLM loaded none of the {len(named)} tensors given (names such as "
                        f"{named[0][0]!r}). Pass Hugging Face parameter names, e.g. the unwrapped "
                        "model's state_dict() (not a DDP/FSDP/PEFT wrapper's)."
                    )
                self._reset_prefix_cache(llm)
                return
        raise AgentGymError(
            f"Could not load weights into vLLM {_vllm_version(self._vllm)}; tried: " + "; ".join(errors)
            + ". If the engine core runs in another process, set VLLM_ALLOW_INSECURE_SERIALIZATION=1 or "
            f"VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating the policy; otherwise use vLLM >= {_MIN_VLLM}."
        )

    @staticmethod
    def _find_local_model(llm: Any) -> Any:
        """The torch model inside an in-process engine, through the attribute paths vLLM has used."""
        engine = getattr(llm, "llm_engine", None)
        executors = [
            getattr(engine, "model_executor", None),  # V0, and V1 releases that expose it
            getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None), "model_executor", None),
        ]
        for executor in executors:
            worker = getattr(executor, "driver_worker", None)
            worker = getattr(worker, "worker", None) or worker  # V1 wraps the worker in WorkerWrapperBase
            runner = getattr(worker, "model_runner", None)
            model = getattr(runner, "model", None)
            if model is not None and hasattr(model, "load_weights"):
                return model
        raise AgentGymError("no in-process model found (is the engine core running in another process?)")

    @staticmethod
    def _reset_prefix_cache(llm: Any) -> None:
        reset = getattr(llm, "reset_prefix_cache", None)
        if not callable(reset):
            logger.warning("This vLLM has no LLM.reset_prefix_cache(); cached prompt KV may predate the new weights.")
            return
        if reset() is False:
            logger.warning(
                "vLLM did not reset its prefix cache (requests were still running); cached prompt KV may "
                "predate the new weights."
            )

    def close(self) -> None:
        """Shut the engine down and free its GPU memory, so a trainer or a new engine can use it."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine_core, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:  # closing is best effort; the memory is freed below either way
                logger.debug("VLLMPolicy.close: engine shutdown failed", exc_info=True)
        del llm, engine_core, shutdown
        gc.collect()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:  # pragma: no cover - moved in some vLLM versions
            cleanup_dist_env_and_memory = None
        if cleanup_dist_env_and_memory is not None:
            cleanup_dist_env_and_memory()
        elif self._torch.cuda.is_available():  # pragma: no cover
            self._torch.cuda.empty_cache()
