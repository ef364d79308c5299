

def test_character_error_rate() -> None:
    from solutions.rag.evaluation import cer, edit_distance

    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3 and edit_distance("ab", "ab") == 0
    assert cer("the  pump\nfailed", "the pump failed") == 0.0  # whitespace normalised
    assert cer("abcd", "abxd") == 0.25
    assert cer("轴承 温度", "轴承温度", keep_spaces=False) == 0.0 and cer("轴承温度", "轴承湿度", keep_spaces=False) == 0.25
    assert cer("", "noise") == 5.0  # an empty reference counts as length 1


def test_lost_word_boundaries_counts_words_run_together() -> None:
    from solutions.rag.evaluation import lost_word_boundaries

    ref = "Clause 7 applies on 12 March\nto unit B-12"
    assert lost_word_boundaries(ref, ref) == (0, 8)
    assert lost_word_boundaries(ref, "Clause7 applies on12March\nto unit B-12") == (3, 8)
    assert lost_word_boundaries(ref, "Clause 7 applies on 12 March to unit B-12") == (0, 8)  # a line break is a boundary
    # a boundary next to a misread character is not judged: "7" read as "T" drops the two around it
    assert lost_word_boundaries("Clause 7 applies", "Clause T applies") == (0, 0)
    assert lost_word_boundaries("Clause 7 applies", "Clause 7applies") == (1, 2)
    assert lost_word_boundaries("", "") == (0, 0)
