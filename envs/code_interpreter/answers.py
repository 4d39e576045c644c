"""Final-answer extraction, equivalence checking and grading for the code-interpreter env.

The pieces live in three modules, re-exported here:

* :mod:`agentgym.envs.code_interpreter.answer_text`: where the final answer is in the text, and its
  canonical spelling (:func:`extract_final_answer`, :func:`normalize_answer`);
* :mod:`agentgym.envs.code_interpreter.answer_equivalence`: whether two answers are mathematically the same,
  bounded in time and size against hostile input (:func:`answers_equivalent`, :func:`is_hedged`);
* :mod:`agentgym.envs.code_interpreter.answer_grading`: the env's reward, one grader per task kind
  (:func:`grade_answer`, :data:`GRADERS`).
"""

from __future__ import annotations

from agentgym.envs.code_interpreter.answer_equivalence import (
    MAX_ANSWER_CHARS,
    MAX_LOG10,
    REL_TOL,
    answers_equivalent,
    is_hedged,
)
from agentgym.envs.code_interpreter.answer_grading import (
    CODEIO_REL_TOL,
    GRADERS,
    MAX_CODEIO_CHARS,
    MAX_LITERAL_CHARS,
    grade_answer,
    number_value,
    task_kind,
)
from agentgym.envs.code_interpreter.answer_text import (
    HEDGE_JOINER,
    MAX_HEDGE_SHOWN,
    MAX_NESTING,
    extract_final_answer,
    final_answer_candidates,
    has_final_answer,
    normalize_answer,
)

__all__ = [
    "answers_equivalent", "CODEIO_REL_TOL", "extract_final_answer", "final_answer_candidates", "grade_answer",
    "GRADERS", "has_final_answer", "HEDGE_JOINER", "is_hedged", "MAX_ANSWER_CHARS", "MAX_CODEIO_CHARS",
    "MAX_HEDGE_SHOWN", "MAX_LITERAL_CHARS", "MAX_LOG10", "MAX_NESTING", "normalize_answer", "number_value",
    "REL_TOL", "task_kind"
]
