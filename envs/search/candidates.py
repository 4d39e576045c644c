"""Every candidate of an answer's type, and the country names the grader accepts beyond the corpus titles.

Why candidates: to accept a sentence answer ("The capital of Fiji is Suva.") without accepting a hedge
("Suva or Nadi"), the grader must know which words in the sentence are *other* answers of the same type.
The candidates are drawn from the same reconciled records the corpus is rendered from: every capital
and every city with a document for capitals, every country name and alias for countries, every currency
name and ISO code, every language, and the counts 0-16 in digits and words.

Why extra country names: the records' own alias data (countryinfo ``altSpellings``: "US", "USA", "UK",
"United States of America") is the first source; only names it lacks that English writers use all the time
come from :data:`COMMON_COUNTRY_NAMES`, a short table kept small on purpose (every entry is a name that
refers to exactly one country in current English usage).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

from agentgym.envs.search.sources import LANGUAGE_NAMES, _countryinfo_records, _geonames_file, load_world, plain

__all__ = ["ANSWER_TYPES", "COMMON_COUNTRY_NAMES", "STOCK_WORDS", "answer_type", "candidate_names",
           "country_short_names", "is_search_kind"]

#: Names of one country only, missing from countryinfo's altSpellings (alpha-3 -> names).
COMMON_COUNTRY_NAMES: Mapping[str, tuple[str, ...]] = {
    "USA": ("America", "the States", "U.S.A.", "U.S."),
    "GBR": ("Britain", "U.K."),
    "NLD": ("Holland",),
    "CZE": ("Czechia",),
    "CIV": ("Ivory Coast",),
    "MMR": ("Burma",),
    "SWZ": ("Swaziland",),
    "TLS": ("East Timor",),
    "CPV": ("Cape Verde",),
    "TUR": ("Turkey", "Türkiye"),
    "MKD": ("Macedonia",),
    "KOR": ("South Korea",),
    "PRK": ("North Korea",),
    "COD": ("DR Congo", "DRC", "Congo-Kinshasa"),
    "COG": ("Congo-Brazzaville",),
}

#: Town names that are also words of an ordinary answer sentence ("The capital of Fiji is Suva": Of is a town
#: in Turkey); they are no rival capital inside a sentence.
_SENTENCE_WORDS = frozenset(
    "a about along an and answer as at be by called can capital city country currency final for from in is it its "
    "known land language largest main mine most much named nation national of official on one republic same "
    "seat spoken state than that the this to un uses was which with".split())

#: Words of stock answer sentences ("It is located in", "The official currency of X is the"), allowed around
#: the gold in a sentence answer besides the question's own words.
STOCK_WORDS = frozenset(
    "a an and answer are as be border borders called capital city countries country currency final for has have "
    "in is it its land language lies located my named neighbors neighbours of official other share shares so "
    "spoken that the there this to used uses was which with".split())

ANSWER_TYPES = ("capital", "country", "currency", "language", "count")
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                 "twelve", "thirteen", "fourteen", "fifteen", "sixteen")


def answer_type(kind: str) -> str:
    """The type of a question kind's answer: ``capital``, ``country``, ``currency``, ``language`` or ``count``."""
    if kind == "border_count":
        return "count"
    for suffix in ("capital", "currency", "language"):
        if kind.endswith(suffix):
            return suffix
    return "country"


@lru_cache(maxsize=1)
def _short_spellings() -> dict[str, tuple[str, ...]]:
    """alpha-3 -> the 2-3 letter abbreviations countryinfo lists for it ("US", "USA"), Latin letters only."""
    out: dict[str, tuple[str, ...]] = {}
    for record in _countryinfo_records():
        code = str((record.get("ISO") or {}).get("alpha3") or "")
        names = [str(a) for a in record.get("altSpellings") or [] if 2 <= len(str(a)) <= 3 and str(a).isascii()]
        if code:
            out[code] = tuple(dict.fromkeys(names))
    return out


def country_short_names(code: str) -> tuple[str, ...]:
    """Names of the country ``code`` accepted beyond its title and long aliases: the records' abbreviations
    (the ISO alpha-2 and alpha-3 codes are among them) and :data:`COMMON_COUNTRY_NAMES`."""
    return (*_short_spellings().get(code, ()), *COMMON_COUNTRY_NAMES.get(code, ()))


@lru_cache(maxsize=1)
def candidate_names() -> dict[str, tuple[str, ...]]:
    """Every candidate answer of each type (:data:`ANSWER_TYPES`), from the reconciled records and GeoNames."""
    world = load_world()
    countries = world.countries.values()
    towns = [str(c["name"]) for c in _geonames_file("cities15000.json").values()  # "Suva, Nadi" names two
             if plain(str(c["name"])) not in _SENTENCE_WORDS]
    capitals = [n for c in countries for n in (c.capital, *c.capital_aliases)] + towns
    names = [n for c in countries for n in (c.name, *c.aliases, *country_short_names(c.code))]
    currencies = [n for c in countries for n in (c.currency, c.currency_code)] + ["Euro", "CFA franc"]
    counts = [str(n) for n in range(100)] + list(_NUMBER_WORDS)
    return {"capital": tuple(capitals), "country": tuple(names), "currency": tuple(currencies),
            "language": tuple(LANGUAGE_NAMES.values()), "count": tuple(counts)}


def is_search_kind(kind: str) -> bool:
    """Whether ``kind`` looks like a question kind (lower-case words joined by underscores)."""
    return bool(kind) and re.fullmatch(r"[a-z_]+", kind) is not None
