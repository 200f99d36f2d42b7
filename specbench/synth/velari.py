"""Velari, the constructed target language of the translation subtask, and its English grammar.

The English side is a small grammar: subject, verb, object, an optional place phrase and an
optional time phrase ("The old baker carried three red baskets to the market yesterday.").
Velari drops articles, puts adjectives and numbers after the noun, uses postpositions, is
subject-object-verb, starts with the time word, marks the plural with -en and the past tense
with -ta, and keeps names. Its words are invented from `WORLD_SEED` and never coincide with an
English word of the grammar, a first name or a word of the translation instructions, so an
answer can never be copied from its prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from specbench.synth.english import capitalized, with_article
from specbench.synth.seeds import WORLD_SEED, seeded_rng
from specbench.synth.world import FIRST_NAMES

#: Name of the constructed target language of the translation subtask.
TARGET_LANGUAGE: str = "Velari"

PEOPLE = (
    ("baker", "bakers"), ("farmer", "farmers"), ("teacher", "teachers"), ("child", "children"),
    ("sailor", "sailors"), ("doctor", "doctors"), ("merchant", "merchants"), ("painter", "painters"),
    ("soldier", "soldiers"), ("student", "students"), ("girl", "girls"), ("boy", "boys"),
    ("woman", "women"), ("man", "men"), ("weaver", "weavers"), ("guard", "guards"),
    ("singer", "singers"), ("hunter", "hunters"),
)
THINGS = (
    ("basket", "baskets"), ("apple", "apples"), ("book", "books"), ("letter", "letters"),
    ("loaf", "loaves"), ("boat", "boats"), ("lamp", "lamps"), ("stone", "stones"),
    ("flower", "flowers"), ("cup", "cups"), ("key", "keys"), ("coat", "coats"), ("horse", "horses"),
    ("bird", "birds"), ("dog", "dogs"), ("cat", "cats"), ("map", "maps"), ("box", "boxes"),
    ("rope", "ropes"), ("coin", "coins"), ("knife", "knives"), ("chair", "chairs"),
    ("table", "tables"), ("bell", "bells"), ("shoe", "shoes"), ("ring", "rings"), ("cake", "cakes"),
    ("candle", "candles"), ("goat", "goats"), ("blanket", "blankets"),
)
PLACES = (
    ("market", "markets"), ("river", "rivers"), ("forest", "forests"), ("house", "houses"),
    ("school", "schools"), ("bridge", "bridges"), ("garden", "gardens"), ("harbour", "harbours"),
    ("village", "villages"), ("tower", "towers"), ("mountain", "mountains"), ("field", "fields"),
    ("kitchen", "kitchens"), ("road", "roads"), ("hill", "hills"), ("lake", "lakes"),
    ("well", "wells"), ("gate", "gates"), ("shop", "shops"), ("temple", "temples"),
)
NOUNS = PEOPLE + THINGS + PLACES  # (singular, plural)
_ADJS = (
    "old", "young", "small", "big", "red", "blue", "green", "white", "black", "heavy", "new",
    "happy", "quiet", "tired", "brave", "cold", "warm", "bright", "dark", "wooden", "golden",
    "tall", "clever", "poor", "rich", "strange", "beautiful", "empty", "full", "little",
)
VERBS = (  # (lemma, third person singular, past)
    ("carry", "carries", "carried"), ("find", "finds", "found"), ("buy", "buys", "bought"),
    ("sell", "sells", "sold"), ("bring", "brings", "brought"), ("make", "makes", "made"),
    ("see", "sees", "saw"), ("paint", "paints", "painted"), ("lose", "loses", "lost"),
    ("take", "takes", "took"), ("hold", "holds", "held"), ("open", "opens", "opened"),
    ("clean", "cleans", "cleaned"), ("give", "gives", "gave"), ("hide", "hides", "hid"),
    ("build", "builds", "built"), ("follow", "follows", "followed"), ("watch", "watches", "watched"),
    ("wash", "washes", "washed"), ("draw", "draws", "drew"), ("keep", "keeps", "kept"),
    ("break", "breaks", "broke"), ("fix", "fixes", "fixed"), ("send", "sends", "sent"),
)
# Adjectives of one group are never combined (no "cold warm cats").
_ADJ_GROUP = {a: g for g, members in enumerate((
    ("old", "young", "new"), ("small", "big", "tall", "little"), ("cold", "warm"), ("bright", "dark"),
    ("rich", "poor"), ("empty", "full"), ("red", "blue", "green", "white", "black", "golden"),
    ("happy", "tired", "quiet", "brave", "clever"),
)) for a in members}
_PREPS = ("to", "from", "near", "in", "behind", "under", "across", "into")
_NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_TIMES_PAST = ("yesterday", "last night", "last week", "today")
_TIMES_PRESENT = ("every day", "every morning", "every evening", "today")
# Every time phrase, in the order the lexicon gives them words.
_TIMES = ("yesterday", "last night", "last week", "every day", "every morning", "every evening", "today")
_NAMES = FIRST_NAMES[::2]
#: Requests for a translation into Velari (no Velari word is one of their words).
TRANSLATE_ONE = (
    f"Translate the following sentence from English into {TARGET_LANGUAGE}: ",
    f"Translate this sentence into {TARGET_LANGUAGE}: ",
    f"Please translate the following English sentence into {TARGET_LANGUAGE}: ",
)
TRANSLATE_MANY = (
    f"Translate the following text from English into {TARGET_LANGUAGE}: ",
    f"Translate these sentences into {TARGET_LANGUAGE}: ",
    f"Please translate the following English text into {TARGET_LANGUAGE}: ",
)
PLURAL_SUFFIX = "en"
PAST_SUFFIX = "ta"


# ---- the lexicon ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lexicon:
    words: dict[str, str]          # English lemma (or time phrase) -> Velari word
    noun_lemma: dict[str, tuple[str, bool]]   # English noun form -> (lemma, plural)
    verb_lemma: dict[str, tuple[str, bool]]   # English verb form -> (lemma, past)
    english: frozenset[str]        # every English word of the grammar


def _english_vocabulary() -> tuple[list[str], set[str]]:
    """The lemmas and time phrases that get a Velari word (in order), and every English word used."""
    items = [sg for sg, _ in NOUNS] + list(_ADJS) + [v[0] for v in VERBS] + list(_PREPS)
    items += list(_NUMBERS) + list(_TIMES)
    english: set[str] = set()
    for item in items:
        english.update(item.split())
    for forms in NOUNS + VERBS:
        english.update(forms)
    for text in TRANSLATE_ONE + TRANSLATE_MANY:
        english.update(w.strip(":").lower() for w in text.split())
    english.update({"the", "a", "an"})
    return items, english


def _invent_words(items: list[str], banned: set[str]) -> dict[str, str]:
    """A distinct invented word of two or three syllables for every item."""
    rng = seeded_rng(WORLD_SEED, "velari")
    onsets = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "th")
    vowels = ("a", "e", "i", "o", "u", "a", "o", "ai", "ou")
    codas = ("n", "r", "l", "s", "k", "m")
    words: dict[str, str] = {}
    used: set[str] = set()
    for item in items:
        while True:
            n_syl = rng.choice((2, 2, 3))
            w = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(n_syl))
            if n_syl == 2 or rng.random() < 0.3:
                w += rng.choice(codas)
            if w not in used and w not in banned and w + PLURAL_SUFFIX not in banned:
                break
        used.add(w)
        words[item] = w
    return words


@lru_cache(maxsize=1)
def lexicon() -> Lexicon:
    """The Velari lexicon: one invented word for every English word of the grammar."""
    items, english = _english_vocabulary()
    words = _invent_words(items, english | {n.lower() for n in FIRST_NAMES})
    noun_lemma = {}
    for sg, pl in NOUNS:
        noun_lemma[sg] = (sg, False)
        noun_lemma[pl] = (sg, True)
    verb_lemma = {}
    for lemma, third, past in VERBS:
        verb_lemma[lemma] = (lemma, False)
        verb_lemma[third] = (lemma, False)
        verb_lemma[past] = (lemma, True)
    return Lexicon(words, noun_lemma, verb_lemma, frozenset(english))


# ---- noun phrases -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _NP:
    noun: str                 # English lemma, or a proper name
    plural: bool = False
    adjs: tuple[str, ...] = ()
    det: str = ""             # "the", "a", a number word, or "" for names
    name: bool = False


def _np_english(np: _NP) -> str:
    if np.name:
        return np.noun
    noun = dict(NOUNS)[np.noun] if np.plural else np.noun
    body = " ".join(np.adjs + (noun,))
    if np.det == "a":
        return with_article(body)
    return f"{np.det} {body}"


def _np_velari(np: _NP, lex: Lexicon) -> list[str]:
    """Noun (with the plural suffix), then adjectives, then the number word; no articles."""
    if np.name:
        return [np.noun]
    out = [lex.words[np.noun] + (PLURAL_SUFFIX if np.plural else "")] + [lex.words[a] for a in np.adjs]
    if np.det in _NUMBERS:
        out.append(lex.words[np.det])
    return out


def _random_np(rng: random.Random, nouns: tuple[tuple[str, str], ...], allow_number: bool) -> _NP:
    noun = rng.choice(nouns)[0]
    while True:
        adjs = tuple(rng.sample(_ADJS, rng.choice((0, 1, 1, 1, 2))))
        if len({_ADJ_GROUP.get(a, a) for a in adjs}) == len(adjs):
            break
    roll = rng.random()
    if allow_number and roll < 0.3:
        return _NP(noun, True, adjs, rng.choice(_NUMBERS))
    if roll < 0.45:
        return _NP(noun, True, adjs, "the")
    return _NP(noun, False, adjs, "the" if roll < 0.75 else "a")


def _parse_np(tokens: list[str], i: int, lex: Lexicon) -> tuple[_NP, int]:
    """The noun phrase starting at tokens[i], and the index after it."""
    tok = tokens[i]
    low = tok.lower()
    if low not in ("the", "a", "an") and low not in _NUMBERS:
        return _NP(tok, name=True), i + 1
    det = "a" if low == "an" else low
    i += 1
    adjs: list[str] = []
    while tokens[i] in _ADJS:
        adjs.append(tokens[i])
        i += 1
    lemma, plural = lex.noun_lemma[tokens[i]]
    return _NP(lemma, plural, tuple(adjs), det), i + 1


# ---- sentences --------------------------------------------------------------------------------

def random_sentence(rng: random.Random) -> tuple[str, str]:
    """One English sentence of the grammar and its Velari translation."""
    if rng.random() < 0.35:
        subj = _NP(rng.choice(_NAMES), name=True)
    else:
        subj = _random_np(rng, PEOPLE, allow_number=True)
    past = rng.random() < 0.5
    lemma, third, past_form = rng.choice(VERBS)
    verb = past_form if past else (lemma if subj.plural else third)
    english = [_np_english(subj), verb, _np_english(_random_np(rng, THINGS, allow_number=True))]
    if rng.random() < 0.7:
        english += [rng.choice(_PREPS), _np_english(_random_np(rng, PLACES, allow_number=False))]
    if rng.random() < 0.5:
        english.append(rng.choice(_TIMES_PAST if past else _TIMES_PRESENT))
    sentence = capitalized(" ".join(english)) + "."
    return sentence, _translate_sentence(sentence, lexicon())


def _translate_sentence(sentence: str, lex: Lexicon) -> str:
    tokens = sentence.strip().rstrip(".").split()
    time = None
    if len(tokens) >= 2 and " ".join(tokens[-2:]) in _TIMES:
        time, tokens = " ".join(tokens[-2:]), tokens[:-2]
    elif tokens[-1] in _TIMES:
        time, tokens = tokens[-1], tokens[:-1]
    subj, i = _parse_np(tokens, 0, lex)
    lemma, past = lex.verb_lemma[tokens[i]]
    obj, i = _parse_np(tokens, i + 1, lex)
    pp_words: list[str] = []
    if i < len(tokens):
        prep = tokens[i]
        place, i = _parse_np(tokens, i + 1, lex)
        pp_words = _np_velari(place, lex) + [lex.words[prep]]
    if i != len(tokens):
        raise ValueError(f"cannot parse sentence: {sentence!r}")
    out: list[str] = [lex.words[time]] if time else []
    out += _np_velari(subj, lex) + _np_velari(obj, lex) + pp_words
    out.append(lex.words[lemma] + (PAST_SUFFIX if past else ""))
    return capitalized(" ".join(out)) + "."


def translate_to_velari(text: str) -> str:
    """Translate English text of the benchmark's grammar into Velari (deterministic).

    Velari drops articles, puts adjectives and numbers after the noun, uses postpositions,
    is subject-object-verb, starts with the time word, marks the plural with ``-en`` and the past
    tense with ``-ta``; names are kept.  Raises ``ValueError``/``KeyError`` outside the grammar.
    """
    lex = lexicon()
    parts = [p.strip() for p in text.strip().split(".") if p.strip()]
    return " ".join(_translate_sentence(p + ".", lex) for p in parts)
