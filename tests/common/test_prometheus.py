from firstfault.common.prometheus import family


def test_a_family_keeps_every_digit_and_escapes_label_values():
    assert family("x_seq", "gauge", "Highest seq.", 12345678901234) == [
        "# HELP x_seq Highest seq.", "# TYPE x_seq gauge", "x_seq 12345678901234"]
    lines = family("x_total", "counter", "By source.",
                   [("", {"source": 'a"b\\c\nd'}, 3), ("", {"source": "k"}, 0.5)])
    assert lines[2:] == ['x_total{source="a\\"b\\\\c\\nd"} 3', 'x_total{source="k"} 0.5']


def test_a_histogram_names_its_samples_by_suffix():
    lines = family("t_seconds", "histogram", "Time.",
                   [("_bucket", {"le": "0.1"}, 1), ("_bucket", {"le": "+Inf"}, 2),
                    ("_sum", {}, 0.25), ("_count", {}, 2)])
    assert lines[1:] == ["# TYPE t_seconds histogram", 't_seconds_bucket{le="0.1"} 1',
                         't_seconds_bucket{le="+Inf"} 2', "t_seconds_sum 0.25", "t_seconds_count 2"]
