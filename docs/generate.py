"""Write the generated parts of the docs and the README from the code.

Each env describes itself once, in its class docstring (read by :func:`agentgym.registration.env_docs.env_doc`);
the trainers are listed by :data:`agentgym.trainers.config.TRAINER_CONFIGS`. This script turns both into:

- ``docs/envs/<family>.md``: one page per env family, every catalogue id of the family (and, on the multi-agent page,
  every PettingZoo game) with its summary, description, tools, reward, episode end, arguments and version history,
  followed by the family's hand-written notes from ``docs/envs/_notes/<family>.md``;
- ``docs/envs/index.md``: the table of every env id;
- ``docs/trainers/config-reference.md``: every config key of every trainer, with type, default and meaning
  (:mod:`agentgym.trainers.config_reference`, also ``agentgym train --help-config TRAINER``);
- the env and trainer tables between the ``<!-- generated:envs:start -->`` / ``<!-- generated:envs:end -->`` and
  ``<!-- generated:trainers:start -->`` / ``<!-- generated:trainers:end -->`` markers of ``README.md`` and
  ``docs/trainers/index.md``.

Usage::

    python docs/generate.py           # rewrite what is stale
    python docs/generate.py --check   # exit 1, naming the stale files, when anything would change

``tests/project/test_docs.py`` runs the check, so a docstring or trainer change without a regenerated page fails the tests.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOTES = DOCS / "envs" / "_notes"

#: Env families in the order the docs show them, with their page titles. Every catalogue family must be here.
FAMILIES: dict[str, str] = {
    "games": "Games",
    "babyai": "BabyAI",
    "textworld": "TextWorld",
    "scienceworld": "ScienceWorld",
    "code_interpreter": "Code interpreter",
    "search": "Search",
    "swe": "SWE",
    "web": "Web",
    "gui": "GUI",
    "multi_agent": "Multi-agent games",
    "quest": "Long-horizon quests",
    "report": "Reports (rubric rewards)",
    "dialogue": "Dialogue (simulated user)",
}


@dataclass(frozen=True)
class TrainerInfo:
    """What the trainer table says about one ``trainer:`` value beyond what its config class names."""

    estimate: str
    page: str


#: One line per ``trainer:`` value of TRAINER_CONFIGS: what the method estimates and its docs page (under
#: docs/trainers/). A trainer missing here stops the generator with the line to add.
TRAINERS: dict[str, TrainerInfo] = {
    "grpo": TrainerInfo("each episode's advantage within its task's group of rollouts, on all its tokens", "grpo.md"),
    "gigpo": TrainerInfo("GRPO's episode advantage plus a step advantage within groups of turns that start from the "
                         "same state", "gigpo.md"),
    "arpo": TrainerInfo("GRPO's group advantage over trees that branch after tool results where entropy rises; "
                        "shared prefixes credited softly or by their branches' mean", "arpo.md"),
    "archer": TrainerInfo("an utterance-level critic's min Q - min V, credited to every token of a fresh sample",
                          "archer.md"),
    "filtered_bc": TrainerInfo("nothing: clones the top quantile of every episode collected so far", "archer.md"),
}

_MARKER = "<!-- generated:{name}:{end} -->"


def _multi_agent_games() -> Sequence:
    """The PettingZoo games (``agentgym.make_multi_agent`` ids), as ``agentgym list`` shows them."""
    from agentgym.registration.multi_agent import MULTI_AGENT_CATALOGUE

    return MULTI_AGENT_CATALOGUE


def _env_docs() -> dict[str, list]:
    """Every catalogue id's :class:`EnvDoc`, by family (catalogue order), the multi-agent games last on theirs."""
    from agentgym.registration.catalogue import CATALOGUE
    from agentgym.registration.env_docs import entry_point_doc, env_doc

    by_family: dict[str, list] = {family: [] for family in FAMILIES}
    for entry in CATALOGUE:
        if entry.family not in FAMILIES:
            raise SystemExit(f"docs/generate.py: family {entry.family!r} of {entry.id} has no page; add it to FAMILIES "
                             "and write docs/envs/_notes/<family>.md.")
        by_family[entry.family].append(env_doc(entry.id))
    for game in _multi_agent_games():
        by_family["multi_agent"].append(entry_point_doc(game.aec_entry_point, game.id))
    return by_family


def _cell(text: str) -> str:
    """Markdown text as one table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _render_env(doc) -> str:
    tools = ["| tool | what it does |", "|---|---|"]
    tools += [f"| `{_cell(t.signature)}` | {_cell(t.text)} |" for t in doc.tools]
    parts = [
        f"## `{doc.env_id}`",
        doc.summary,
        "### Description", doc.description,
        "### Tools", "\n".join(tools),
        "### Reward", doc.reward,
        "### Episode end", doc.episode_end,
        "### Arguments", doc.arguments,
        "### Version history", doc.version_history,
        f"Class: `{doc.class_path}`",
    ]
    return "\n\n".join(parts)


def family_page(family: str, docs: Sequence) -> str:
    """The Markdown page of one env family."""
    header = (f"# {FAMILIES[family]}\n\n"
              f"<!-- Generated by docs/generate.py from the env class docstrings and docs/envs/_notes/{family}.md: "
              "edit those, then run `python docs/generate.py`. -->\n")
    table = ["| id | what the agent does |", "|---|---|"]
    table += [f"| `{d.env_id}` | {_cell(d.summary)} |" for d in docs]
    notes_path = NOTES / f"{family}.md"
    notes = notes_path.read_text(encoding="utf-8").strip() if notes_path.is_file() else ""
    sections = [header, "\n".join(table), *(_render_env(d) for d in docs)]
    if notes:
        sections.append(notes)
    return "\n\n".join(s.strip() for s in sections) + "\n"


def env_table(by_family: dict[str, list], link_prefix: str) -> str:
    """The table of every catalogue id (no PettingZoo games), each family linked to its page."""
    from agentgym.registration.catalogue import CATALOGUE

    family_of = {entry.id: entry.family for entry in CATALOGUE}
    rows = ["| id | family | what the agent does |", "|---|---|---|"]
    for family, docs in by_family.items():
        for doc in docs:
            if doc.env_id in family_of:
                rows.append(f"| `{doc.env_id}` | [{FAMILIES[family]}]({link_prefix}{family}.md) | {_cell(doc.summary)} |")
    return "\n".join(rows)


def envs_index(by_family: dict[str, list]) -> str:
    """``docs/envs/index.md``."""
    games = ["| id | forms | what the agents do |", "|---|---|---|"]
    summaries = {d.env_id: d.summary for d in by_family["multi_agent"]}
    for game in _multi_agent_games():
        forms = "AEC + parallel" if game.parallel_entry_point else "AEC"
        games.append(f"| `{game.id}` | {forms} | {_cell(summaries[game.id])} |")
    return (
        "# Environments\n\n"
        "<!-- Generated by docs/generate.py from the env class docstrings: edit those, then run "
        "`python docs/generate.py`. -->\n\n"
        "Every id below is a Gymnasium env: `gym.make(id)` after `import agentgym` (or `gym.make(\"agentgym:\" + id)`).\n"
        "Its family's page documents its tools, reward, episode end, arguments and version history.\n\n"
        f"{env_table(by_family, '')}\n\n"
        "## Multi-agent games\n\n"
        "PettingZoo games, made with `agentgym.make_multi_agent(id)` (and `agentgym.make_multi_agent_parallel(id)` for "
        "the parallel form); the `-SelfPlay-v0` ids above are one seat of them as a single-agent env. See "
        "[Multi-agent games](multi_agent.md).\n\n"
        + "\n".join(games) + "\n"
    )


def _example_configs() -> dict[str, list[str]]:
    """``configs/*.yaml`` by the trainer they pick (``trainer:``, default grpo)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        found.setdefault(str(data.get("trainer", "grpo")), []).append(f"configs/{path.name}")
    return found


def trainer_table(link_prefix: str) -> str:
    """The table of every ``trainer:`` value of the config loader."""
    from agentgym.trainers.config import TRAINER_CONFIGS

    missing = [name for name in TRAINER_CONFIGS if name not in TRAINERS]
    if missing:
        raise SystemExit(f"docs/generate.py: trainer {missing[0]!r} has no line in TRAINERS; add what it estimates and "
                         "its docs page (docs/trainers/<page>.md).")
    examples = _example_configs()
    rows = ["| `trainer:` | what it estimates | config class | example configs |", "|---|---|---|---|"]
    for name, target in TRAINER_CONFIGS.items():
        info = TRAINERS[name]
        configs = ", ".join(f"`{c}`" for c in examples.get(name, [])) or "-"
        rows.append(f"| [`{name}`]({link_prefix}{info.page}) | {info.estimate} | `{target.partition(':')[2]}` | "
                    f"{configs} |")
    return "\n".join(rows)


def replace_between_markers(text: str, name: str, body: str, *, where: str) -> str:
    """``text`` with what lies between the ``name`` markers replaced by ``body``."""
    start, end = _MARKER.format(name=name, end="start"), _MARKER.format(name=name, end="end")
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), flags=re.S)
    if not pattern.search(text):
        raise SystemExit(f"docs/generate.py: {where} lacks the markers {start} ... {end}; put them where the "
                         f"{name} table belongs.")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text, count=1)


def outputs() -> dict[Path, str]:
    """Every generated file's full new contents."""
    by_family = _env_docs()
    files = {DOCS / "envs" / f"{family}.md": family_page(family, docs) for family, docs in by_family.items()}
    files[DOCS / "envs" / "index.md"] = envs_index(by_family)
    for path, env_prefix, trainer_prefix in ((ROOT / "README.md", "docs/envs/", "docs/trainers/"),
                                             (DOCS / "trainers" / "index.md", "../envs/", "")):
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(ROOT))
        if path.name == "README.md":
            text = replace_between_markers(text, "envs", env_table(by_family, env_prefix), where=where)
        text = replace_between_markers(text, "trainers", trainer_table(trainer_prefix), where=where)
        files[path] = text
    from agentgym.trainers.config_reference import markdown_reference

    files[DOCS / "trainers" / "config-reference.md"] = markdown_reference()
    return files


def stale(files: dict[Path, str]) -> Iterable[Path]:
    """The files whose contents on disk differ from ``files``."""
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            yield path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    files = outputs()
    changed = sorted(stale(files))
    if args.check:
        for path in changed:
            print(f"stale: {path.relative_to(ROOT)} (run python docs/generate.py)", file=sys.stderr)
        return 1 if changed else 0
    for path in changed:
        path.write_text(files[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
