"""The fields and checks every trainer's config shares: :class:`TrainerConfig`, its type checks and YAML mapping.

Each method's config subclasses it in a module of its own (:mod:`agentgym.trainers.grpo_config` and the ones built
on it); :mod:`agentgym.trainers.config` reads config files and names every class. Every field has a docstring;
``__post_init__`` checks each value and the combinations that cannot work, and every message names the field and
the fix. ``from_dict`` rejects unknown keys with a 'did you mean'.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import typing
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, get_origin

from agentgym.errors import ConfigError, did_you_mean
from agentgym.trajectory import TURN_KINDS

if TYPE_CHECKING:
    from agentgym.suite import TaskSuite

__all__ = ["RENAMED_FIELDS", "TURN_KINDS", "TrainerConfig"]


@dataclass(frozen=True)
class TrainerConfig:
    """Fields and checks every trainer shares: model, suites, sampling, evaluation, checkpoints, BC warm start.

    Subclasses add their algorithm's fields (and may redeclare a shared field to change its default), extend
    ``__post_init__`` with ``super().__post_init__()`` first, and name their trainer in ``trainer_name``.
    """

    model: str
    """Model to start from: a Hugging Face model directory, a Hub id in the local Hugging Face cache, or
    ``tiny:<suite>``, the built-in tiny model with a tokenizer trained on that suite's text (built and cached on
    first use)."""
    suite: str
    """Task suite name (``agentgym list``) or path to a suite YAML; trains on ``train_split``."""
    output_dir: str = "runs/train"
    """Where checkpoints, metrics (JSONL + TensorBoard), the learning curve and the final model go."""
    steps: int = 50
    """Training steps; each samples ``tasks_per_step x group_size`` episodes with the current policy, then learns."""
    tasks_per_step: int = 16
    """Distinct training tasks per step (read in a seeded order, a new permutation per pass over the split)."""
    group_size: int = 8
    """Episodes per task and step (G): group methods compare them; 1 for methods that need no group."""
    learning_rate: float = 3e-4
    """AdamW learning rate of the policy after warm-up (typical: 1e-6 for 7B models, 3e-4 for the tiny model)."""
    warmup_steps: int = 10
    """Linear learning-rate warm-up, in optimizer steps (a fresh optimizer at full lr can wreck a warm start)."""
    weight_decay: float = 0.0
    """AdamW weight decay of the policy."""
    max_staleness: int = 0
    """Asynchronous training: 0 samples each step with the current weights, then learns (synchronous); k >= 1
    generates the next steps' episodes in a background worker while the current step trains, each step starting
    at most k updates behind (1: one-step-off). The update corrects for the lag (``off_policy_correction``)."""
    async_worker: Literal["thread", "process"] = "thread"
    """Where asynchronous rollouts (``max_staleness`` >= 1) are generated: a thread of the trainer's process (starts
    at once; best when env latency and torch kernels, which release the GIL, dominate, and the only choice with vLLM
    or Ray envs, which run out of process anyway), or a process of its own (``forkserver``: envs, engine and an HF copy of
    the model; no GIL shared with the trainer, a few seconds to start). See :mod:`agentgym.trainers.async_rollouts`."""
    env_backend: Literal["local", "ray"] = "local"
    """Where rollout envs run: in this process, or as Ray actors across the cluster this process reaches
    (``RAY_ADDRESS``; ``pip install 'agentgym[ray]'``), the policy staying here."""
    generation_backend: Literal["hf", "vllm"] = "hf"
    """Who samples rollouts: the training model itself through HF (CPU or GPU), or an in-process vLLM engine
    (GPU only, ``agentgym[vllm]``) whose weights are synced from the trained model after every update."""
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """How ranks share the policy under ``torchrun`` (no effect in one process): ``ddp`` replicates it on every rank
    and sums gradients; ``fsdp`` shards weights, gradients and optimizer states across ranks (FSDP2 ``fully_shard``
    per decoder layer) for models whose training state does not fit one device: the same update, gathered to full
    weights on each rank only to sample. GRPO, GiGPO and ARPO; HF generation."""
    train_split: str = "train"
    """Split of ``suite`` to train on."""
    eval_suite: str | None = None
    """Suite holding the held-out split (``None``: ``suite``), e.g. code-test for a code-train run."""
    eval_split: str = "test"
    """Held-out split used for evaluation (must differ from the training split unless eval_suite is set)."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for every env of the run (training, evaluation, BC demonstrations), on top of the suite's
    own ``env_kwargs``: e.g. ``{reward: gym-sokoban}`` trains Sokoban on gym-sokoban's shaped reward. Names the
    env does not take are rejected before any rollout."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 disables clipping)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (log-probs are computed at the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass for training rollouts."""
    max_tokens_per_turn: int = 48
    """Most tokens sampled per turn."""
    max_context_tokens: int | None = 2048
    """Episodes whose context would exceed this end with context_limit, a truncation (None: no limit). With a
    rewriting ``context`` strategy it bounds each segment."""
    context: Mapping[str, Any] | None = None
    """How rollouts keep a growing conversation: ``{strategy: window, keep_turns: 4}``, ``drop_tool_outputs``,
    ``summarize`` or ``package.module:function`` (fields of ``agentgym.rollout.context.ContextConfig``); ``null``:
    the whole history (``full``). A rewrite starts a new segment; its rows train with the episode's advantage. The
    BC warm start's demonstrations are rewritten the same way, so the policy clones actions in these contexts."""
    max_turn_tokens: int | None = None
    """An action that uses this many tokens is cut and ends its episode with turn_token_limit (None: no limit)."""
    max_episode_tokens: int | None = None
    """Tokens an episode may sample over all its segments; then it ends with episode_token_limit (None: no limit)."""
    constrain_actions: bool = False
    """Decode every reply as one of the env's valid actions (``action_choices()``: BabyAI, Sokoban, Maze), in
    training and evaluation rollouts alike: no turn is void, and the tokens a choice forces (``()``, ``_left``
    after ``turn`` when only turn_left() fits) are not trained, so policy-gradient noise cannot break the format.
    HF generation, on-policy trainers (GRPO, GiGPO, ARPO)."""
    system_prompt: str | None = None
    """Replaces the env's instructions as the system prompt; '' sends none (short prompts train faster)."""
    eval_every: int = 10
    """Evaluate on the held-out split every N steps or iterations (and before the first and after the last)."""
    eval_tasks: int = 100
    """Held-out tasks per evaluation."""
    eval_temperature: float = 0.0
    """Sampling temperature at evaluation (0 = greedy)."""
    checkpoint_every: int = 10
    """Save a checkpoint every N steps or iterations (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    save_rollouts: int = 0
    """Keep every N-th step's training episodes (0: none) in ``rollouts/step-NNNNNN.jsonl``, the format of eval's
    trajectories.jsonl, with a ``.tokens.jsonl`` sidecar of per-token loss mask, log-prob and advantage, so
    ``agentgym view OUTPUT_DIR`` shows what the policy did while it trained."""
    seed: int = 0
    """Seeds task order, sampling and initialisation: the same config gives the same run."""
    warmstart: Literal["none", "bc"] = "none"
    """Behaviour cloning on demonstrations before training."""
    bc_demos: int = 200
    """Demonstrations for BC, from the train split's reference solver."""
    bc_shortcut_fraction: float = 0.0
    """Fraction of BC demonstrations taken from the env's shortcut solver (imperfect demonstrations)."""
    bc_steps: int = 300
    """BC optimizer steps."""
    bc_learning_rate: float = 1e-3
    """BC learning rate."""
    bc_batch_size: int = 32
    """BC sequences per step."""
    max_in_flight: int = 256
    """Episodes the rollout engine runs at once."""
    reward: Literal["env", "rubric"] = "env"
    """What an episode is worth: ``env`` (the env's checker) or ``rubric`` (the ``rubric`` below, with its judge)."""
    rubric: str | None = None
    """With ``reward: rubric``: ``module:name`` or ``path/to/file.py:name`` naming the Rubric."""
    judge: str | None = None
    """With ``reward: rubric``: the judge policy (``openai:BASE_URL#MODEL``, ``hf:MODEL``, or ``scripted-naive``,
    a scripted stand-in); ``null`` uses the rubric's own judge."""
    judge_mode: Literal["independent", "group"] = "independent"
    """``independent``: one judge call per episode and criterion; ``group``: one per task group, scoring its
    ``group_size`` episodes relative to each other (RULER-style)."""
    judge_verdict_format: Literal["line", "json"] = "line"
    """How the ``judge`` policy answers: ``line`` (a closing ``VERDICT: x`` line, any policy) or ``json`` (a JSON
    object decoded under a schema constraint, so a small judge model always gives a verdict in the scale)."""
    device: str = "cpu"
    """Torch device for training and generation."""
    cpu_threads: int | None = None
    """Torch threads of this process on a CPU (None: chosen for the machine: the free cores, one per process when
    other work keeps them busy; ``AGENTGYM_CPU_THREADS`` and an explicit ``OMP_NUM_THREADS`` win over this)."""
    tensorboard: bool = True
    """Also write TensorBoard event files (metrics always go to metrics.jsonl)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Precision the model is loaded and trained in (auto: the dtype its config.json names). bfloat16 halves the
    memory of weights and activations (CPU and GPU); log-probs are still computed in float32 from the logits."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """``bf16``: the weights and the optimizer stay float32 (``dtype: float32``), the policy's training forwards run
    under ``torch.autocast`` in bfloat16, and HF sampling runs on a bfloat16 copy of the weights refreshed after every
    update (see :mod:`agentgym.trainers.precision`). On hardware with fast bfloat16 products (AVX512-BF16 or AMX CPUs,
    recent GPUs) an update and sampling take less time; sampled log-probs then differ a little from the update's
    float32-weight forward (``train/logprob_mismatch``). Unlike ``dtype: bfloat16``, small updates are not lost to the
    weights' rounding. ``no``: float32 throughout."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    """Attention kernel (None: transformers' default, sdpa where the model supports it); flash_attention_2 needs
    a CUDA GPU and the flash_attn package."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (non-reentrant): much less memory for about 30% more time."""
    lora: Mapping[str, Any] | None = None
    """Train LoRA adapters instead of all weights: ``{r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}``
    (missing keys take these defaults; ``{}`` means all defaults). The final ``model/`` is the merged model and
    ``adapter/`` holds the adapter alone. GRPO and ARPO only for now. None: full fine-tuning."""
    load_in_4bit: bool = False
    """QLoRA: load the frozen base in 4-bit NF4 (bitsandbytes, CUDA only) and train LoRA adapters on it (needs lora)."""

    # ---- experiment tracking and progress (see agentgym.trainers.metrics and agentgym.utils.progress) ----------
    loggers: tuple[str, ...] = ()
    """Experiment trackers beside metrics.jsonl and TensorBoard: 'wandb' and/or 'mlflow' (pip install
    'agentgym[tracking]'; WANDB_MODE=offline logs to W&B without an account)."""
    tracking_project: str | None = None
    """W&B project / MLflow experiment the run is logged to (None: 'agentgym')."""
    tracking_uri: str | None = None
    """MLflow tracking URI, e.g. http://localhost:5000 or sqlite:///mlflow.db (None: MLflow's default)."""
    progress: bool | Literal["auto"] = "auto"
    """Progress bar over training steps (rate, ETA): 'auto' draws it when stderr is a terminal (the rollout and
    BC bars inside follow 'auto' too; AGENTGYM_PROGRESS=0 turns every bar off, =1 on)."""

    trainer_name: ClassVar[str] = "train"
    """The ``trainer:`` key of a config file that selects this class."""
    display_name: ClassVar[str] = "training"
    """How the CLI and logs name the method (GRPO, GiGPO, ARPO, ArCHer, filtered BC)."""
    trainer_class: ClassVar[str] = ""
    """``module:Class`` of the trainer this config runs (:func:`agentgym.trainers.make_trainer` imports it)."""
    trains_on_token_views: ClassVar[bool] = True
    """Whether the loss reads each trajectory's token view (whose loss mask leaves out forced tokens); trainers
    that rebuild turns into their own transitions (ArCHer, filtered BC) cannot take ``constrain_actions`` yet."""

    def __post_init__(self) -> None:
        self._check_types()
        for name in ("steps", "tasks_per_step", "group_size", "max_tokens_per_turn", "eval_tasks", "keep_checkpoints",
                     "bc_demos", "bc_steps", "bc_batch_size", "max_in_flight"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
        for name in ("eval_every", "checkpoint_every", "save_rollouts"):
            if getattr(self, name) < 0:
                raise self._fail(name, f"must be >= 0, got {getattr(self, name)}.")
        if self.warmup_steps < 0:
            raise self._fail("warmup_steps", f"must be >= 0, got {self.warmup_steps}.")
        if not self.learning_rate > 0:
            raise self._fail("learning_rate", f"must be > 0 (typical: 1e-6 for 7B models, 3e-4 for the tiny model), "
                                              f"got {self.learning_rate}.")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise self._fail("cpu_threads", f"must be >= 1 (or null: chosen for the machine), got {self.cpu_threads}.")
        if self.max_staleness < 0:
            raise self._fail("max_staleness", f"must be >= 0 (0: synchronous, 1: one-step-off), got {self.max_staleness}.")
        if self.max_staleness and self.async_worker == "process" and self.generation_backend != "hf":
            raise self._fail("async_worker", "'process' runs an HF copy of the model in the worker; vLLM already runs "
                                             "its engine out of the trainer's process: use async_worker: thread.")
        if self.max_staleness and self.async_worker == "process" and self.env_backend != "local":
            raise self._fail("async_worker", "'process' would start its own Ray runtime in the worker; Ray envs already "
                                             "run out of the trainer's process: use async_worker: thread.")
        if self.weight_decay < 0:
            raise self._fail("weight_decay", f"must be >= 0, got {self.weight_decay}.")
        if self.generation_backend == "vllm" and not self.device.startswith("cuda"):
            raise self._fail("generation_backend", "'vllm' needs a CUDA GPU: set device: cuda, or use generation_backend: hf.")
        if self.mixed_precision != "no" and self.dtype != "float32":
            raise self._fail("mixed_precision", f"keeps float32 master weights, but dtype is {self.dtype!r}: set dtype: "
                                                "float32 (mixed_precision: bf16 still computes in bfloat16), or "
                                                "mixed_precision: no to train in that dtype throughout.")
        if self.mixed_precision != "no" and self.parallelism == "fsdp":
            raise self._fail("mixed_precision", "is not supported with parallelism: fsdp yet (its sampling copy "
                                                "would need the gathered weights on every rank): use parallelism: ddp, "
                                                "or mixed_precision: no.")
        if self.parallelism == "fsdp" and self.generation_backend != "hf":
            raise self._fail("parallelism", "'fsdp' samples with the trained model gathered on each rank (HF); "
                                            "syncing sharded weights into vLLM is not supported yet: use "
                                            "generation_backend: hf, or parallelism: ddp with vLLM.")
        if self.parallelism == "fsdp" and self.load_in_4bit:
            raise self._fail("parallelism", "'fsdp' cannot shard a 4-bit (bitsandbytes) base: use parallelism: ddp for "
                                            "QLoRA, or load_in_4bit: false (dtype: bfloat16 also halves the memory).")
        if self.generation_backend == "vllm" and self.load_in_4bit:
            raise self._fail("load_in_4bit", "with generation_backend: vllm the trained weights are synced into vLLM "
                                             "after every update, which a 4-bit base cannot give: use "
                                             "generation_backend: hf, or LoRA without load_in_4bit.")
        if self.constrain_actions and self.generation_backend != "hf":
            raise self._fail("constrain_actions", "decodes inside the env's action choices with HF generation only; "
                                                  "use generation_backend: hf, or constrain_actions: false.")
        if self.constrain_actions and not self.trains_on_token_views:
            raise self._fail("constrain_actions", f"is not supported by {self.display_name} yet (it rebuilds turns into "
                                                  "its own transitions); use GRPO, GiGPO or ARPO, or constrain_actions: false.")
        if self.reward == "rubric" and not self.rubric:
            raise self._fail("rubric", "reward: rubric needs rubric: module:name naming the Rubric to score with.")
        if self.reward != "rubric" and (self.rubric or self.judge):
            raise self._fail("reward", f"rubric/judge are set but reward is {self.reward!r}: set reward: rubric to "
                                       "use them.")
        if not self.bc_learning_rate > 0:
            raise self._fail("bc_learning_rate", f"must be > 0 (typical: 1e-3), got {self.bc_learning_rate}.")
        if self.temperature <= 0:
            raise self._fail("temperature", "training rollouts need sampling: use a temperature > 0 (typical 1.0).")
        if not 0 < self.top_p <= 1:
            raise self._fail("top_p", f"must be in (0, 1], got {self.top_p}.")
        if self.eval_temperature < 0:
            raise self._fail("eval_temperature", "must be >= 0 (0 = greedy).")
        if self.max_grad_norm < 0:
            raise self._fail("max_grad_norm", "must be >= 0 (0 disables clipping).")
        if self.max_context_tokens is not None and self.max_context_tokens <= self.max_tokens_per_turn:
            raise self._fail("max_context_tokens", "must exceed max_tokens_per_turn, or no turn fits.")
        from agentgym.rollout.context import ContextConfig  # the rollout layer owns the strategies' settings

        ContextConfig.coerce(self.context)
        for name in ("max_turn_tokens", "max_episode_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise self._fail(name, f"must be a positive number of tokens or null (no limit), got {value}.")
        if not 0 <= self.bc_shortcut_fraction <= 1:
            raise self._fail("bc_shortcut_fraction", f"must be in [0, 1], got {self.bc_shortcut_fraction}.")
        from agentgym.trainers.metrics import check_loggers

        try:
            check_loggers(self.loggers)
        except ConfigError as exc:
            raise self._fail("loggers", str(exc)) from None
        self._check_loading_fields()
        if self.train_split == self.eval_split and self.eval_suite in (None, self.suite):
            raise self._fail("eval_split", f"equals train_split ({self.train_split!r}) on the same suite: evaluate on "
                                           "held-out tasks (another split, or another suite via eval_suite).")

    def _check_loading_fields(self) -> None:
        """Precision, attention, LoRA and 4-bit: the combinations that cannot work, without touching the disk."""
        from agentgym.models.loading import lora_settings

        on_cuda = self.device.startswith("cuda")
        if self.lora is not None:
            try:
                lora_settings(self.lora)
            except ConfigError as exc:
                raise self._fail("lora", str(exc)) from exc
        if self.attn_implementation == "flash_attention_2" and not on_cuda:
            raise self._fail("attn_implementation", "flash_attention_2 needs a CUDA GPU (device: cuda) and the "
                                                    "flash_attn package; on a CPU use sdpa (or leave it null).")
        if self.load_in_4bit:
            if self.lora is None:
                raise self._fail("load_in_4bit", "QLoRA trains LoRA adapters on a frozen 4-bit base, so it needs lora: "
                                                 "set lora: {r: 16, alpha: 32} too, or load_in_4bit: false.")
            if not on_cuda:
                raise self._fail("load_in_4bit", "4-bit loading (bitsandbytes) needs a CUDA GPU: set device: cuda, or "
                                                 "load_in_4bit: false on a CPU (dtype: bfloat16 also saves memory).")

    def load_options(self) -> Any:
        """The :class:`agentgym.models.loading.LoadOptions` these fields describe."""
        from agentgym.models.loading import LoadOptions

        return LoadOptions.from_config(self)

    def check_runtime(self) -> None:
        """Fail with the fix when this machine cannot honour the loading fields (CUDA, flash_attn, bitsandbytes)."""
        from agentgym.models.loading import check_runtime

        check_runtime(self.load_options())

    def _fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(f"{type(self).__name__}.{name}: {message}")

    def _check_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _matches(value, hints[f.name]):
                raise self._fail(f.name, f"expected {_describe(hints[f.name])}, got {value!r} ({type(value).__name__}).")

    # ---- checks that read the disk (run by the trainer's constructor, before any rollout) ----------------
    def load_suites(self) -> tuple[TaskSuite, TaskSuite]:
        """The training suite and the suite holding the held-out split, each checked: it loads, its env is
        registered, and it has the split this config names."""
        train = self._with_env_kwargs(self._load_suite(self.suite, "suite", self.train_split, "train_split"))
        if self.eval_suite in (None, self.suite):
            self._check_split(train, "suite", self.eval_split, "eval_split")
            return train, train
        return train, self._with_env_kwargs(self._load_suite(self.eval_suite, "eval_suite", self.eval_split, "eval_split"))

    def _with_env_kwargs(self, suite: TaskSuite) -> TaskSuite:
        """``suite`` with ``env_kwargs`` laid over its own, after checking its env takes every name."""
        if not self.env_kwargs:
            return suite
        import gymnasium as gym

        for key in self.env_kwargs:
            if not isinstance(key, str):
                raise self._fail("env_kwargs", f"keys must be argument names (str), got {key!r}.")
        entry = gym.registry[suite.env_id].entry_point
        if isinstance(entry, str):
            module, _, name = entry.partition(":")
            entry = getattr(importlib.import_module(module), name)
        parameters = inspect.signature(entry).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            unknown = sorted(set(self.env_kwargs) - set(parameters))
            if unknown:
                takes = sorted(n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
                raise self._fail("env_kwargs", f"{suite.env_id} takes no argument {', '.join(map(repr, unknown))}; "
                                               f"it takes {', '.join(takes)}.")
        merged = dataclasses.replace(suite, env_kwargs={**dict(suite.env_kwargs), **dict(self.env_kwargs)})
        if getattr(entry, "cheap_steps", False):  # an in-process env: make one now, so a bad value fails here
            try:
                merged.make_env().close()
            except Exception as exc:  # noqa: BLE001 - any constructor error is the config's
                raise self._fail("env_kwargs", f"{suite.env_id} rejects them: {exc}") from None
        return merged

    def check_model_dir(self, field_name: str = "model") -> Path:
        """The local directory of the model named by ``field_name`` (a directory, or a Hub id in the local
        Hugging Face cache); fails with the fix when it is missing or not a HF model."""
        from agentgym.models.loading import resolve_model_dir
        from agentgym.trainers.tiny_model import is_tiny_spec, tiny_model_dir

        value = getattr(self, field_name)
        try:
            if is_tiny_spec(value):
                return tiny_model_dir(value)
            return resolve_model_dir(value, what=field_name.replace("_", " "))
        except ConfigError as exc:
            hint = ""
            if not is_tiny_spec(value) and not Path(str(value)).expanduser().exists():
                hint = (f" For the built-in tiny model with a tokenizer trained on this run's suite, write "
                        f"{field_name}: tiny:{self.suite} (built and cached on first use).")
            raise self._fail(field_name, str(exc) + hint) from exc

    def _load_suite(self, name: str, field_name: str, split: str, split_field: str) -> TaskSuite:
        import gymnasium as gym

        import agentgym  # noqa: F401 - registers the env ids
        from agentgym.errors import TaskError
        from agentgym.registration.suites import load_suite

        try:
            suite = load_suite(name)
        except TaskError as exc:
            raise self._fail(field_name, str(exc)) from exc
        if suite.env_id not in gym.registry:
            raise self._fail(field_name, f"suite {suite.name!r} names env {suite.env_id!r}, which is not "
                                         f"registered.{did_you_mean(suite.env_id, list(gym.registry))}")
        self._check_split(suite, field_name, split, split_field)
        return suite

    def _check_split(self, suite: TaskSuite, field_name: str, split: str, split_field: str) -> None:
        if split not in suite.splits:
            hint = " (or set eval_suite to a suite that holds the held-out split)" if split_field == "eval_split" else ""
            raise self._fail(split_field, f"suite {suite.name!r} has no split {split!r}; it has "
                                          f"{sorted(suite.splits)}{hint}.")

    # ---- (de)serialisation ---------------------------------------------------------------------------
    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """The keys a config file may set: every field (ARPO lists its sampler's settings instead of the field
        that holds them, so a file keeps one flat vocabulary)."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """Build from a mapping (a YAML file's fields), rejecting unknown keys with a 'did you mean'."""
        name = cls.__name__
        names = cls.config_keys()
        _check_renamed_fields(name, data, names)
        for key in data:
            if key not in names:
                raise ConfigError(f"Unknown {name} field {key!r}.{did_you_mean(key, names)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data]
        if missing:
            raise ConfigError(f"{name} needs {missing}: set them in the config file.")
        return cls(**cls._arguments(data))

    @classmethod
    def _arguments(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments from a config file's checked keys: YAML has no tuples, so a list becomes one where
        the field is a tuple."""
        hints = typing.get_type_hints(cls)
        return {k: tuple(v) if isinstance(v, list) and get_origin(hints[k]) is tuple else v for k, v in data.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON values: tuples become lists, mappings dicts."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v for k, v in d.items()}


def _matches(value: Any, hint: Any) -> bool:
    origin = get_origin(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    if origin is Mapping or hint is Mapping:
        if get_args(hint)[1:] == (Any,):
            return isinstance(value, Mapping)  # checked key by key in __post_init__
        return isinstance(value, Mapping) and all(isinstance(v, (int, float)) for v in value.values())
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))


RENAMED_FIELDS: dict[str, tuple[str, str]] = {
    "iterations": ("steps", ""),
    "episodes_per_iteration": ("tasks_per_step", " (ArCHer and filtered BC default to group_size: 1, so the episodes "
                                                 "per step stay the same)"),
    "actor_learning_rate": ("learning_rate", ""),
    "warmup_iterations": ("actor_warmup_steps", ""),
}
"""Fields of the per-trainer vocabularies before the one-loop redesign -> their name now (and a note)."""


def _check_renamed_fields(config_name: str, data: Mapping[str, Any], names: AbstractSet[str]) -> None:
    """Fail on old field names with the exact lines to write instead (every renamed field at once)."""
    old = [key for key in data if key in RENAMED_FIELDS and key not in names]
    if not old:
        return
    lines = []
    for key in old:
        new, note = RENAMED_FIELDS[key]
        if new not in names:
            continue
        lines.append(f"  {key}: {data[key]!r}  ->  {new}: {data[key]!r}{note}")
    if lines:
        raise ConfigError(f"{config_name}: every trainer now shares one vocabulary (steps, tasks_per_step, group_size, "
                          "learning_rate); rename these fields in your config:\n" + "\n".join(lines))
