"""The studies: what each compares, on which task, with which control, and how big its goal scale must be.

A study is only worth its compute if a real difference could show. Two numbers size it:

* **rollouts per step** from the gradient noise scale ``B_noise = tr(S) / |G|^2`` measured by
  ``benchmarks/gradient_noise.py`` (McCandlish et al., 2018): below it a step is mostly noise, and Adam, which moves
  every weight by about the learning rate whatever the gradient's size, takes mostly random steps;
* **held-out tasks** so that one evaluation's standard error ``sqrt(p (1 - p) / n)`` is at most 0.025 at the worst
  case ``p = 0.5``: ``n >= 400``. A 10-point goal then stands 4 standard errors above one evaluation's noise.

Where a suite's held-out split is smaller than that, or the task's noise scale was never measured, the study
says so (``--list``) instead of pretending.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
import credit_assignment as credit  # noqa: E402 - the tasks, warm start and run configs every study reuses

SE_TARGET = 0.025
"""Largest standard error one held-out evaluation may have at the goal scale."""

GROUP_SIZE = 8
"""Rollouts per task for the group methods at the goal scale (GRPO's usual G; ArCHer/filtered BC take as many
tasks of one episode each, so every method sees the same episodes)."""

SAMPLER_RESULT = Path(__file__).resolve().parents[1] / "results" / "sampler.json"
"""The sampler benchmark's result: its first figure is rollouts a second on 2 torch threads, the default
(continuous) sampler in the agentgym column and the goal's baseline (the default sampler of the last commit before
continuous batching) in the baseline column."""


def sampler_rates_per_core() -> tuple[float, float]:
    """``(default sampler, the goal's baseline)`` rollouts a second per core for the tiny model on Sokoban, as last
    measured by ``benchmarks/sampler.py``; the hour estimates of ``--list`` and the research pages use them."""
    record = json.loads(SAMPLER_RESULT.read_text(encoding="utf-8"))
    figure = next(f for f in record["figures"] if f.get("unit") == "rollouts/s")
    return float(figure["agentgym"]) / 2, float(figure["baseline"]) / 2

# Noise scales measured with benchmarks/gradient_noise.py (6 independent batches of 128 Sokoban rollouts at the
# Sokoban BC warm start): (task, variant) -> rollouts a step for half signal. A committed
# benchmarks/results/gradient_noise.json for the task replaces these (see noise_scale).
MEASURED_NOISE: dict[tuple[str, str], float] = {("sokoban", "grpo"): 1000.0, ("sokoban", "gigpo_seq_mean"): 555.0}

# TextWorld is not one of the credit-assignment benchmark's tasks, and its commands are longer than a maze move: on
# the first 40 training walkthroughs they run to 23 tokens as native calls (command("...")), as the reference solver
# writes them, and to 40 as Hermes tool calls, a form a policy may use as well. A turn may hold 48: at 24, every
# Hermes call longer than a few words was cut mid-call (greedy training success 0.000 through 150 BC steps).
# Its room descriptions are long (about 190 tokens a turn with the task's tokenizer): with the whole history, 20
# of the first 60 training walkthroughs (7.7 turns on average) end at the 1,536-token context before the game is
# won. Older observations become a stub instead (``drop_tool_outputs``, the latest two kept whole; every command
# stays), and all 60 fit, in 1.4 segments on average.
TEXTWORLD_CONTEXT = {"strategy": "drop_tool_outputs", "keep_tool_outputs": 2, "stub": "..."}
EXTRA_TASKS = {"textworld": credit.CreditTask("textworld", "textworld", "test", max_tokens_per_turn=48,
                                              max_context_tokens=1536, context=TEXTWORLD_CONTEXT)}
SMOKE_SUITES = {"textworld": "textworld-smoke"}
"""A smaller suite the smoke scale uses instead (no game generation: its training games are the env's default)."""


def task_of(name: str) -> Any:
    """The :class:`credit_assignment.CreditTask` of a study task (the benchmark's own, or :data:`EXTRA_TASKS`)."""
    return credit.TASKS.get(name) or EXTRA_TASKS[name]


@dataclass(frozen=True)
class Scale:
    """How big one run of a study is. ``tasks_per_step x group_size`` episodes a step for every method."""

    tasks_per_step: int
    group_size: int
    steps: int
    eval_tasks: int
    eval_every: int
    warm_start: str
    """``bc``: the benchmark's BC warm start to ``bc_target`` training success (checked on 64 greedy training
    episodes per chunk); ``smoke``: a small tiny model cloned for ``bc_steps`` steps with no check (seconds)."""
    bc_steps: int = 400
    bc_target: float = 0.25

    @property
    def rollouts_per_step(self) -> int:
        return self.tasks_per_step * self.group_size


@dataclass(frozen=True)
class Study:
    """One comparison: methods against a baseline, each with a control, on one task."""

    name: str
    task: str
    methods: tuple[str, ...]
    """Method names of :data:`METHODS`; the first is the one the goal is about."""
    baseline: str
    control: str
    goal: str
    """The goal in words, as the research page states it."""
    question: str
    """Why this study, in one sentence."""
    noise_variant: str = "grpo"
    """Which measured noise scale sizes the goal scale (the noisier method of the comparison)."""
    sized_by: tuple[float, str] | None = None
    """``(noise scale, where it came from)`` a study that has run was sized by, when a later measurement says
    otherwise: its goal scale stays the one its runs were trained at (so they are found and resumed, not trained
    again at another size), and its page says both figures. ``None``: today's measurement."""
    margin: float = 0.0
    """How far the lead method must beat the baseline (on top of the difference exceeding 2 se)."""
    learning_rate_from: str | None = None
    """Another study whose tuned learning rate this one trains at (``None``: its own tuning). Where every method
    runs at one advantage scale, one rate means one step size; it also makes this study's GRPO runs the very runs
    of that study, which are then reused instead of trained again."""
    lead_rate_only: bool = False
    """The study's rate (tuned, borrowed or ``--learning-rate``) is its lead method's alone, and every other run
    trains at the benchmark's default: for a lead method whose optimizer has another scale of rate (an SGD actor
    against AdamW), where one rate for all would be a step of another size for each. The baseline and control then
    are the very runs of any study that trained them at the default."""
    steps: int = 20
    eval_every: int = 5
    bc_target: float = 0.25
    """Greedy training success the BC warm start clones to (at most :attr:`Scale.bc_steps` steps). A weak start
    leaves most groups all-failed, with no advantage at all, and so a noisier gradient."""
    extra: dict[str, Any] = field(default_factory=dict)


PRIOR_EPISODES = 4096
"""Episodes of the warm start a ``*_prior`` method starts from (``prior_episodes``): about 30,000 maze turns, over half
the 55,273 on which the grid critic's offline fit explained 0.467 of held-out returns, and 3.2 times a 20-step
run's own 1,280 episodes."""

SMOKE_CAPS = {"prior_episodes": 4, "critic_prior_steps": 2, "critic_steps": 2}
"""Method settings the smoke scale caps: at their study values, a run's episodes and critic fit before its first step,
and its critic updates a step, would take minutes of the seconds the smoke scale has (two updates run the same code
as fifty)."""

# Methods a study can run: name -> (credit_assignment method, trainer config overrides).
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "grpo_shuffled": ("grpo_shuffled", {}),
    # each trajectory weighed once in the loss (the original GRPO's aggregation): under token-mean, failed episodes
    # that run to the turn or context limit hold more tokens than solved ones, and the batch's tokens carry a net
    # negative advantage (trainers.algorithms.advantage_drift; each study's "before training" line measures it)
    "grpo_seq_mean": ("grpo", {"loss_agg": "seq-mean-token-mean"}),
    "grpo_shuffled_seq_mean": ("grpo_shuffled", {"loss_agg": "seq-mean-token-mean"}),
    # the same, with each step's rollouts split into 4 mini-batches: 4 optimizer updates a step instead of 1 (PPO's
    # clip bounds how far the later ones move from the sampling policy), so a run of 20 steps takes 80 updates from
    # the same rollouts; pi_old then costs one no-grad pass over the batch
    "grpo_seq_mean_mb4": ("grpo", {"loss_agg": "seq-mean-token-mean", "mini_batches": 4}),
    "grpo_shuffled_seq_mean_mb4": ("grpo_shuffled", {"loss_agg": "seq-mean-token-mean", "mini_batches": 4}),
    "gigpo": ("gigpo", {}),
    # GiGPO at GRPO's advantage scale: the same learning rate then means the same step size
    "gigpo_equal_scale": ("gigpo", {"advantage_scale": "grpo"}),
    # the same in grpo_seq_mean_mb4's setting: each trajectory weighed once, four optimizer updates a step
    "gigpo_equal_scale_seq_mean_mb4": ("gigpo", {"advantage_scale": "grpo", "loss_agg": "seq-mean-token-mean",
                                                 "mini_batches": 4}),
    "arpo": ("arpo", {}),
    # one fresh rollout a task, the other seven of the group branched from it (and from its branches): every
    # branch reruns none of the calls of the prefix it copies, so the training budget falls with the share of
    # branched trajectories (with four fresh of eight, arpo_vs_grpo's ARPO ran 0.87x GRPO's calls)
    "arpo_one_fresh": ("arpo", {"initial_rollouts": 1}),
    "archer": ("archer", {}),
    "archer_observation": ("archer", {"critic_input": "observation"}),
    # the actor's baseline from 4 fresh utterances a state instead of the learned V, whose lag behind Q shifted
    # each batch's advantages by 2.6x their spread in archer_vs_filtered_bc
    "archer_sampled": ("archer", {"critic_input": "observation", "actor_baseline": "sampled",
                                  "actor_samples_per_state": 4}),
    # the critic that ranked maze moves best when fit offline (the move read after the state, the last token
    # pooled; benchmarks/archer_critic_fit.py), with the reference code's 50 critic updates a step
    "archer_joint": ("archer", {"critic_input": "observation", "actor_baseline": "sampled",
                                "actor_samples_per_state": 4, "critic_action_view": "joint", "critic_pooling": "last",
                                "critic_steps": 50}),
    # archer_joint with a critic that reads the maze as a grid (a recurrent convolution over its cells; the one
    # encoder whose offline fit of held-out returns passed the (distance, move) table's, 0.480 against 0.468, with
    # benchmarks/archer_critic_fit.py on six runs' buffers), at the rate that fit used
    "archer_grid": ("archer", {"critic_input": "observation", "actor_baseline": "sampled",
                               "actor_samples_per_state": 4, "critic_action_view": "joint", "critic_encoder": "grid",
                               "critic_max_tokens": 128, "critic_learning_rate": 3e-4, "critic_steps": 50}),
    # archer_grid starting, as its baseline below does, from PRIOR_EPISODES episodes of the warm start, with its
    # critic first regressed onto their returns for as many steps as the offline fit that explained 0.467 of held-out
    # returns (benchmarks/results/archer_critic_fit.json: six runs' 55,273 turns, 3,000 steps): the data and fit a
    # 20-step run of 64 episodes a step cannot collect
    "archer_grid_prior": ("archer", {"critic_input": "observation", "actor_baseline": "sampled",
                                     "actor_samples_per_state": 4, "critic_action_view": "joint",
                                     "critic_encoder": "grid", "critic_max_tokens": 128, "critic_learning_rate": 3e-4,
                                     "critic_steps": 50, "prior_episodes": PRIOR_EPISODES,
                                     "critic_prior_steps": 3000}),
    # archer_grid_prior with an SGD actor: its step is the learning rate times the advantage-weighted gradient, so it
    # moves as far as the critic separates the utterances it samples (AdamW's step has one size whatever the
    # advantages' scale: in archer_prior_vs_filtered_bc's seed 1 advantages of 1e-4 to 1e-3 took the policy from 0.41 to 0.08)
    "archer_grid_prior_sgd": ("archer", {"critic_input": "observation", "actor_baseline": "sampled",
                                         "actor_samples_per_state": 4, "critic_action_view": "joint",
                                         "critic_encoder": "grid", "critic_max_tokens": 128,
                                         "critic_learning_rate": 3e-4, "critic_steps": 50,
                                         "prior_episodes": PRIOR_EPISODES, "critic_prior_steps": 3000,
                                         "actor_optimizer": "sgd"}),
    "filtered_bc": ("filtered_bc", {}),
    "filtered_bc_prior": ("filtered_bc", {"prior_episodes": PRIOR_EPISODES}),
}

GOAL_SEEDS = 3
"""Seeds per method at the goal scale: a goal is met only when its difference exceeds two standard errors over
them."""

SOKOBAN_BC_TARGET = 0.5
"""Sokoban's warm start clones towards half the training rooms solved (400 BC steps reach 0.45): cloned to 0.25
(held out 0.145), 9 of 16 groups of a batch failed every rollout, and neither GRPO's nor GiGPO's gradient showed
signal on 8 batches of 128 (noise scales above 1,319 and 2,003 rollouts within 2 se). At the stronger start the
gradients are measurable (benchmarks/results/gradient_noise.json), which sizes the Sokoban studies."""

BABYAI_SIZED_BY = (131.0, "GRPO token-mean's noise scale on 6 batches of 256 rollouts at the warm start "
                          "(benchmarks/results/gradient_noise_babyai.json), the figure of record when the study ran")
"""What the BabyAI studies up to ``grpo_babyai_mini_batches_40_steps`` were sized by. Twelve fresh batches at the same
warm start put GRPO's noise scale near ten times higher (four of the twelve batches' gradients point away from the
other eight's, so a mean cosine over six batches can be far off), so those studies ran well below their noise."""

STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("grpo_sokoban", "sokoban", ("grpo",), baseline="grpo_start", control="grpo_shuffled",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="Does GRPO learn on Sokoban at the rollouts a step its gradient noise asks for?",
          bc_target=SOKOBAN_BC_TARGET),
    Study("grpo_babyai", "babyai", ("grpo",), sized_by=BABYAI_SIZED_BY, baseline="grpo_start", control="grpo_shuffled",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="Does GRPO learn BabyAI GoToLocal (held-out rooms) from a BC warm start?"),
    # BabyAI's failed rollouts hold about twice the sampled tokens of its solved ones: under token-mean GRPO's
    # net advantage on a batch's tokens is negative, and held-out success fell at every learning rate tried
    Study("grpo_babyai_seq_mean", "babyai", ("grpo_seq_mean",), noise_variant="grpo_seq_mean",
          sized_by=BABYAI_SIZED_BY, baseline="grpo_start",
          control="grpo_shuffled_seq_mean",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="With each trajectory weighed once in the loss (seq-mean-token-mean), so that failed episodes' "
                   "extra turns no longer push down every sampled token, does GRPO learn BabyAI GoToLocal?"),
    # at one optimizer update a step (grpo_babyai_seq_mean), held-out success rose in every seed (+0.060 on
    # average) and two seeds were still rising after 20 steps: the rollouts carried more signal than 20 updates took
    Study("grpo_babyai_mini_batches", "babyai", ("grpo_seq_mean_mb4",), noise_variant="grpo_seq_mean",
          sized_by=BABYAI_SIZED_BY, baseline="grpo_start",
          control="grpo_shuffled_seq_mean_mb4",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="With four optimizer updates a step from the same rollouts (four mini-batches, PPO's clip bounding "
                   "the later ones), does GRPO improve held-out BabyAI success by 10 points in 20 steps?"),
    # grpo_babyai_mini_batches ended at +8.8 points with two of its seeds still rising (0.295 -> 0.325 and 0.21 ->
    # 0.315 over their last five steps): ten steps more, each of its runs and controls extended from step 20
    Study("grpo_babyai_mini_batches_30_steps", "babyai", ("grpo_seq_mean_mb4",), noise_variant="grpo_seq_mean",
          sized_by=BABYAI_SIZED_BY, baseline="grpo_start",
          control="grpo_shuffled_seq_mean_mb4",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="Does GRPO with four updates a step reach +10 points on held-out BabyAI in 30 steps?",
          learning_rate_from="grpo_babyai_mini_batches", steps=30),
    # grpo_babyai_mini_batches_30_steps met +10 points on test_large (+0.101) but read +0.077 on test_replica, 400
    # rooms none of its choices saw (+0.089 +- 0.020 over both, paired): ten steps more, chosen after that reading, so
    # its verdict is read on test_large, test_replica and test_fresh (400 rooms no result had been read on) pooled
    Study("grpo_babyai_mini_batches_40_steps", "babyai", ("grpo_seq_mean_mb4",), noise_variant="grpo_seq_mean",
          sized_by=BABYAI_SIZED_BY, baseline="grpo_start",
          control="grpo_shuffled_seq_mean_mb4",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="Ten steps past 30, does the BabyAI gain reach 10 points on rooms no choice of the study saw?",
          learning_rate_from="grpo_babyai_mini_batches", steps=40),
    # The BabyAI studies above ran 136 rollouts a step (BABYAI_SIZED_BY) with seq-mean-token-mean and four updates a
    # step. At the warm start, 12 batches of 256 put seq-mean's noise scale at 573 rollouts
    # (gradient_noise_babyai_seq_mean.json), so each update took 34 rollouts, a seventeenth of a half-signal batch.
    # The same recipe at seq-mean's own noise scale; its verdict is read on test_large, test_replica and test_fresh
    # pooled (--held-out-again), as fixed before it ran.
    Study("grpo_babyai_noise_sized", "babyai", ("grpo_seq_mean_mb4",), baseline="grpo_start",
          control="grpo_shuffled_seq_mean_mb4",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="At the rollouts a step its own loss weighting's gradient noise asks for, does GRPO gain 10 points "
                   "on held-out BabyAI rooms?",
          noise_variant="grpo_seq_mean", learning_rate_from="grpo_babyai_mini_batches"),
    Study("grpo_textworld", "textworld", ("grpo",), baseline="grpo_start", control="grpo_shuffled",
          goal="GRPO beats its shuffled control and improves held-out success by >= 10 points",
          question="Does GRPO learn TextWorld cooking games with unseen foods and house layouts?"),
    Study("gigpo_vs_grpo", "sokoban", ("gigpo_equal_scale", "grpo"), baseline="grpo", control="grpo_shuffled",
          goal="GiGPO beats GRPO by >= 10 points (difference > 2 se) at equal rollouts and equal advantage scale",
          question="Does step credit from recurring Sokoban states beat episode credit once the scale is equal?",
          margin=0.10, bc_target=SOKOBAN_BC_TARGET),
    # BabyAI is where the two methods' credit differs most before training (10.8% of tokens get credit from one of
    # them only, against 0.0% on the maze; step-vs-episode correlation 0.71 against 0.93), and GiGPO's gradient is
    # half signal at 59 rollouts a step against GRPO's 131 (benchmarks/results/gradient_noise_babyai.json)
    Study("gigpo_vs_grpo_babyai", "babyai", ("gigpo_equal_scale", "grpo"), sized_by=BABYAI_SIZED_BY, baseline="grpo",
          control="grpo_shuffled",
          goal="GiGPO beats GRPO by >= 10 points (difference > 2 se) at equal rollouts and equal advantage scale",
          question="Does step credit beat episode credit on BabyAI, where a tenth of the tokens get credit from only "
                   "one of the two?", margin=0.10, learning_rate_from="grpo_babyai"),
    # GRPO's setting in which BabyAI held-out success rose in every seed (grpo_babyai_mini_batches): there GRPO
    # learns, so a lead of step credit over episode credit can show; its GRPO and control runs are that study's
    Study("gigpo_vs_grpo_babyai_mini_batches", "babyai", ("gigpo_equal_scale_seq_mean_mb4", "grpo_seq_mean_mb4"),
          noise_variant="grpo_seq_mean",
          sized_by=BABYAI_SIZED_BY, baseline="grpo_seq_mean_mb4", control="grpo_shuffled_seq_mean_mb4",
          goal="GiGPO beats GRPO by >= 10 points (difference > 2 se) at equal rollouts and equal advantage scale",
          question="In the setting where GRPO learns BabyAI (each trajectory weighed once, four updates a step), does "
                   "step credit from recurring states add to it?", margin=0.10,
          learning_rate_from="grpo_babyai_mini_batches"),
    Study("gigpo_vs_grpo_babyai_mini_batches_30_steps", "babyai",
          ("gigpo_equal_scale_seq_mean_mb4", "grpo_seq_mean_mb4"), noise_variant="grpo_seq_mean",
          sized_by=BABYAI_SIZED_BY, baseline="grpo_seq_mean_mb4",
          control="grpo_shuffled_seq_mean_mb4",
          goal="GiGPO beats GRPO by >= 10 points (difference > 2 se) at equal rollouts and equal advantage scale",
          question="Ten steps on, with GiGPO's low seed still rising at step 20, does step credit pull ahead?",
          margin=0.10, learning_rate_from="grpo_babyai_mini_batches_30_steps", steps=30),
    # grpo_babyai_noise_sized with step credit beside it: at 576 rollouts a step both methods' gradients are at
    # least half signal at the warm start (GRPO seq-mean's noise scale 573, GiGPO seq-mean's 393 on the same 12
    # batches, gradient_noise_babyai_gigpo_seq_mean.json; GRPO's scale multiplies a batch's GiGPO advantages by one
    # number, which leaves the gradient's direction and so the noise scale as they are), where the earlier
    # comparisons ran at 136. Its GRPO and control runs are that study's; the verdict is read on test_large,
    # test_replica and test_fresh pooled (--held-out-again), as fixed before it ran.
    Study("gigpo_vs_grpo_babyai_noise_sized", "babyai", ("gigpo_equal_scale_seq_mean_mb4", "grpo_seq_mean_mb4"),
          noise_variant="grpo_seq_mean", baseline="grpo_seq_mean_mb4", control="grpo_shuffled_seq_mean_mb4",
          goal="GiGPO beats GRPO by >= 10 points (difference > 2 se) at equal rollouts and equal advantage scale",
          question="At the rollouts a step both methods' gradient noise asks for, does step credit from recurring "
                   "states beat episode credit on held-out BabyAI rooms?", margin=0.10,
          learning_rate_from="grpo_babyai_noise_sized"),
    Study("archer_vs_filtered_bc", "maze", ("archer_observation", "archer", "filtered_bc"), baseline="filtered_bc",
          control="grpo_shuffled",
          goal="ArCHer's critic explains >= 50% of the return variance and ArCHer beats filtered BC at equal episodes",
          question="Does a critic that reads the maze state (not the whole history) make ArCHer beat filtered BC?"),
    Study("archer_sampled_vs_filtered_bc", "maze", ("archer_sampled", "filtered_bc"), baseline="filtered_bc",
          control="grpo_shuffled",
          goal="ArCHer's critic explains >= 50% of the return variance and ArCHer beats filtered BC at equal episodes",
          question="With the learned V's offset removed from the actor's advantage (the other fresh utterances' Q "
                   "at the same state as its baseline), does ArCHer beat filtered BC?"),
    Study("archer_joint_vs_filtered_bc", "maze", ("archer_joint", "filtered_bc"), baseline="filtered_bc",
          control="grpo_shuffled",
          goal="ArCHer's critic explains >= 50% of the return variance and ArCHer beats filtered BC at equal episodes",
          question="With a critic that reads each move after its state and five times the critic updates, does its Q "
                   "rank the maze's moves, and does ArCHer then beat filtered BC?"),
    Study("archer_grid_vs_filtered_bc", "maze", ("archer_grid", "filtered_bc"), baseline="filtered_bc",
          control="grpo_shuffled",
          goal="ArCHer's critic explains >= 50% of the return variance and ArCHer beats filtered BC at equal episodes",
          question="With a critic that reads the maze as a grid of cells, not a string of tokens, does its Q explain "
                   "the returns, and does ArCHer then beat filtered BC?"),
    Study("archer_prior_vs_filtered_bc", "maze", ("archer_grid_prior", "filtered_bc_prior"),
          baseline="filtered_bc_prior", control="grpo_shuffled",
          goal="ArCHer's critic explains >= 50% of the return variance and ArCHer beats filtered BC at equal episodes",
          question="When both methods start from the same thousands of episodes of the warm start, and ArCHer's grid "
                   "critic is first fit to their returns, does the critic explain the returns and ArCHer beat "
                   "filtered BC?"),
    Study("archer_sgd_vs_filtered_bc", "maze", ("archer_grid_prior_sgd", "filtered_bc_prior"),
          baseline="filtered_bc_prior", control="grpo_shuffled", lead_rate_only=True,
          goal="ArCHer's critic explains >= 50% of the return variance and ArCHer beats filtered BC at equal episodes",
          question="With an actor whose step grows with the critic's advantages (SGD) instead of one size whatever "
                   "they are (AdamW), does ArCHer keep what its critic knows and beat filtered BC?"),
    Study("arpo_vs_grpo", "guess", ("arpo", "grpo"), baseline="grpo", control="grpo_shuffled",
          goal="ARPO reaches GRPO's held-out success with <= 0.8x its tool calls",
          question="On a task where the number of calls is free, does ARPO's branching spend fewer of them?"),
    Study("arpo_one_fresh_vs_grpo", "guess", ("arpo_one_fresh", "grpo"), baseline="grpo", control="grpo_shuffled",
          goal="ARPO reaches GRPO's held-out success with <= 0.8x its tool calls",
          question="With one fresh rollout a task and the rest of its group branched, does ARPO reach GRPO's success "
                   "on fewer tool calls?"),
)}


def suite_of(study: Study, scale_name: str) -> str:
    """The suite a study's runs use at a scale (the smoke scale may use a smaller one)."""
    task = task_of(study.task)
    smoke = scale_name.split(",")[0] == "smoke"  # "smoke" or "smoke, N steps"
    return SMOKE_SUITES.get(study.task, task.suite) if smoke else task.suite


HELD_OUT_SPLITS = {"sokoban": "validation", "babyai": "test_large", "textworld": "test_large",
                   "maze": "validation_large", "guess": "validation_all"}
"""Each task's held-out split large enough for se <= 0.025: Sokoban's ``validation`` (400 rooms from held-out
seeds, the training room size; its ``test`` holds 100 bigger rooms), 400-task splits beside the 100-200-task ones
earlier results used (those stay as they were), and for guess-the-number every one of its 100 secrets."""

FURTHER_HELD_OUT_SPLITS = {"babyai": ("test_replica", "test_fresh")}
"""Each task's further held-out splits, each as large as :data:`HELD_OUT_SPLITS`' and sharing no task with it,
with each other or with training: ``agentgym study NAME --held-out-again`` scores a finished study's models on them,
rooms none of the study's choices saw."""

TASK_SPACE = {"credit-guess": 100}
"""Suites whose whole task space is this many tasks: a split that holds all of them measures a greedy policy's
success exactly (the finite-population correction of the standard error is 0)."""


def eval_split_of(study: Study, scale_name: str = "goal") -> str:
    """The study's held-out split (:data:`HELD_OUT_SPLITS`); a smoke suite's own held-out split at the smoke
    scale."""
    task = task_of(study.task)
    if suite_of(study, scale_name) != task.suite:
        return task.eval_split
    return HELD_OUT_SPLITS.get(study.task, task.eval_split)


def split_size(suite: str, split: str) -> int | None:
    """Tasks in a suite's split, read from its YAML's ``count`` (no task generation); ``None`` when unknown."""
    import yaml

    path = BENCHMARKS.parent / "tasks" / "suites" / f"{suite}.yaml"
    if not path.is_file():
        return None
    spec = yaml.safe_load(path.read_text()) or {}
    entry = (spec.get("splits") or {}).get(split)
    if isinstance(entry, dict) and isinstance(entry.get("count"), int):
        return int(entry["count"])
    if isinstance(entry, list):
        return len(entry)
    return None


def held_out_needed(se: float = SE_TARGET, p: float = 0.5) -> int:
    """Held-out tasks for one evaluation's standard error ``sqrt(p (1 - p) / n)`` to be at most ``se``."""
    if not 0 < se < 1 or not 0 <= p <= 1:
        raise ValueError(f"se must be in (0, 1) and p in [0, 1], got se={se}, p={p}")
    return math.ceil(p * (1 - p) / se ** 2 - 1e-9)


def binomial_se(p: float, n: int, population: int | None = None) -> float:
    """Standard error of a success rate ``p`` measured on ``n`` tasks drawn without repeats from ``population``
    (``None``: an unbounded task space); all of a finite space measured leaves no task-sampling error."""
    if n <= 0:
        return float("nan")
    correction = 1.0 if population is None or population <= 1 else max(population - n, 0) / (population - 1)
    return math.sqrt(max(p * (1 - p), 0.0) / n * correction)


def noise_scale(task: str, variant: str, results_dir: Path | None = None) -> tuple[float | None, str]:
    """``(rollouts a step for half signal, where the number comes from)`` for a task and gradient_noise variant,
    from the committed measurements at the model the studies train from: the task's own ``gradient_noise`` file
    and any labelled one (``gradient_noise.py --label``) measured at the same model (a figure at a trained model
    never sizes a study). Of those holding the variant, the one on the most rollouts wins (the own file on a tie):
    a mean cosine over few batches can be far off (BabyAI's GRPO read 131 on 6 batches, 1,307 on 12). Then
    :data:`MEASURED_NOISE`; ``(None, why)`` if none has it."""
    folder = results_dir or BENCHMARKS / "results"
    candidates: list[tuple[Path, dict[str, Any]]] = []
    for name in (f"gradient_noise_{task}.json", "gradient_noise.json"):  # the task's own file, then the shared one
        path = folder / name
        details = (json.loads(path.read_text()).get("details") or {}) if path.is_file() else {}
        if details.get("task") == task:
            candidates.append((path, details))
            break
    if candidates:
        model = candidates[0][1].get("model")
        for path in sorted(folder.glob(f"gradient_noise_{task}_*.json")):
            details = json.loads(path.read_text()).get("details") or {}
            if details.get("task") == task and details.get("model") == model:
                candidates.append((path, details))
    best: tuple[int, float, str] | None = None
    for i, (path, details) in enumerate(candidates):
        value = ((details.get("variants") or {}).get(variant) or {}).get("noise_scale")
        rollouts = int(details.get("batches") or 0) * int(details.get("rollouts_per_batch") or 0)
        if value and (best is None or rollouts > best[0]):
            where = f" at {details.get('model')}" if i else ""
            best = (rollouts, float(value), f"benchmarks/results/{path.name} ({details.get('batches')} batches of "
                                            f"{details.get('rollouts_per_batch')} rollouts{where})")
    if best is not None:
        return best[1], best[2]
    if (task, variant) in MEASURED_NOISE:
        return MEASURED_NOISE[(task, variant)], "benchmarks/gradient_noise.py at the Sokoban BC warm start"
    return None, (f"not measured: run python benchmarks/gradient_noise.py --task {task} --model <its warm start> "
                  f"--variants grpo,{variant}")


def goal_scale(study: Study) -> tuple[Scale, dict[str, Any]]:
    """The goal scale of a study and how it was sized (noise scale, held-out size and whether each bound holds).

    Rollouts a step: the measured noise scale rounded up to whole groups of :data:`GROUP_SIZE`; a task never
    measured borrows the largest measured figure (Sokoban's GRPO), and says so."""
    task = task_of(study.task)
    noise, source = noise_scale(study.task, study.noise_variant)
    if study.sized_by is not None:  # the figure it ran at, kept so that its runs stay the very runs it trained
        pinned, why = study.sized_by
        source = f"{why}; measured since: {noise:.0f}, {source}" if noise is not None else why
        noise = pinned
    measured = noise is not None
    if noise is None:
        noise = max(MEASURED_NOISE.values())
        source += f"; sized with the largest measured scale ({noise:.0f}, Sokoban GRPO) meanwhile"
    tasks_per_step = math.ceil(noise / GROUP_SIZE)
    needed = held_out_needed()
    available = split_size(task.suite, eval_split_of(study))
    eval_tasks = needed if available is None else min(needed, available)
    population = TASK_SPACE.get(task.suite)
    se = binomial_se(0.5, eval_tasks, population)
    scale = Scale(tasks_per_step=tasks_per_step, group_size=GROUP_SIZE, steps=study.steps, eval_tasks=eval_tasks,
                  eval_every=study.eval_every, warm_start="bc", bc_target=study.bc_target)
    sizing = {"noise_scale": noise, "noise_measured": measured, "noise_source": source,
              "held_out_needed": needed, "held_out_available": available, "held_out_used": eval_tasks,
              "task_space": population, "held_out_se_at_p_0.5": se, "se_target": SE_TARGET,
              "se_bound_met": se <= SE_TARGET + 1e-12}
    return scale, sizing


SMOKE = Scale(tasks_per_step=2, group_size=4, steps=1, eval_tasks=2, eval_every=1, warm_start="smoke", bc_steps=2)
"""Seconds: the whole code path (warm start, every method and the control, evaluation, result file, plot)."""


def scale_of(study: Study, name: str) -> tuple[Scale, dict[str, Any]]:
    """``(scale, sizing)`` for ``smoke`` or ``goal``."""
    if name == "smoke":
        return SMOKE, {"note": "smoke scale: checks the code path, measures nothing"}
    if name == "goal":
        return goal_scale(study)
    raise ValueError(f"unknown scale {name!r}; use smoke or goal")


def runs_of(study: Study) -> tuple[str, ...]:
    """Every method a study trains: its methods, then its control."""
    return tuple(dict.fromkeys((*study.methods, study.control)))


def counts_tool_calls(study: Study) -> bool:
    """Whether the study's goal is about tool calls: its lead method is ARPO (in any configuration), whose
    claim is reaching the baseline's success on fewer calls."""
    return METHODS[study.methods[0]][0] == "arpo"


def rate_source(study: Study) -> str:
    """The study whose learning-rate tuning this one trains at: itself, or the end of its ``learning_rate_from``
    chain (a study may borrow its rate from one that borrows it in turn)."""
    seen = {study.name}
    while study.learning_rate_from:
        study = STUDIES[study.learning_rate_from]
        if study.name in seen:
            raise ValueError(f"learning_rate_from forms a cycle through {study.name}: end the chain at a study that "
                             "tunes its own rate")
        seen.add(study.name)
    return study.name


def same_size(one: Study, other: Study) -> bool:
    """Whether two studies' goal scales agree in everything but the number of steps (rollouts a step, held-out
    size, warm start): only then can one's runs be the other's, or extend them."""
    return dataclasses.replace(goal_scale(one)[0], steps=0) == dataclasses.replace(goal_scale(other)[0], steps=0)


def shared_runs(study: Study) -> tuple[str, ...]:
    """The methods whose runs this study shares with the one it takes its learning rate from (same task, scale
    and rate: the same runs, copied from whichever study trained them first)."""
    source_study = STUDIES.get(study.learning_rate_from or "")
    if source_study is None or source_study.steps != study.steps or not same_size(source_study, study):
        return ()  # at another number of steps (the longer one extends the shorter) or rollouts a step: other runs
    source = runs_of(STUDIES[study.learning_rate_from])
    return tuple(m for m in runs_of(study) if m in source)


def extended_study(study: Study) -> Study | None:
    """The longest study with fewer steps whose runs this one's extend where that study ran them (the same task,
    rate source and every one of its methods and control), or ``None``."""
    shorter = [s for s in STUDIES.values() if s.task == study.task and s.steps < study.steps
               and rate_source(s) == rate_source(study) and set(runs_of(study)) <= set(runs_of(s))
               and same_size(s, study)]
    return max(shorter, key=lambda s: s.steps, default=None)


def measured_hours(study: Study, results_dir: Path | None = None) -> dict[str, Any] | None:
    """What the study's last goal-scale run cost, read from its committed result: ``{"hours", "jobs", "runs",
    "warm_start_s", "date"}``, or ``None`` when it has none.

    ``hours``: the BC warm start plus every run but those of :func:`shared_runs` (the source study trains them),
    each run's own wall time divided by the runs that ran at once (``--jobs``, which shares the cores among them).
    A run copied from another study only because it happened to have run first counts at its own wall time: a
    user who runs this study alone trains it. Sampling, updates and evaluations all count, so this is what a rerun on a like machine
    takes, where :func:`expected_hours` counts the sampling alone, at Sokoban's rollout rate."""
    path = (results_dir or BENCHMARKS / "results") / f"study_{study.name}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    details = record.get("details") or {}
    if details.get("scale_name") != "goal":
        return None
    jobs = 1
    words = str(record.get("command", "")).split()
    for i, word in enumerate(words):  # "--jobs N" or "--jobs=N"; the last one wins, as argparse reads it
        value = word.partition("=")[2] if word.startswith("--jobs=") else (
            words[i + 1] if word == "--jobs" and i + 1 < len(words) else "")
        if value.isdigit() and int(value) > 0:
            jobs = int(value)
    shared = shared_runs(study)
    runs = [r for r in details.get("runs") or []
            if r.get("method") not in shared and isinstance(r.get("seconds"), (int, float))]
    warm = float((details.get("warm_start") or {}).get("seconds") or 0.0)
    hours = (warm + sum(float(r["seconds"]) for r in runs) / max(jobs, 1)) / 3600
    return {"hours": hours, "jobs": jobs, "runs": len(runs), "warm_start_s": warm,
            "date": str(record.get("date", ""))[:10]}


def progress_on_disk(study: Study, scale: Scale, seeds: int, root: Path) -> dict[str, Any] | None:
    """How far an unfinished goal-scale run of the study in its run folder ``root`` (``lr_tuning.workdir_name``)
    has got, from its runs' ``metrics.jsonl``: ``{"steps_done", "steps", "step_s"}`` (``step_s``: the median
    training step, sampling and update, as the runs measured it with the cores they shared), or ``None`` when
    nothing is on disk. Runs it copies from another study (:func:`shared_runs`) count in neither figure: it does
    not train them."""
    import statistics

    shared = set(shared_runs(study))
    done: dict[Path, dict[int, float]] = {}
    for metrics in sorted(root.glob("*/seed*/metrics.jsonl")) if root.is_dir() else []:
        if metrics.parent.parent.name in shared:
            continue
        for line in metrics.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a killed run
                continue
            if isinstance(row.get("time/step_s"), (int, float)):  # a resumed step counts once, its last time
                done.setdefault(metrics, {})[int(row["step"])] = float(row["time/step_s"])
    times = [t for steps in done.values() for t in steps.values()]
    if not times:
        return None
    return {"steps_done": len(times), "steps": (len(runs_of(study)) - len(shared)) * seeds * scale.steps,
            "step_s": statistics.median(times)}


def expected_hours(study: Study, scale: Scale, seeds: int, cores: int = 2) -> float:
    """Hours on ``cores`` idle cores at today's sampler rate: rollouts sampled (training, episodes before the first
    step, and greedy held-out evaluations, which dominate nothing at the goal scale but are counted) over the
    measured rollouts a second, for the runs this study trains itself (not those it shares, :func:`shared_runs`). The rate is Sokoban's, so a
    task whose episodes run shorter samples faster; training the model comes on top. What a finished run really
    took is :func:`measured_hours`."""
    trained = [m for m in runs_of(study) if m not in shared_runs(study)]
    evaluations = scale.steps // scale.eval_every + 1
    rollouts = seeds * sum(scale.steps * scale.rollouts_per_step + evaluations * scale.eval_tasks
                           + METHODS[m][1].get("prior_episodes", 0) for m in trained)
    return rollouts / (sampler_rates_per_core()[0] * cores) / 3600
