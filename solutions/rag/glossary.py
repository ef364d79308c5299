"""A domain glossary per knowledge-base collection: terms with their synonyms and abbreviations.

A question that says 心梗 (or "MI") finds the passages that say 心肌梗死 ("myocardial
infarction") only when something tells retrieval the two are one concept. The glossary does:
each term found in a question adds the entry's other forms to the query that BM25 and the
embedder see (:meth:`Glossary.expand`), the answer reports which entries matched, and the
client-side jieba (extractive answers, the support check) learns every form as a word
(:func:`teach_jieba`).

Milvus's own BM25 analyzer (jieba, server side, fixed when a collection is created) does not
learn the glossary: Milvus Lite 2.5.1 refuses a jieba tokenizer with a user dictionary
(``{"tokenizer": {"type": "jieba", "dict": [...]}}``: "tokenizer name should be string", and every
insert then fails), so ingest analyses text as before. Expansion makes up for it: the added form
is cut by the same analyzer as the passages that use it. Milvus servers from 2.5.x document the
``dict`` option; passing the glossary to :func:`infra.milvus.ensure_collection` there is left to do.

One file per collection, ``<home>/rag/glossary/<collection>.yaml`` (or ``.csv``), written by
hand or uploaded through the API (``PUT /v1/kb/collections/{name}/glossary``). YAML::

    terms:
      - term: 心肌梗死
        synonyms: [心肌梗塞]
        abbreviations: [心梗, AMI]
      - term: non-disclosure agreement
        synonyms: [confidentiality agreement]
        abbreviations: [NDA]

CSV: a header ``term,synonyms,abbreviations``; several synonyms in one cell are separated
by ``|``. Any language. Matching: a form with a CJK character matches anywhere in the question;
a Latin form matches whole words only, case-insensitively, except an all-capital form (an
acronym: ``MI``, ``NDA``), which matches only in capitals. The longest form wins where two
overlap. A form shorter than two characters, or one that belongs to two entries, is refused:
it would expand questions it has nothing to do with.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.home import HomeLayout, home_layout

#: The file names a collection's glossary may have, in the order they are looked for.
SUFFIXES = (".yaml", ".yml", ".csv")
#: Fields of an entry.
FIELDS = ("term", "synonyms", "abbreviations")
#: Several forms in one CSV cell.
CSV_SEPARATOR = "|"
#: A glossary larger than this is refused (it is read on every question's first use).
MAX_BYTES = 2_000_000
_LATIN = "0-9A-Za-z\u00c0-\u024f"
_NOT_LATIN_BEFORE, _NOT_LATIN_AFTER = f"(?<![{_LATIN}])", f"(?![{_LATIN}])"
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


class GlossaryError(ValueError):
    """A glossary file that cannot be used; its message names the file and each bad line.

    Attributes:
        source: the file's name.
        problems: ``(line, what is wrong)`` pairs, 1-based lines (0: the file as a whole).
    """

    def __init__(self, source: str, problems: Sequence[tuple[int, str]]) -> None:
        self.source = source
        self.problems = list(problems)
        where = "; ".join(f"line {line}: {what}" if line else what for line, what in self.problems)
        super().__init__(f"glossary {source}: {where}")


class GlossaryMatch(BaseModel):
    """One glossary entry a question matched."""

    model_config = ConfigDict(frozen=True)

    term: str = Field(description="The entry's term.")
    matched: str = Field(description="The form found in the question.")
    added: list[str] = Field(default_factory=list, description="The entry's other forms added to the query.")


@dataclass(frozen=True)
class GlossaryEntry:
    """A term, its synonyms and abbreviations, and the line of the file it came from."""

    term: str
    synonyms: tuple[str, ...] = ()
    abbreviations: tuple[str, ...] = ()
    line: int = 0

    @property
    def forms(self) -> tuple[str, ...]:
        """Every form of the entry, the term first, without repeats."""
        return tuple(dict.fromkeys((self.term, *self.synonyms, *self.abbreviations)))


@dataclass(frozen=True)
class Expansion:
    """A question and the query retrieval uses for it.

    Attributes:
        question: the question as given.
        query: the question followed by the other forms of every entry it matched (the
            question itself when it matched none).
        matches: the entries matched, in the order they occur in the question.
    """

    question: str
    query: str
    matches: tuple[GlossaryMatch, ...] = ()


def _is_acronym(form: str) -> bool:
    return any(c.isupper() for c in form) and not any(c.islower() for c in form)


def _pattern(form: str) -> re.Pattern[str]:
    """The regular expression a form is found with (see the module's matching rules)."""
    if _CJK.search(form):
        return re.compile(re.escape(form), re.IGNORECASE)
    flags = 0 if _is_acronym(form) else re.IGNORECASE
    # a word boundary of Latin text: CJK characters count as \w in Python, and a Latin name sits
    # right against them in a Chinese question ("Manis javanica的天敌")
    return re.compile(_NOT_LATIN_BEFORE + re.escape(form) + _NOT_LATIN_AFTER, flags)


@dataclass(frozen=True)
class Glossary:
    """The entries of one collection's glossary (see the module docstring).

    Attributes:
        source: the file's name (reported with errors and matches).
        entries: the entries in file order.
    """

    source: str
    entries: tuple[GlossaryEntry, ...]

    def __post_init__(self) -> None:
        problems = check_entries(self.entries)
        if problems:
            raise GlossaryError(self.source, problems)
        compiled = [(form, _pattern(form), i) for i, e in enumerate(self.entries) for form in e.forms]
        compiled.sort(key=lambda item: -len(item[0]))  # the longest form first: it wins an overlap
        object.__setattr__(self, "_compiled", compiled)

    def matches(self, question: str) -> list[GlossaryMatch]:
        """The entries ``question`` mentions, in the order they occur (each entry once)."""
        taken: list[tuple[int, int]] = []
        found: dict[int, tuple[int, str]] = {}  # entry -> (first position, form)
        for form, pattern, index in self._compiled:  # type: ignore[attr-defined]
            for m in pattern.finditer(question):
                a, b = m.span()
                if any(a < y and x < b for x, y in taken):
                    continue
                taken.append((a, b))
                if index not in found or a < found[index][0]:
                    found[index] = (a, form)
        out = []
        for index, (_, form) in sorted(found.items(), key=lambda item: item[1][0]):
            entry = self.entries[index]
            present = {f.lower() for f in entry.forms if _pattern(f).search(question)}
            out.append(GlossaryMatch(term=entry.term, matched=form,
                                     added=[f for f in entry.forms if f.lower() not in present]))
        return out

    def expand(self, question: str) -> Expansion:
        """The question with the other forms of each entry it mentions appended (for BM25 and
        the embedder alike)."""
        found = self.matches(question)
        extra = [form for m in found for form in m.added]
        query = f"{question} {' '.join(extra)}" if extra else question
        return Expansion(question=question, query=query, matches=tuple(found))

    def words(self) -> list[str]:
        """Every form of every entry (a tokenizer's user dictionary)."""
        return [form for e in self.entries for form in e.forms]


def in_passage_words(expansion: Expansion, passages: Sequence[str]) -> str:
    """The question with each matched form replaced by the entry's first form that the
    ``passages`` use (unchanged where they use the question's own form or none of the entry's):
    the question in the documents' words, for the answer step (its support check and the
    sentences an extractive answer picks count the question's terms found in the passages)."""
    text = " ".join(passages).lower()
    question = expansion.question
    for match in expansion.matches:
        if match.matched.lower() in text:
            continue
        used = next((form for form in match.added if form.lower() in text), None)
        if used is not None:
            question = _pattern(match.matched).sub(lambda _m, u=used: u, question)
    return question


def expand(glossary: Glossary | None, question: str) -> Expansion:
    """:meth:`Glossary.expand`, or the question unchanged when there is no glossary."""
    return glossary.expand(question) if glossary is not None else Expansion(question=question, query=question)


def check_entries(entries: Iterable[GlossaryEntry]) -> list[tuple[int, str]]:
    """What is wrong with these entries: empty or one-character forms, or a form that belongs
    to two entries (named with both lines)."""
    problems: list[tuple[int, str]] = []
    owner: dict[str, GlossaryEntry] = {}
    for entry in entries:
        if not entry.term:
            problems.append((entry.line, "the entry has no 'term'"))
        for form in entry.forms:
            if len(form) < 2:
                problems.append((entry.line, (f"{form!r} is shorter than two characters: it would match inside "
                                 "unrelated words; write the longer form")))
                continue
            key = form.lower()
            first = owner.setdefault(key, entry)
            if first is not entry:
                problems.append((entry.line, (f"{form!r} is also a form of {first.term!r} (line {first.line}): "
                                 "one form can stand for one term only; merge the two entries or drop it from one")))
    return problems


# ------------------------------------------------------------------------------------
# reading


def _forms(value: object, where: str) -> tuple[tuple[str, ...], str | None]:
    """A field's forms (a string, a list of strings, or empty) or what is wrong with it."""
    if value is None:
        return (), None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) and not isinstance(v, bool)
                                              for v in value):
        return (), f"'{where}' must be a text or a list of texts"
    forms = tuple(" ".join(str(v).split()) for v in value)
    return tuple(f for f in forms if f), None


def _yaml_entries(text: str, source: str) -> tuple[list[GlossaryEntry], list[tuple[int, str]]]:
    """Entries of a YAML glossary (``terms:`` a list, or a bare list), with their lines, and the
    problems of the entries that could not be read."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise GlossaryError(source, [(line, f"not valid YAML ({getattr(exc, 'problem', None) or exc})")]) from None
    if root is None:
        return [], []
    items = root
    if isinstance(root, yaml.MappingNode):
        keys = {k.value: v for k, v in root.value if isinstance(k, yaml.ScalarNode)}
        if set(keys) != {"terms"}:
            raise GlossaryError(source, [(root.start_mark.line + 1, ("the file must hold 'terms:', a list of entries "
                                          f"(found keys: {', '.join(sorted(map(str, keys))) or 'none'})"))])
        items = keys["terms"]
    if not isinstance(items, yaml.SequenceNode):
        raise GlossaryError(source, [(items.start_mark.line + 1, ("'terms' must be a list of entries "
                                      "(- term: ..., synonyms: [...], abbreviations: [...])"))])
    entries, problems = [], []
    for node in items.value:
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode):
            problems.append((line, "an entry must be a mapping with 'term' (and 'synonyms', 'abbreviations')"))
            continue
        data = yaml.safe_load(yaml.serialize(node))
        unknown = sorted(set(map(str, data)) - set(FIELDS))
        if unknown:
            problems.append((line, f"unknown field(s) {', '.join(unknown)}: use {', '.join(FIELDS)}"))
            continue
        entry, wrong = _entry(data, line)
        problems += [(line, w) for w in wrong]
        if entry is not None:
            entries.append(entry)
    return entries, problems


def _entry(data: dict, line: int) -> tuple[GlossaryEntry | None, list[str]]:
    """An entry from its fields, or what is wrong with them."""
    term, bad_term = _forms(data.get("term"), "term")
    synonyms, bad_syn = _forms(data.get("synonyms"), "synonyms")
    abbreviations, bad_abbr = _forms(data.get("abbreviations"), "abbreviations")
    wrong = [w for w in (bad_term, bad_syn, bad_abbr) if w]
    if not wrong and len(term) != 1:
        wrong.append("'term' must be one text (put other forms under 'synonyms' or 'abbreviations')")
    if not wrong and not synonyms and not abbreviations:
        wrong.append(f"{term[0]!r} has no synonyms or abbreviations: nothing to expand it with")
    if wrong:
        return None, wrong
    return GlossaryEntry(term=term[0], synonyms=synonyms, abbreviations=abbreviations, line=line), []


def _csv_entries(text: str, source: str) -> tuple[list[GlossaryEntry], list[tuple[int, str]]]:
    """Entries of a CSV glossary (header ``term,synonyms,abbreviations``), with their lines, and
    the problems of the rows that could not be read."""
    reader = csv.reader(io.StringIO(text))
    rows = [(reader.line_num, row) for row in reader]
    if not rows:
        return [], []
    header = [h.strip().lower() for h in rows[0][1]]
    if "term" not in header or set(header) - set(FIELDS) or len(set(header)) != len(header):
        raise GlossaryError(source, [(rows[0][0], (f"the header must be {','.join(FIELDS)} (term required; found "
                                      f"{','.join(header) or 'nothing'})"))])
    entries, problems = [], []
    for line, row in rows[1:]:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            problems.append((line, f"{len(row)} cells for {len(header)} columns (quote a cell that holds a comma)"))
            continue
        data = {h: list(cell.split(CSV_SEPARATOR)) if h != "term" else cell for h, cell in zip(header, row)}
        entry, wrong = _entry(data, line)
        problems += [(line, w) for w in wrong]
        if entry is not None:
            entries.append(entry)
    return entries, problems


def parse_glossary(text: str, source: str, kind: str | None = None) -> Glossary:
    """A glossary from its text: ``kind`` ``yaml`` or ``csv`` (default: from ``source``'s suffix).

    Raises:
        GlossaryError: naming ``source``, the line and what is wrong, for every bad entry.
    """
    kind = kind or ("csv" if source.lower().endswith(".csv") else "yaml")
    if kind not in ("yaml", "csv"):
        raise GlossaryError(source, [(0, f"unknown format {kind!r}: yaml or csv")])
    text = text.lstrip("\ufeff")
    entries, problems = _csv_entries(text, source) if kind == "csv" else _yaml_entries(text, source)
    problems = sorted(problems + check_entries(entries), key=lambda p: p[0])
    if problems:
        raise GlossaryError(source, problems)
    return Glossary(source=source, entries=tuple(entries))


def load_glossary(path: Path) -> Glossary:
    """The glossary in ``path`` (YAML, or CSV by its ``.csv`` suffix).

    Raises:
        GlossaryError: the file is too large, not UTF-8, or has bad entries (file, line, what).
    """
    if path.stat().st_size > MAX_BYTES:
        raise GlossaryError(path.name, [(0, f"larger than {MAX_BYTES:,} bytes")])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GlossaryError(path.name, [(0, f"not UTF-8 text (byte {exc.start}); save it as UTF-8")]) from None
    return parse_glossary(text, path.name)


# ------------------------------------------------------------------------------------
# where a collection's glossary lives


def glossary_folder(layout: HomeLayout | None = None) -> Path:
    """The folder of the collections' glossaries (``<home>/rag/glossary``)."""
    return (layout or home_layout()).kb_glossaries()


def glossary_path(collection: str, layout: HomeLayout | None = None) -> Path | None:
    """The glossary file of ``collection``, or None when it has none."""
    folder = glossary_folder(layout)
    for suffix in SUFFIXES:
        path = folder / f"{collection}{suffix}"
        if path.is_file():
            return path
    return None


def save_glossary(collection: str, text: str, kind: str, layout: HomeLayout | None = None) -> Glossary:
    """Check ``text`` and make it ``collection``'s glossary (``<collection>.yaml`` or ``.csv``,
    replacing any other); readers never see a half-written file.

    Raises:
        GlossaryError: the text is too large or has bad entries; nothing is written then.
    """
    from infra.store import atomic_path

    if len(text.encode("utf-8")) > MAX_BYTES:
        raise GlossaryError(f"{collection}.{kind}", [(0, f"larger than {MAX_BYTES:,} bytes")])
    glossary = parse_glossary(text, f"{collection}.{kind}", kind)
    folder = glossary_folder(layout)
    target = folder / f"{collection}.{kind}"
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    for suffix in SUFFIXES:
        other = folder / f"{collection}{suffix}"
        if other != target and other.is_file():
            other.unlink()
    return glossary


class GlossaryCache:
    """Glossaries by file, re-read when the file changes (size or modification time); jieba
    learns each new one's forms."""

    def __init__(self) -> None:
        self._known: dict[Path, tuple[tuple[int, int], Glossary]] = {}

    def get(self, path: Path | None) -> Glossary | None:
        """The glossary in ``path`` (None: None). Raises :class:`GlossaryError` for a bad file."""
        if path is None:
            return None
        try:
            stat = path.stat()
        except FileNotFoundError:  # replaced by an upload in another format just now
            return None
        stamp = (stat.st_size, stat.st_mtime_ns)
        known = self._known.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        glossary = load_glossary(path)
        teach_jieba(glossary)
        self._known[path] = (stamp, glossary)
        return glossary


def collection_glossary(collection: str, layout: HomeLayout | None = None,
                        cache: GlossaryCache | None = None) -> Glossary | None:
    """The glossary of ``collection`` (None when it has none), jieba taught its forms."""
    return (cache or GlossaryCache()).get(glossary_path(collection, layout))


def teach_jieba(glossary: Glossary) -> None:
    """Add every form with a CJK character to jieba's dictionary (the one
    :func:`solutions.rag.text.query_terms` cuts with), so a term is one word, not its pieces."""
    import jieba

    for form in glossary.words():
        if _CJK.search(form):
            jieba.add_word(form)
