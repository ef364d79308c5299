

def test_character_error_rate() -> None:
    from solutions.rag.evaluation import cer, edit_distance

    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3 and edit_distance("ab", "ab") == 0
    assert cer("the  pump\nfailed", "the pump failed") == 0.0  # whitespace normalised
    assert cer("abcd", "abxd") == 0.25
    assert cer("轴承 温度", "轴承温度", keep_spaces=False) == 0.0 and cer("轴承温度", "轴承湿度", keep_spaces=False) == 0.25
    assert cer("", "noise") == 5.0  # an empty reference counts as length 1
