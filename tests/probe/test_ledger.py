"""`preclint probe --top N`: the layers with the largest shares, the totals, and what a share means."""
import json
import re

import pytest

from tests.probe.test_probe_cli import run


@pytest.mark.slow
def test_top_shows_the_largest_shares_first_and_the_totals(capsys, tiny):
    code, full, err = run(capsys, "probe", tiny, "--device", "cpu", "--precision", "bf16", "--output-format", "json",
                          "--ablate", "--exit-zero")
    assert code == 0, err
    rows = json.loads(full)["nodes"]
    shares = sorted(((row["modes"]["bf16"].get("contribution") or 0.0, row["node"]) for row in rows), reverse=True)
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--precision", "bf16", "--top", "2",
                         "--color", "never", "--exit-zero")
    assert code == 0, err
    table = out[out.index("Measured per layer under bf16: the 2 largest shares"):]
    body = [line for line in table.splitlines()[3:] if "│" in line]
    assert len(body) == 2
    shown = [float(re.search(r"(-?[\d.]+)%", line.split("│")[6]).group(1)) / 100 for line in body]
    assert shown == sorted(shown, reverse=True)
    assert shown[0] == pytest.approx(shares[0][0], abs=0.006)
    total = sum(share for share, _ in shares)
    assert f"the shares of all {len(rows)} nodes add up to" in table and "the 2 shown hold" in table
    assert f"{total * 100:.0f}%" in table or f"{total * 100:.1f}%" in table
    assert "A negative share is an error that partly cancels the others'" in out
    code, out, _ = run(capsys, "probe", tiny, "--device", "cpu", "--precision", "bf16", "--top", "2",
                       "--output-format", "json", "--exit-zero")
    doc = json.loads(out)
    assert doc["nodes_top"] == 2 and [row["node"] for row in doc["nodes"]] == [
        row["node"] for row in rows if row["node"] in {name for _, name in shares[:2]}]


@pytest.mark.slow
def test_a_negative_share_is_what_the_exact_one_node_run_measures(capsys, tiny):
    """Shares are signed on purpose: a layer whose error partly cancels the rest at the output has a
    negative share by the adjoint estimate and by the exact run that injects its error alone."""
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--precision", "tf32,fp16,bf16", "--ablate",
                         "--output-format", "json", "--exit-zero")
    assert code == 0, err
    pairs = [(m["contribution"], m["ablation"]["contribution"]) for row in json.loads(out)["nodes"]
             for m in row["modes"].values() if "ablation" in m and m.get("contribution")]
    assert pairs
    for adjoint, exact in pairs:
        if abs(exact) > 1e-3:
            assert (adjoint < 0) == (exact < 0), (adjoint, exact)


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_top_needs_a_positive_count(capsys, tiny, value):
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--top", value)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--top" in err
