"""The word rules of the Spanish→English pronoun contrastive sets (:mod:`.pronoun_set`).

English side (the reference):

* **Gendered pronouns** (third person singular): masculine *he him his himself*, feminine
  *she her hers herself*, found as whole words (case-insensitive).
* **Gender swap** (:func:`swap_gender`): he↔she, himself↔herself, him→her, hers→his; *his*
  and *her* are decided by the next word (:func:`starts_noun_phrase`): *his* → *her* before a
  noun phrase, else *hers* ("the house is his."); *her* → *his* before a noun phrase ("her
  husband" → "his husband"), else *him* ("told her that", "to her.", and always after *let*:
  "let her glean"). Each
  swapped word keeps its capitalisation (``Her`` → ``His``, ``HE`` → ``SHE``).
* **Possessor number** (:func:`swap_number`): possessive *his*/*her* → *their*, *their* →
  *his*, *hers*/*theirs* likewise (the plural's singular is the masculine: a stated choice).

Spanish side (the source, Reina-Valera 1909):

* **Overt gendered pronouns** (:func:`overt_pronouns`): *él*, *ella*, the accented
  demonstratives *éste ése aquél* / *ésta ésa aquélla*; the clitics *lo* / *la* before a verb
  (:func:`is_verb_after_clitic`) and as enclitics (:func:`enclitic_gender`: *tomóla*,
  *hízolo*, *tomarla*, *diciéndolo*, *dióselo*). *le*/*les*/*se* (*díjole*) are not gendered
  and are no cue; plurals (*ellos*, *las*, *los*) are about *they*/*them* and are ignored.
* *la*/*lo* before a word is the **article** unless that word looks like a verb: it ends
  like a finite verb that no noun ends like (*-ó*, *-ron*, *-aba(n)*, *-rá(n)*, *-ré*,
  *-ste*, *-éis*, *-áis*, *-ís*, *-mos*), is an auxiliary (*ha, he, había* ...), or -- failing
  those -- the corpus shows it after a clitic (*me te se le les nos os*) and never after a
  determiner (``evidence``, from the TSVs the set is built from).

Gender cues (:func:`gender_cues`): the words of :data:`CUES_EN` in the reference and of
:data:`CUES_ES` in the source: gendered nouns (*woman*, *wife*, *king*; *mujer*, *rey*) and
the names of the test and dev books' people; *Zion* and *Jerusalem* count as feminine (the
cities are *she* in Lamentations). Agreement (*quedó sola*) is not detected.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

MASCULINE, FEMININE = "masculine", "feminine"
GENDERS = (MASCULINE, FEMININE)
PRONOUNS_EN: dict[str, str] = {
    **{w: MASCULINE for w in ("he", "him", "his", "himself")},
    **{w: FEMININE for w in ("she", "her", "hers", "herself")},
}
_FIXED_SWAP = {
    "he": "she",
    "she": "he",
    "him": "her",
    "himself": "herself",
    "herself": "himself",
    "hers": "his",
}
#: Words after which *her*/*his* is not a determiner: function words, common verbs after an
#: object (*let her go*), pronouns.
NOT_NOUN = frozenset(
    """a about above according after again against all also although am among an and any are
    as at away back be because been before behind being below beneath beside besides between
    but by can come comes could did do does down during else even ever for forth from go goes
    had has have he her here hers herself him himself his how i if in into is it its itself
    just know like may me might more much must my no nor not now of off on once only or our
    out over say says see shall she should sit so stand still such than that the thee their
    them then there these they this those thou through thus till to too under unto until up
    upon us very was we were what when where whether which while who whom whose why will with
    within without would ye yet you your""".split()
)
_WORD_EN = re.compile(r"[A-Za-z]+")
_WORD_ES = re.compile(r"[^\W\d_]+")


def _keep_case(original: str, new: str) -> str:
    if len(original) > 1 and original.isupper():
        return new.upper()
    return new[0].upper() + new[1:] if original[0].isupper() else new


def english_words(text: str) -> list[re.Match[str]]:
    return list(_WORD_EN.finditer(text))


def pronouns_en(text: str) -> list[tuple[str, str]]:
    """``(word lower-cased, gender)`` of every gendered pronoun of ``text``, in order."""
    words = (m.group().lower() for m in english_words(text))
    return [(w, PRONOUNS_EN[w]) for w in words if w in PRONOUNS_EN]


def starts_noun_phrase(text: str, end: int) -> bool:
    """Whether the text after position ``end`` (right after a *his*/*her*) starts a noun
    phrase: the next character is not punctuation and the next word is not in
    :data:`NOT_NOUN` and does not end in *-ly*. A possessive *’s* stays with its word."""
    rest = text[end:]
    follower = re.match(r"\s+([A-Za-z]+)", rest)
    if follower is None:
        return False
    word = follower.group(1).lower()
    return word not in NOT_NOUN and not word.endswith("ly")


def _rewrite(text: str, rule: Callable[[re.Match[str], str], str | None]) -> tuple[str, int]:
    out, last, changed = [], 0, 0
    for m in english_words(text):
        new = rule(m, text)
        if new is None:
            continue
        out.append(text[last : m.start()] + _keep_case(m.group(), new))
        last, changed = m.end(), changed + 1
    out.append(text[last:])
    return "".join(out), changed


def swap_gender(text: str, gender: str) -> tuple[str, int]:
    """``text`` with every pronoun of ``gender`` given the other gender (module docstring),
    and the number of words swapped."""

    def rule(m: re.Match[str], text: str) -> str | None:
        word = m.group().lower()
        if PRONOUNS_EN.get(word) != gender:
            return None
        if word in _FIXED_SWAP:
            return _FIXED_SWAP[word]
        noun = starts_noun_phrase(text, m.end())
        if word == "her" and re.search(r"\blet\s+$", text[: m.start()], re.IGNORECASE):
            noun = False  # "let her glean"
        if word == "his":
            return "her" if noun else "hers"
        return "his" if noun else "him"  # her

    return _rewrite(text, rule)


def possessives_en(text: str) -> list[tuple[str, str]]:
    """``(word, number)`` of the possessives of ``text``: *his*, *hers*, *her* before a
    noun phrase (singular); *their*, *theirs* (plural)."""
    found = []
    for m in english_words(text):
        word = m.group().lower()
        if word in ("his", "hers") or (word == "her" and starts_noun_phrase(text, m.end())):
            found.append((word, "singular"))
        elif word in ("their", "theirs"):
            found.append((word, "plural"))
    return found


def swap_number(text: str, number: str) -> tuple[str, int]:
    """``text`` with its possessives of ``number`` in the other number (module docstring)."""
    table = {"his": "their", "her": "their", "hers": "theirs", "their": "his", "theirs": "his"}

    def rule(m: re.Match[str], text: str) -> str | None:
        word = m.group().lower()
        if word == "her" and not starts_noun_phrase(text, m.end()):
            return None
        found = "plural" if word in ("their", "theirs") else "singular"
        return table[word] if word in table and found == number else None

    return _rewrite(text, rule)


# -------------------------------------------------------------------------------- Spanish

_OVERT_ES = {
    "él": MASCULINE,
    "ella": FEMININE,
    "éste": MASCULINE,
    "ése": MASCULINE,
    "aquél": MASCULINE,
    "ésta": FEMININE,
    "ésa": FEMININE,
    "aquélla": FEMININE,
}
_CLITIC_GENDER = {"lo": MASCULINE, "la": FEMININE}
#: Words ending like a verb with an enclitic that are not one.
_NOT_ENCLITIC = frozenset(
    "sólo solo parábola escándalo águila ídolo pábilo ángela perla ábila vándalo cántala".split()
)
_VERB_ENDINGS = tuple("ó ron aba aban rá rán ré ste steis éis áis ís mos".split())
_NOT_VERB = frozenset("peste hueste este oeste mió".split())
_AUXILIARIES = frozenset(
    """ha has han he hemos habéis había habían hubo hubiera hubieron habrá habrán hayas haya
    hayan tenía tenían""".split()
)
_CLITICS_ES = frozenset("me te se le les nos os".split())
_DETERMINERS_ES = frozenset(
    """el los las un una unos unas del al este esta estos estas ese esa aquel aquella mi tu
    su mis tus sus nuestra nuestro vuestra vuestro toda todo cada otra otro""".split()
)
_ACUTE = frozenset("áéíóú")


def spanish_words(text: str) -> list[str]:
    return [w.lower() for w in _WORD_ES.findall(text)]


def clitic_evidence(sources: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    """``(verbal, nominal)``: the words seen after a clitic and after a determiner."""
    verbal: set[str] = set()
    nominal: set[str] = set()
    for text in sources:
        words = spanish_words(text)
        for a, b in zip(words, words[1:], strict=False):
            if a in _CLITICS_ES:
                verbal.add(b)
            elif a in _DETERMINERS_ES:
                nominal.add(b)
    return frozenset(verbal), frozenset(nominal)


def is_verb_after_clitic(
    word: str, evidence: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
) -> bool:
    """Whether ``word`` (lower-case) after *la*/*lo* makes them a pronoun (module docstring)."""
    if word in _AUXILIARIES:
        return True
    if word.endswith(_VERB_ENDINGS) and word not in _NOT_VERB:
        return True
    verbal, nominal = evidence
    return word in verbal and word not in nominal


def enclitic_gender(word: str) -> str | None:
    """The gender of a singular *-la*/*-lo* enclitic on ``word`` (lower-case), or None: the
    stem (without the clitic) is an infinitive (*-ar/-er/-ir*), or carries a written accent
    and ends in a vowel, *n* or *s* (*tomó-la*, *hízo-lo*, *diciéndo-lo*, *lléven-lo*,
    *dínos-lo*), not in *-u* (*discípulo*, *título*) and not one of the listed nouns."""
    if len(word) < 5 or word[-2:] not in _CLITIC_GENDER or word in _NOT_ENCLITIC:
        return None
    stem = word[:-2]
    if stem.endswith("u"):
        return None
    infinitive = stem.endswith(("ar", "er", "ir"))
    accented = any(c in _ACUTE for c in stem) and stem[-1] in "aeioáéíóúns"
    return _CLITIC_GENDER[word[-2:]] if infinitive or accented else None


def overt_pronouns(
    text: str, evidence: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
) -> list[tuple[str, str]]:
    """``(word, gender)`` of the overt gendered third-person singular pronouns of a Spanish
    sentence (module docstring)."""
    words = spanish_words(text)
    found = []
    for i, word in enumerate(words):
        if word in _OVERT_ES:
            found.append((word, _OVERT_ES[word]))
        elif word in _CLITIC_GENDER:
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if nxt and is_verb_after_clitic(nxt, evidence):
                found.append((f"{word} {nxt}", _CLITIC_GENDER[word]))
        else:
            gender = enclitic_gender(word)
            if gender:
                found.append((word, gender))
    return found


# ----------------------------------------------------------------------------- gender cues

_NAMES_M = """jesus christ god lord yahweh messiah john peter simon andrew philip nathanael
nicodemus lazarus judas thomas pilate caiaphas annas malchus barabbas joseph moses abraham
jacob isaac isaiah elijah didymus cephas zebedee paul james barnabas titus job solomon david
boaz elimelech mahlon chilion obed jesse perez judah hezron ram amminadab nahshon salmon daniel
nebuchadnezzar belshazzar belteshazzar darius cyrus shadrach meshach abednego hananiah mishael
azariah ashpenaz arioch gabriel michael mordecai haman hegai hathach ahasuerus bigthan teresh
memucan harbonah hammedatha melchizedek aaron abel enoch noah esau gideon barak samson
jephthah samuel levi silvanus mark jonah""".split()
_NAMES_F = """naomi ruth orpah mary martha magdalene tamar rachel leah rahab sarah hagar esther
hadassah vashti zeresh zion jerusalem""".split()
_NOUNS_EN_M = """man husband father son brother king prince boy uncle nephew grandfather
kinsman bridegroom nobleman master sir""".split()
_NOUNS_EN_F = """woman wife mother daughter sister queen maid maiden virgin widow bride lady
mistress handmaid girl damsel prostitute harlot prophetess aunt niece grandmother concubine
moabitess""".split()
_NOUNS_ES_M = """varón hombre marido padre hijo hermano rey príncipe niño muchacho mozo suegro
señor dios jesús cristo""".split()
_NOUNS_ES_F = """mujer esposa madre hija hermana reina virgen viuda moza doncella señora sierva
criada ramera nuera suegra profetisa concubina niña muchacha moabita noemi ruth orpha maría
marta tamar rachêl lea rahab sara agar esther hadassa vasthi zeres sión jerusalem""".split()
#: Reference (English) cue words -> gender.
CUES_EN: dict[str, str] = {
    **{w: MASCULINE for w in _NAMES_M + _NOUNS_EN_M},
    **{w: FEMININE for w in _NAMES_F + _NOUNS_EN_F},
}
#: Source (Spanish) cue words -> gender.
CUES_ES: dict[str, str] = {
    **{w: MASCULINE for w in _NOUNS_ES_M},
    **{w: FEMININE for w in _NOUNS_ES_F},
}


def gender_cues(src: str | None, tgt: str, gender: str) -> list[str]:
    """The cue words of ``gender`` in the reference ``tgt`` (also in the source ``src``
    unless None); a possessive's *’s* is split off (*Naomi’s* → *naomi*)."""
    found = [w.lower() for w in _WORD_EN.findall(tgt) if CUES_EN.get(w.lower()) == gender]
    if src is not None:
        found += [w for w in spanish_words(src) if CUES_ES.get(w) == gender]
    return found


def names_gender(tgt: str, gender: str) -> bool:
    """Whether a reference sentence names ``gender``: one of its pronouns or cue words."""
    return any(g == gender for _, g in pronouns_en(tgt)) or bool(gender_cues(None, tgt, gender))
