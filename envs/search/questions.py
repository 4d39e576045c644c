"""Questions with known answers, generated from real country and city facts, with a reference search path.

Every question is built from the reconciled records in :mod:`agentgym.envs.search.sources` (the same ones
the corpus's profile documents are rendered from), so its answer is stated in the corpus, and it carries a
*reference path*: one search query per hop and the documents that answer that hop (``gold``: the profile,
plus any Wikipedia summary that states the same fact). :meth:`SearchEnv.reference_solver` replays the path
and proves each question answerable with the configured retriever; the retrieval benchmark scores
recall@k against the same gold documents.

Kinds of questions (``hops`` = documents that must be chained):

* 1 hop: ``capital``, ``currency``, ``language``, ``city_country``, ``border_count``
* 2 hops: ``capital_currency``, ``capital_language``, ``city_capital``, ``city_currency`` (find the country
  first), ``compare_population``, ``compare_area``, ``compare_city_countries`` (two parallel lookups
  each), ``common_neighbour``, ``only_neighbour_capital``, ``only_neighbour_currency``
* 3 hops: ``common_neighbour_capital``, ``common_neighbour_currency``, ``city_only_neighbour_capital``

Question types (``metadata["type"]``), so results can be reported per type: ``single-hop``, ``bridge`` (find
an entity, then a fact about it), ``intersection`` (the one country bordering two others, then maybe a
fact about it) and ``comparison`` (which of two countries has more people or land). A comparison that names
its two options (``compare_population``, ``compare_area``) can be answered by a coin flip half the time:
the generator balances whether the first- or the second-named option wins (``metadata["answer_position"]``)
and caps comparisons at :data:`COMPARISON_SHARE` of a draw, and the grader fails an answer that names both
options (:func:`agentgym.envs.search.scoring.grade_answer`).

Held-out entities: each country belongs to the ``train`` or ``test`` group by a hash of its ISO code (45 %
test, so a 500-question test split spans over 80 countries), a city to its country's group, and a question
to a group only when *every* country it touches (named, bridged or answered) is in it, so no test question
shares an entity with any train question.

Premises with one answer: a city or capital is only named in a question when no other place in another
country fits the name (:mod:`agentgym.envs.search.premises`: "Cuenca" is in Ecuador and in Spain, so
neither is asked about).
Phrasings vary by template, chosen by a hash of the question's content (stable across runs).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from agentgym.envs.search.candidates import country_short_names
from agentgym.envs.search.corpus import city_doc_id, country_doc_id, wiki_doc_ids
from agentgym.envs.search.premises import ambiguous_capitals, ambiguous_cities
from agentgym.envs.search.sources import (
    City,
    Country,
    World,
    load_world,
    plain,
    the,
    wiki_summaries,
)

from agentgym.errors import TaskError, did_you_mean
from agentgym.suite import Task

__all__ = [
    "COMPARISON_SHARE",
    "ENTITY_GROUPS",
    "KINDS",
    "NAMED_OPTION_KINDS",
    "Hop",
    "Question",
    "entity_group",
    "generate_questions",
    "question_pool",
    "question_type",
]

ENTITY_GROUPS = ("train", "test", "all")
TEST_SHARE_PERCENT = 45
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                 "twelve", "thirteen", "fourteen", "fifteen", "sixteen")
#: Comparisons only between values this far apart. The Wikipedia summaries state populations up to 1.54x
#: off GeoNames' (Syria 26 M vs 16.9 M; measured over the 86 summaries that state one), so a ratio of 2 keeps
#: every comparison's winner the same whichever source an agent reads.
_MIN_RATIO = 2.0
#: Largest share of a draw that comparisons may take (all comparison kinds together).
COMPARISON_SHARE = 0.1


@dataclass(frozen=True)
class Hop:
    """One step of a reference path: what to search, which documents answer it, and what it reveals."""

    query: str
    gold: tuple[str, ...]
    finds: str

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "gold": list(self.gold), "finds": self.finds}


@dataclass(frozen=True)
class Question:
    """A generated question with its answer, accepted aliases and reference path."""

    kind: str
    question: str
    answer: str
    aliases: tuple[str, ...]
    path: tuple[Hop, ...]
    entities: tuple[str, ...]  # ISO alpha-3 codes of every country involved
    #: For comparisons: the two candidate answers in the order the question names or implies them.
    options: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "question", self.question[:1].upper() + self.question[1:])

    @property
    def hops(self) -> int:
        return KINDS[self.kind][0]

    @property
    def type(self) -> str:
        return question_type(self.kind)

    @property
    def answer_position(self) -> str | None:
        """``first`` or ``second``: which of a comparison's options is the answer."""
        if self.options is None:
            return None
        return "first" if self.options[0] == self.answer else "second"

    def to_task(self) -> Task:
        digest = hashlib.sha256(self.question.encode()).hexdigest()[:10]
        metadata: dict[str, Any] = {"kind": self.kind, "type": self.type, "hops": self.hops,
                                    "aliases": list(self.aliases), "path": [h.to_dict() for h in self.path],
                                    "entities": list(self.entities)}
        if self.options is not None:
            metadata.update(options=list(self.options), answer_position=self.answer_position,
                            options_named=self.kind in NAMED_OPTION_KINDS)
        return Task(id=f"{self.kind}-{digest}", prompt=self.question, answer=self.answer, metadata=metadata)


def entity_group(code: str) -> str:
    """``train`` or ``test`` for a country's ISO alpha-3 code (stable hash; 45 % test)."""
    value = int(hashlib.sha256(f"agentgym-search/{code}".encode()).hexdigest(), 16) % 100
    return "test" if value < TEST_SHARE_PERCENT else "train"


def _pick(templates: Sequence[str], key: str) -> str:
    return templates[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(templates)]


# ---- answers and gold documents ------------------------------------------------------------------------
def _country_answers(c: Country) -> tuple[str, ...]:
    """The title, the records' aliases and abbreviations ("US", "USA") and the few common English names the
    records lack ("America"; :data:`agentgym.envs.search.candidates.COMMON_COUNTRY_NAMES`)."""
    return tuple(dict.fromkeys((c.name, *c.aliases, *country_short_names(c.code))))


def _capital_answers(c: Country) -> tuple[str, ...]:
    return (c.capital, *c.capital_aliases)


def _currency_answers(c: Country, world: World) -> tuple[str, ...]:
    """The currency's name, its ISO 4217 code and the name qualified by its issuer ("Australian Dollar" for AUD,
    also in Kiribati; the issuer is the country whose alpha-2 code starts the currency code, none for EUR or
    XOF). Never the using country's demonym: "I-Kiribati Dollar" is no currency."""
    names = [c.currency, c.currency_code]
    issuer = next((x for x in world.countries.values() if x.alpha2 == c.currency_code[:2]), None)
    if issuer is not None:  # "Australian Dollar", "Australia Dollar", "AU Dollar" (so "U.S. dollar" passes)
        names += [f"{issuer.demonym} {c.currency}"] if issuer.demonym else []
        names += [f"{issuer.name} {c.currency}", f"{issuer.alpha2} {c.currency}"]
    if c.currency_code in ("XOF", "XAF"):
        names.append("CFA franc")
    return tuple(names)


def _count_answers(n: int) -> tuple[str, ...]:
    words = (_NUMBER_WORDS[n],) if n < len(_NUMBER_WORDS) else ()
    return (str(n), *words, *(("none",) if n == 0 else ()))


class _Gold:
    """Which documents state a fact: the profile documents, plus Wikipedia summaries that say the same."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.wiki = wiki_summaries()
        self.wiki_ids = wiki_doc_ids()
        self.capital_docs: dict[str, list[str]] = {}
        for city in world.cities:
            if city.is_capital:
                self.capital_docs.setdefault(city.country, []).append(city_doc_id(city, world))

    def _wiki_mentioning(self, title: str, country: Country) -> tuple[str, ...]:
        record = self.wiki.get(title)
        if record is None or plain(country.name) not in plain(record["extract"]):
            return ()
        return (self.wiki_ids[title],)

    def profile(self, c: Country) -> tuple[str, ...]:
        return (country_doc_id(c),)

    def capital_of(self, c: Country) -> tuple[str, ...]:
        """Documents saying that ``c.capital`` is the capital of ``c`` (profile, capital's city profile, wiki)."""
        return (country_doc_id(c), *self.capital_docs.get(c.code, ()), *self._wiki_mentioning(c.capital, c))

    def city(self, city: City) -> tuple[str, ...]:
        country = self.world.countries[city.country]
        return (city_doc_id(city, self.world), *self._wiki_mentioning(city.name, country))


# ---- question builders ------------------------------------------------------------------------------------
Builder = Callable[[World, _Gold], Iterable[Question]]


def _capital_ok(c: Country) -> bool:
    return c.capital_reliable


def _capital_as_clue(c: Country, world: World) -> bool:
    """A capital can name its country in a question only when it does not contain the country's name and no
    other country or territory has a capital of that name (:func:`ambiguous_capitals`)."""
    return (c.capital_reliable and plain(c.name) not in plain(c.capital) and plain(c.capital) not in plain(c.name)
            and c.code not in ambiguous_capitals(world))


def _single_language(c: Country) -> bool:
    return len(c.languages) == 1


def _hop_capital(c: Country, gold: _Gold) -> Hop:
    return Hop(f"capital of {the(c.name)}", gold.profile(c), c.capital)


def _hop_currency(c: Country, gold: _Gold) -> Hop:
    return Hop(f"currency of {the(c.name)}", gold.profile(c), c.currency)


def _hop_language(c: Country, gold: _Gold) -> Hop:
    return Hop(f"official language of {the(c.name)}", gold.profile(c), c.languages[0])


def _hop_borders(c: Country, gold: _Gold, finds: str) -> Hop:
    return Hop(f"{the(c.name)} land borders", gold.profile(c), finds)


def _hop_country_of_capital(c: Country, gold: _Gold) -> Hop:
    return Hop(f"{c.capital} capital of which country", gold.capital_of(c), c.name)


def _hop_country_of_city(city: City, gold: _Gold) -> Hop:
    return Hop(f"{city.name} city country", gold.city(city), gold.world.countries[city.country].name)


def _single_hop(world: World, gold: _Gold) -> Iterable[Question]:
    for c in world.countries.values():
        if _capital_ok(c):
            q = _pick(["What is the capital of {c}?", "Which city is the capital of {c}?",
                       "Name the capital city of {c}."], f"capital/{c.code}").format(c=the(c.name))
            yield Question("capital", q, c.capital, _capital_answers(c), (_hop_capital(c, gold),), (c.code,))
        q = _pick(["What currency is used in {c}?", "What is the official currency of {c}?",
                   "Which currency do people pay with in {c}?"], f"currency/{c.code}").format(c=the(c.name))
        yield Question("currency", q, c.currency, _currency_answers(c, world), (_hop_currency(c, gold),), (c.code,))
        if _single_language(c):
            q = _pick(["What is the official language of {c}?", "Which language is the official language of {c}?"],
                      f"language/{c.code}").format(c=the(c.name))
            yield Question("language", q, c.languages[0], (c.languages[0],), (_hop_language(c, gold),), (c.code,))
        if not c.borders_reliable:
            continue
        n = len(c.neighbours)
        q = _pick(["How many countries share a land border with {c}?",
                   "With how many other countries does {c} share a land border?"], f"borders/{c.code}").format(c=the(c.name))
        yield Question("border_count", q, str(n), _count_answers(n), (_hop_borders(c, gold, str(n)),), (c.code,))


def _question_cities(world: World) -> list[City]:
    """Cities a question may name: not capitals, not containing their country's name, and unambiguous: no
    other place in another country fits the name (:func:`agentgym.envs.search.premises.ambiguous_cities`)."""
    elsewhere = ambiguous_cities(world)
    taken = " | ".join(plain(n) for c in world.countries.values() for n in (c.name, c.capital, *c.capital_aliases))
    out = []
    for city in world.cities:
        country = world.countries[city.country]
        name = plain(city.name)
        if (city.is_capital or not name or name in world.ambiguous_city_names or plain(country.name) in name
                or city.geonameid in elsewhere):
            continue
        if re.search(rf"\b{re.escape(name)}\b", taken):  # "Salvador" would also find El Salvador, San Salvador
            continue
        if not all(ord(ch) < 0x250 for ch in city.name):
            continue
        out.append(city)
    return out


def _city_questions(world: World, gold: _Gold) -> Iterable[Question]:
    for city in _question_cities(world):
        c = world.countries[city.country]
        find = _hop_country_of_city(city, gold)
        q = _pick(["In which country is the city of {x}?", "{x} is a city in which country?",
                   "Which country is {x} located in?"], f"city_country/{city.geonameid}").format(x=city.name)
        yield Question("city_country", q, c.name, _country_answers(c), (find,), (c.code,))
        if _capital_ok(c):
            q = _pick(["What is the capital of the country where {x} is located?",
                       "{x} lies in a country. What is that country's capital?"],
                      f"city_capital/{city.geonameid}").format(x=city.name)
            yield Question("city_capital", q, c.capital, _capital_answers(c), (find, _hop_capital(c, gold)), (c.code,))
        q = _pick(["What currency is used in the country where {x} is located?",
                   "Which currency would you pay with in {x}?"], f"city_currency/{city.geonameid}").format(x=city.name)
        yield Question("city_currency", q, c.currency, _currency_answers(c, world), (find, _hop_currency(c, gold)), (c.code,))


def _capital_clue_questions(world: World, gold: _Gold) -> Iterable[Question]:
    for c in world.countries.values():
        if not _capital_as_clue(c, world):
            continue
        find = _hop_country_of_capital(c, gold)
        q = _pick(["What currency is used in the country whose capital is {x}?",
                   "{x} is the capital of a country. What is that country's currency?"],
                  f"capital_currency/{c.code}").format(x=c.capital)
        yield Question("capital_currency", q, c.currency, _currency_answers(c, world), (find, _hop_currency(c, gold)), (c.code,))
        if _single_language(c):
            q = _pick(["What is the official language of the country whose capital is {x}?",
                       "{x} is a capital city. What is the official language of its country?"],
                      f"capital_language/{c.code}").format(x=c.capital)
            yield Question("capital_language", q, c.languages[0], (c.languages[0],),
                           (find, _hop_language(c, gold)), (c.code,))


def _comparisons(world: World, gold: _Gold) -> Iterable[Question]:
    countries = list(world.countries.values())
    for i, a in enumerate(countries):
        for b in countries[i + 1:]:
            key = f"{a.code}/{b.code}"
            first, second = (a, b) if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 2 else (b, a)
            hi, lo = max(a.population, b.population), min(a.population, b.population)
            if hi >= _MIN_RATIO * lo:
                winner = a if a.population > b.population else b
                q = _pick(["Which country has the larger population, {a} or {b}?", "Which is more populous: {a} or {b}?",
                           "Does {a} or {b} have more inhabitants?"], f"compare_population/{key}")
                yield Question("compare_population", q.format(a=the(first.name), b=the(second.name)), winner.name,
                               _country_answers(winner),
                               (Hop(f"population of the country {first.name}", gold.profile(first),
                                    str(first.population)),
                                Hop(f"population of the country {second.name}", gold.profile(second),
                                    str(second.population))),
                               (first.code, second.code), (first.name, second.name))
            hi, lo = max(a.area_km2, b.area_km2), min(a.area_km2, b.area_km2)
            if hi >= _MIN_RATIO * lo:
                winner = a if a.area_km2 > b.area_km2 else b
                q = _pick(["Which country is larger by area, {a} or {b}?", "Which covers more land: {a} or {b}?",
                           "Which country has the bigger area, {a} or {b}?"], f"compare_area/{key}")
                yield Question("compare_area", q.format(a=the(first.name), b=the(second.name)), winner.name,
                               _country_answers(winner),
                               (Hop(f"area of {the(first.name)}", gold.profile(first), str(first.area_km2)),
                                Hop(f"area of {the(second.name)}", gold.profile(second), str(second.area_km2))),
                               (first.code, second.code), (first.name, second.name))


def _city_comparisons(world: World, gold: _Gold) -> Iterable[Question]:
    cities = _question_cities(world)
    for i, x in enumerate(cities):
        for offset in (7, 31, 101):
            y = cities[(i + offset) % len(cities)]
            cx, cy = world.countries[x.country], world.countries[y.country]
            if cx.code == cy.code or max(cx.population, cy.population) < _MIN_RATIO * min(cx.population, cy.population):
                continue
            winner = cx if cx.population > cy.population else cy
            q = _pick(["Which is more populous: the country where {x} is located, or the country where {y} is located?",
                       "{x} and {y} are in different countries. Which of those two countries has more people?"],
                      f"compare_city_countries/{x.geonameid}/{y.geonameid}").format(x=x.name, y=y.name)
            path = (_hop_country_of_city(x, gold), _hop_country_of_city(y, gold),
                    Hop(f"population of the country {cx.name}", gold.profile(cx), str(cx.population)),
                    Hop(f"population of the country {cy.name}", gold.profile(cy), str(cy.population)))
            yield Question("compare_city_countries", q, winner.name, _country_answers(winner), path, (cx.code, cy.code),
                           (cx.name, cy.name))


def _neighbour_questions(world: World, gold: _Gold) -> Iterable[Question]:
    countries = list(world.countries.values())
    countries = [c for c in countries if c.borders_reliable]  # borders the corpus states the same way
    reliable = {c.code for c in countries}
    for a in countries:
        if len(a.neighbours) != 1:
            continue
        b = world.countries[a.neighbours[0]]
        find = _hop_borders(a, gold, b.name)
        if _capital_ok(b):
            q = _pick(["{a} shares a land border with exactly one country. What is the capital of that country?",
                       "What is the capital of the only country that shares a land border with {a}?"],
                      f"only_neighbour_capital/{a.code}").format(a=the(a.name))
            yield Question("only_neighbour_capital", q, b.capital, _capital_answers(b), (find, _hop_capital(b, gold)),
                           (a.code, b.code))
        q = _pick(["{a} shares a land border with exactly one country. What currency does that country use?",
                   "What is the currency of the only country that shares a land border with {a}?"],
                  f"only_neighbour_currency/{a.code}").format(a=the(a.name))
        yield Question("only_neighbour_currency", q, b.currency, _currency_answers(b, world), (find, _hop_currency(b, gold)),
                       (a.code, b.code))
    for i, a in enumerate(countries):
        for b in countries[i + 1:]:
            common = set(a.neighbours) & set(b.neighbours)
            if len(common) != 1 or not common <= reliable:
                continue
            c = world.countries[common.pop()]
            key = f"{a.code}/{b.code}"
            path = (_hop_borders(a, gold, c.name), _hop_borders(b, gold, c.name))
            entities = (a.code, b.code, c.code)
            q = _pick(["Which country shares a land border with both {a} and {b}?",
                       "Name the only country that borders both {a} and {b}."], f"common_neighbour/{key}")
            yield Question("common_neighbour", q.format(a=the(a.name), b=the(b.name)), c.name, _country_answers(c),
                           path, entities)
            if _capital_ok(c):
                q = _pick(["What is the capital of the country that borders both {a} and {b}?",
                           "One country shares a land border with both {a} and {b}. What is its capital?"],
                          f"common_neighbour_capital/{key}")
                yield Question("common_neighbour_capital", q.format(a=the(a.name), b=the(b.name)), c.capital,
                               _capital_answers(c), (*path, _hop_capital(c, gold)), entities)
            q = _pick(["What currency is used in the country that borders both {a} and {b}?",
                       "One country shares a land border with both {a} and {b}. What is its currency?"],
                      f"common_neighbour_currency/{key}")
            yield Question("common_neighbour_currency", q.format(a=the(a.name), b=the(b.name)), c.currency,
                           _currency_answers(c, world), (*path, _hop_currency(c, gold)), entities)
    for city in _question_cities(world):
        a = world.countries[city.country]
        if len(a.neighbours) != 1 or not a.borders_reliable:
            continue
        b = world.countries[a.neighbours[0]]
        if not _capital_ok(b):
            continue
        q = _pick([("{x} is in a country that shares a land border with exactly one other country. What is the "
                    "capital of that neighbouring country?")],
                  f"city_only_neighbour_capital/{city.geonameid}").format(x=city.name)
        path = (_hop_country_of_city(city, gold), _hop_borders(a, gold, b.name), _hop_capital(b, gold))
        yield Question("city_only_neighbour_capital", q, b.capital, _capital_answers(b), path, (a.code, b.code))


_BUILDERS: tuple[Builder, ...] = (_single_hop, _city_questions, _capital_clue_questions, _comparisons,
                                  _city_comparisons, _neighbour_questions)

#: kind -> (hops, one-line description)
KINDS: dict[str, tuple[int, str]] = {
    "capital": (1, "capital of a country"),
    "currency": (1, "currency of a country"),
    "language": (1, "official language of a single-language country"),
    "city_country": (1, "country a city is in"),
    "border_count": (1, "number of countries sharing a land border"),
    "capital_currency": (2, "currency of the country with a given capital"),
    "capital_language": (2, "language of the country with a given capital"),
    "city_capital": (2, "capital of the country a city is in"),
    "city_currency": (2, "currency of the country a city is in"),
    "compare_population": (2, "which of two countries has more people"),
    "compare_area": (2, "which of two countries is larger"),
    "compare_city_countries": (2, "which of the countries of two cities has more people"),
    "common_neighbour": (2, "the one country bordering two given countries"),
    "only_neighbour_capital": (2, "capital of a country's only land neighbour"),
    "only_neighbour_currency": (2, "currency of a country's only land neighbour"),
    "common_neighbour_capital": (3, "capital of the one country bordering two given countries"),
    "common_neighbour_currency": (3, "currency of the one country bordering two given countries"),
    "city_only_neighbour_capital": (3, "capital of the only neighbour of a city's country"),
}


#: Comparison kinds whose question names both candidate answers (a coin flip is right half the time).
NAMED_OPTION_KINDS = frozenset({"compare_population", "compare_area"})
_TYPES = {"comparison": ("compare_",), "intersection": ("common_neighbour",)}


def question_type(kind: str) -> str:
    """``single-hop``, ``bridge``, ``intersection`` or ``comparison``: the coarse type results are reported by."""
    for name, prefixes in _TYPES.items():
        if kind.startswith(prefixes):
            return name
    return "single-hop" if KINDS[kind][0] == 1 else "bridge"


@lru_cache(maxsize=1)
def _built_questions() -> tuple[Question, ...]:
    """What every question builder makes from the world, in order, repeats included (built once a process: each
    entity group's pool filters the same list)."""
    world = load_world()
    gold = _Gold(world)
    return tuple(question for builder in _BUILDERS for question in builder(world, gold))


@lru_cache(maxsize=4)
def question_pool(group: str = "all") -> dict[str, tuple[Question, ...]]:
    """Every question of every kind whose entities all lie in ``group`` (deterministic order, no duplicates)."""
    if group not in ENTITY_GROUPS:
        raise TaskError(f"Unknown entity group {group!r}.{did_you_mean(str(group), ENTITY_GROUPS)} "
                        f"Use one of: {', '.join(ENTITY_GROUPS)}.")
    pool: dict[str, list[Question]] = {kind: [] for kind in KINDS}
    seen: set[str] = set()
    for question in _built_questions():
        if question.question in seen:
            continue
        if group != "all" and any(entity_group(code) != group for code in question.entities):
            continue
        seen.add(question.question)
        pool[question.kind].append(question)
    return {kind: tuple(items) for kind, items in pool.items()}


def generate_questions(
    rng: random.Random,
    count: int,
    *,
    entities: str = "train",
    kinds: Sequence[str] | None = None,
    min_hops: int = 1,
    max_hops: int = 3,
) -> list[Task]:
    """Draw ``count`` distinct questions, spread evenly over the allowed kinds (the suite generator).

    Kinds are taken in turn (in an order shuffled by ``rng``), each from its own shuffled pool, until
    ``count`` questions are drawn; a kind whose pool runs out drops out, so rare kinds (3-hop chains in
    the smaller test group) appear as often as they can. Comparisons together take at most
    :data:`COMPARISON_SHARE` of the draw (rounded down; at least one when only comparison kinds are allowed),
    and each comparison drawn has its answer in whichever position (first- or second-named option) has won
    less often so far, so always answering the first (or the second) option scores exactly or nearly 50 %.
    Within a kind, the question drawn is one whose gold answer has been drawn least so far, so no answer
    dominates a split (many cities of one large country would otherwise make "Dollar" a fifth of the
    currency answers, and a constant guess would score far above chance).

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many questions.
        entities: ``train``, ``test`` (disjoint country groups) or ``all``.
        kinds: Question kinds to draw from (default: all of :data:`KINDS`).
        min_hops: Smallest number of hops.
        max_hops: Largest number of hops.
    """
    chosen = list(KINDS) if kinds is None else list(kinds)
    for kind in chosen:
        if kind not in KINDS:
            raise TaskError(f"Unknown question kind {kind!r}.{did_you_mean(str(kind), KINDS)} "
                            f"Kinds: {', '.join(KINDS)}.")
    if not 1 <= min_hops <= max_hops:
        raise TaskError(f"Need 1 <= min_hops <= max_hops, got min_hops={min_hops}, max_hops={max_hops}.")
    pool = question_pool(entities)
    queues: list[_Queue] = []
    for kind in chosen:
        if min_hops <= KINDS[kind][0] <= max_hops and pool[kind]:
            queues.append(_Queue(kind, pool[kind], rng))
    only_comparisons = all(q.comparison for q in queues)
    comparison_cap = count if only_comparisons else int(count * COMPARISON_SHARE)
    available = sum(len(q) if not q.comparison else 0 for q in queues)
    available += min(comparison_cap, sum(len(q) for q in queues if q.comparison))
    if count > available:
        raise TaskError(f"Asked for {count} questions but entities={entities!r}, these kinds and hops give only "
                        f"{available} (comparisons are capped at {COMPARISON_SHARE:.0%} of a draw); lower count or "
                        "allow more kinds.")
    rng.shuffle(queues)
    drawn: list[Question] = []
    wins = {"first": 0, "second": 0}
    answers: dict[str, int] = {}
    while len(drawn) < count:
        for queue in queues:
            if len(drawn) >= count or not queue:
                continue
            if queue.comparison:
                if sum(wins.values()) >= comparison_cap:
                    continue
                question = queue.pop(answers, prefer=min(wins, key=lambda side: (wins[side], side)))
                wins[question.answer_position or "first"] += 1
            else:
                question = queue.pop(answers)
            answers[_answer_key(question)] = answers.get(_answer_key(question), 0) + 1
            drawn.append(question)
    rng.shuffle(drawn)
    return [q.to_task() for q in drawn]


class _Queue:
    """One kind's shuffled questions; a comparison kind keeps first- and second-option winners apart."""

    def __init__(self, kind: str, questions: Sequence[Question], rng: random.Random) -> None:
        self.kind = kind
        self.comparison = question_type(kind) == "comparison"
        self.sides: dict[str, list[Question]] = {"first": [], "second": []}
        for question in questions:
            self.sides[question.answer_position or "first"].append(question)
        for side in ("first", "second"):
            rng.shuffle(self.sides[side])

    def __len__(self) -> int:
        return len(self.sides["first"]) + len(self.sides["second"])

    def pop(self, answers: dict[str, int], prefer: str = "first") -> Question:
        """The question whose answer has been drawn least so far (the last such in shuffled order)."""
        other = "second" if prefer == "first" else "first"
        side = self.sides[prefer] or self.sides[other]
        best = min(range(len(side) - 1, -1, -1), key=lambda i: answers.get(_answer_key(side[i]), 0))
        return side.pop(best)


def _answer_key(question: Question) -> str:
    return plain(question.answer)
