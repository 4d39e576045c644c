"""Regenerate tests/data/grading/search.jsonl (run from the repository root after a search suite changes).

Tasks are the shipped search suites' own (search-test first, then search-train's splits), one or more per
question kind. Each candidate answer is built from the task's gold answer, its aliases and the gold
answers of other tasks of the same answer type, and its verdict follows from that construction (the gold
in a stock sentence is right; the gold next to a second candidate, a denial, or the other option of a
comparison is wrong), never from running the grader being measured. The common-name cases (USA, America,
Suva, Fiji, yen (¥)) are the false negatives the grader once had.
"""
import json
from collections import defaultdict
from pathlib import Path

from agentgym.envs.search.candidates import answer_type
from agentgym.envs.search.questions import KINDS
from agentgym.envs.search.scoring import normalize_answer
from agentgym.registration.suites import load_suite

OUT = Path(__file__).resolve().parent / "search.jsonl"
rows = []


def add(task, answer, verdict, why):
    rows.append({"env": "search", "kind": task.metadata["kind"],
                 "task": {"id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata)},
                 "answer": answer, "verdict": verdict, "why": why})


tasks = list(load_suite("search-test").test)
for split in load_suite("search-train").splits.values():
    tasks += [t for t in split if t not in tasks]
by_kind = defaultdict(list)
for t in tasks:
    by_kind[t.metadata["kind"]].append(t)
by_type = defaultdict(list)
for t in tasks:
    by_type[answer_type(t.metadata["kind"])].append(t.answer)


def accepted(task):
    return {normalize_answer(a) for a in [task.answer, *task.metadata["aliases"]]}


def wrong_for(task, skip=0):
    """Another gold of the same answer type that is no name of this task's gold."""
    words = set(normalize_answer(task.prompt).split())
    options = sorted({a for a in by_type[answer_type(task.metadata["kind"])]
                      if normalize_answer(a) not in accepted(task) and not set(normalize_answer(a).split()) & words
                      and normalize_answer(a) not in normalize_answer(task.answer)
                      and normalize_answer(task.answer) not in normalize_answer(a)})
    return options[(len(task.prompt) + skip) % len(options)]


def find(kind, answer):
    """A shipped task of ``kind`` with this gold, else one of any kind with the same answer type."""
    same = [t for t in tasks if t.answer == answer and answer_type(t.metadata["kind"]) == answer_type(kind)]
    return next((t for t in same if t.metadata["kind"] == kind), same[0] if same else None)


# ---- every kind: the gold, harmless forms, a wrong answer, a hedge, F1 padding
for kind in KINDS:
    for task in by_kind[kind][:2]:
        gold, wrong = task.answer, wrong_for(task)
        add(task, gold, True, "the gold answer as stored")
        add(task, f"The answer is {gold.upper()}.", True, "a stock phrase, upper case and a full stop change nothing")
        add(task, gold.lower(), True, "lower case")
        add(task, wrong, False, "a wrong answer of the same kind")
        add(task, f"{gold} or {wrong}", False, f"hedges between {gold} and a different entity, {wrong}")
        add(task, f"{gold} {wrong_for(task, 1)}", False, "the gold's tokens padded with another candidate's (F1 gaming)")
        if "options" in task.metadata:
            a, b = task.metadata["options"]
            loser = b if gold == a else a
            add(task, loser, False, "the other option of the comparison")
            add(task, f"{a} or {b}", False, "names both options of the comparison: a hedge a coin flip would also win")
            add(task, f"{a}, {b}", False, "both options as a list")
        for alias in task.metadata["aliases"][1:3]:
            if normalize_answer(alias) != normalize_answer(gold):
                add(task, alias, True, f"an accepted name of the same {answer_type(kind)} as {gold}")

# ---- sentences that name the gold and nothing else of its type (false negatives once)
for kind in ("capital", "city_capital", "common_neighbour_capital"):
    for task in by_kind[kind][:2]:
        country = next((w for w in [task.metadata["path"][-1]["query"].removeprefix("capital of ")]), "")
        add(task, f"The capital is {task.answer}.", True, "the gold in a stock sentence")
        add(task, f"The capital is not {task.answer}.", False, "denies the gold")
        add(task, f"Maybe {task.answer}", False, "a hedge: not a committed answer")
        add(task, f"{task.answer}, {wrong_for(task, 2)}", False, "a list of two capitals")
        if kind == "capital":
            add(task, f"The capital of {country} is {task.answer}.", True, "the question's own words around the gold")
            add(task, f"{task.answer}, {country}", True, "the capital and its country (a country is no capital)")
for kind in ("currency", "city_currency"):
    for task in by_kind[kind][:2]:
        add(task, f"The currency is the {task.answer}.", True, "the gold in a stock sentence")
        add(task, f"The currency is the {task.answer}, not the {wrong_for(task)}.", False, "names a second currency")
for kind in ("city_country", "common_neighbour"):
    for task in by_kind[kind][:2]:
        add(task, f"It is located in {task.answer}.", True, "the gold in a stock sentence")
        add(task, f"It is located in {task.answer} or {wrong_for(task)}.", False, "hedges between two countries")
for task in by_kind["border_count"][:2]:
    add(task, f"{task.answer} countries", True, "the count with its noun")
    add(task, str(int(task.answer) + 1), False, "off by one")
    add(task, f"{task.answer} or {int(task.answer) + 1}", False, "hedges between two counts")

# ---- the common names of the gold that the grader once refused
us = find("city_country", "United States")
for name in ("USA", "U.S.", "the US", "America", "United States of America"):
    add(us, name, True, f"{name!r}: a common name of the United States")
add(us, "It is in the United States.", True, "the gold in a stock sentence")
add(us, "USA or Canada", False, "hedges between two countries")
add(us, "Canada", False, "another country")
add(us, "not the United States", False, "denies the gold")
add(us, "The answer is in the passage", False, "no country named ('in' is India's code, not a name in a sentence)")
fiji = find("capital", "Suva")
add(fiji, "Suva, Fiji", True, "the capital and its country (Fiji is no capital)")
add(fiji, "The capital of Fiji is Suva.", True, "the question's words around the gold")
add(fiji, "Suva, Lautoka, Nadi", False, "a list of Fijian towns")
add(fiji, "Fiji", False, "the country, not its capital")
add(fiji, "The capital of Fiji is not Suva.", False, "denies the gold")
yen = find("currency", "Yen")
add(yen, "yen (¥)", True, "the currency with its symbol")
add(yen, "Japanese yen", True, "the currency qualified by its issuer")
add(yen, "JPY", True, "the ISO 4217 code of the currency")
add(yen, "yen or dollar", False, "hedges between two currencies")
add(yen, "Yen Euro", False, "gold token stuffed with another currency")
empty = by_kind["capital"][0]
add(empty, "", False, "empty answer")
add(empty, empty.prompt, False, "the question echoed back")

OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
print(f"{len(rows)} rows -> {OUT}")
