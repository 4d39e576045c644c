"""Report tasks: "write a short report on COUNTRY", with the facts the corpus states about it as the reference.

Countries are split between train and test by the search suites' entity groups, so a test report is always about a
country no training task names.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
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
    """Per fact, the items a report must mention, each as a list of accepted spellings; ``subject`` holds the
    country's own names (a report names it freely: it is not a wrong neighbour)."""
    return {
        "capital": [[country.capital, *country.capital_aliases]],
        "currency": [[country.currency, country.currency_code]],
        "languages": [[language] for language in country.languages],
        "neighbours": [[world.countries[c].name, *world.countries[c].aliases] for c in country.neighbours],
        "subject": [[country.name, *country.aliases]],
    }


@lru_cache(maxsize=1)
def _vocabulary() -> dict[str, tuple[str, ...]]:
    """Every spelling of each kind of fact in the world: what a report could name, rightly or wrongly."""
    world = load_world()
    countries = world.countries.values()
    kinds = {
        "capital": {s for c in countries for s in (c.capital, *c.capital_aliases)},
        "currency": {s for c in countries for s in (c.currency, c.currency_code)},
        "languages": {s for c in countries for s in c.languages},
        "neighbours": {s for c in countries for s in (c.name, *c.aliases)},
    }
    return {k: tuple(sorted((s for s in v if s and s.strip()), key=lambda s: (-len(s), s))) for k, v in kinds.items()}


@lru_cache(maxsize=8)
def _pattern(kind: str) -> re.Pattern[str]:
    """One alternation of a kind's spellings, longest first, on word boundaries: "Equatorial Guinea" is one
    mention (not also "Guinea"), and "Europe" is not the Euro's code."""
    words = "|".join(re.escape(s.lower()) for s in _vocabulary()[kind])
    return re.compile(rf"(?<!\w)(?:{words})(?!\w)")


def _mentions(text: str, spellings: Sequence[str]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(s.lower())}(?!\w)", text) for s in spellings if s)


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
    """Per fact key, the share of its items the report names (any accepted spelling, case-insensitive, whole words)
    times the share of the report's names of that kind that are right.

    Why the second factor: without it a report that lists every currency, language and country of the world (all
    fit in 2,000 characters) states most facts of any country without researching it. A name counts as wrong only
    when it is of the fact's kind and none of the task's own facts (a neighbour named as such is not a wrong
    capital; the country itself is never a wrong neighbour). A fact with no items (an island with no neighbours)
    counts as covered: its profile names its region, which may share a country's name ("Micronesia").
    """
    low = report.lower()
    own = {s.lower() for key, items in facts.items() for item in (items or []) for s in item if s}
    out: dict[str, float] = {}
    for key in FACT_KEYS:
        items: Any = facts.get(key) or []
        right = [item for item in items if _mentions(low, item)]
        recall = 1.0 if not items else len(right) / len(items)
        wrong = {m.group(0) for m in _pattern(key).finditer(low)} - own
        named = len(right) + len(wrong)
        out[key] = recall * (len(right) / named if named else 1.0) if items else 1.0
    return out
