"""Task data of the code-interpreter env: reasoning-gym problems and the CHAMP competition set.

Two task sources, both returning :class:`~agentgym.suite.Task` lists for ``TaskSuite.from_yaml``, re-exported
here:

* :func:`generate_tasks` (:mod:`agentgym.envs.code_interpreter.reasoning_gym_tasks`) draws problems from
  reasoning-gym datasets, each with a reference program (:mod:`agentgym.envs.code_interpreter.reference_code`;
  CodeI/O samples are vetted by :mod:`agentgym.envs.code_interpreter.codeio`);
* :func:`champ_tasks` (:mod:`agentgym.envs.code_interpreter.champ`) loads the 270 problems of the CHAMP
  competition-math dataset.

:func:`agentgym.envs.code_interpreter.answer_grading.grade_answer` grades a final answer for either source
(reasoning-gym's own scorers are not used: they reject correct forms and accept hedged answers).
"""

from __future__ import annotations

from agentgym.envs.code_interpreter.champ import CHAMP_SIZE, champ_tasks
from agentgym.envs.code_interpreter.codeio import codeio_sample_is_safe
from agentgym.envs.code_interpreter.reasoning_gym_tasks import generate_tasks
from agentgym.envs.code_interpreter.reference_code import DATASETS, LITERAL_DATASETS, reference_code

__all__ = [
    "CHAMP_SIZE", "champ_tasks", "codeio_sample_is_safe", "DATASETS", "generate_tasks", "LITERAL_DATASETS",
    "reference_code"
]
