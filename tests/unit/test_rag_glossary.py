"""The glossary of a knowledge-base collection: reading (YAML, CSV), validation with file and
line, matching rules and query expansion."""

from __future__ import annotations

import pytest

from infra.home import HomeLayout
from solutions.rag.glossary import (
    GlossaryCache,
    GlossaryError,
    collection_glossary,
    expand,
    glossary_path,
    in_passage_words,
    parse_glossary,
    save_glossary,
)
from solutions.rag.text import query_terms

MEDICAL = """\
# the medical collection's terms
terms:
  - term: 心肌梗死
    synonyms: [心肌梗塞]
    abbreviations: [心梗, AMI]
  - term: myocardial infarction
    synonyms: heart attack
    abbreviations: [MI]
  - term: non-disclosure agreement
    abbreviations: [NDA]
"""


def medical():
    return parse_glossary(MEDICAL, "medical.yaml")


def test_yaml_entries_keep_their_lines_and_forms() -> None:
    g = medical()
    assert [(e.term, e.line) for e in g.entries] == [("心肌梗死", 3), ("myocardial infarction", 6),
                                                     ("non-disclosure agreement", 9)]
    assert g.entries[0].forms == ("心肌梗死", "心肌梗塞", "心梗", "AMI")
    assert g.entries[1].synonyms == ("heart attack",)  # a single text is a list of one


def test_csv_is_read_like_yaml() -> None:
    g = parse_glossary("term,synonyms,abbreviations\n心肌梗死,心肌梗塞,心梗|AMI\n\nnon-disclosure agreement,,NDA\n",
                       "medical.csv")
    assert [e.forms for e in g.entries] == [("心肌梗死", "心肌梗塞", "心梗", "AMI"), ("non-disclosure agreement", "NDA")]
    assert [e.line for e in g.entries] == [2, 4]


def test_an_abbreviation_in_a_chinese_question_adds_the_other_forms() -> None:
    e = medical().expand("心梗的典型症状是什么？")
    assert e.query == "心梗的典型症状是什么？ 心肌梗死 心肌梗塞 AMI"
    assert [(m.term, m.matched, m.added) for m in e.matches] == [("心肌梗死", "心梗", ["心肌梗死", "心肌梗塞", "AMI"])]


def test_latin_forms_match_whole_words_and_acronyms_only_in_capitals() -> None:
    g = medical()
    assert [m.term for m in g.matches("Can a Heart Attack follow an NDA?")] == ["myocardial infarction",
                                                                                "non-disclosure agreement"]
    assert g.matches("the admin said mi casa") == []  # 'MI' is an acronym: capitals only
    assert g.matches("AMIGO and NDAs") == []  # whole words only
    assert medical().expand("What is an MI?").query == "What is an MI? myocardial infarction heart attack"
    # a Latin form right against Chinese text is a whole word (CJK characters are \w to Python)
    assert [m.matched for m in g.matches("NDA的期限是多久？heart attack是什么")] == ["NDA", "heart attack"]


def test_forms_already_in_the_question_are_not_added_again() -> None:
    e = medical().expand("heart attack (MI) treatment")
    assert e.matches[0].added == ["myocardial infarction"]
    assert e.query == "heart attack (MI) treatment myocardial infarction"


def test_the_longest_form_wins_an_overlap() -> None:
    g = parse_glossary("terms:\n  - term: 北京大学\n    abbreviations: [北大]\n  - term: 北京\n    synonyms: [燕京]\n",
                       "x.yaml")
    assert [m.term for m in g.matches("北京大学在哪里")] == ["北京大学"]
    assert [m.term for m in g.matches("北京大学和北京")] == ["北京大学", "北京"]


def test_the_answer_step_reads_the_question_in_the_passages_words() -> None:
    e = medical().expand("心梗和MI有何不同？")
    assert in_passage_words(e, ["急性心肌梗塞是……", "Myocardial infarction is ..."]) == "心肌梗塞和myocardial infarction有何不同？"
    assert in_passage_words(e, ["心梗与心肌梗死"]) == "心梗和MI有何不同？"  # the passage uses the question's form
    assert in_passage_words(e, ["天气"]) == "心梗和MI有何不同？"


def test_no_glossary_or_no_match_leaves_the_question() -> None:
    assert expand(None, "心梗").query == "心梗"
    assert medical().expand("天气如何").query == "天气如何"


@pytest.mark.parametrize(("text", "line", "words"), [
    ("terms:\n  - term: 心\n    synonyms: [心脏]\n", 2, "shorter than two characters"),
    ("terms:\n  - term: heart\n    synonym: [cardiac]\n", 2, "unknown field(s) synonym"),
    ("terms:\n  - term: heart\n", 2, "no synonyms or abbreviations"),
    ("terms:\n  - term: [a1, b2]\n    synonyms: [c3]\n", 2, "'term' must be one text"),
    ("terms:\n  - term: ab\n    synonyms: {x: 1}\n", 2, "'synonyms' must be a text or a list"),
    (("terms:\n  - term: heart attack\n    synonyms: [MI]\n  - term: mitral insufficiency\n"
     "    abbreviations: [mi]\n"), 4, "'mi' is also a form of 'heart attack' (line 2)"),
    ("terms:\n  - just a string\n", 2, "an entry must be a mapping"),
    ("terms: [\n", 2, "not valid YAML"),
    ("glossary:\n  - term: a\n", 1, "must hold 'terms:'"),
])
def test_bad_yaml_names_the_file_the_line_and_the_fault(text: str, line: int, words: str) -> None:
    with pytest.raises(GlossaryError) as err:
        parse_glossary(text, "medical.yaml")
    assert err.value.source == "medical.yaml"
    assert any(ln == line and words in what for ln, what in err.value.problems), err.value.problems
    assert str(err.value).startswith(f"glossary medical.yaml: line {line}: ")


def test_every_bad_entry_is_reported_at_once() -> None:
    text = "terms:\n  - term: x\n    synonyms: [xx]\n  - term: ok\n    synonyms: [fine]\n  - term: lonely\n"
    with pytest.raises(GlossaryError) as err:
        parse_glossary(text, "g.yaml")
    assert [line for line, _ in err.value.problems] == [2, 6]


@pytest.mark.parametrize(("text", "line", "words"), [
    ("word,meaning\nheart,cardiac\n", 1, "the header must be term,synonyms,abbreviations"),
    ("term,synonyms\nheart attack,\"MI, AMI\",extra\n", 2, "3 cells for 2 columns"),
    ("term,synonyms\nheart attack,\n", 2, "no synonyms or abbreviations"),
])
def test_bad_csv_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(GlossaryError) as err:
        parse_glossary(text, "legal.csv")
    assert err.value.problems[0][0] == line and words in err.value.problems[0][1], err.value.problems


def test_saved_glossary_replaces_the_other_format_and_a_bad_one_writes_nothing(tmp_path) -> None:
    layout = HomeLayout(tmp_path)
    save_glossary("medical", "term,abbreviations\nnon-disclosure agreement,NDA\n", "csv", layout)
    assert glossary_path("medical", layout).name == "medical.csv"
    save_glossary("medical", MEDICAL, "yaml", layout)
    assert glossary_path("medical", layout).name == "medical.yaml"
    assert not (layout.kb_glossaries() / "medical.csv").exists()
    with pytest.raises(GlossaryError):
        save_glossary("medical", "terms:\n  - term: x\n", "yaml", layout)
    assert glossary_path("medical", layout).read_text(encoding="utf-8") == MEDICAL
    assert glossary_path("legal", layout) is None and collection_glossary("legal", layout) is None


def test_cache_rereads_a_changed_file_and_teaches_jieba(tmp_path) -> None:
    layout = HomeLayout(tmp_path)
    cache = GlossaryCache()
    path = layout.kb_glossaries() / "medical.yaml"
    path.write_text(MEDICAL, encoding="utf-8")
    first = cache.get(path)
    assert cache.get(path) is first
    path.write_text(MEDICAL + "  - term: 急性冠脉综合征\n    abbreviations: [ACS]\n", encoding="utf-8")
    assert len(cache.get(path).entries) == 4
    assert "急性冠脉综合征" in query_terms("急性冠脉综合征怎么治")  # one word now, not its pieces
