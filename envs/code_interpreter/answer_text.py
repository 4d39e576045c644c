"""Where the final answer is in a model's text, and its canonical spelling.

The model ends its turn with ``\\boxed{...}`` or ``<answer>...</answer>``; :func:`extract_final_answer` finds it
(several different ones are a hedge) and :func:`normalize_answer` removes what is only notation (``$``,
``\\text{}``, units, thousands separators, ``x =``), so that the comparisons of
:mod:`agentgym.envs.code_interpreter.answer_equivalence` see the value alone.
"""

from __future__ import annotations

import re

__all__ = [
    "extract_final_answer", "final_answer_candidates", "has_final_answer", "HEDGE_JOINER", "MAX_HEDGE_SHOWN",
    "MAX_NESTING", "normalize_answer", "unit_of"
]

MAX_NESTING = 30  # brackets deeper than this are only compared as text


# ---------------------------------------------------------------- extraction


_BOX = re.compile(r"\\(?:boxed|fbox)(?:\s*(\{)|[ \t]+([^$\n]*))?")


class _Truncated(Exception):
    """A box whose braces never close: the model was cut off before it finished its answer."""


def _box_at(text: str, start: int) -> tuple[int, str | None]:
    """(end, content) of the ``\\boxed``/``\\fbox`` at ``start``; content None for a bare ``\\boxed``.

    Raises _Truncated when the braces never close.
    """
    match = _BOX.match(text, start)
    if not match[1]:  # "\boxed 42$", or a bare "\boxed" that holds nothing
        return match.end(), (match[2] or "").strip() or None
    depth, i = 1, match.end()
    while i < len(text):
        if text[i] == "\\":
            i += 2  # escaped \{ and \} are content, not delimiters
            continue
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return i + 1, text[match.end() : i].strip()
        i += 1
    raise _Truncated


_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_HEDGE_SHOWN = 10  # distinct answers kept in a hedge's joined text (any two already make it wrong)
HEDGE_JOINER = " or "  # distinct final answers are joined with this, so that graders see (and reject) a hedge


def final_answer_candidates(text: str) -> list[str] | None:
    """Every final answer in ``text`` (boxes, ``\\boxed{}`` included, and ``<answer>`` tags) in order.

    None when a box never closes: a truncated answer means the text has no usable answer at all.
    """
    found: list[tuple[int, str]] = [(m.start(), m[1].strip()) for m in _TAG.finditer(text)]
    position = 0
    while (match := _BOX_START.search(text, position)) is not None:
        try:
            end, content = _box_at(text, match.start())
        except _Truncated:
            return None
        if content is not None:
            found.append((match.start(), content))
        position = max(end, match.end())
    return [content for _, content in sorted(found, key=lambda item: item[0])]


def extract_final_answer(text: str) -> str | None:
    """The answer the model committed to, or None when it gave none.

    That is the content of ``\\boxed{...}`` (also ``\\fbox{...}`` and ``\\boxed 42``), with nested braces
    balanced, or of ``<answer>...</answer>``; stripped. A box whose braces never close is a truncated answer,
    so it gives None rather than an earlier box. Several final answers that differ (``\\boxed{5}``, then
    ``\\boxed{6}``; ``final_answer`` called in a loop) are a hedge, not a commitment: they come back joined
    by " or " so that every grader rejects them, instead of letting the last of many guesses count.
    """
    if not isinstance(text, str):
        return None
    candidates = final_answer_candidates(text)
    if not candidates:
        return None
    distinct: dict[str, str] = {}
    for content in candidates:
        distinct.setdefault("".join(normalize_answer(content).casefold().split()), content)
        if len(distinct) > MAX_HEDGE_SHOWN:  # a hedge already; the rest need no normalizing
            break
    if len(distinct) > 1:
        return HEDGE_JOINER.join(distinct.values())
    return candidates[-1]


def _unwrap_answers(text: str) -> str:
    """``text`` with every box and ``<answer>`` tag replaced by its content (``\\boxed{252} or 126`` keeps
    its ``or 126``: an answer that holds a box is judged whole, never cut down to the box)."""
    text = text.replace("<answer>", " ").replace("</answer>", " ")
    for _ in range(MAX_NESTING):  # nested boxes unwrap one level per pass; hostile depth is left as text
        match = _BOX_START.search(text)
        if match is None:
            break
        try:
            end, content = _box_at(text, match.start())
        except _Truncated:
            break
        text = text[: match.start()] + f" {content or ''} " + text[end:]
    return text.strip()


def has_final_answer(text: str) -> bool:
    """Cheap format check (SimpleTIR's is the substring ``\\boxed{``); a closed ``<answer>`` tag also counts."""
    if not isinstance(text, str):
        return False
    tag_start = text.find("<answer>")
    return "\\boxed{" in text or (tag_start >= 0 and text.find("</answer>", tag_start) >= 0)


# ---------------------------------------------------------------- normalization

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])\.?")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SINGLE_VARIABLE_EQUATION = re.compile(r"(?:[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*=\s*([^=]+)")
_NUMBER_WITH_UNITS = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?)\s*([A-Za-z][A-Za-z ]*?)(?:\^\{?[23]\}?)?")
_UNITS = frozenset("mm cm m km meter meters inch inches ft feet mile miles mph kg g grams lb pounds sec seconds "
                   "minutes hours days weeks years dollars cents degrees units square sq cubic".split())
#: Spellings of one unit, so that a unit dropped from both sides can still be compared ("5 meters" is
#: "5 m", "5 m" is not "5 cm").
_UNIT_NAMES = {"meter": "m", "meters": "m", "inch": "in", "inches": "in", "feet": "ft", "mile": "mi", "miles": "mi",
               "grams": "g", "pounds": "lb", "sec": "s", "seconds": "s", "minutes": "min", "hours": "h", "days": "d",
               "weeks": "wk", "years": "yr", "dollars": "$", "cents": "c", "degrees": "deg", "sq": "square"}
#: A leading "the answer is" / "final answer:" changes nothing ("The answer is 7").
_STOCK_PHRASE = re.compile(r"^(?:(?:so|thus|therefore|hence),?\s+)?(?:the\s+|my\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:|=)\s*",
                           re.IGNORECASE)
#: A tilde that starts a number ("~12", "$~12$") means "about 12", not LaTeX's non-breaking space ("5~cm").
_APPROXIMATELY = re.compile(r"(?:^|(?<=[\s(=]))~(?=\s*[-+.\d])")
#: A mixed number ``1\frac{1}{2}`` (a whole number, then a proper fraction): school notation for 3/2.
_MIXED = re.compile(r"([+-]?)(\d{1,18})\s*\\frac\s*\{\s*(\d{1,18})\s*\}\s*\{\s*(\d{1,18})\s*\}")


def unit_of(text: str) -> str | None:
    """The unit after a plain number (``5 cm`` -> ``cm``, ``5 meters`` -> ``m``), or None without one.

    Only known units count (as in :func:`normalize_answer`), in one spelling per unit.
    """
    if not isinstance(text, str):
        return None
    s = _unwrap_answers(text.strip()).replace("\\$", "").replace("$", "")
    for _ in range(MAX_NESTING):
        s, count = _TEXT_MACRO.subn(r"\1", s)
        if not count:
            break
    s = re.sub(r"\\[;:, !]|~", " ", s)
    s = " ".join(_STOCK_PHRASE.sub("", s).split()).removesuffix(".").strip()
    match = _NUMBER_WITH_UNITS.fullmatch(s)
    if not match or not all(word.lower() in _UNITS for word in match[2].split()):
        return None
    return " ".join(_UNIT_NAMES.get(word.lower(), word.lower()) for word in match[2].split())


def normalize_answer(text: str) -> str:
    """Canonical spelling of an answer, so that cosmetic differences never reach the math comparison.

    Unwraps ``\\boxed{}`` and ``<answer>`` tags, drops ``$``, ``\\text{}``-like wrappers, ``\\left``/``\\right``, LaTeX spacing, degree marks and a trailing
    period; spells ``\\dfrac``/``\\tfrac`` as ``\\frac`` and ``\\%`` as ``%``; turns ``1,000`` into ``1000``
    (a whole-string number only, so the tuple ``(1,2)`` is kept); drops unit words after a plain number
    (``5 cm``, known units only: dropping words elsewhere could change the answer; :func:`unit_of` keeps
    the unit for comparison); reduces ``x = 3`` to ``3`` when the left side is a single variable (an equation
    like ``x + y = 3`` is kept); drops a leading "The answer is"; writes a mixed number ``1\\frac{1}{2}`` as
    ``\\frac{3}{2}``; and keeps a tilde before a number as ``\u2248`` ("about 12": a hedge), where elsewhere
    it is LaTeX's non-breaking space.
    """
    if not isinstance(text, str):
        return ""
    s = _unwrap_answers(text.strip())
    s = s.replace("\\$", "").replace("$", "").replace("\\displaystyle", "").replace("\u2212", "-")
    s = _APPROXIMATELY.sub("\u2248", _STOCK_PHRASE.sub("", s.strip()))
    s = re.sub(r"\\[()\[\]]", "", s)
    for _ in range(MAX_NESTING):  # innermost first: \text{\textbf{5}}
        s, count = _TEXT_MACRO.subn(r"\1", s)
        if not count:
            break
    s = _DEGREES.sub("", _LEFT_RIGHT.sub("", s))
    s = re.sub(r"\\[!,]", "", s)
    s = re.sub(r"\\[;: ]|\\q?quad(?![A-Za-z])|~", " ", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s).replace("\\%", "%").replace("{,}", ",")
    s = " ".join(s.split()).removesuffix(".").strip()
    if match := _SINGLE_VARIABLE_EQUATION.fullmatch(s):
        s = match[1].strip()
    match = _NUMBER_WITH_UNITS.fullmatch(s)
    if match and all(word.lower() in _UNITS for word in match[2].split()):
        s = match[1]
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if (mixed := _MIXED.fullmatch(s)) and 0 < int(mixed[3]) < int(mixed[4]):
        whole, num, den = int(mixed[2]), int(mixed[3]), int(mixed[4])
        s = f"{mixed[1]}\\frac{{{whole * den + num}}}{{{den}}}"
    return s
