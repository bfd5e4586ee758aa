"""Training text for the mini MoE: a seeded mix of English prose, Python code and numbers, with gold line labels.

Three generators, each small but varied enough that a router has something to specialise on:
- prose: sentences from a phrase grammar (subject, verb, object, place, time, clauses) over ~450 words;
- code: small Python functions and classes (loops, conditions, comprehensions, calls, string literals);
- numbers: arithmetic facts that are correct, arithmetic/geometric sequences, dated tables of decimals.
A document joins 1-3 segments of random kinds with blank lines, so segments of every kind meet in one context.
Everything is a pure function of the seed, so the corpus (and the trained model) is reproducible.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("prose", "code", "numbers")

NAMES = ["Anna", "Ben", "Clara", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemal", "Lena",
         "Marta", "Noah", "Olga", "Pablo", "Rosa", "Samir", "Tara", "Victor", "Yuki", "Zoe"]
PEOPLE = ["the teacher", "the farmer", "the doctor", "a student", "the old man", "my sister", "our neighbour",
          "the captain", "a young woman", "the baker", "the engineer", "the children", "the writer", "her friend",
          "the driver", "the nurse", "his brother", "the painter", "a traveller", "the gardener"]
THINGS = ["the letter", "a small boat", "the garden", "an old map", "the bread", "a red bicycle", "the window",
          "the river", "a long story", "the wooden table", "the lamp", "a basket of apples", "the bridge",
          "the new school", "a quiet song", "the broken clock", "the mountain road", "a cup of tea", "the market",
          "the village", "a warm coat", "the library", "an empty room", "the harbour", "the forest path"]
ADJECTIVES = ["quiet", "bright", "cold", "heavy", "gentle", "narrow", "ancient", "busy", "green", "tired", "clever",
              "strange", "careful", "happy", "dark", "silver", "distant", "simple", "warm", "patient"]
VERBS_T = ["found", "opened", "painted", "carried", "watched", "repaired", "visited", "described", "cleaned",
           "followed", "remembered", "built", "sold", "noticed", "closed", "shared", "crossed", "measured"]
VERBS_I = ["slept", "laughed", "waited", "arrived", "worked", "walked home", "sang", "stayed inside", "listened",
           "left early", "smiled", "kept quiet", "travelled north", "woke up", "returned"]
PLACES = ["in the kitchen", "near the station", "by the river", "at the market", "in the old town", "on the hill",
          "behind the house", "at the harbour", "in the library", "under the bridge", "across the valley",
          "beside the lake", "in the garden", "at school", "on the island"]
TIMES = ["in the morning", "after dinner", "on Sunday", "before the rain", "every summer", "late at night",
         "during the storm", "at noon", "in early spring", "last winter", "the next day", "once a week"]
ADVERBS = ["slowly", "quickly", "carefully", "quietly", "happily", "suddenly", "finally", "often", "rarely",
           "always"]
CONNECTIVES = ["because", "although", "while", "after", "before", "when", "until", "since"]
OPENERS = ["Later", "Meanwhile", "Afterwards", "Of course", "In the end", "At first", "Then", "Still", "Once",
           "However"]
FEELINGS = ["glad", "surprised", "worried", "proud", "curious", "calm", "sorry", "certain"]
PRONOUNS = ["he", "she", "they", "we", "I", "it", "you"]
DESTINATIONS = ["the market", "the harbour", "school", "the station", "the old town", "the river", "the library",
                "the island", "work", "the mountains", "the city", "the sea"]
VERBS_BASE = ["find", "open", "paint", "carry", "watch", "repair", "visit", "describe", "clean", "build", "sell",
              "see", "read", "write", "cook", "fix"]

IDENTIFIERS = ["items", "values", "total", "count", "result", "data", "names", "scores", "words", "numbers",
               "index", "size", "limit", "text", "line", "key", "value", "table", "row", "price", "weight",
               "width", "height", "offset", "step", "buffer", "queue", "node", "left", "right", "parts", "chunk"]
FUNCTIONS = ["compute", "parse", "load", "filter", "merge", "count", "average", "normalise", "split", "update",
             "find", "sort", "clean", "build", "check", "format", "scale", "collect", "encode", "flatten"]
NOUNS = ["items", "values", "scores", "lines", "words", "records", "prices", "tokens", "rows", "names", "points",
         "weights", "files", "pairs"]
BUILTINS = ["len", "sum", "max", "min", "sorted", "abs", "round", "list", "str", "int", "float"]
CLASSES = ["Counter", "Buffer", "Matrix", "Parser", "Record", "Stack", "Queue", "Vector", "Timer", "Cache"]


@dataclass(frozen=True)
class Segment:
    kind: str  # one of KINDS
    text: str


# --- prose ------------------------------------------------------------------------------------------------------

def _subject(rng: random.Random) -> str:
    roll = rng.random()
    return rng.choice(NAMES) if roll < 0.35 else rng.choice(PRONOUNS) if roll < 0.6 else rng.choice(PEOPLE)


def _clause(rng: random.Random) -> str:
    subject = _subject(rng)
    roll = rng.random()
    if roll < 0.45:
        thing = rng.choice(THINGS)
        if rng.random() < 0.4:
            thing = thing.replace("the ", f"the {rng.choice(ADJECTIVES)} ", 1)
        core = f"{subject} {rng.choice(VERBS_T)} {thing}"
    elif roll < 0.7:
        core = f"{subject} {rng.choice(ADVERBS)} {rng.choice(VERBS_I)}"
    elif roll < 0.78:
        core = f"{subject} was {rng.choice(FEELINGS)} that {_subject(rng)} {rng.choice(VERBS_I)}"
    elif roll < 0.86:
        core = f"{subject} {rng.choice(['went', 'walked', 'drove', 'came back'])} to {rng.choice(DESTINATIONS)}"
        if rng.random() < 0.5:
            core += f" to {rng.choice(VERBS_BASE)} {rng.choice(THINGS)}"
    else:
        count = rng.choice([2, 3, 4, 5, 7, 10, 12, 20, 100])
        core = f"{subject} {rng.choice(['bought', 'counted', 'saw', 'needed'])} {count} " \
               f"{rng.choice(['apples', 'books', 'birds', 'chairs', 'boats', 'letters', 'stones'])}"
    if rng.random() < 0.5:
        core += " " + rng.choice(PLACES)
    if rng.random() < 0.3:
        core += " " + rng.choice(TIMES)
    return core


def prose_sentence(rng: random.Random) -> str:
    sentence = _clause(rng)
    if rng.random() < 0.35:
        sentence += f" {rng.choice(CONNECTIVES)} {_clause(rng)}"
    if rng.random() < 0.25:
        sentence = f"{rng.choice(OPENERS)}, {sentence}"
    sentence = sentence[0].upper() + sentence[1:]
    return sentence + rng.choice([".", ".", ".", ".", "!", "?"] if "?" not in sentence else ["."])


def prose(rng: random.Random) -> str:
    return " ".join(prose_sentence(rng) for _ in range(rng.randint(2, 6)))


# --- code -------------------------------------------------------------------------------------------------------

def _expr(rng: random.Random, names: list[str]) -> str:
    a = rng.choice(names)
    roll = rng.random()
    if roll < 0.3:
        return f"{a} {rng.choice(['+', '-', '*', '//', '%'])} {rng.randint(1, 20)}"
    if roll < 0.55:
        return f"{rng.choice(BUILTINS)}({a})"
    if roll < 0.75:
        return f"{a}[{rng.choice(['0', '-1', 'i', 'index', '1:'])}]"
    return f"{a} {rng.choice(['+', '-', '*'])} {rng.choice(names)}"


def _body(rng: random.Random, names: list[str], indent: str, depth: int = 0) -> list[str]:
    lines = []
    for _ in range(rng.randint(2, 4)):
        roll = rng.random()
        target = rng.choice(IDENTIFIERS)
        if roll < 0.3 or depth >= 2:
            lines.append(f"{indent}{target} = {_expr(rng, names)}")
            names = names + [target]
        elif roll < 0.5:
            var = rng.choice(["item", "value", "word", "x", "row"])
            lines.append(f"{indent}for {var} in {rng.choice(names)}:")
            lines += _body(rng, names + [var], indent + "    ", depth + 1)
        elif roll < 0.65:
            lines.append(f"{indent}if {rng.choice(names)} {rng.choice(['>', '<', '==', '!=', '>='])} "
                         f"{rng.randint(0, 10)}:")
            lines += _body(rng, names, indent + "    ", depth + 1)
            if rng.random() < 0.4:
                lines.append(f"{indent}else:")
                lines += _body(rng, names, indent + "    ", depth + 1)
        elif roll < 0.8:
            var = rng.choice(["x", "v", "item"])
            lines.append(f"{indent}{target} = [{var} * {rng.randint(2, 9)} for {var} in {rng.choice(names)} "
                         f"if {var} > {rng.randint(0, 5)}]")
            names = names + [target]
        elif roll < 0.9:
            lines.append(f"{indent}{rng.choice(names)}.append({_expr(rng, names)})")
        else:
            lines.append(f'{indent}print("{rng.choice(FUNCTIONS)}", {rng.choice(names)})')
    return lines


def code(rng: random.Random) -> str:
    if rng.random() < 0.2:
        name = rng.choice(CLASSES)
        field_a, field_b = rng.sample(IDENTIFIERS, 2)
        return "\n".join([
            f"class {name}:",
            f"    def __init__(self, {field_a}, {field_b}={rng.randint(0, 9)}):",
            f"        self.{field_a} = {field_a}",
            f"        self.{field_b} = {field_b}",
            "",
            f"    def {rng.choice(FUNCTIONS)}(self):",
            f"        return self.{field_a} {rng.choice(['+', '*', '-'])} self.{field_b}",
        ])
    args = rng.sample(IDENTIFIERS, rng.randint(1, 3))
    name = f"{rng.choice(FUNCTIONS)}_{rng.choice(NOUNS)}"
    lines = [f"def {name}({', '.join(args)}):"]
    if rng.random() < 0.3:
        lines.append(f'    """{rng.choice(FUNCTIONS).capitalize()} the {rng.choice(NOUNS)}."""')
    lines += _body(rng, list(args), "    ")
    lines.append(f"    return {rng.choice(args + [_expr(rng, args)])}")
    return "\n".join(lines)


# --- numbers ----------------------------------------------------------------------------------------------------

def numbers(rng: random.Random) -> str:
    roll = rng.random()
    rows = rng.randint(3, 6)
    if roll < 0.35:
        lines = []
        for _ in range(rows):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            op = rng.choice(["+", "-", "*"])
            lines.append(f"{a} {op} {b} = {a + b if op == '+' else a - b if op == '-' else a * b}")
        return "\n".join(lines)
    if roll < 0.6:
        start, step = rng.randint(0, 50), rng.randint(1, 12)
        if rng.random() < 0.3:
            ratio = rng.choice([2, 3])
            return ", ".join(str(start + 1) if i == 0 else str((start + 1) * ratio ** i) for i in range(8))
        return ", ".join(str(start + step * i) for i in range(rng.randint(6, 12)))
    if roll < 0.85:
        year, month = rng.randint(1990, 2030), rng.randint(1, 12)
        return "\n".join(f"{year}-{month:02d}-{day:02d} {rng.uniform(0, 100):.2f} {rng.randint(100, 9999)}"
                         for day in sorted(rng.sample(range(1, 29), rows)))
    return "\n".join(" ".join(f"{rng.uniform(-10, 10):.{rng.choice([1, 2, 3])}f}" for _ in range(4))
                     for _ in range(rows))


GENERATORS = {"prose": prose, "code": code, "numbers": numbers}


def document(rng: random.Random) -> list[Segment]:
    """1-3 segments of random kinds (prose is the most common, as in real text)."""
    kinds = rng.choices(KINDS, weights=[0.45, 0.35, 0.2], k=rng.randint(1, 3))
    return [Segment(kind, GENERATORS[kind](rng)) for kind in kinds]


def segments(num_chars: int, seed: int) -> list[Segment]:
    """Documents' segments in order until their text reaches ``num_chars``."""
    rng = random.Random(seed)
    found, size = [], 0
    while size < num_chars:
        for segment in document(rng):
            found.append(segment)
            size += len(segment.text) + 2
    return found


def corpus(num_chars: int, seed: int) -> str:
    """The segments joined by blank lines."""
    return "\n\n".join(segment.text for segment in segments(num_chars, seed))
