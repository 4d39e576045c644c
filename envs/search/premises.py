"""Which entities satisfy a question's premise: a question is only asked when exactly one does.

Why: "In which country is Cuenca?" has two right answers (Ecuador and Spain), and a grader that knows
only one of them punishes the agent that found the other. The records a question is generated from know
of one Cuenca; the corpus and GeoNames know of more. So before a city or a capital may name a question's
premise, this module looks for every *other* place that fits the same words:

* any GeoNames populated place (``cities15000``: every place of 15,000+ people, not only those with a
  document) of that name in another country ("Boston" in England, "Donetsk" in Russia);
* for a city without a summary of its own, any corpus summary that mentions the name and names another
  country but not the city's (nor its aliases or demonym): that summary speaks of some other place
  ("Surrey" in London's summary is the English county, not the Canadian city);
* for a capital used as a clue ("X is the capital of a country"), any other country or territory whose
  capital carries that name (a town of that name elsewhere, "Paris, Texas", is no capital of a country).

Ambiguity is judged by country: two places of one name in the same country leave "which country?"
with one answer, so they do not drop a question. A name that fails any check is never put in a
question; what this costs is reported by :func:`premise_report`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Callable

from agentgym.envs.search.sources import City, Country, World, _countryinfo_records, _geonames_file, plain, wiki_summaries

__all__ = ["ambiguous_capitals", "ambiguous_cities", "country_words", "premise_report"]


#: (what, id(world)) -> (world, result). A World holds dicts, so it cannot key an lru_cache; the world is
#: kept alongside so its id is not reused while cached.
_CACHE: dict[tuple[str, int], tuple[World, Any]] = {}


def _cached(what: str, world: World, compute: Callable[[World], Any]) -> Any:
    key = (what, id(world))
    if key not in _CACHE or _CACHE[key][0] is not world:
        _CACHE[key] = (world, compute(world))
    return _CACHE[key][1]


def country_words(country: Country) -> tuple[str, ...]:
    """plain() forms by which a text can name ``country``: its title, aliases and demonym."""
    words = {plain(n) for n in (country.name, *country.aliases, country.demonym) if len(plain(n)) > 2}
    if country.code == "USA":  # summaries write "U.S. state", "US" (plain: "u s", "us")
        words |= {"u s", "us state", "american"}
    if country.code == "GBR":  # constituent countries name the United Kingdom in summaries
        words |= {"england", "english", "scotland", "scottish", "wales", "welsh", "northern ireland", "british"}
    return tuple(sorted(words))


def _places_abroad(world: World) -> dict[str, set[str]]:
    """plain(name) -> alpha-2 codes of every GeoNames place (15,000+ people) of that name or ASCII name."""
    out: dict[str, set[str]] = {}
    for raw in _geonames_file("cities15000.json").values():
        for name in {str(raw.get("name") or ""), str(raw.get("asciiname") or "")}:
            if plain(name):
                out.setdefault(plain(name), set()).add(str(raw["countrycode"]))
    return out


_WORD = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")
_MAX_NAME_WORDS = 5


def _ngrams(words: list[str], starts: set[str]) -> set[str]:
    """Runs of 1 to 5 words that begin with a word in ``starts`` (the first words of the names sought)."""
    return {" ".join(words[i:i + n]) for i, word in enumerate(words) if word in starts
            for n in range(1, _MAX_NAME_WORDS + 1) if i + n <= len(words)}


def _foreign_mentions(cities: Iterable[City], world: World) -> set[int]:
    """geonameids of cities without a summary of their own whose name a summary uses while naming another
    country and not the city's ("Surrey" among London's counties).

    A city with its own summary (titled with its name, naming its country) is the corpus's sense of the
    name; another place of that name with 15,000+ people is still found in GeoNames. A summary that names
    no country at all ("Chicago Bulls ... NBA") says nothing about which place it means and is not counted.
    """
    wiki = wiki_summaries()
    words = {code: set(country_words(c)) for code, c in world.countries.items()}
    country_starts = {form.split()[0] for forms in words.values() for form in forms}
    by_name: dict[str, list[City]] = {}
    for city in cities:
        own = wiki.get(city.name)
        if own is not None and words[city.country] & _ngrams(plain(f"{own['description']} {own['extract']}").split(),
                                                             country_starts):
            continue
        by_name.setdefault(" ".join(_WORD.findall(city.name)), []).append(city)
    name_starts = {name.split()[0] for name in by_name if name}
    flagged: set[int] = set()
    for record in wiki.values():
        text = f"{record['title']}. {record['description']}. {record['extract']}"
        found = _ngrams(_WORD.findall(text), name_starts) & by_name.keys()
        if not found:
            continue
        grams = _ngrams(plain(text).split(), country_starts)
        named = {code for code, forms in words.items() if forms & grams}
        for name in found:
            titled = record["title"] == name or record["title"].startswith((f"{name},", f"{name} ("))
            for city in by_name[name]:
                if city.country not in named and (named or titled):
                    flagged.add(city.geonameid)
    return flagged


def _ambiguous_cities_cached(world: World) -> frozenset[int]:
    abroad = _places_abroad(world)
    flagged = _foreign_mentions(world.cities, world)
    for city in world.cities:
        alpha2 = world.countries[city.country].alpha2
        if abroad.get(plain(city.name), set()) - {alpha2}:
            flagged.add(city.geonameid)
    return frozenset(flagged)


def ambiguous_cities(world: World) -> frozenset[int]:
    """geonameids of the cities whose name another place in another country also fits (never asked about)."""
    return _cached("cities", world, _ambiguous_cities_cached)


def _ambiguous_capitals_cached(world: World) -> frozenset[str]:
    holders: dict[str, set[str]] = {}
    for record in _countryinfo_records():
        code = str((record.get("ISO") or {}).get("alpha3") or record.get("name") or "")
        for capital in (record.get("capital"),):
            if capital and plain(str(capital)):
                holders.setdefault(plain(str(capital)), set()).add(code)
    for country in world.countries.values():
        for name in (country.capital, *country.capital_aliases):
            holders.setdefault(plain(name), set()).add(country.code)
    out = set()
    for country in world.countries.values():
        names = [plain(n) for n in (country.capital, *country.capital_aliases) if plain(n)]
        if any(holders.get(n, set()) - {country.code} for n in names):
            out.add(country.code)
    return frozenset(out)


def ambiguous_capitals(world: World) -> frozenset[str]:
    """alpha-3 codes of countries whose capital's name also names a capital or town elsewhere, so
    "X is the capital of a country" could point to two places (never used as a clue)."""
    return _cached("capitals", world, _ambiguous_capitals_cached)


def premise_report(world: World) -> dict[str, int]:
    """How many cities and capital clues the premise checks drop (for the docs and the tests)."""
    return {"cities": len(world.cities), "ambiguous_cities": len(ambiguous_cities(world)),
            "countries": len(world.countries), "ambiguous_capitals": len(ambiguous_capitals(world))}
