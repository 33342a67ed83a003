"""ShapesWorld's caption grammar, both ways: the sentences the world writes (:func:`long_caption`,
:func:`short_caption`, :func:`raw_caption`) and the parser that reads them back into claims
(:func:`parse_shapes_caption`), built from the same templates and word lists, so a wording change reaches
both (tests/test_shapesworld_grammar.py round-trips every caption of the default world).

The claims are :class:`Mention` (an object: shape, optionally color and size) and :class:`Description`
(mentions, at most one relation between the first two, optionally the background); the exact rules
(:mod:`components.data.shapesworld_rules`) decide their truth in a scene and edit them. Pure Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
INVERSE_RELATION = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
RELATIONS = tuple(INVERSE_RELATION)
# Words with the same meaning as the world's own (which the training captions never use): the REPLACE
# hard positives swap them in, and the truth check reads them as the word they stand for.
SIZE_SYNONYMS = {"big": "large", "little": "small"}
RELATION_SYNONYMS = {"to the left of": "left of", "to the right of": "right of", "over": "above", "under": "below"}

# the long caption: one count sentence, one sentence per object, one per relation
COUNT_SENTENCES = (
    "A picture of {count} {noun} on a {background} background.",
    "An image showing {count} {noun} on a plain {background} background.",
    "This image contains {count} simple {noun} against a {background} background.",
)
OBJECT_PREFIXES = ("There is", "The image shows", "We can see")
RAW_SUFFIXES = ("stock photo", "clipart", "vector illustration", "icon set")


@dataclass(frozen=True)
class Mention:
    shape: str
    color: str | None = None
    size: str | None = None

    def words(self) -> str:
        return " ".join(w for w in (self.size, self.color, self.shape) if w)

    def matches(self, obj: dict[str, Any]) -> bool:
        return (obj["shape"] == self.shape and (self.color is None or obj["color"] == self.color)
                and (self.size is None or obj["size"] == SIZE_SYNONYMS.get(self.size, self.size)))


@dataclass(frozen=True)
class Description:
    """What a caption claims. ``relation`` relates mention 0 (subject) to mention 1 (object)."""

    mentions: tuple[Mention, ...]
    relation: str | None = None
    background: str | None = None
    form: str = "plain"  # plain: "A red circle left of ..."; there: "There is a red circle left of ..."

    def text(self) -> str:
        phrases = [f"a {m.words()}" for m in self.mentions]
        if self.relation is not None:
            head, rest = f"{phrases[0]} {self.relation} {phrases[1]}", phrases[2:]
        else:
            head, rest = phrases[0], phrases[1:]
        body = head + "".join(f", and {p}" if self.relation is not None else f" and {p}" for p in rest)
        if self.background is not None:
            body += f" on a {self.background} background"
        body = f"there is {body}" if self.form == "there" else body
        return body[0].upper() + body[1:] + "."

    def pairs(self) -> set[tuple[str, str]]:
        """The (color, shape) pairs it names (mentions without a color name none)."""
        return {(m.color, m.shape) for m in self.mentions if m.color is not None}


# --------------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------------


def object_phrase(mention: Mention) -> str:
    """An object's noun phrase, ``a large red circle``: its true concept (the manifest's ``object_phrases``)."""
    return f"a {mention.words()}"


def parse_object_phrase(text: str) -> Mention | None:
    """``a large red circle`` -> Mention(shape, color, size); None for text of another form."""
    m = re.fullmatch(_MENTION, text.strip())
    return Mention(shape=m[3], color=m[2], size=m[1]) if m else None


def count_sentence(template: int, count: int, background: str) -> str:
    """``COUNT_SENTENCES[template]`` for ``count`` objects on ``background``."""
    return COUNT_SENTENCES[template].format(count=NUMBER_WORDS[count], noun="shape" if count == 1 else "shapes", background=background)


def object_sentence(prefix: str, mention: Mention) -> str:
    """"There is a large red circle." (``prefix`` one of OBJECT_PREFIXES)."""
    return f"{prefix} a {mention.words()}."


def relation_sentence(subject: Mention, relation: str, obj: Mention) -> str:
    """"The red circle is left of the blue square." (definite references: sizes left out)."""
    return f"The {subject.color} {subject.shape} is {relation} the {obj.color} {obj.shape}."


def long_caption(count_template: int, background: str, objects: list[Mention], prefixes: list[str],
                 relations: list[tuple[int, str, int]]) -> str:
    """The ``long`` field: the count sentence, an object sentence per object (with ``prefixes[i]``), and a
    relation sentence per (subject index, relation, object index)."""
    sentences = [count_sentence(count_template, len(objects), background)]
    sentences += [object_sentence(prefix, m) for prefix, m in zip(prefixes, objects, strict=False)]
    sentences += [relation_sentence(objects[a], rel, objects[b]) for a, rel, b in relations]
    return " ".join(sentences)


def short_caption(objects: list[Mention], background: str, relation: str | None) -> str:
    """The ``short`` field: one object on its background, or the first two objects in ``relation`` and the
    others listed ("A large red circle left of a small blue square, and a large green cross.")."""
    if len(objects) == 1:
        return Description(tuple(objects), background=background).text()
    return Description(tuple(objects), relation=relation).text()


def raw_caption(style: int, objects: list[Mention], order: list[int] | None = None, suffix: str = "", number: int = 0) -> str:
    """The ``raw`` alt-text: 0, the objects' color and shape words in ``order`` (a shuffled bag of words, as
    scraped alt-text often is); 1, the first object and a stock-photo ``suffix``; 2, a camera file name."""
    if style == 0:
        words = [w for m in objects for w in (m.color, m.shape)]
        return " ".join(words[i] for i in order)
    if style == 1:
        return f"{objects[0].color} {objects[0].shape} {suffix}"
    return f"IMG_{number:04d}.jpg"


# --------------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------------

_RELATION_WORDS = "|".join(sorted({*RELATIONS, *RELATION_SYNONYMS}, key=len, reverse=True))
_OBJECT_SENTENCE = re.compile(rf"^({'|'.join(OBJECT_PREFIXES)}) a (\S+) (\S+) (\S+)\.$")
_RELATION_SENTENCE = re.compile(rf"^The (\S+) (\S+) is ({_RELATION_WORDS}) the (\S+) (\S+)\.$")
_MENTION = r"a ([^\s,.]+) ([^\s,.]+) ([^\s,.]+)"
_SHORT = re.compile(rf"^(?:There is )?{_MENTION}(?: ({_RELATION_WORDS}) {_MENTION})?((?:,? and {_MENTION})*)(?: on a ([^\s,.]+) background)?\.$", re.I)


@dataclass(frozen=True)
class Sentence:
    """One sentence of a ShapesWorld caption: ``text`` (kept verbatim: the count/background sentence),
    ``object`` (``prefix`` + "a size color shape"), ``relation`` (the first mention ``relation`` the second)
    or ``description`` (a short caption: a :class:`Description`)."""

    kind: str
    text: str = ""
    mentions: tuple[Mention, ...] = ()
    relation: str | None = None
    description: Description | None = None

    def render(self) -> str:
        if self.kind == "object":
            return object_sentence(self.text, self.mentions[0])
        if self.kind == "relation":
            return relation_sentence(self.mentions[0], self.relation, self.mentions[1])
        if self.kind == "description":
            return self.description.text()
        return self.text

    def claim(self) -> Description | None:
        if self.kind == "object":
            return Description(self.mentions)
        if self.kind == "relation":
            return Description(self.mentions, relation=self.relation)
        return self.description


@dataclass(frozen=True)
class ShapesCaption:
    """A ShapesWorld caption as sentences whose claims can be edited (and checked against a scene with
    :func:`components.data.shapesworld_rules.caption_holds`: the rules read this module, never the reverse)."""

    sentences: tuple[Sentence, ...]

    def text(self) -> str:
        return " ".join(s.render() for s in self.sentences)

    def claims(self) -> list[Description]:
        """What the caption claims (verbatim sentences claim nothing the rules check)."""
        return [c for c in (s.claim() for s in self.sentences) if c is not None]

    def pairs(self) -> list[tuple[str, str]]:
        """The (color, shape) pairs named, in order of first mention."""
        seen: list[tuple[str, str]] = []
        for s in self.sentences:
            mentions = s.description.mentions if s.kind == "description" else s.mentions
            for m in mentions:
                if m.color is not None and (m.color, m.shape) not in seen:
                    seen.append((m.color, m.shape))
        return seen

    def recolor(self, mapping: dict[tuple[str, str], tuple[str, str]]) -> ShapesCaption:
        """Every mention of a (color, shape) in ``mapping`` replaced by the mapped (color, shape)."""
        def edit(m: Mention) -> Mention:
            if m.color is None or (m.color, m.shape) not in mapping:
                return m
            color, shape = mapping[(m.color, m.shape)]
            return replace(m, color=color, shape=shape)

        out = []
        for s in self.sentences:
            if s.kind == "description":
                out.append(replace(s, description=replace(s.description, mentions=tuple(edit(m) for m in s.description.mentions))))
            else:
                out.append(replace(s, mentions=tuple(edit(m) for m in s.mentions)))
        return ShapesCaption(tuple(out))


def parse_shapes_caption(text: str) -> ShapesCaption | None:
    """The long caption's sentences (object and relation sentences structured, the rest verbatim), or a short
    caption as one description; None for text of another form (the raw alt-text)."""
    short = parse_description(text)
    if short is not None:
        return ShapesCaption((Sentence("description", description=short),))
    sentences = []
    for sentence in re.split(r"(?<=\.)\s+", text.strip()):
        if m := _OBJECT_SENTENCE.match(sentence):
            sentences.append(Sentence("object", text=m[1], mentions=(Mention(shape=m[4], color=m[3], size=m[2]),)))
        elif m := _RELATION_SENTENCE.match(sentence):
            mentions = (Mention(shape=m[2], color=m[1]), Mention(shape=m[5], color=m[4]))
            sentences.append(Sentence("relation", mentions=mentions, relation=m[3]))
        else:
            sentences.append(Sentence("text", text=sentence))
    if not any(s.kind != "text" for s in sentences):
        return None
    return ShapesCaption(tuple(sentences))


def parse_description(text: str) -> Description | None:
    """A short caption ("A large red circle above a small blue square, and a large green cross.")."""
    m = _SHORT.match(text.strip())
    if m is None:
        return None
    mentions = [Mention(shape=m[3], color=m[2], size=m[1].lower())]
    if m[4]:
        mentions.append(Mention(shape=m[7], color=m[6], size=m[5]))
    mentions += [Mention(shape=s, color=c, size=z) for z, c, s in re.findall(_MENTION, m[8] or "")]
    form = "there" if text.lower().startswith("there is") else "plain"
    return Description(tuple(mentions), relation=m[4], background=m[12], form=form)
