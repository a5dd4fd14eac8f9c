"""benchmarks/loader.py --reader: the reader's figures beside a busy thread come out and add up."""

from __future__ import annotations

import re

from benchmarks import loader as bench


def test_reader_mode_prints_crop_costs_and_rates_alone_and_beside_a_busy_thread(capsys):
    assert bench.main(["--reader", "--records", "64", "--reader-records", "96", "--batch-size", "32",
                       "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    old, new, ratio = re.search(r"crop draws: ([0-9.]+) us/sample .* ([0-9.]+) us/sample drawn per batch of 32; "
                                r"ratio ([0-9.]+)x", out).groups()
    assert float(old) > 0 and float(new) > 0 and abs(float(old) / float(new) - float(ratio)) < 0.1
    alone, busy = (float(re.search(rf"reader\s+{what}:\s+([0-9,]+) records/s", out).group(1).replace(",", ""))
                   for what in ("alone", "beside a busy thread"))
    assert alone > 0 and busy > 0
    assert re.search(r"the busy thread keeps \d+% of its speed", out)
    assert "median records/s: alone" in out and "goal >= 12,000 beside it" in out
