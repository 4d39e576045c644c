"""The one online trainer loop: sample, estimate, update. Every bundled trainer is this loop plus its parts.

``OnlineTrainer(config).train()`` reads top to bottom in execution order:

1. load the policy (or resume it from the latest checkpoint), write ``config.json``, optionally behaviour-clone
   it on reference demonstrations (``warmstart: bc``);
2. build the optimizer and learning-rate schedule, the generation policy (the training model itself through HF,
   or a vLLM engine synced after every update) and the method's own parts (:meth:`_setup`: a KL reference, a
   critic and its replay buffer, an episode pool), then restore the checkpoint's states;
3. evaluate on the held-out split, then for each step:
   :meth:`_sample` ``tasks_per_step x group_size`` episodes (the data cursor: a seeded permutation of the train
   split per pass, read in order) -> :meth:`_learn` from them (the method: estimate advantages and update) ->
   log, evaluate every ``eval_every`` and checkpoint every ``checkpoint_every`` steps;
4. evaluate, save the final model (merged, with LoRA) and its rollout defaults, a last checkpoint, the learning
   curve and ``summary.json``.

The methods plug in by overriding the hooks: GRPO, GiGPO and ARPO (:mod:`agentgym.trainers.grpo`) learn with the
clipped policy-gradient update on per-token advantages, and differ only in how advantages are estimated (group
scores, anchor-state groups) or episodes sampled (branching); ArCHer (:mod:`agentgym.trainers.archer`) learns a
critic and an actor from a replay buffer; filtered BC (:mod:`agentgym.trainers.filtered_bc`) clones the best
episodes of a pool. Episodes per step, learning rate, evaluation, checkpoints and resume mean the same in all of
them, so methods compare at an equal number of episodes by construction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from agentgym.errors import ConfigError
from agentgym.policies import SamplingParams
from agentgym.utils.progress import track
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.suite import Task
from agentgym.trainers.rollout_worker import RolloutJob
from agentgym.trainers.rollout_saver import save_step_rollouts
from agentgym.trainers.bc import behaviour_clone, collect_demonstrations
from agentgym.trainers.precision import forward_precision, refresh_sampling_copy, sampling_copy, slow_bfloat16
from agentgym.trainers.interrupt import BCInterrupted, InterruptGuard, TrainingInterrupted
from agentgym.utils.cpu_threads import SlowStepWatch
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.base_config import TrainerConfig
from agentgym.trainers.distributed import Sharding, World, init_world
from agentgym.trainers.metrics import MetricsLogger, plot_learning_curve
from agentgym.utils.durable import atomic_write_text
from agentgym.utils.log_setup import format_metrics
from agentgym.utils.run_settings import CHANGES_FILE, check_resume_settings, record_changes, settings_changes, \
    write_settings
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["OnlineTrainer"]

logger = logging.getLogger(__name__)

#: most memory the HF policy's KV cache may take between turns (see OnlineTrainer._kv_cache_tokens)
_KV_CACHE_BUDGET_BYTES = 4 << 30
#: The parts of a run's summary made before its first step, kept in every checkpoint so that a resumed run (a
#: crash, a preemption, a second ``make quickstart``) still reports its warm start and its evaluation before training.
_CARRIED_SUMMARY = ("bc", "eval_before")

#: Config fields that may change when a run is resumed: how it is shown, where it is logged, how many threads and
#: checkpoints it keeps. Any other change mixes two runs' settings in one directory and is refused without --force.
RESUMABLE_CHANGES = ("output_dir", "progress", "cpu_threads", "keep_checkpoints", "tensorboard", "loggers",
                     "tracking_project", "tracking_uri")
#: The run directory's record of the full resolved config it was trained with.
CONFIG_FILE = "config.json"

#: Metrics echoed to the log after each step (all of them go to metrics.jsonl and the trackers).
SHOWN_METRICS = ("train/success_rate", "eval/success_rate", "train/loss", "critic/loss", "actor/loss", "bc/loss",
                 "time/step_s", "train/errors")


def _is_evaluation_at(metrics: Path, index: int, step: int) -> bool:
    """Whether record ``index`` (from 0) of ``metrics.jsonl`` is an evaluation at ``step`` and nothing else: what a
    finished run logs right after the point its final checkpoint rewinds to."""
    try:
        with metrics.open("rb") as fh:
            line = next((line for i, line in enumerate(fh) if i == index), b"")
        record = json.loads(line)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("step") == step and len(record) > 1 \
        and all(key == "step" or key.startswith("eval/") for key in record)


def _has_evaluation_at(metrics: Path, step: int) -> bool:
    """Whether ``metrics.jsonl`` holds an evaluation record (``eval/`` keys) at ``step``."""
    try:
        lines = metrics.read_bytes().splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step") == step and any(k.startswith("eval/") for k in record):
            return True
    return False


class OnlineTrainer:
    """``Trainer(config).train()``; see the module docstring for the order of work.

    Everything that can be checked without a rollout is checked here, so a bad config fails at once.
    Subclasses implement :meth:`_learn` and may override :meth:`_setup`, :meth:`_sample`,
    :meth:`_checkpoint_state`, :meth:`_save_extra_state` and :meth:`_restore_state`.
    """

    config: TrainerConfig
    #: Whether the method can run data-parallel under torchrun (gradients summed across ranks).
    supports_distributed = False
    #: Whether it can shard its policy with FSDP2 (``parallelism: fsdp``; :meth:`_parallelize`).
    supports_fsdp = False

    def __init__(self, config: TrainerConfig, *, world: World | None = None) -> None:
        self.config = config
        self.world = world or init_world(config.device)
        if self.world.distributed and config.max_staleness:
            raise config._fail("max_staleness", "asynchronous rollouts run in one process for now: use max_staleness: 0 "
                                                "under torchrun.")
        if self.world.distributed and not self.supports_distributed:
            raise config._fail("trainer", f"{config.display_name} runs in one process: launch it without torchrun "
                                          "(GRPO, GiGPO, ARPO, ArCHer and filtered BC run data-parallel).")
        if self.world.distributed and config.parallelism == "fsdp" and not self.supports_fsdp:
            raise config._fail("parallelism", f"{config.display_name} does not shard its models yet: use parallelism: "
                                              "ddp (GRPO, GiGPO and ARPO run with fsdp).")
        self.sharding = Sharding(self.world, config.parallelism == "fsdp")
        self.suite, self.eval_suite = config.load_suites()
        self.model_dir = config.check_model_dir("model")  # a local directory, or a Hub id's cached snapshot
        config.check_runtime()
        self.output_dir = Path(config.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.train_tasks = self.suite.split(config.train_split)
        self.eval_tasks = self.eval_suite.split(config.eval_split)[: config.eval_tasks]
        self.episodes = 0
        self._async: Any = None  # the background rollout worker when max_staleness > 0
        self._sampling_model: Any = None  # mixed precision: the bfloat16 copy HF sampling runs on
        self._rubric: Any = None  # reward: rubric: scores each step's episodes before the update
        if config.reward == "rubric":
            from agentgym.trainers.rubric_reward import RubricReward

            self._rubric = RubricReward(config.rubric or "", config.judge, config.judge_mode, self.output_dir,
                                        verdict_format=config.judge_verdict_format)
        self._rollout_stats: dict[str, Any] = {}  # the sampler's statistics of the step being learned from
        self._guard: InterruptGuard | None = None  # Ctrl-C handling while train() runs
        self._slow: SlowStepWatch | None = None  # the slow-step hint on a CPU
        self._threads = torch.get_num_threads()
        self._completed = 0  # training steps whose update is done (what an interrupted run saves)
        self._bc_done: int | None = None  # BC steps completed while a warm start is under way
        self.optimizer: Any = None

    # ---- the method's parts (overridden by each trainer) ----------------------------------------------
    def _setup(self, resume_from: Path | None) -> None:
        """Build the method's own modules (reference model, critic, buffers) once the policy is ready."""

    def _learn(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """Learn from one step's episodes; returns the metrics to log."""
        raise NotImplementedError

    def _parallelize(self) -> None:
        """Shard the policy (``parallelism: fsdp`` under torchrun) before the optimizer takes its parameters."""

    def _checkpoint_state(self) -> dict[str, Any]:
        """Extra JSON state stored in each checkpoint's ``state.json`` (e.g. how many transitions were kept)."""
        return {}

    def _save_extra_state(self, directory: Path) -> None:
        """Write the method's modules into a checkpoint directory (beside ``model/``)."""

    def _restore_state(self, state: dict[str, Any], directory: Path) -> None:
        """Restore what :meth:`_checkpoint_state` and :meth:`_save_extra_state` wrote."""

    # ---- setup -------------------------------------------------------------------------------------
    def _load(self, path: str | Path, *, trainable: bool = True) -> tuple[Any, Any]:
        """The model at ``path`` as the config's loading fields say; a LoRA checkpoint (``adapter_config.json``,
        no full weights) is the base model plus its saved adapter."""
        from agentgym.models.loading import load_model

        options = self.config.load_options()
        if trainable and (Path(path) / "adapter_config.json").is_file():
            return load_model(self.model_dir, options, adapter_dir=path)
        return load_model(path, options, trainable=trainable)

    def _schedule(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        warmup = self.config.warmup_steps
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    def _warm_start(self, summary: dict[str, Any], start: int = 0) -> None:
        """Behaviour-clone on reference demonstrations, from BC step ``start`` (an interrupted warm start)."""
        cfg = self.config
        demos = collect_demonstrations(self.suite, cfg.train_split, cfg.bc_demos, self.tokenizer,
                                       shortcut_fraction=cfg.bc_shortcut_fraction, seed=cfg.seed,
                                       system_prompt=cfg.system_prompt, processor=self._processor(),
                                       max_context_tokens=cfg.max_context_tokens, context=cfg.context,
                                       max_action_tokens=cfg.max_tokens_per_turn)
        self._bc_done = start
        try:
            summary["bc"] = behaviour_clone(
                self.model, self.tokenizer, demos, steps=cfg.bc_steps, learning_rate=cfg.bc_learning_rate,
                batch_size=cfg.bc_batch_size, seed=cfg.seed, device=cfg.device,
                log=lambda s, m: self.world.is_main and self.metrics.log(0, {**m, "bc/step": s}),
                processor=self._processor(), start=start, critical=self._critical, threads=self._threads,
                forward_context=self._forward_precision)
        except BCInterrupted as exc:
            self._bc_done = exc.completed if exc.completed > 0 else None  # None: the model has not changed
            raise KeyboardInterrupt from None
        self._bc_done = None
        self.world.broadcast_parameters(self.model)

    def _generation_policy(self, model_dir: Path) -> Any:
        """HF: sample from the training model itself (always current), or with ``mixed_precision`` from a bfloat16
        copy of it. vLLM: a separate engine, synced now."""
        cfg = self.config
        if cfg.generation_backend == "vllm":
            from agentgym.policies.vllm import VLLMPolicy

            if cfg.max_staleness:  # the rollout worker samples with it and loads each update before a batch
                from agentgym.trainers.policy_versions import versioned_policy_class

                VLLMPolicy = versioned_policy_class(VLLMPolicy)  # noqa: N806
            policy = VLLMPolicy(str(model_dir), tokenizer=self.tokenizer, max_batch_size=cfg.max_in_flight,
                                seed=cfg.seed, name=cfg.trainer_name)
            policy.load_weights(self._sync_weights())  # the BC warm start may have changed them
            return policy
        from agentgym.policies.hf import HFPolicy

        # mixed precision samples from a bfloat16 copy, refreshed after every update (_step)
        slow = slow_bfloat16(cfg.device) if cfg.mixed_precision != "no" else None
        if slow and self.world.is_main:
            logger.warning("mixed_precision: %s: %s", cfg.mixed_precision, slow)
        self._sampling_model = None if cfg.mixed_precision == "no" else sampling_copy(self.model, cfg.mixed_precision)
        sampled = self.model if self._sampling_model is None else self._sampling_model
        return HFPolicy(sampled, self.tokenizer, device=cfg.device, max_batch_size=cfg.max_in_flight,
                        name=cfg.trainer_name, processor=self._processor(), kv_cache_tokens=self._kv_cache_tokens())

    def _kv_cache_tokens(self) -> int:
        """Room in the HF policy's KV cache for every episode in flight at its full context, within a memory budget.

        Without it each turn recomputes its whole conversation whenever the episodes in flight hold more tokens than
        the policy's default (65,536): 512 Sokoban rollouts a step took 7-8 CPU minutes to sample instead of about
        2. The budget: 4 GiB, and on a GPU at most a tenth of its memory (the training state needs the rest).
        """
        from agentgym.policies.kv_cache import DEFAULT_KV_CACHE_TOKENS, kv_bytes_per_token

        cfg = self.config
        per_token = kv_bytes_per_token(self.model)
        if per_token is None:  # a model whose config does not say its cache size: the policy's default
            return DEFAULT_KV_CACHE_TOKENS
        budget = _KV_CACHE_BUDGET_BYTES
        if str(cfg.device).startswith("cuda") and torch.cuda.is_available():
            budget = min(budget, torch.cuda.get_device_properties(torch.device(cfg.device)).total_memory // 10)
        wanted = cfg.max_in_flight * (cfg.max_context_tokens or 4096)
        return max(DEFAULT_KV_CACHE_TOKENS, min(wanted, budget // per_token))

    def _processor(self) -> Any:
        """The model's processor when it is a vision-language model (else ``None``), loaded once: sampling and the
        training forward turn stored images into pixel values with it."""
        if not hasattr(self, "_loaded_processor"):
            from agentgym.models.loading import load_processor

            self._loaded_processor = load_processor(self.model_dir)
        return self._loaded_processor

    def _forward_precision(self) -> contextlib.AbstractContextManager[Any]:
        """The context every training forward of the policy runs in (autocast under ``mixed_precision``)."""
        return forward_precision(self.config.device, self.config.mixed_precision)

    def _sync_weights(self) -> Any:
        """What vLLM loads after an update: the model itself, or with LoRA the base with the adapters merged in."""
        from agentgym.models.loading import is_peft_model, merged_state_dict

        return merged_state_dict(self.model) if is_peft_model(self.model) else self.model

    def _save_defaults(self, model_dir: Path) -> None:
        """Write the rollout settings next to the weights, so `agentgym eval` prompts the model as in training."""
        from agentgym.policies.rollout_defaults import save_rollout_defaults

        save_rollout_defaults(model_dir, system_prompt=self.config.system_prompt,
                              max_tokens=self.config.max_tokens_per_turn, suite=self.config.suite,
                              constrain_actions=self.config.constrain_actions)
        processor = self._processor()
        if processor is not None:  # a VLM's directory loads as one (and reads images) only with its processor
            processor.save_pretrained(model_dir)

    def _log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.world.is_main:
            self.metrics.log(step, metrics)
            shown = {k: metrics[k] for k in SHOWN_METRICS if k in metrics}  # one fixed order: columns line up
            if shown:
                logger.info("step %*d/%d  %s", len(str(self.config.steps)), step, self.config.steps,
                            format_metrics(shown))

    def _settings(self) -> dict[str, Any]:
        """The full resolved config this run trains with, as stored in ``config.json``."""
        return {"trainer": self.config.trainer_name, **self.config.to_dict()}

    def _check_resume(self, force: bool) -> None:
        """Before resuming from a checkpoint in the output directory: refuse a config that differs from the one
        stored there (listing each changed field), unless ``force``, which records the change and stores the new
        config. Without a checkpoint the run starts afresh and its config is stored."""
        if not self.world.is_main:
            return
        path = self.output_dir / CONFIG_FILE
        if latest_checkpoint(self.checkpoint_dir) is None:
            write_settings(path, self._settings())
            return
        if self._extend_steps(path):
            return
        changes = check_resume_settings(
            path, self._settings(), force=force, what=f"the training run in {self.output_dir}",
            force_flag="--force (Python: train(force_resume=True))",
            new_dir_hint="train into a new output directory (--output-dir DIR, or output_dir in the config)",
            ignore=RESUMABLE_CHANGES)
        if changes:
            logger.warning("resuming %s with %d changed config field(s) (--force; recorded in %s): %s",
                           self.output_dir, len(changes), self.output_dir / "resume_changes.jsonl",
                           ", ".join(key for key, _, _ in changes))

    def _extend_steps(self, path: Path) -> bool:
        """Resume with another ``steps`` than the stored config (at least the latest checkpoint's step) and nothing
        else changed: the run trains on from that checkpoint to the new count, as if it had been started with it (the
        learning rate is constant after warm-up, so no step depends on the total); the change is recorded in
        ``resume_changes.jsonl`` and ``config.json`` then holds the new count. Returns whether this was one.

        Raises:
            ConfigError: The new count is below the step the latest checkpoint holds.
        """
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False  # check_resume_settings says what is wrong with the file
        if not isinstance(stored, dict) or not isinstance(stored.get("steps"), int):
            return False
        changes = settings_changes(stored, self._settings(), ignore=RESUMABLE_CHANGES)
        if [key for key, _, _ in changes] != ["steps"]:
            return False
        checkpoint = latest_checkpoint(self.checkpoint_dir)
        done = int(json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))["step"]) if checkpoint else 0
        if self.config.steps < done:
            raise ConfigError(
                f"steps: {self.config.steps} is below the {done} steps the run in {self.output_dir} has already "
                f"trained (checkpoint {checkpoint}). A resume can only train on: set steps to at least {done}, or "
                f"train a shorter run into a new output directory (--output-dir DIR, or output_dir in the config).")
        logger.info("extending %s from %d to %d steps (recorded in %s)", self.output_dir, stored["steps"],
                    self.config.steps, self.output_dir / CHANGES_FILE)
        record_changes(path, self._settings(), changes)
        return True

    def _apply_config_to_optimizer(self) -> None:
        """After restoring a checkpoint's optimizer and scheduler: this config's learning rate, warmup and weight
        decay, not the stored run's (a scheduler's state carries its base learning rates). A no-op when they are
        equal; what a forced resume with a new learning rate needs."""
        scheduler, cfg = self.scheduler, self.config
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            return
        scheduler.base_lrs = [cfg.learning_rate for _ in self.optimizer.param_groups]
        for group, rule in zip(self.optimizer.param_groups, scheduler.lr_lambdas):
            group["initial_lr"] = cfg.learning_rate
            group["lr"] = cfg.learning_rate * rule(max(scheduler.last_epoch, 0))
            group["weight_decay"] = cfg.weight_decay
        scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what get_last_lr() reports

    # ---- the run -----------------------------------------------------------------------------------
    def train(self, *, force_resume: bool = False) -> dict[str, Any]:
        """Run (or resume) training; returns the summary also written to ``summary.json``.

        A run resumes from the latest checkpoint in its output directory only with the config stored there
        (``config.json``); another config raises :class:`~agentgym.errors.ConfigError` listing each changed field,
        unless ``force_resume``, which records the change in ``resume_changes.jsonl`` and trains on with the new one.

        Ctrl-C (SIGINT) stops within about a second: the step or BC step under way finishes its update, a
        checkpoint of the work done so far is written, and :class:`~agentgym.trainers.interrupt.TrainingInterrupted`
        (a ``KeyboardInterrupt``) says where it is; running the same config again resumes from it.
        """
        cfg = self.config
        torch.manual_seed(cfg.seed)
        self._threads = self._apply_cpu_threads()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._check_resume(force_resume)  # before anything in the directory changes
        self.metrics = MetricsLogger.from_config(self.output_dir, cfg, main=self.world.is_main)
        self._completed = 0
        self._bc_done: int | None = None  # BC steps completed while a warm start is under way
        # under torchrun every rank gets the signal and FSDP checkpoints need every rank: Python's default there
        guard: Any = InterruptGuard() if not self.world.distributed else contextlib.nullcontext(None)
        with guard as self._guard:
            try:
                return self._train()
            except KeyboardInterrupt:
                if self._guard is None:
                    raise
                raise self._save_interrupted() from None

    def _critical(self) -> Any:
        """A region a Ctrl-C must not cut (weights or checkpoints change); see :mod:`agentgym.trainers.interrupt`."""
        return self._guard.critical() if self._guard is not None else contextlib.nullcontext()

    def _apply_cpu_threads(self) -> int:
        """On a CPU, the torch thread count chosen for this machine (logged once); on a GPU, torch's own."""
        if not str(self.config.device).startswith("cpu"):
            return torch.get_num_threads()
        from agentgym.utils.cpu_threads import apply_cpu_threads

        return apply_cpu_threads(self.config.cpu_threads).threads

    def _train(self) -> dict[str, Any]:
        cfg = self.config
        resume_from = latest_checkpoint(self.checkpoint_dir)
        self._metrics_mark: int | None = None  # see _checkpoint
        if self.world.is_main:
            self._rewind_metrics(resume_from)
        self.model, self.tokenizer = self._load(resume_from / "model" if resume_from else self.model_dir)
        summary: dict[str, Any] = {"config": cfg.to_dict(), "trainer": cfg.trainer_name}
        self._summary = summary  # what each checkpoint carries of it (the warm start, the evaluation before training)
        pending_bc = _pending_bc(resume_from)
        if resume_from is None or pending_bc is not None:
            if cfg.warmstart == "bc":
                if pending_bc is not None:
                    logger.info("continuing the interrupted BC warm start at step %d/%d", pending_bc, cfg.bc_steps)
                self._warm_start(summary, start=pending_bc or 0)

        self._parallelize()
        self._make_optimizer()
        self.policy = self._generation_policy(resume_from / "model" if resume_from and not cfg.lora else self.model_dir)
        torch.manual_seed(mix_seed(cfg.seed, 17))  # the method's modules start the same whether or not we resume
        self._setup(resume_from)
        start = 0
        if resume_from is not None:  # after _setup, so building modules does not shift the restored RNG
            state = load_checkpoint(resume_from, self.optimizer, self.scheduler, model=self.model)
            start, self.episodes = int(state["step"]), int(state.get("episodes", 0))
            self._apply_config_to_optimizer()
            self._restore_state(state, resume_from)
            if self.world.is_main:
                logger.info("resuming %s from step %d of %d (checkpoint %s, %d episodes so far)", self.output_dir,
                            start, cfg.steps, resume_from.name, self.episodes)
            # the first run's warm start and evaluation before training, which a resumed run does not repeat
            summary.update({k: v for k, v in self._carried_summary(state).items() if k not in summary})
            summary["resumed_from"] = str(resume_from)
        self._completed = start

        if start == 0:
            summary["eval_before"] = self._evaluate(0)
        elif self.world.sum(float(self.world.is_main and self._evaluation_owed(start))) > 0:
            # stopped between an evaluation step's update (checkpointed) and its evaluation: the curve gets it now,
            # with the same weights the uninterrupted run evaluated
            self._evaluate(start)
        self._async = None
        if cfg.max_staleness:  # the next steps' rollouts are generated while this one trains
            from agentgym.trainers.async_rollouts import AsyncRollouts

            self._async = AsyncRollouts(self, start, cfg.max_staleness, cfg.async_worker)
        self._slow = SlowStepWatch("a training update", threads=self._threads) \
            if str(cfg.device).startswith("cpu") else None
        try:
            for step in track(range(start, cfg.steps), f"{cfg.display_name} steps", completed=start, unit="step",
                              enabled=cfg.progress if self.world.is_main else False):
                self._step(step)
                done = step + 1
                if cfg.eval_every and done % cfg.eval_every == 0 and done != cfg.steps:
                    self._evaluate(done)
                if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done != cfg.steps:
                    with self._critical():
                        self._checkpoint(done)
                self.world.barrier()
        finally:
            if self._async is not None:
                self._async.close()
        # the final checkpoint points metrics.jsonl at the records before this evaluation, which a run of the same
        # config after it finished does again
        self._metrics_mark = self.metrics.records() if self.world.is_main else None
        summary["eval_after"] = self._evaluate(cfg.steps)
        summary["episodes"] = self.episodes
        with self._critical():
            self._finish(summary)
        self.metrics.close()
        return summary

    def _evaluation_owed(self, step: int) -> bool:
        """Whether ``step`` is a mid-run evaluation step with no evaluation in ``metrics.jsonl`` (main rank)."""
        cfg = self.config
        if not cfg.eval_every or step % cfg.eval_every or not 0 < step < cfg.steps:
            return False
        return not _has_evaluation_at(self.metrics.path, step)

    def _rewind_metrics(self, resume_from: Path | None) -> None:
        """Cut metrics.jsonl back to the checkpoint this run resumes from (to nothing without one): everything
        logged after it is logged again, and a record must not appear twice (nor the step-0 evaluation)."""
        records: int | None = 0
        step = 0
        if resume_from is not None:
            state = json.loads((resume_from / "state.json").read_text(encoding="utf-8"))
            records, step = state.get("metrics_records"), int(state["step"])
            cfg = self.config
            # a finished run extended to more steps: its final evaluation is the one a run of the new length makes
            # at this step (the same weights; the evaluation draws on no training randomness), so it stays
            if isinstance(records, int) and step < cfg.steps and cfg.eval_every and step % cfg.eval_every == 0 \
                    and _is_evaluation_at(self.metrics.path, records, step):
                records += 1
        self.metrics.rewind(records if isinstance(records, int) else None, step)

    def _make_optimizer(self) -> None:
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        self.optimizer = torch.optim.AdamW(trainable, lr=self.config.learning_rate, weight_decay=self.config.weight_decay)
        self.scheduler = self._schedule(self.optimizer)

    def _finish(self, summary: dict[str, Any]) -> None:
        """Save the final model (merged, with LoRA) and its rollout defaults, a last checkpoint, the learning curve
        and ``summary.json``."""
        cfg = self.config
        states = self.sharding.full_state_dicts(self.model, self.optimizer)  # FSDP: every rank gathers, rank 0 gets
        if self.world.is_main:
            from agentgym.models.loading import save_trained_model

            # LoRA: model/ is the merged model (loads like any model directory) and adapter/ the adapter alone
            final = save_trained_model(self.model, self.tokenizer, self.output_dir, base=self.model_dir,
                                       options=cfg.load_options(), state_dict=states[0])
            self._save_defaults(final)
            if (self.output_dir / "adapter").is_dir() and cfg.lora is not None:
                self._save_defaults(self.output_dir / "adapter")
            self._checkpoint(cfg.steps, states)
            plot_learning_curve(self.metrics.path, self.output_dir / "learning_curve.png")
            atomic_write_text(self.output_dir / "summary.json", json.dumps(summary, indent=2, default=str))

    def _save_interrupted(self) -> TrainingInterrupted:
        """After Ctrl-C: a checkpoint of the completed steps (or of the BC steps so far), and the exception that
        says where it is. Nothing is saved before the model has changed (no BC step, no training step)."""
        cfg = self.config
        bc_done = self._bc_done
        changed = self._completed > 0 or bc_done is not None or "bc" in getattr(self, "_summary", {})
        path = None
        if changed and getattr(self, "model", None) is not None and self.world.is_main:
            if getattr(self, "optimizer", None) is None:  # interrupted before the RL optimizer existed (BC)
                self._make_optimizer()
            extra = {"bc_steps_done": bc_done} if bc_done is not None else {}
            self._checkpoint(self._completed, extra=extra)
            path = latest_checkpoint(self.checkpoint_dir)
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        return TrainingInterrupted(path, self._completed, cfg.steps, bc_done)

    def _step(self, step: int) -> None:
        cfg = self.config
        t0 = time.perf_counter()
        lag: dict[str, float] = {}
        if self._async is not None:
            trajectories, self._rollout_stats, lag = self._async.take(step)
        else:
            with self.sharding.full_weights(self.model):  # FSDP: each rank samples with the full weights
                trajectories = self._sample(step)
        judged: dict[str, float] = {}
        if self._rubric is not None:
            trajectories, judged = self._rubric.score(trajectories)
        t_rollout = time.perf_counter() - t0
        with self._critical():  # a Ctrl-C now takes effect once this step's update is done and logged
            if self._slow is not None:
                self._slow.start()
            self.episodes += int(self.world.sum(float(len(trajectories))))
            stats = self._learn(step, trajectories)
            if cfg.save_rollouts and (step + 1) % cfg.save_rollouts == 0:  # what the policy did, for 'agentgym view'
                save_step_rollouts(self, step + 1, trajectories)
            if self._slow is not None:
                self._slow.stop(cpu_bound=False)
            if self._async is not None:  # the worker (and with vLLM the engine) loads them before its next batch
                self._async.publish(self.model)
            elif cfg.generation_backend == "vllm":
                self.policy.load_weights(self._sync_weights())
            elif self._sampling_model is not None:  # mixed precision's bfloat16 copy
                refresh_sampling_copy(self._sampling_model, self.model)
            self._log(step + 1, {
                **stats, **self._episode_metrics(trajectories), "train/episodes_seen": float(self.episodes),
                **lag, **judged, "time/rollout_s": t_rollout, "time/step_s": time.perf_counter() - t0,
                "lr": self.scheduler.get_last_lr()[0],
            })
            self._completed = step + 1

    def _episode_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """The step's rollout metrics over every rank's episodes, not rank 0's shard of the groups (one object
        all-gather; every rank calls it)."""
        rollout = summarize(trajectories)
        n = len(trajectories)
        local = {"episodes": float(n), "success": rollout.get("success_rate", 0.0) * n,
                 "return": float(sum(t.score for t in trajectories)), "turns": rollout.get("mean_turns", 0.0) * n,
                 "tool_calls": rollout.get("mean_tool_calls", 0.0) * n,
                 "errors": float(sum(t.error is not None or t.end_reason == "error" for t in trajectories))}
        parts = self.world.gather_objects(local)
        total = {key: sum(part[key] for part in parts) for key in local}
        count = max(total["episodes"], 1.0)
        return {"train/success_rate": total["success"] / count, "train/return_mean": total["return"] / count,
                "train/mean_turns": total["turns"] / count, "train/mean_tool_calls": total["tool_calls"] / count,
                "train/episodes": total["episodes"], "train/errors": total["errors"]}

    def _carried_summary(self, state: dict[str, Any]) -> dict[str, Any]:
        """What the checkpoint carries of the run's summary; a checkpoint without one (written by an older release)
        falls back on the summary a finished run left in the output directory."""
        if "summary" in state:
            return dict(state["summary"])
        try:
            earlier = json.loads((self.output_dir / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in earlier.items() if k in _CARRIED_SUMMARY} if isinstance(earlier, dict) else {}

    def _checkpoint(self, done: int, states: tuple[Any, Any] | None = None, *, extra: dict[str, Any] | None = None) -> None:
        """Rank 0 writes the checkpoint; with FSDP every rank first gathers the full states (or passes them)."""
        model_state, optimizer_state = states or self.sharding.full_state_dicts(self.model, self.optimizer)
        if not self.world.is_main:
            return

        def save_files(model_dir: Path) -> None:
            self._save_defaults(model_dir)
            self._save_extra_state(model_dir.parent)

        save_checkpoint(self.checkpoint_dir, done, self.model, self.tokenizer, self.optimizer, self.scheduler,
                        {"data_cursor": done * self.config.tasks_per_step, "episodes": self.episodes,
                         "metrics_records": mark if (mark := getattr(self, "_metrics_mark", None)) is not None
                         else self.metrics.records(),
                         "summary": {k: v for k, v in self._summary.items() if k in _CARRIED_SUMMARY},
                         **self._checkpoint_state(), **(extra or {})}, self.config.keep_checkpoints, save_files,
                        model_state=model_state, optimizer_state=optimizer_state)

    # ---- sampling ----------------------------------------------------------------------------------
    def _tasks_for_step(self, step: int) -> list[Task]:
        """The data cursor: a seeded permutation of the train split per epoch over it, read in order."""
        cfg = self.config
        n = len(self.train_tasks)
        chosen = []
        for k in range(step * cfg.tasks_per_step, (step + 1) * cfg.tasks_per_step):
            epoch, offset = divmod(k, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(cfg.seed, epoch)))
            chosen.append(self.train_tasks[int(order[offset])])
        return chosen

    def _rollout_plan(self, step: int) -> tuple[list[EpisodeSpec], SamplingParams]:
        """This rank's episode specs (``group_size`` per task; whole groups are sharded) and sampling."""
        cfg = self.config
        groups = self.world.shard(list(enumerate(self._tasks_for_step(step))))
        specs = [EpisodeSpec(self.suite.env_id, task=task, seed=mix_seed(cfg.seed, step, k, g) % (2**31),
                             group_id=f"{step}/{k}", env_kwargs=dict(self.suite.env_kwargs),
                             sampling_seed=mix_seed(cfg.seed, step, k, g, 1))
                 for k, task in groups for g in range(cfg.group_size)]
        sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature,
                                  top_p=cfg.top_p, seed=mix_seed(cfg.seed, step, self.world.rank))
        return specs, sampling

    def _rollout_config(self, sampling: SamplingParams) -> RolloutConfig:
        """Pipelined rollouts (env steps overlap generation): reproducible anyway, because every episode samples
        from its own seed (``EpisodeSpec.sampling_seed``: seed, step, task, sample) and turn, drawn per row by the
        in-process policies, whatever batches the timing forms, however many run at once and on which rank."""
        return RolloutConfig(max_in_flight=self.config.max_in_flight, sampling=sampling,
                             system_prompt=self.config.system_prompt,
                             max_context_tokens=self.config.max_context_tokens, deterministic=False,
                             env_backend=self.config.env_backend, constrain_actions=self.config.constrain_actions,
                             context=self.config.context, max_turn_tokens=self.config.max_turn_tokens,
                             max_episode_tokens=self.config.max_episode_tokens)

    def _rollout_job(self, step: int) -> RolloutJob:
        """This step's sampling as plain data (run here when synchronous, by the rollout worker when asynchronous):
        ``group_size`` independent episodes per task; ARPO adds its branching sampler's settings."""
        specs, sampling = self._rollout_plan(step)
        return RolloutJob(step, tuple(specs), self._rollout_config(sampling))

    def _sample(self, step: int) -> list[Trajectory]:
        """This step's episodes, sampled now with the current policy (the sampler's statistics go to
        ``_rollout_stats``)."""
        self.model.eval()
        trajectories, self._rollout_stats = self._rollout_job(step).run(self.policy)
        return trajectories

    # ---- evaluation --------------------------------------------------------------------------------
    def evaluation_episodes(self) -> list[Trajectory]:
        """One episode of each held-out task (``eval_split``, its first ``eval_tasks``) with the current policy at
        ``eval_temperature``: what every evaluation of a run scores, and what re-scores a finished run's model on
        another split (``benchmarks/studies/held_out_replica.py``), so both play the tasks the same way."""
        cfg = self.config
        sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.eval_temperature,
                                  seed=mix_seed(cfg.seed, 999))
        specs = [EpisodeSpec(self.eval_suite.env_id, task=t, seed=i, env_kwargs=dict(self.eval_suite.env_kwargs))
                 for i, t in enumerate(self.eval_tasks)]
        self.model.eval()
        return RolloutEngine(self.policy, self._rollout_config(sampling)).run(specs)

    def _evaluate(self, step: int) -> dict[str, Any]:
        """Held-out success with the current weights (rank 0; other ranks wait)."""
        result: dict[str, Any] = {}
        with self.sharding.full_weights(self.model):  # FSDP: every rank gathers the weights, rank 0 uses them
            if self.world.is_main:
                started = time.perf_counter()
                result = summarize(self.evaluation_episodes())
                result["wall_s"] = time.perf_counter() - started
                self._log(step, {**{f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))},
                                 "eval/episodes_seen": float(self.episodes)})
        self.world.barrier()
        return result


def _pending_bc(checkpoint: Path | None) -> int | None:
    """BC steps an interrupted warm start completed before ``checkpoint`` was written (``None``: none pending)."""
    if checkpoint is None:
        return None
    try:
        state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    done = state.get("bc_steps_done") if isinstance(state, dict) else None
    return int(done) if isinstance(done, int) else None
