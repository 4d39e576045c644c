"""The search corpus: real Wikipedia summaries plus short fact documents, built once and cached on disk.

Wikipedia lead summaries rarely state a country's currency or its full list of neighbours, so a question
generated from country records would not always be answerable from Wikipedia alone. Each country therefore
also gets a short *country profile* (capital, currency, languages, population, area, land borders) and each
large city (and every capital) a *city profile* (its country and population), rendered from the same
reconciled records the questions are generated from (:mod:`agentgym.envs.search.sources`). Every hop of
every generated question is thus retrievable, while the 10,033 real summaries act both as extra evidence
and as realistic distractors.

Building is deterministic (sorted inputs, no randomness) and takes about a second; the result is cached as
JSONL under ``<cache root>/search`` (:func:`agentgym.utils.cache.cache_root`) with the corpus version and the data packages' versions in the
file name, so upgrading either rebuilds it.

Corpora: ``full`` (Wikipedia + profiles, the default) and ``profiles`` (country and city profiles only: a
small corpus for fast tests).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from agentgym.envs.search.sources import (
    City,
    Country,
    World,
    load_world,
    plain,
    source_versions,
    the,
    wiki_summaries,
)
from agentgym.tools.retrieval.base import Document, default_cache_dir

from agentgym.utils.cache import build_once
from agentgym.errors import ConfigError, did_you_mean

__all__ = [
    "CORPORA",
    "CORPUS_VERSION",
    "Corpus",
    "build_documents",
    "city_doc_id",
    "country_doc_id",
    "load_corpus",
    "wiki_doc_ids",
]

logger = logging.getLogger(__name__)

#: Bump when document ids, texts or the selection of documents change.
#: 2: capitals as the Wikipedia summaries state them (Kazakhstan's is Astana, not Nur-Sultan).
CORPUS_VERSION = 2
CORPORA = ("full", "profiles")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", plain(text)).strip("-")


def country_doc_id(country: Country) -> str:
    return f"country-{_slug(country.name)}"


def city_doc_id(city: City, world: World) -> str:
    return f"city-{_slug(city.name) or city.geonameid}-{world.countries[city.country].alpha2.lower()}"


@lru_cache(maxsize=1)
def wiki_doc_ids() -> Mapping[str, str]:
    """Wikipedia title -> document id (``wiki-<slug>``; a clash of slugs gets ``-2``, ``-3`` in title order)."""
    ids: dict[str, str] = {}
    used: set[str] = set()
    for title in sorted(wiki_summaries()):
        base = f"wiki-{_slug(title) or hashlib.sha256(title.encode()).hexdigest()[:8]}"
        doc_id, n = base, 1
        while doc_id in used:
            n += 1
            doc_id = f"{base}-{n}"
        used.add(doc_id)
        ids[title] = doc_id
    return ids


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def country_document(country: Country, world: World) -> Document:
    """A short, factual profile; one sentence per fact, each naming the country (so BM25 finds the sentence)."""
    n = the(country.name)
    start = n[0].upper() + n[1:]
    where = f"{country.subregion}, {country.region}" if country.subregion else country.region
    sentences = [f"{start} is a country in {where}." if where else f"{start} is a country."]
    sentences.append(f"The capital of {n} is {country.capital.rstrip('.')}.")
    sentences.append(f"The currency of {n} is the {country.currency} ({country.currency_code}).")
    if len(country.languages) == 1:
        sentences.append(f"The official language of {n} is {country.languages[0]}.")
    elif country.languages:
        sentences.append(f"The official languages of {n} are {_join(list(country.languages))}.")
    sentences.append(f"{start} has a population of {country.population:,} and an area of {country.area_km2:,} "
                     "square kilometres.")
    neighbours = sorted(world.countries[c].name for c in country.neighbours)
    if not neighbours:
        sentences.append(f"{start} shares no land border with any other country: it borders 0 countries.")
    elif len(neighbours) == 1:
        sentences.append(f"{start} shares a land border with only 1 country: {the(neighbours[0])}.")
    else:
        sentences.append(f"{start} shares land borders with {len(neighbours)} countries: "
                         f"{_join([the(x) for x in neighbours])}.")
    return Document(country_doc_id(country), f"{country.name} (country profile)", " ".join(sentences),
                    {"source": "countryinfo+geonames", "kind": "country", "entity": country.code})


def city_document(city: City, world: World) -> Document:
    country = world.countries[city.country].name
    # "inhabitants", not "population": "population of China" must find China's profile, not 300 city profiles.
    text = f"{city.name} is a city in {the(country)} with {city.population:,} inhabitants."
    if city.is_capital:
        text += f" {city.name} is the capital of {the(country)}."
    if city.timezone:
        text += f" Its time zone is {city.timezone}."
    return Document(city_doc_id(city, world), f"{city.name}, {country} (city profile)", text,
                    {"source": "geonames", "kind": "city", "entity": city.country, "geonameid": city.geonameid})


def build_documents(name: str = "full") -> list[Document]:
    """Build a corpus's documents from the installed data packages (deterministic)."""
    _check_name(name)
    world = load_world()
    docs = [country_document(c, world) for c in world.countries.values()]
    docs += [city_document(c, world) for c in world.cities]
    if name == "full":
        ids = wiki_doc_ids()
        for title, record in sorted(wiki_summaries().items()):
            docs.append(Document(ids[title], title, record["extract"],
                                 {"source": "wikipedia", "kind": "wiki", "topic": record["topic"],
                                  "description": record["description"]}))
    return docs


def _check_name(name: str) -> None:
    if name not in CORPORA:
        raise ConfigError(f"Unknown corpus {name!r}.{did_you_mean(str(name), CORPORA)} Choose one of: {', '.join(CORPORA)}.")


class Corpus:
    """The documents of one corpus, by id, with a fingerprint that keys every derived cache (indexes)."""

    def __init__(self, name: str, docs: Sequence[Document], fingerprint: str) -> None:
        self.name = name
        self.docs: tuple[Document, ...] = tuple(docs)
        self.fingerprint = fingerprint
        self._by_id = {d.doc_id: d for d in self.docs}
        if len(self._by_id) != len(self.docs):
            raise ConfigError(f"Corpus {name!r} has duplicate document ids; delete its cache file and rebuild.")
        self._by_title: dict[str, Document] = {}
        for doc in self.docs:
            self._by_title.setdefault(plain(doc.title), doc)

    def __len__(self) -> int:
        return len(self.docs)

    def __iter__(self) -> Iterator[Document]:
        return iter(self.docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._by_id

    def __getitem__(self, doc_id: str) -> Document:
        return self._by_id[doc_id]

    def get(self, doc_id: str) -> Document | None:
        return self._by_id.get(doc_id)

    def by_title(self, title: str) -> Document | None:
        """The first document whose title matches ``title`` ignoring case, accents and punctuation."""
        return self._by_title.get(plain(title))

    def suggest(self, doc_id: str) -> str:
        """A ' Did you mean ...?' hint for an unknown id: the id form of a title, a prefix, or a close id."""
        key = doc_id.strip().lower()[:200]
        if not key:
            return ""
        slug = _slug(key)
        for guess in (f"wiki-{slug}", f"country-{slug}"):
            if guess in self._by_id:
                return f" Did you mean {guess!r}?"
        prefix = [d for d in self._by_id if d.startswith(key)][:3] if len(key) >= 4 else []
        if prefix:
            return " Did you mean " + " or ".join(repr(p) for p in prefix) + "?"
        # Fuzzy matching over 11k ids is slow; compare only with ids that share the kind and first letter.
        kind, _, rest = key.partition("-")
        head = f"{kind}-{rest[:1]}" if rest else key[:1]
        return did_you_mean(key, [d for d in self._by_id if d.startswith(head)])

    def __repr__(self) -> str:
        return f"Corpus({self.name!r}, {len(self)} docs, fingerprint={self.fingerprint})"


def corpus_fingerprint(name: str) -> str:
    payload = json.dumps({"corpus": name, "version": CORPUS_VERSION, "sources": source_versions()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def corpus_cache_path(name: str, cache_dir: Path | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "search" / f"corpus-{name}-v{CORPUS_VERSION}-{corpus_fingerprint(name)}.jsonl"


def _write_documents(path: Path, docs: Sequence[Document]) -> None:
    path.write_text("\n".join(json.dumps(d.to_dict(), ensure_ascii=False) for d in docs) + "\n", encoding="utf-8")


@lru_cache(maxsize=4)
def _load_cached(name: str, cache_dir: str | None, use_cache: bool) -> Corpus:
    fingerprint = corpus_fingerprint(name)
    if not use_cache:
        return Corpus(name, build_documents(name), fingerprint)
    path = corpus_cache_path(name, Path(cache_dir) if cache_dir else None)
    built: list[Document] = []

    def build(tmp: Path) -> None:  # runs under the cache lock, into a temporary sibling renamed into place
        built.extend(build_documents(name))
        _write_documents(tmp, built)

    try:
        build_once(path, build, directory=False)
    except OSError as exc:  # a read-only cache is not fatal: the corpus is in memory
        logger.warning("could not cache the %s corpus in %s (%s)", name, path, exc)
        return Corpus(name, built or build_documents(name), fingerprint)
    if built:
        return Corpus(name, built, fingerprint)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        return Corpus(name, [Document.from_dict(json.loads(line)) for line in lines if line], fingerprint)
    except (OSError, ValueError, KeyError) as exc:  # corrupted by hand: rebuild it, under the lock again
        logger.warning("rebuilding the %s corpus: its cache %s is unreadable (%s)", name, path, exc)
        path.unlink(missing_ok=True)
        docs = build_documents(name)
        build_once(path, lambda tmp: _write_documents(tmp, docs), directory=False)
        return Corpus(name, docs, fingerprint)


def load_corpus(name: str = "full", *, cache_dir: str | Path | None = None, use_cache: bool = True) -> Corpus:
    """The corpus ``name`` (``full`` or ``profiles``), from the disk cache or built and cached (once per process).

    Args:
        name: Which corpus.
        cache_dir: Cache root (default ``$AGENTGYM_CACHE_DIR`` or ``~/.cache/agentgym``).
        use_cache: ``False`` builds in memory without reading or writing the cache.
    """
    _check_name(name)
    return _load_cached(name, str(cache_dir) if cache_dir is not None else None, use_cache)
