"""Regenerate tests/data/grading/code.jsonl and games.jsonl (run from the repository root after a suite changes).

Tasks are the shipped suites' own (code-test/code-train, champ, games-calc, games-guess; the smallest of each
kind, as every line repeats its task). Each candidate answer is a transformation of the gold answer whose
verdict follows from arithmetic or from the task's stated structure (off by one, wrong sign, unreduced, a
prime missing, a hedge ...), never from running the grader being measured; CHAMP candidates are written by hand.
"""
import ast
import json
import math
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

from agentgym.registration.suites import load_suite

OUT = str(Path(__file__).resolve().parent) + "/"
rows = []


def add(env, kind, task, answer, verdict, why):
    rows.append({"env": env, "kind": kind,
                 "task": {"id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata)},
                 "answer": answer, "verdict": verdict, "why": why})


test = load_suite("code-test").test
train = load_suite("code-train").train
by = defaultdict(list)
for t in list(test) + list(train):
    by[t.metadata["dataset"]].append(t)


def size(t):
    return len(json.dumps(t.metadata)) + len(t.prompt)


for kind in by:  # the smallest real tasks first: the file repeats each task on every line
    by[kind] = sorted(by[kind][:200], key=size)


def pick(kind, n):
    return by[kind][:n]


def sep(g):
    return f"{g:,}"


# ---- numbers
for kind in ("basic_arithmetic", "gsm_symbolic", "simple_equations", "count_primes", "letter_counting"):
    tasks = pick(kind, 5)
    if kind == "gsm_symbolic":
        tasks += [t for t in by[kind] if "." in t.answer][:1]
    if kind == "basic_arithmetic":
        tasks += [t for t in by[kind] if abs(int(t.answer)) >= 1000][:2]
    for t in tasks:
        gold = t.answer
        is_int = "." not in gold
        g = int(gold) if is_int else None
        var = t.metadata["entry"]["metadata"].get("variable")
        add("code", kind, t, gold, True, "the gold answer")
        add("code", kind, t, f"{gold}.0" if is_int else gold + "0", True, "same value with a trailing zero decimal")
        add("code", kind, t, f"${gold}$", True, "math delimiters change nothing")
        if is_int and abs(g) >= 1000:
            add("code", kind, t, sep(g), True, "thousands separators")
        if var:
            add("code", kind, t, f"{var} = {gold}", True, "names the unknown asked for")
            other = "x" if var != "x" else "y"
            add("code", kind, t, f"{other} = {gold}", False, f"names {other}, but the unknown is {var}")
        elif kind == "gsm_symbolic":
            add("code", kind, t, f"\\text{{{gold}}}", True, "\\text wrapper changes nothing")
        if is_int:
            add("code", kind, t, str(g + 1), False, "off by one")
            add("code", kind, t, str(g - 1), False, "off by one")
            if g != 0:
                add("code", kind, t, str(-g), False, "wrong sign")
                add("code", kind, t, f"\\pm {abs(g)}", False, "hedge: plus or minus")
            add("code", kind, t, f"{g} or {g + 1}", False, "hedge: two candidates")
            add("code", kind, t, f"{g}, {g + 1}, {g + 2}", False, "hedge: a list of candidates where one value is wanted")
            add("code", kind, t, f"{g}.5", False, "not the value")
        else:
            v = Fraction(gold)
            add("code", kind, t, f"{v.numerator}/{v.denominator}", True, "the same value as a reduced fraction")
            add("code", kind, t, str(math.floor(v)), False, "rounded down: not the value")
            add("code", kind, t, f"{math.floor(v)} or {math.ceil(v)}", False, "hedge")
        if is_int:  # notation math-verify and our grader once misjudged
            add("code", kind, t, f"The answer is {g}", True, "a stock phrase before the number")
            add("code", kind, t, f"~{g}", False, "'about g': an approximation, not the value (the tilde is no LaTeX space here)")
            add("code", kind, t, f"\\approx {g}", False, "an approximation, not the value")
            noun = {"gsm_symbolic": "apples", "letter_counting": "letters", "count_primes": "primes"}.get(kind)
            if noun:
                add("code", kind, t, f"{g} {noun}", True, "the number with the noun it counts")
                add("code", kind, t, f"{g + 1} {noun}", False, "off by one, with a noun")
            if kind == "gsm_symbolic":
                add("code", kind, t, f"\\boxed{{\\${g}}}", True, "a boxed amount of money with an escaped dollar sign")
                add("code", kind, t, f"${g}", True, "a dollar sign")
                add("code", kind, t, f"{g} dollars", True, "a unit word")
        if kind == "basic_arithmetic":
            add("code", kind, t, t.metadata["entry"]["metadata"]["expression"], False,
                "the question's own expression echoed, not its value (numeric kinds want the computed number)")
        if kind == "simple_equations":
            add("code", kind, t, t.metadata["entry"]["metadata"]["equation"], False, "the equation echoed back")

# ---- fractions
for t in pick("fraction_simplification", 6):
    m = t.metadata["entry"]["metadata"]
    n, d = m["simplified_numerator"], m["simplified_denominator"]
    N, D = m["numerator"], m["denominator"]
    kind = "fraction_simplification"
    add("code", kind, t, t.answer, True, "the gold answer")
    add("code", kind, t, f"{n}/{d}", True, "plain reduced fraction")
    add("code", kind, t, f"\\frac{{{n}}}{{{d}}}", True, "LaTeX reduced fraction")
    add("code", kind, t, f"\\dfrac{{{n}}}{{{d}}}", True, "\\dfrac reduced fraction")
    add("code", kind, t, f"{n} / {d}", True, "spaces around the slash")
    add("code", kind, t, f"{N}/{D}", False, "the unreduced fraction from the question, echoed")
    if (2 * n, 2 * d) != (N, D):
        add("code", kind, t, f"{2 * n}/{2 * d}", False, "equivalent but not in lowest terms")
    add("code", kind, t, f"-{n}/{d}", False, "wrong sign")
    add("code", kind, t, f"{d}/{n}", False, "inverted")
    add("code", kind, t, f"{n / d:.6f}", False, "a decimal, not the simplified fraction asked for")
    add("code", kind, t, f"{n + 1}/{d}", False, "numerator off by one")
    add("code", kind, t, f"{n}/{d} or {N}/{D}", False, "hedge")
    if n > d > 1:  # an improper fraction: its mixed number is the same reduced value
        add("code", kind, t, f"{n // d}\\frac{{{n % d}}}{{{d}}}", True, "the mixed number of the reduced fraction")
        add("code", kind, t, f"{n // d + 1}\\frac{{{n % d}}}{{{d}}}", False, "a mixed number one too large")

# ---- prime factorization
pf = pick("prime_factorization", 6)
pf += [t for t in by["prime_factorization"] if len(t.metadata["entry"]["metadata"]["factors"]) == 1][:1]
pf += [t for t in by["prime_factorization"]
       if len(set(t.metadata["entry"]["metadata"]["factors"])) < len(t.metadata["entry"]["metadata"]["factors"])][:2]
for t in pf:
    kind = "prime_factorization"
    m = t.metadata["entry"]["metadata"]
    fs, number = list(m["factors"]), m["number"]
    counts = {p: fs.count(p) for p in sorted(set(fs))}
    power = " × ".join(f"{p}^{k}" if k > 1 else str(p) for p, k in counts.items())
    add("code", kind, t, t.answer, True, "the gold answer")
    add("code", kind, t, "*".join(map(str, fs)), True, "* instead of ×")
    add("code", kind, t, " \\times ".join(map(str, reversed(fs))), True, "any order, LaTeX \\times")
    add("code", kind, t, power, True, "exponent notation")
    add("code", kind, t, power.replace(" × ", "*").replace("^", "**"), True, "Python ** notation")
    add("code", kind, t, f"{number} = {t.answer}", True, "the number = its factorisation")
    add("code", kind, t, " \\cdot ".join(map(str, fs)), True, "\\cdot")
    add("code", kind, t, str(number), len(fs) == 1, "the number itself is a factorisation only if it is prime")
    add("code", kind, t, " × ".join(map(str, fs + [2])), False, "an extra prime")
    if len(fs) > 1:
        add("code", kind, t, " × ".join(map(str, fs[:-1])), False, "a prime missing")
        merged = [fs[0] * fs[1]] + fs[2:]
        add("code", kind, t, " × ".join(map(str, merged)), False,
            f"right product but {fs[0] * fs[1]} is not prime")
        add("code", kind, t, ", ".join(map(str, fs)), False, "a list of the primes, not a product")
    add("code", kind, t, f"{t.answer} or {' × '.join(map(str, fs + [3]))}", False, "hedge")
    add("code", kind, t, f"1 × {t.answer}", False, "1 is not a prime")

# ---- base conversion
bc = pick("base_conversion", 6) + [t for t in by["base_conversion"] if t.metadata["entry"]["metadata"]["target_base"] == 16][:2]
bc += [t for t in by["base_conversion"] if t.metadata["entry"]["metadata"]["target_base"] == 2][:1]
digits = "0123456789abcdefghijklmnopqrstuvwxyz"


def to_base(v, b):
    out = ""
    while v:
        v, r = divmod(v, b)
        out = digits[r] + out
    return out or "0"


for t in bc:
    kind = "base_conversion"
    m = t.metadata["entry"]["metadata"]
    b, value, src = m["target_base"], m["decimal_value"], m["source_repr"]
    gold = t.answer
    add("code", kind, t, gold, True, "the gold answer")
    if any(c.isalpha() for c in gold):
        add("code", kind, t, gold.upper(), True, "digits above 9 in upper case")
    add("code", kind, t, f"{gold}_{{{b}}}", True, "base subscript naming the target base")
    if b == 16:
        add("code", kind, t, "0x" + gold, True, "0x prefix for a hexadecimal answer")
        add("code", kind, t, "0b" + gold, False, "in base 16, 0b... is a different numeral (b is a digit)")
    if b == 2:
        add("code", kind, t, "0b" + gold, True, "0b prefix for a binary answer")
    add("code", kind, t, to_base(value + 1, b), False, "off by one")
    if b != 10 and str(value) != gold:
        add("code", kind, t, str(value), False, "the decimal value, not the base-%d numeral" % b)
        add("code", kind, t, f"{gold}_{{10}}", False, "subscript names the wrong base")
    if all(c in digits[:b] for c in src) and int(src, b) != value:
        add("code", kind, t, src, False, "the source numeral echoed")
    add("code", kind, t, f"{gold} or {to_base(value + 1, b)}", False, "hedge")
    add("code", kind, t, to_base(value, b + 1) if to_base(value, b + 1) != gold else to_base(value + 2, b), False,
        "converted to the wrong base")

# ---- codeio
def parses(text):
    for parse in (json.loads, ast.literal_eval):
        try:
            parse(text)
            return True
        except Exception:
            pass
    return False


cio = pick("codeio", 6)
cio += [t for t in by["codeio"] if t.answer.startswith('"')][:2]
cio += [t for t in by["codeio"] if t.answer in ("true", "false")][:1]
for t in cio:
    kind = "codeio"
    gold = json.loads(t.answer)
    add("code", kind, t, t.answer, True, "the gold answer")
    add("code", kind, t, repr(gold), True, "the Python repr of the same value")
    add("code", kind, t, json.dumps(gold, indent=1), True, "the same JSON, other whitespace")
    if isinstance(gold, str) and not parses(gold):
        add("code", kind, t, gold, True, "the bare string")
        add("code", kind, t, json.dumps(gold + "x"), False, "a different string")
        add("code", kind, t, json.dumps(gold.swapcase()) if gold.swapcase() != gold else json.dumps(gold + " "),
            False, "a different string (case or spacing)")
    elif isinstance(gold, bool):
        add("code", kind, t, json.dumps(not gold), False, "the opposite boolean")
        add("code", kind, t, "1" if gold else "0", False, "a number is not a boolean")
    elif isinstance(gold, (int, float)):
        add("code", kind, t, json.dumps(gold + 1 if isinstance(gold, int) else gold + 1 + abs(gold) * 0.01), False,
            "a different number")
        add("code", kind, t, json.dumps(-gold) if gold != 0 else json.dumps(1), False, "wrong sign / value")
    elif isinstance(gold, dict) and gold:
        k = next(iter(gold))
        smaller = dict(gold)
        del smaller[k]
        add("code", kind, t, json.dumps(smaller), False, "a key missing")
        add("code", kind, t, json.dumps({**gold, "__extra__": 1}), False, "an extra key")
        add("code", kind, t, json.dumps([gold]), False, "right value wrapped in a list")
    elif isinstance(gold, list) and gold:
        add("code", kind, t, json.dumps(gold[:-1]), False, "an element missing")
        add("code", kind, t, json.dumps(gold + gold[-1:]), False, "an extra element")
    add("code", kind, t, f"{t.answer} or null", False, "hedge")

# ---- champ
champ = {t.metadata["problem_id"]: t for t in load_suite("champ").test}
C = [
    ("P_Combinatorics_1", [("239", True, "gold"), ("239.0", True, "same number"), ("238", False, "off by one"),
                           ("239 or 240", False, "hedge"), ("-239", False, "wrong sign")]),
    ("P_Combinatorics_2", [("252", True, "gold"), ("C(10, 5)", True, "accepted alternative form"),
                           ("\\binom{10}{5}", True, "the binomial in LaTeX"), ("251", False, "off by one"),
                           ("252, 253", False, "hedge list"), ("\\boxed{252} \\text{ or } 126", False, "hedge")]),
    ("P_Combinatorics_6", [("2^{n-1}", True, "gold in LaTeX"), ("2^n/2", True, "equal expression"),
                           ("\\frac{2^n}{2}", True, "equal expression"), ("2^n", False, "different expression"),
                           ("2^{n-1} \\text{ or } 2^n", False, "hedge")]),
    ("P_Combinatorics_11", [("n(n-3)/2", True, "gold"), ("\\frac{n^2-3n}{2}", True, "expanded"),
                            ("n(n-1)/2", False, "different expression")]),
    ("P_Combinatorics_14", [("5/14", True, "gold"), ("\\frac{5}{14}", True, "LaTeX"), ("0.357142857", True, "decimal to 1e-6"),
                            ("0.36", False, "rounded too far"), ("9/14", False, "complement")]),
    ("P_Combinatorics_17", [("No", True, "gold"), ("no", True, "case"), ("\\text{No}", True, "wrapper"),
                            ("Yes", False, "opposite"), ("No or Yes", False, "hedge")]),
    ("P_Combinatorics_25", [("n!", True, "gold"), ("n \\cdot (n-1)!", True, "n (n-1)! equals n! for every n >= 1")]),
    ("P_Inequality_1", [("[-1, 1]", True, "gold"), ("[-1,1]", True, "spacing"), ("(-1, 1)", False, "open interval"),
                        ("-1 \\le x \\le 1", True, "the same interval written as an inequality")]),
    ("P_Inequality_13", [("-9", True, "gold"), ("9", False, "wrong sign"), ("\\pm 9", False, "hedge"),
                         ("-9.0", True, "same number")]),
    ("P_Inequality_18", [("\\frac{\\sqrt{3}}{3}", True, "gold in LaTeX"), ("1/\\sqrt{3}", True, "alternative"),
                         ("0.5773502692", True, "decimal"), ("-\\frac{\\sqrt3}{3}", False, "wrong sign"),
                         ("\\pm\\frac{\\sqrt3}{3}", False, "hedge")]),
    ("P_Inequality_28", [("Yes", True, "gold"), ("yes", True, "case"), ("No", False, "opposite")]),
    ("P_Number-Theory_3", [("376 and 625", True, "gold"), ("376, 625", True, "the two values as a list"),
                           ("625 and 376", True, "order"), ("376", False, "one missing"),
                           ("376, 625, 1", False, "an extra value"), ("625 or 376", True, "both values, joined by or")]),
    ("P_Number-Theory_4", [("x=6, y=5", True, "gold"), ("x = 6, y = 5", True, "spacing"), ("y=5, x=6", True, "order"),
                           ("x=5, y=6", False, "swapped values")]),
    ("P_Number-Theory_7", [("No integer solutions", True, "gold"), ("no integer solutions", True, "case"),
                           ("1", False, "a value where there is none")]),
    ("P_Number-Theory_51", [("1176470588235294", True, "gold"), ("(20*10^15-2)/17", True, "alternative form"),
                            ("1176470588235295", False, "off by one")]),
    ("P_Polynomial_7", [("-2x+2", True, "gold"), ("2-2x", True, "reordered"), ("2x-2", False, "wrong sign"),
                        ("-2x+2 \\text{ or } 2x-2", False, "hedge")]),
    ("P_Polynomial_14", [("(x^2+x+1)(x^2-x+1)", True, "gold"), ("(x^2-x+1)(x^2+x+1)", True, "order"),
                         ("(x^2+x+1)(x^2+x+1)", False, "a different product")]),
    ("P_Polynomial_22", [("x=±1", True, "gold"), ("x = \\pm 1", True, "LaTeX"), ("1", False, "one root missing"),
                         ("x=1, x=-1", True, "both roots listed"), ("x = 1 or x = -1", True, "both roots, joined by or"),
                         ("x=1 or x=2", False, "a wrong second root"), ("1, -1, 2", False, "an extra value")]),
    ("P_Polynomial_38", [("x=±1, ±2, ±1/2", True, "gold"), ("x=1, x=-1, 2, -2, 1/2, -1/2", True, "every root listed"),
                         ("x=1, x=-1, 2, -2, 1/2", False, "a root missing"), ("x=±1, ±2", False, "two roots missing")]),
    ("P_Number-Theory_39", [("x=0, y=2 and x=9, y=11", True, "gold"), ("x=9, y=11 and x=0, y=2", True, "pairs reordered"),
                            ("x=0, y=11 and x=9, y=2", False, "values swapped between the pairs"),
                            ("x=0, y=2", False, "a pair missing")]),
    ("P_Number-Theory_65", [("p=3, q=2 and p=5, q=3", True, "gold"), ("p=5, q=3 and p=3, q=2", True, "pairs reordered"),
                            ("p=5, q=2 and p=3, q=3", False, "values swapped between the pairs")]),
    ("P_Sequence_29", [("2/3", True, "gold"), ("\\frac{2}{3}", True, "LaTeX"), ("0.6666667", True, "decimal"),
                       ("3/2", False, "inverted"), ("2/3 \\text{ or } 3/2", False, "hedge")]),
    ("P_Sequence_34", [("2^{997}", True, "gold"), ("2^{996}", False, "off by one in the exponent"),
                       (str(2 ** 997), True, "the number written out")]),
    ("P_Sequence_41", [("\\frac{1+\\sqrt{4a+1}}{2}", True, "gold in LaTeX"), ("\\frac{1-\\sqrt{4a+1}}{2}", False, "other root"),
                       ("\\frac{1\\pm\\sqrt{4a+1}}{2}", False, "hedge")]),
    ("P_Inequality_16", [("3/2", True, "gold"), ("1\\frac{1}{2}", True, "the mixed number"),
                         ("The answer is 3/2", True, "a stock phrase"), ("~1.5", False, "an approximation"),
                         ("1\\frac{1}{3}", False, "a different mixed number"), ("1.5 or 2", False, "hedge")]),
    ("P_Inequality_11", [("2^n", True, "gold"), ("2^{n}", True, "braces"), ("2^{n+1}", False, "different"),
                         ("2^n, 2^{n+1}", False, "hedge list")]),
]
for pid, answers in C:
    t = champ[pid]
    for answer, verdict, why in answers:
        add("code", "champ", t, answer, verdict, why)

with open(OUT + "code.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print("code", len(rows))

# ---- games
rows = []
calc = list(load_suite("games-calc").test)[:10]
for t in calc:
    g = int(t.answer)
    m = t.metadata
    add("games", "calculator", t, str(g), True, "the product")
    add("games", "calculator", t, f"{g}.0", True, "a JSON number with a zero fraction is the same integer")
    if g >= 1000:
        add("games", "calculator", t, f"{g:,}", True, "thousands separators")
    add("games", "calculator", t, f"+{g}", True, "explicit plus sign")
    add("games", "calculator", t, str(g + 1), False, "off by one")
    add("games", "calculator", t, str(g - 1), False, "off by one")
    add("games", "calculator", t, str(-g), False, "wrong sign")
    add("games", "calculator", t, f"{m['a']}{m['op']}{m['b']}", False, "the question echoed, not its value")
    add("games", "calculator", t, f"{g} or {g + 1}", False, "hedge")
    add("games", "calculator", t, f"{g}.5", False, "not an integer")
    add("games", "calculator", t, f"${g}", True, "a dollar sign before the integer")
    add("games", "calculator", t, f"${g + 1}", False, "off by one, with a dollar sign")
for t in list(load_suite("games-guess").test)[:6] + list(load_suite("games-guess").train)[:4]:
    s = int(t.answer)
    add("games", "guess_number", t, str(s), True, "the secret")
    add("games", "guess_number", t, f"{s}.0", True, "same integer as a JSON float")
    add("games", "guess_number", t, str(s + 1), False, "off by one")
    add("games", "guess_number", t, str(s - 1), False, "off by one")
    add("games", "guess_number", t, f"{s} or {s + 1}", False, "hedge")
    add("games", "guess_number", t, "True", False, "a boolean is not a guess")
with open(OUT + "games.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print("games", len(rows))
