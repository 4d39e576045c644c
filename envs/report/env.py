"""The report env: research a country in the search corpus, then submit a short report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import ReferenceSolver
from agentgym.envs.report.tasks import FACT_KEYS, fact_coverage, generate_report_tasks
from agentgym.envs.search.env import SearchEnv
from agentgym.errors import ConfigError, TaskError
from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["ReportEnv"]


class ReportEnv(SearchEnv):
    """Write a short report on a country from the search corpus with `search`, `open` and `submit`.

    ## Description

    An open-ended task with no single answer: the agent researches a country in the local search corpus (the
    Search env's documents and retriever) and submits a short report on its capital, currency, official languages
    and neighbours. The env's own score checks the facts against what the corpus states; a rubric
    (`agentgym.envs.report.rubric.report_rubric`) adds grounding (every number must appear in a document the agent
    saw), a length cap and, with a judge, completeness: make the env with `reward=report_rubric(judge)`.

    ## Tools

    - `search(query, k)`: search the corpus; numbered results with titles, document ids and snippets.
    - `open(doc_id)`: read a whole document.
    - `submit(report)`: submit the report (at most `max_report_chars` characters); this ends the episode.

    ## Reward

    Without a rubric: the share of the asked facts the report states (capital, currency, languages, neighbours;
    each list item counted, whole words only), each fact's share times the share of the report's names of that
    kind that are right (a report that lists every currency or country of the world states nothing), as the
    component `report`; success when every fact is stated and nothing wrong is named. With `reward=rubric`,
    the rubric's score (the fact share is kept as `outcome["checker_score"]`).

    ## Episode end

    Terminated by `submit`; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation.
    - `tasks`: tasks to draw from (a suite's split); without them a country is drawn from the reset seed.
    - `corpus`: `profiles` (default: country and city profiles, small and fast) or `full` (plus 10,033 Wikipedia
      summaries as distractors).
    - `max_report_chars`: the longest report accepted.
    - `entities`: entity group of drawn countries when no tasks are given: `train`, `test` or `all`.
    - other arguments: as for `agentgym/Search-v1`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Research a country in the search corpus and submit a short report: search, open, submit."
    native_format_hint: ClassVar[str] = (
        'You may also write plain calls such as search("Peru capital"), open("country-peru") and submit("...").'
    )

    def __init__(self, *, max_turns: int = 6, tasks: Sequence[Task] | None = None, corpus: str = "profiles",
                 max_report_chars: int = 2000, entities: str = "all", **kwargs: Any) -> None:
        if max_report_chars < 100:
            raise ConfigError(f"max_report_chars must be >= 100, got {max_report_chars}.")
        self.max_report_chars = int(max_report_chars)
        self._facts: Mapping[str, Any] = {}
        super().__init__(max_turns=max_turns, tasks=tasks, corpus=corpus, entities=entities, **kwargs)

    @tool
    def submit(self, report: str) -> str | ToolResult:
        """Submit your report; this ends the episode.

        Args:
            report: A few sentences: the capital, the currency, the official languages and the neighbours.
        """
        if not report.strip():
            return ToolResult.error("Error: the report is empty; write a few sentences, then submit them.")
        if len(report) > self.max_report_chars:
            return ToolResult.error(f"Error: the report has {len(report)} characters; the limit is "
                                    f"{self.max_report_chars}. Shorten it and submit again.")
        self.mark_answer()
        coverage = fact_coverage(report, self._facts)
        score = sum(coverage.values()) / len(coverage)
        self.add_reward("report", score)
        self.finish(success=score == 1.0, score=score, reason="answered")
        missing = [k for k in FACT_KEYS if coverage[k] < 1.0]
        return "Report received." + (f" Facts missing or incomplete: {', '.join(missing)}." if missing else "")

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.search, self.open, self.submit])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([HermesParser(), FunctionCallParser(["search", "open", "submit"],
                                                                   {"open": "doc_id", "submit": "report"})])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        from agentgym.envs.games._common import python_rng

        return generate_report_tasks(python_rng(rng), 1, entities=self.entities)[0]

    def _begin_episode(self, task: Task) -> str:
        if not isinstance(task.answer, Mapping) or not set(FACT_KEYS) <= set(task.answer):
            raise TaskError(f"Report task {task.id!r} needs answer: a mapping with the facts {list(FACT_KEYS)}.")
        self._facts = task.answer
        self._answers, self._context, self._question = (), None, task.prompt
        self._last_results, self._seen, self._answer_score, self._opened = [], {}, None, set()
        return f"Task: {task.prompt}"

    def _task_instructions(self) -> str:
        return ("Research the country in a collection of encyclopedia documents, then write a short report. Call "
                "search with a few keywords for numbered results (title, document id, snippet); call open with a "
                "document id to read it. Then call submit with a few plain sentences stating the facts asked for, "
                f"each as the documents state it; submitting ends the episode. You have {self.max_turns} turns.")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super(SearchEnv, self).step(action)
        return observation, reward, terminated, truncated, info

    def reference_solver(self) -> ReferenceSolver:
        """Open the country's profile (its id is in the task), then submit the profile's sentences as the report."""
        doc_id = str((self.task.metadata if self.task is not None else {}).get("doc_id", ""))
        opened = {"done": False}

        def call(name: str, **arguments: Any) -> str:
            return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"

        def solve(observation: str) -> str:
            if not opened["done"]:
                opened["done"] = True
                return call("open", doc_id=doc_id)
            body = observation.split("\n", 1)[1] if "\n" in observation else observation
            return call("submit", report=body[: self.max_report_chars])

        return solve

    def shortcut_solver(self) -> ReferenceSolver:
        """Submit at once without research: a report that names the country and nothing it was asked for."""
        name = self.task.prompt.split(":")[0].removeprefix("Write a short report on ") if self.task else "it"
        return lambda observation: f'submit("{name} is a country with a rich history.")'
