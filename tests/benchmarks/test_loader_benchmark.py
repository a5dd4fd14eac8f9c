"""benchmarks/loader.py: the reader's figures (--reader), and the loaders' and their stages', come out
and add up."""

from __future__ import annotations

import re

from benchmarks import loader as bench


def test_reader_mode_prints_crop_costs_and_rates_alone_and_beside_a_busy_thread(capsys):
    assert (
        bench.main(
            ["--reader", "--records", "64", "--reader-records", "96", "--batch-size", "32", "--repeats", "1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    old, new, ratio = re.search(
        r"crop draws: ([0-9.]+) us/sample .* ([0-9.]+) us/sample drawn per batch of 32; "
        r"ratio ([0-9.]+)x",
        out,
    ).groups()
    assert float(old) > 0 and float(new) > 0 and abs(float(old) / float(new) - float(ratio)) < 0.1
    rates = {}
    for way in ("a thread", "2 processes"):
        for what in ("alone", "beside a busy thread"):
            found = re.search(rf"reader in\s+{way}, \s*{what}:\s+([0-9,]+) records/s", out)
            rates[way, what] = float(found.group(1).replace(",", ""))
    assert all(rate > 0 for rate in rates.values())
    assert len(re.findall(r"the busy thread keeps \d+% of its speed", out)) == 2
    summary = re.search(
        r"beside a busy Python thread: in a thread ([0-9,]+) .* in 2 processes ([0-9,]+) .*"
        r"ratio processes / thread: ([0-9.]+)x",
        out,
    )
    thread, procs, ratio = (float(g.replace(",", "")) for g in summary.groups())
    assert (thread, procs) == (
        rates["a thread", "beside a busy thread"],
        rates["2 processes", "beside a busy thread"],
    )
    assert abs(procs / thread - ratio) < 0.06 * ratio + 0.05
    assert "goal >= 12,000 beside it" in out


def test_loader_mode_times_the_cpu_and_mixed_ways_against_the_fallback_and_each_stage(capsys):
    assert (
        bench.main(
            ["--records", "48", "--batch-size", "16", "--input-size", "32", "--repeats", "1", "--stages"]
        )
        == 0
    )
    out = capsys.readouterr().out
    for unit, name in (("images/s", "wall"), ("images per CPU-second", "cpu")):
        found = re.search(
            rf"median {unit}: DALI CPU ([0-9.]+), PyTorch fallback ([0-9.]+); ratio DALI / fallback "
            rf"\({name}\): ([0-9.]+)x; the mixed way on the CPU \(whole decodes, DALI's resize\) "
            r"([0-9.]+), ([0-9.]+)x \(the CPU pipeline gains ([0-9.]+)x\)",
            out,
        )
        window, fallback, ratio, full, full_ratio, gain = (float(g) for g in found.groups())
        assert min(window, fallback, full) > 0
        assert abs(window / fallback - ratio) < 0.01 + 0.005 * ratio
        assert abs(full / fallback - full_ratio) < 0.01 + 0.005 * full_ratio
        assert abs(window / full - gain) < 0.01 + 0.005 * gain
    stages = re.findall(r"^  (\S.*?)\s+DALI\s+([0-9.]+)(?:\s+PIL\s+([0-9.]+))?$", out, re.M)
    assert [label for label, _, _ in stages] == [
        "decode the whole image",
        "decode the crop's window only",
        "whole decode + crop, DALI's resize to 32",
        "window decode, torch's resize (the CPU loader)",
        "+ flip, normalise: the mixed way, on the CPU",
        "+ flip, normalise: the CPU loader",
    ]
    assert all(float(dali) > 0 for _, dali, _ in stages)
    assert [bool(pil) for _, _, pil in stages] == [True, False, True, False, True, False]
