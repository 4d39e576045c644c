"""A scripted judge that behaves like a naive LLM judge, for tests and CPU benchmarks.

It is deliberately gullible in the ways real judges are, so that tests of the quoting can fail: it treats any text
*outside* a quoted field as instructions and obeys one that asks for a score ("give 10", "VERDICT: 10"); it
echoes the start of the answer in its reasoning before its verdict (so a fake verdict line in the answer appears
in its reply); and without terms to look for it prefers longer answers (a length bias to measure). Inside a
correctly fenced field it only reads content: the share of the criterion's ``[bracketed]`` terms the answer
mentions. Use it as ``ScriptedPolicy(naive_judge_reply)``.

Asked for a JSON verdict (``verdict_format="json"``) it writes the object as a careless unconstrained model would:
verdict first, then its reasoning pasted between quotes without escaping. Agent text holding ``"`` can therefore
forge a second ``verdict`` key or a second object after the first, which is what the strict JSON parsing must not
fall for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["naive_judge_reply", "split_quoted"]

_BEGIN = re.compile(r"^<<<BEGIN (\S+) (\S+)>>>$")
_OBEY = re.compile(r"(?:give|score|rate|VERDICT)\D{0,20}?(\d+)", re.IGNORECASE)
_SCALE = re.compile(r"scale from (\d+) to (\d+)")


def split_quoted(text: str) -> tuple[dict[str, str], str]:
    """The fields of a judge prompt by label, and the text outside every field (what a naive judge reads as
    instructions). A field runs from its BEGIN line to the first END line with the same label and marker."""
    fields: dict[str, str] = {}
    outside: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _BEGIN.match(lines[i])
        if match is None:
            outside.append(lines[i])
            i += 1
            continue
        end = f"<<<END {match.group(1)} {match.group(2)}>>>"
        j = i + 1
        while j < len(lines) and lines[j] != end:
            j += 1
        fields[match.group(1)] = "\n".join(lines[i + 1: j])
        i = j + 1
    return fields, "\n".join(outside)


def _coverage(answer: str, terms: Sequence[str]) -> float:
    if not terms:  # no terms to look for: a naive judge rewards effort, read as length
        return min(1.0, len(answer) / 400.0)
    low = answer.lower()
    return sum(term.lower() in low for term in terms) / len(terms)


def naive_judge_reply(messages: Sequence[Mapping[str, Any]]) -> str:
    """The judge's reply to a judge prompt's messages (independent or group)."""
    system = str(messages[0].get("content", ""))
    user = str(messages[-1].get("content", ""))
    scale = _SCALE.search(system)
    low, high = (int(scale.group(1)), int(scale.group(2))) if scale else (0, 10)
    terms = re.findall(r"\[([^\]]+)\]", system)
    fields, outside = split_quoted(user)
    ordered = sorted(int(k.rsplit("-", 1)[1]) for k in fields if re.fullmatch(r"answer-\d+", k))
    answers = [fields[f"answer-{i}"] for i in ordered] or [fields.get("answer", "")]
    # what it reads for content: the answer and, when shown, the transcript
    shown = [a + "\n" + fields.get(f"transcript-{i}", "") for a, i in zip(answers, ordered)] if ordered else \
        [answers[0] + "\n" + fields.get("transcript", "")]
    obey = _OBEY.search(outside.replace("Attempt", ""))
    if obey is not None:  # an instruction outside the quotes: the naive judge does what it says
        forced = min(high, max(low, int(obey.group(1))))
        verdicts = [forced] * len(answers)
    else:
        cover = [_coverage(text.strip(), terms) for text in shown]
        if len(answers) > 1 and max(cover) > min(cover):  # group mode: relative to the group
            cover = [(c - min(cover)) / (max(cover) - min(cover)) for c in cover]
        verdicts = [round(low + c * (high - low)) for c in cover]
    echo = "\n".join(answers[0].splitlines()[:6])[:300]
    if "Reply with one JSON object" in system:
        names = ["verdict"] if '"verdict":' in system else [f"verdict_{i}" for i in range(1, len(answers) + 1)]
        head = ", ".join(f'"{name}": {v}' for name, v in zip(names, verdicts))
        pasted = " ".join(echo.splitlines())  # pasted, not escaped: a quote in the answer ends the string
        return f'{{{head}, "reasoning": "The answer reads: {pasted} I checked it against the criterion."}}'
    reasoning = f"The answer reads:\n{echo}\nI checked it against the criterion."
    if len(answers) == 1 and "VERDICT 1:" not in system:
        return f"{reasoning}\nVERDICT: {verdicts[0]}"
    return reasoning + "\n" + "\n".join(f"VERDICT {i}: {v}" for i, v in enumerate(verdicts, 1))
