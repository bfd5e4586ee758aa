"""A small English→French grammar that emits sentence pairs with gold word alignments.

It covers what makes translation need attention rather than a word-by-word lookup (Bahdanau et al. 2015, fig. 3):

- articles and gender: "the" → le / la / l' / les, "a" → un / une, "this" → ce / cet / cette / ces, with
  elision before a vowel and the contractions "of the" → du / des, so one French word can align to two English ones;
- adjective–noun reordering: most French adjectives follow the noun and stack in mirror order, so
  "the European Economic Area" → "la zone économique européenne" (the alignment bends backwards), while a few
  ("new", "great", "small", "first", "old") stay in front ("le nouvel accord");
- agreement: adjectives and passive participles agree with the noun's gender and number ("a été signée"), verbs with
  the subject ("approuvent"), and tense changes the word count ("approved" → "a approuvé", "will sign" → "signera");
- numbers and dates: counts in words or digits ("three reports" → "trois rapports"), "in August 1992" →
  "en août 1992", "on 12 March 2004" → "le 12 mars 2004";
- varied lengths: prepositional phrases nest, noun phrases and clauses coordinate.

Every pair carries its alignment as (English word index, French word index) pairs, "sure" links in the sense of
Och & Ney (2003). Words are what ``split_words`` returns: letters/digits runs, an elided "l'" / "d'" on its own, and
each punctuation mark on its own.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

WORD_PATTERN = re.compile(r"\w+'|\w+|[^\w\s]")
VOWELS = set("aeiouyéèêàâîô")


def split_words(text: str) -> list[str]:
    """Words as the alignments count them: "L'accord sur la zone, en 1992." -> L' accord sur la zone , en 1992 ."""
    return WORD_PATTERN.findall(text.replace("’", "'"))


def join_words(words: list[str]) -> str:
    """Inverse of ``split_words`` for this grammar: no space before punctuation or after an elided article."""
    text = ""
    for word in words:
        if text and not (word in {".", ","} or text.endswith("'")):
            text += " "
        text += word
    return text


@dataclass(frozen=True)
class Noun:
    en: str
    en_plural: str
    fr: str
    fr_plural: str
    gender: str  # "m" or "f"


@dataclass(frozen=True)
class Adjective:
    en: str
    forms: tuple[str, str, str, str]  # masculine singular, feminine singular, masculine plural, feminine plural
    before_noun: bool = False  # French position: most adjectives follow the noun
    before_vowel: str = ""  # masculine singular before a vowel ("nouvel accord")

    def french(self, gender: str, plural: bool, next_word: str) -> str:
        if self.before_vowel and gender == "m" and not plural and starts_with_vowel(next_word):
            return self.before_vowel
        return self.forms[(gender == "f") + 2 * plural]


@dataclass(frozen=True)
class Verb:
    en: str  # base form: "approve"
    en_third: str  # "approves"
    en_past: str  # "approved" (also the participle)
    fr_third: str  # "approuve"
    fr_third_plural: str  # "approuvent"
    fr_participle: str  # "approuvé" (masculine singular)
    fr_future: str  # "approuvera"
    fr_future_plural: str  # "approuveront"


def _nouns(rows: str, gender: str) -> list[Noun]:
    out = []
    for row in rows.split(";"):
        en, en_pl, fr, fr_pl = row.split()
        out.append(Noun(en, en_pl, fr, fr_pl, gender))
    return out


NOUNS: list[Noun] = _nouns(
    "agreement agreements accord accords; report reports rapport rapports; council councils conseil conseils;"
    "treaty treaties traité traités; market markets marché marchés; committee committees comité comités;"
    "parliament parliaments parlement parlements; budget budgets budget budgets; country countries pays pays;"
    "programme programmes programme programmes; government governments gouvernement gouvernements;"
    "plan plans plan plans; investment investments investissement investissements; network networks réseau réseaux;"
    "office offices bureau bureaux", "m") + _nouns(
    "area areas zone zones; commission commissions commission commissions; meeting meetings réunion réunions;"
    "proposal proposals proposition propositions; policy policies politique politiques; bank banks banque banques;"
    "union unions union unions; law laws loi lois; decision decisions décision décisions;"
    "company companies entreprise entreprises; strategy strategies stratégie stratégies;"
    "institution institutions institution institutions; election elections élection élections", "f")

_POST = """European européen européenne européens européennes; economic économique économique économiques économiques;
social social sociale sociaux sociales; political politique politique politiques politiques;
public public publique publics publiques; financial financier financière financiers financières;
national national nationale nationaux nationales; international international internationale internationaux
internationales; annual annuel annuelle annuels annuelles; important important importante importants importantes;
central central centrale centraux centrales; green vert verte verts vertes; digital numérique numérique numériques
numériques; regional régional régionale régionaux régionales"""
ADJECTIVES_AFTER: list[Adjective] = [
    Adjective(parts[0], tuple(parts[1:5])) for parts in (row.split() for row in _POST.split(";"))
]
ADJECTIVES_BEFORE: list[Adjective] = [
    Adjective("new", ("nouveau", "nouvelle", "nouveaux", "nouvelles"), True, "nouvel"),
    Adjective("old", ("vieux", "vieille", "vieux", "vieilles"), True, "vieil"),
    Adjective("great", ("grand", "grande", "grands", "grandes"), True),
    Adjective("small", ("petit", "petite", "petits", "petites"), True),
    Adjective("first", ("premier", "première", "premiers", "premières"), True),
]

_VERBS = """approve approves approved approuve approuvent approuvé approuvera approuveront;
sign signs signed signe signent signé signera signeront; discuss discusses discussed discute discutent discuté
discutera discuteront; adopt adopts adopted adopte adoptent adopté adoptera adopteront;
reject rejects rejected rejette rejettent rejeté rejettera rejetteront;
support supports supported soutient soutiennent soutenu soutiendra soutiendront;
publish publishes published publie publient publié publiera publieront;
present presents presented présente présentent présenté présentera présenteront;
examine examines examined examine examinent examiné examinera examineront;
prepare prepares prepared prépare préparent préparé préparera prépareront;
finance finances financed finance financent financé financera financeront;
launch launches launched lance lancent lancé lancera lanceront"""
VERBS: list[Verb] = [Verb(*row.split()) for row in _VERBS.split(";")]

MONTHS = list(zip(
    "January February March April May June July August September October November December".split(),
    "janvier février mars avril mai juin juillet août septembre octobre novembre décembre".split()))
NUMBER_WORDS = list(zip("two three four five six seven eight nine ten".split(),
                        "deux trois quatre cinq six sept huit neuf dix".split()))
PREPOSITIONS = [("of", "de"), ("on", "sur"), ("for", "pour"), ("with", "avec"), ("in", "dans")]
YEARS = (1950, 2029)  # inclusive
DAYS = (2, 28)  # "1" would be "1er" in French; left out to keep one number one word


def starts_with_vowel(word: str) -> bool:
    return bool(word) and word[0].lower() in VOWELS


def english_vowel_sound(word: str) -> bool:
    """"an agreement", "an annual report", but "a European bank", "a union" (a consonant sound)."""
    return starts_with_vowel(word) and not word.lower().startswith(("eu", "uni"))


@dataclass
class Phrase:
    """English words, French words and sure links (English index, French index) between them."""

    en: list[str] = field(default_factory=list)
    fr: list[str] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)

    @staticmethod
    def word(en: str | list[str], fr: str | list[str]) -> "Phrase":
        """A unit whose English words all align to all of its French words ("will sign" ↔ "signera")."""
        en_words = en.split() if isinstance(en, str) else list(en)
        fr_words = fr.split() if isinstance(fr, str) else list(fr)
        links = [(i, j) for i in range(len(en_words)) for j in range(len(fr_words))]
        return Phrase(en_words, fr_words, links)


def combine(parts: list[Phrase], fr_order: list[int] | None = None) -> Phrase:
    """English in the order given, French in ``fr_order`` (indices into ``parts``); links follow the words."""
    fr_order = list(range(len(parts))) if fr_order is None else fr_order
    en_offsets, fr_offsets, out = {}, {}, Phrase()
    for i, part in enumerate(parts):
        en_offsets[i] = len(out.en)
        out.en.extend(part.en)
    for i in fr_order:
        fr_offsets[i] = len(out.fr)
        out.fr.extend(parts[i].fr)
    for i, part in enumerate(parts):
        out.links.extend((a + en_offsets[i], b + fr_offsets[i]) for a, b in part.links)
    return out


@dataclass
class NounPhrase:
    phrase: Phrase
    gender: str
    plural: bool
    definite: bool  # starts with the definite article (so "of" + it contracts to du / des)


@dataclass
class SentencePair:
    english: str
    french: str
    en_words: list[str]
    fr_words: list[str]
    alignment: list[tuple[int, int]]  # sure links (English word index, French word index), sorted


class Grammar:
    """Samples sentence pairs. ``depth`` bounds nesting; the probabilities set the length distribution."""

    def __init__(self, seed: int = 0, max_pp_depth: int = 2, pp_probability: float = 0.35,
                 clause_probability: float = 0.2, title_probability: float = 0.3):
        self.rng = random.Random(seed)
        self.max_pp_depth = max_pp_depth
        self.pp_probability = pp_probability
        self.clause_probability = clause_probability
        self.title_probability = title_probability

    # --- noun phrases ------------------------------------------------------------------------------------------
    def noun_phrase(self, depth: int = 0, allow_coordination: bool = False) -> NounPhrase:
        rng = self.rng
        if allow_coordination and rng.random() < 0.08:
            left = self.noun_phrase(depth + 1, allow_coordination=False)
            right = self.noun_phrase(depth + 1, allow_coordination=False)
            both = combine([left.phrase, Phrase.word("and", "et"), right.phrase])
            gender = "f" if left.gender == right.gender == "f" else "m"
            return NounPhrase(both, gender, True, False)
        noun = rng.choice(NOUNS)
        determiner = rng.choices(["the", "a", "this", "our", "their", "each", "count"], [8, 3, 2, 1, 1, 1, 2])[0]
        plural = determiner == "count" or (determiner in ("the", "this", "our", "their") and rng.random() < 0.35)
        before = rng.choice(ADJECTIVES_BEFORE) if rng.random() < 0.2 else None
        after = rng.sample(ADJECTIVES_AFTER, rng.choices([0, 1, 2], [5, 3, 2])[0])
        title = bool(after) and before is None and determiner == "the" and rng.random() < self.title_probability

        noun_part = Phrase.word(noun.en_plural if plural else noun.en, noun.fr_plural if plural else noun.fr)
        after_parts = [Phrase.word(a.en, a.french(noun.gender, plural, "")) for a in after]
        if title:  # an English proper name: "the European Economic Area" (French keeps lower case)
            noun_part.en = [w[0].upper() + w[1:] for w in noun_part.en]
            for part in after_parts:
                part.en = [w[0].upper() + w[1:] for w in part.en]
        # English: [before] a1 a2 noun; French: [before] noun a2 a1 (post-nominal adjectives stack in mirror order)
        parts = ([Phrase.word(before.en, before.french(noun.gender, plural, noun_part.fr[0]))] if before else [])
        parts += after_parts + [noun_part]
        n_before = 1 if before else 0
        fr_order = list(range(n_before)) + [len(parts) - 1] + list(range(len(parts) - 2, n_before - 1, -1))
        body = combine(parts, fr_order)

        det = self.determiner(determiner, noun.gender, plural, body.en[0], body.fr[0])
        phrase = combine([det, body])
        if depth < self.max_pp_depth and rng.random() < self.pp_probability / (depth + 1):
            en_prep, fr_prep = rng.choice(PREPOSITIONS)
            inner = self.noun_phrase(depth + 1)
            phrase = combine([phrase, self.preposition(en_prep, fr_prep, inner)])
        return NounPhrase(phrase, noun.gender, plural, determiner == "the")

    def determiner(self, kind: str, gender: str, plural: bool, en_next: str, fr_next: str) -> Phrase:
        rng = self.rng
        vowel = starts_with_vowel(fr_next)
        if kind == "the":
            fr = "les" if plural else ("l'" if vowel else ("la" if gender == "f" else "le"))
            return Phrase.word("the", fr)
        if kind == "a":
            return Phrase.word("an" if english_vowel_sound(en_next) else "a", "une" if gender == "f" else "un")
        if kind == "this":
            if plural:
                return Phrase.word("these", "ces")
            return Phrase.word("this", "cette" if gender == "f" else ("cet" if vowel else "ce"))
        if kind == "our":
            return Phrase.word("our", "nos" if plural else "notre")
        if kind == "their":
            return Phrase.word("their", "leurs" if plural else "leur")
        if kind == "each":
            return Phrase.word("each", "chaque")
        if rng.random() < 0.6:  # a count in words agrees in gender only for "one", which is singular: left out
            en, fr = rng.choice(NUMBER_WORDS)
            return Phrase.word(en, fr)
        number = str(rng.randint(11, 99))
        return Phrase.word(number, number)

    def preposition(self, en: str, fr: str, inner: NounPhrase) -> Phrase:
        """"of the" contracts: de + le → du, de + les → des (one French word for two English ones)."""
        first = inner.phrase.fr[0]
        if fr == "de" and inner.definite and first in ("le", "les"):
            fused = Phrase.word([en, inner.phrase.en[0]], "du" if first == "le" else "des")
            rest = Phrase(inner.phrase.en[1:], inner.phrase.fr[1:],
                          [(a - 1, b - 1) for a, b in inner.phrase.links if a > 0])
            return combine([fused, rest])
        if fr == "de" and starts_with_vowel(first):
            fr = "d'"
        return combine([Phrase.word(en, fr), inner.phrase])

    # --- clauses ----------------------------------------------------------------------------------------------
    def verb_phrase(self, subject: NounPhrase) -> Phrase:
        rng = self.rng
        verb = rng.choice(VERBS)
        plural = subject.plural
        tense = rng.choices(["present", "past", "perfect", "future", "passive", "passive_future"],
                            [3, 3, 1, 2, 3, 1])[0]
        if tense.startswith("passive"):
            participle = verb.fr_participle + ("e" if subject.gender == "f" else "") + ("s" if plural else "")
            if tense == "passive":
                aux = Phrase.word("were" if plural else "was", "ont été" if plural else "a été")
            else:
                aux = Phrase.word("will be", "seront" if plural else "sera")
            parts = [aux, Phrase.word(verb.en_past, participle)]
            if rng.random() < 0.4:
                parts.append(self.preposition("by", "par", self.noun_phrase(1)))
            return combine(parts)
        if tense == "present":
            head = Phrase.word(verb.en if plural else verb.en_third, verb.fr_third_plural if plural else verb.fr_third)
        elif tense == "past":
            head = Phrase.word(verb.en_past, ["ont" if plural else "a", verb.fr_participle])
        elif tense == "perfect":
            head = combine([Phrase.word("have" if plural else "has", "ont" if plural else "a"),
                            Phrase.word(verb.en_past, verb.fr_participle)])
        else:
            head = Phrase.word(["will", verb.en], verb.fr_future_plural if plural else verb.fr_future)
        return combine([head, self.noun_phrase(1, allow_coordination=True).phrase])

    def date(self) -> Phrase:
        rng = self.rng
        year = str(rng.randint(*YEARS))
        kind = rng.choices(["month_year", "year", "day", "month"], [3, 2, 3, 1])[0]
        month_en, month_fr = rng.choice(MONTHS)
        if kind == "month_year":
            return combine([Phrase.word("in", "en"), Phrase.word(month_en, month_fr), Phrase.word(year, year)])
        if kind == "year":
            return combine([Phrase.word("in", "en"), Phrase.word(year, year)])
        if kind == "month":
            return combine([Phrase.word("in", "en"), Phrase.word(month_en, month_fr)])
        day = str(rng.randint(*DAYS))
        return combine([Phrase.word("on", "le"), Phrase.word(day, day), Phrase.word(month_en, month_fr),
                        Phrase.word(year, year)])

    def clause(self) -> Phrase:
        subject = self.noun_phrase(0, allow_coordination=True)
        return combine([subject.phrase, self.verb_phrase(subject)])

    def sentence(self) -> SentencePair:
        rng = self.rng
        body = self.clause()
        if rng.random() < self.clause_probability:
            body = combine([body, Phrase.word("and", "et"), self.clause()])
        if rng.random() < 0.45:
            when = self.date()
            if rng.random() < 0.3:  # fronted: "In 1992, the council ..."
                body = combine([when, Phrase.word(",", ","), body])
            else:
                body = combine([body, when])
        body = combine([body, Phrase.word(".", ".")])
        en = _capitalise_first(body.en)
        fr = _capitalise_first(body.fr)
        return SentencePair(join_words(en), join_words(fr), en, fr, sorted(set(body.links)))

    def sample(self, count: int) -> list[SentencePair]:
        return [self.sentence() for _ in range(count)]


def _capitalise_first(words: list[str]) -> list[str]:
    return [words[0][0].upper() + words[0][1:], *words[1:]] if words else words


def held_out_split(train_seed: int, test_seed: int, train_count: int, test_count: int,
                   max_source_words: int | None = None) -> tuple[list[SentencePair], list[SentencePair]]:
    """Training pairs and test pairs whose English sentence never occurs in training (a true held-out set)."""
    def draw(seed: int, count: int, exclude: set[str]) -> list[SentencePair]:
        grammar, out, seen = Grammar(seed), [], set(exclude)
        while len(out) < count:
            pair = grammar.sentence()
            if pair.english in seen or (max_source_words and len(pair.en_words) > max_source_words):
                continue
            seen.add(pair.english)
            out.append(pair)
        return out

    train = draw(train_seed, train_count, set())
    test = draw(test_seed, test_count, {p.english for p in train})
    return train, test


def example_pair() -> SentencePair:
    """The sentence of Bahdanau et al. (2015, fig. 3a), which this grammar generates word for word."""
    det = Phrase.word("The", "L'")
    agreement = Phrase.word("agreement", "accord")
    area = combine([Phrase.word("the", "la"), combine(
        [Phrase.word("European", "européenne"), Phrase.word("Economic", "économique"), Phrase.word("Area", "zone")],
        [2, 1, 0])])
    on = combine([Phrase.word("on", "sur"), area])
    verb = combine([Phrase.word("was", "a été"), Phrase.word("signed", "signé")])
    when = combine([Phrase.word("in", "en"), Phrase.word("August", "août"), Phrase.word("1992", "1992")])
    body = combine([det, agreement, on, verb, when, Phrase.word(".", ".")])
    return SentencePair(join_words(body.en), join_words(body.fr), body.en, body.fr, sorted(set(body.links)))



def english_words() -> list[str]:
    """Every English word form the grammar can emit (lower case as in mid-sentence; the minis also know each word
    capitalised)."""
    words = {"the", "a", "an", "this", "these", "our", "their", "each", "and", "was", "were", "will", "be", "has",
             "have", "by", "in", "on", ",", "."}
    for noun in NOUNS:
        words.update([noun.en, noun.en_plural])
    words.update(a.en for a in ADJECTIVES_AFTER + ADJECTIVES_BEFORE)
    for verb in VERBS:
        words.update([verb.en, verb.en_third, verb.en_past])
    for pairs in (MONTHS, NUMBER_WORDS, PREPOSITIONS):
        words.update(en for en, _ in pairs)
    return sorted(words, key=str.lower)


def english_words_by_kind() -> dict[str, list[str]]:
    """``english_words`` (letters and digits only) grouped as the grammar uses them, for a vocabulary a person picks
    words from: determiners and small words, nouns, adjectives, verbs, months, numbers."""
    groups = {
        "articles and small words": ["the", "a", "an", "this", "these", "our", "their", "each", "and", "was", "were",
                                     "will", "be", "has", "have", "by", *(en for en, _ in PREPOSITIONS)],
        "nouns": [form for noun in NOUNS for form in (noun.en, noun.en_plural)],
        "adjectives": [a.en for a in ADJECTIVES_BEFORE + ADJECTIVES_AFTER],
        "verbs": [form for verb in VERBS for form in (verb.en, verb.en_third, verb.en_past)],
        "months": [en for en, _ in MONTHS],
        "numbers": [en for en, _ in NUMBER_WORDS],
    }
    return {kind: list(dict.fromkeys(words)) for kind, words in groups.items()}


def french_words() -> list[str]:
    """Every French word form the grammar can emit."""
    words = {"le", "la", "l'", "les", "un", "une", "ce", "cet", "cette", "ces", "notre", "nos", "leur", "leurs",
             "chaque", "et", "a", "ont", "été", "sera", "seront", "par", "en", "du", "des", "d'", "de", ",", "."}
    for noun in NOUNS:
        words.update([noun.fr, noun.fr_plural])
    for adjective in ADJECTIVES_AFTER + ADJECTIVES_BEFORE:
        words.update([*adjective.forms] + ([adjective.before_vowel] if adjective.before_vowel else []))
    for verb in VERBS:
        words.update([verb.fr_third, verb.fr_third_plural, verb.fr_future, verb.fr_future_plural])
        words.update(verb.fr_participle + ending for ending in ("", "e", "s", "es"))
    for pairs in (MONTHS, NUMBER_WORDS, PREPOSITIONS):
        words.update(fr for _, fr in pairs)
    return sorted(words, key=str.lower)


def lexicon_words() -> list[str]:
    """Every word form the grammar can emit, English and French (the minis' vocabulary covers all of them)."""
    return sorted(set(english_words()) | set(french_words()))


def showcase_pairs() -> dict[str, SentencePair]:
    """Named sentences with gold alignments for the page's presets: the paper's example, then grammar samples of
    growing length (seed 2, the held-out seed; the first sample in each length range)."""
    chosen = {"Bahdanau et al., fig. 3": example_pair()}
    wanted = {"Short": (6, 8), "Reordered adjectives": (9, 14), "Medium": (15, 19), "Long": (22, 27),
              "Very long": (32, 40)}
    generator = Grammar(seed=2)
    while len(chosen) < len(wanted) + 1:
        pair = generator.sentence()
        for name, (low, high) in wanted.items():
            if name in chosen or not low <= len(pair.en_words) <= high:
                continue
            if name == "Reordered adjectives" and not _has_two_post_adjectives(pair):
                continue
            chosen[name] = pair
            break
    return {"Bahdanau et al., fig. 3": chosen.pop("Bahdanau et al., fig. 3"), **{name: chosen[name] for name in wanted}}


def _has_two_post_adjectives(pair: SentencePair) -> bool:
    post = {a.en.lower() for a in ADJECTIVES_AFTER}
    return any(a.lower() in post and b.lower() in post for a, b in zip(pair.en_words, pair.en_words[1:]))
