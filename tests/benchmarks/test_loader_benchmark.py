"""benchmarks/loader.py --reader: the reader's figures, in a thread and in processes, come out and add up."""

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
    rates = {}
    for way in ("a thread", "2 processes"):
        for what in ("alone", "beside a busy thread"):
            found = re.search(rf"reader in\s+{way}, \s*{what}:\s+([0-9,]+) records/s", out)
            rates[way, what] = float(found.group(1).replace(",", ""))
    assert all(rate > 0 for rate in rates.values())
    assert len(re.findall(r"the busy thread keeps \d+% of its speed", out)) == 2
    summary = re.search(r"beside a busy Python thread: in a thread ([0-9,]+) .* in 2 processes ([0-9,]+) .*"
                        r"ratio processes / thread: ([0-9.]+)x", out)
    thread, procs, ratio = (float(g.replace(",", "")) for g in summary.groups())
    assert (thread, procs) == (rates["a thread", "beside a busy thread"], rates["2 processes", "beside a busy thread"])
    assert abs(procs / thread - ratio) < 0.06 * ratio + 0.05
    assert "goal >= 12,000 beside it" in out
