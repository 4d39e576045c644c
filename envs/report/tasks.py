"""Report tasks: "write a short report on COUNTRY", with the facts the corpus states about it as the reference.

Countries are split between train and test by the search suites' entity groups, so a test report is always about a
country no training task names.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.envs.search.corpus import country_doc_id
from agentgym.envs.search.questions import ENTITY_GROUPS, entity_group
from agentgym.envs.search.sources import Country, World, load_world
from agentgym.errors import TaskError, did_you_mean
from agentgym.suite import Task

__all__ = ["FACT_KEYS", "facts_of", "generate_report_tasks"]

#: The facts a report is asked for, in the order the prompt names them.
FACT_KEYS = ("capital", "currency", "languages", "neighbours")


def facts_of(country: Country, world: World) -> dict[str, list[list[str]]]:
    """Per fact, the items a report must mention, each as a list of accepted spellings."""
    return {
        "capital": [[country.capital, *country.capital_aliases]],
        "currency": [[country.currency, country.currency_code]],
        "languages": [[language] for language in country.languages],
        "neighbours": [[world.countries[c].name, *world.countries[c].aliases] for c in country.neighbours],
    }


def generate_report_tasks(rng: random.Random, count: int, *, entities: str = "train") -> list[Task]:
    """``count`` distinct report tasks about countries of an entity group (the suite generator)."""
    if entities not in ENTITY_GROUPS:
        raise TaskError(f"Unknown entity group {entities!r}.{did_you_mean(entities, ENTITY_GROUPS)} "
                        f"Use one of: {', '.join(ENTITY_GROUPS)}.")
    world = load_world()
    pool = sorted(code for code, c in world.countries.items()
                  if c.capital_reliable and c.borders_reliable and c.languages
                  and (entities == "all" or entity_group(code) == entities))
    if count > len(pool):
        raise TaskError(f"Only {len(pool)} countries are in entity group {entities!r}; ask for at most that many.")
    return [_task(world.countries[code], world) for code in rng.sample(pool, count)]


def _task(country: Country, world: World) -> Task:
    return Task(id=f"report-{country.code.lower()}",
                prompt=(f"Write a short report on {country.name}: its capital, its currency, its official "
                        "languages and the countries it borders."),
                answer=facts_of(country, world),
                metadata={"country": country.code, "doc_id": country_doc_id(country)})


def fact_coverage(report: str, facts: Mapping[str, Sequence[Sequence[str]]]) -> dict[str, float]:
    """Per fact key, the share of its items the report mentions (any accepted spelling, case-insensitive); a fact
    with no items (an island with no neighbours) counts as covered."""
    low = report.lower()
    out: dict[str, float] = {}
    for key in FACT_KEYS:
        items: Any = facts.get(key) or []
        out[key] = 1.0 if not items else sum(any(s.lower() in low for s in item if s) for item in items) / len(items)
    return out
