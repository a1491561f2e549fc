"""Paired-seed statistics (SPEC.md "Trainer variants": improvement = mean over seeds of
(loss_B - loss_A), positive = A better, standard error with n - 1; Wang 2026 Tables 1 and 2),
checked on synthetic losses whose answers are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.stats.paired import fmt_pm, mean_se, paired_improvement, table1, table2

BASE = {0: 3.00, 1: 3.10, 2: 2.90}


def shifted(gains: dict[int, float]) -> dict[int, float]:
    """Losses that are ``gains`` below the baseline's, seed by seed."""
    return {s: BASE[s] - gains[s] for s in BASE}


def test_improvement_sign_mean_and_standard_error():
    losses = {"baseline": BASE, "sinklogit": shifted({0: 0.02, 1: 0.01, 2: 0.03})}
    better = paired_improvement(losses, "sinklogit", "baseline")
    assert better.mean == pytest.approx(0.02)  # positive: the sink logit has the lower loss
    assert better.se == pytest.approx(0.01 / math.sqrt(3))  # sd (n-1) of 0.02, 0.01, 0.03 is 0.01
    assert better.n == 3 and better.seeds == (0, 1, 2)
    worse = paired_improvement(losses, "baseline", "sinklogit")
    assert worse.mean == pytest.approx(-0.02) and worse.se == pytest.approx(better.se)


def test_pairing_removes_the_seed_effect():
    # the seeds differ by 0.2 nats, the variants by exactly 0.005 in every seed: se is 0, not seed noise
    losses = {"baseline": BASE, "normgate": shifted({0: 0.005, 1: 0.005, 2: 0.005})}
    result = paired_improvement(losses, "normgate", "baseline")
    assert result.mean == pytest.approx(0.005) and result.se == pytest.approx(0.0, abs=1e-12)


def test_only_shared_seeds_count_and_one_seed_has_no_error():
    losses = {"baseline": BASE, "projgate": {1: 3.05, 7: 1.0}}
    result = paired_improvement(losses, "projgate", "baseline")
    assert result.seeds == (1,) and result.mean == pytest.approx(0.05) and math.isnan(result.se)
    assert mean_se([]) == (pytest.approx(math.nan, nan_ok=True), pytest.approx(math.nan, nan_ok=True))


def test_frame_input_and_duplicates_refused():
    frame = pd.DataFrame({"variant": ["baseline"] * 3 + ["sinklogit"] * 3, "seed": [0, 1, 2] * 2,
                          "loss": list(BASE.values()) + [2.9, 3.0, 2.8]})
    assert paired_improvement(frame, "sinklogit", "baseline").mean == pytest.approx(0.1)
    with pytest.raises(SinkscopeError, match="two losses"):
        paired_improvement(pd.concat([frame, frame.iloc[:1]]), "sinklogit", "baseline")


def seed000_10m() -> dict:
    """Losses whose paired improvements are Wang 2026's 10M rows of Table 2 in every seed, plus noise
    that averages to zero over the three seeds (so the means are exact and the errors known)."""
    noise = {0: -0.001, 1: 0.0, 2: 0.001}
    gains = {"sinklogit": 0.0185, "normgate": 0.0037, "projgate": 0.0113, "sink+norm": 0.0177, "sink+proj": 0.0221}
    losses = {"baseline": BASE}
    for variant, gain in gains.items():
        losses[variant] = shifted({s: gain + (noise[s] if variant == "sink+proj" else 0.0) for s in BASE})
    return losses


def test_table1_blocks():
    t1 = table1(seed000_10m())
    over_base = t1[t1.block == "over baseline"].set_index("variant")
    assert list(over_base.index) == ["sinklogit", "normgate", "projgate", "sink+norm", "sink+proj"]
    assert over_base.loc["sinklogit", "improvement"] == pytest.approx(0.0185)
    assert over_base.loc["sink+proj", "se"] == pytest.approx(0.001 / math.sqrt(3))
    assert (over_base.reference == "baseline").all() and (over_base.n == 3).all()
    over_sink = t1[t1.block == "over sinklogit"].set_index("variant")
    assert list(over_sink.index) == ["sink+norm", "sink+proj"]  # the filtering increment
    assert over_sink.loc["sink+norm", "improvement"] == pytest.approx(0.0177 - 0.0185)
    assert over_sink.loc["sink+proj", "improvement"] == pytest.approx(0.0221 - 0.0185)


def test_table2_identities_and_seed000_row():
    t2 = table2(seed000_10m()).set_index("gate")
    proj = t2.loc["projection gate"]
    assert proj["sink"] == pytest.approx(0.0185) and proj["gate_alone"] == pytest.approx(0.0113)
    assert proj["both"] == pytest.approx(0.0221)
    assert proj["overlap"] == pytest.approx(0.0185 + 0.0113 - 0.0221)  # the seed prints 0.0076 (rounded inputs)
    assert proj["filter"] == pytest.approx(0.0036)
    assert round(100 * proj["share"]) == 16  # Wang 2026: 16%
    assert proj["filter_se"] == pytest.approx(0.001 / math.sqrt(3)) and proj["sink_se"] == pytest.approx(0.0, abs=1e-12)
    norm = t2.loc["norm gate"]
    assert norm["filter"] == pytest.approx(-0.0008) and round(100 * norm["share"]) == -5  # Wang 2026: -5%
    assert (t2.n == 3).all()


def test_table2_against_an_independent_computation():
    rng = np.random.default_rng(0)
    seeds = range(5)
    losses = {v: {s: 3.0 + rng.normal(0, 0.05) for s in seeds}
              for v in ("baseline", "sinklogit", "projgate", "sink+proj")}
    row = table2(losses).iloc[0]
    b = np.array([losses["baseline"][s] for s in seeds])
    sink, gate, both = (b - np.array([losses[v][s] for s in seeds]) for v in ("sinklogit", "projgate", "sink+proj"))
    overlap = sink + gate - both
    assert row["overlap"] == pytest.approx(overlap.mean())
    assert row["overlap_se"] == pytest.approx(overlap.std(ddof=1) / np.sqrt(5))
    assert row["share"] == pytest.approx((both - sink).mean() / both.mean())
    assert list(table2(losses).gate) == ["projection gate"]  # the norm gate's variants were not trained


def test_format():
    assert fmt_pm(0.01851, 0.0033) == "0.0185 ± 0.0033"
    assert fmt_pm(0.0185, math.nan) == "0.0185"
    assert fmt_pm(7.216e-05, 3.417e-05) == "0.000072 ± 0.000034"  # small effects keep two figures of their error


@pytest.mark.parametrize(("value", "se", "printed"), [
    (0.0348732, 2.02109e-05, "0.034873 ± 0.000020"),  # the newcomer's table cell (issue 61)
    (3.18234, 0.2149, "3.18 ± 0.21"),
    (0.5, 0.0999, "0.50 ± 0.10"),  # the se rounds up to 0.10: two significant digits, not three
    (1234.5, 567.0, "1230 ± 570"),  # an se above 10: the value rounds to tens
    (-0.00001, 0.0033, "0.0000 ± 0.0033"),  # no "-0.0000"
    (0.0348732, None, "0.03487"),  # no se: four significant digits
    (0.0348732, 0.0, "0.03487 ± 0"),  # a zero se is an se: every window agrees
    (0.0348732, math.inf, "0.03487"),
    (12345.6, math.nan, "12346"),  # never an exponent for a large value
    (None, 0.1, "–"),
    (math.nan, 0.1, "–"),
])
def test_a_value_is_rounded_where_its_standard_errors_second_digit_ends(value, se, printed):
    assert fmt_pm(value, se) == printed


def test_a_difference_is_signed_and_a_page_names_its_own_dash():
    assert fmt_pm(3.18234, 0.2149, sign=True) == "+3.18 ± 0.21"
    assert fmt_pm(-3.18234, 0.2149, sign=True) == "-3.18 ± 0.21"
    assert fmt_pm(0.5, None, sign=True) == "+0.5"
    assert fmt_pm(pd.NA, 0.1, missing="—") == "—"
