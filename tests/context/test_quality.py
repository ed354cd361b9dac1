"""The quality guard: sections, identifiers, the latest ask, retention proxies and ranking."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from context.identifiers import extract_identifiers
from context.quality import (
    REQUIRED_SECTIONS,
    QualityReport,
    audit_summary,
    find_sections,
    keywords,
    score_for_ranking,
    semantic_retention,
)
from context.types import Identifier

SOURCE = [
    "Please ship order ORD-1042 to the Berlin warehouse; the config is /etc/shipping/routes.conf.",
    "We decided to use carrier DHL because UPS lost parcels last month.",
    "Constraint: never ship hazardous batteries by air. Deploy to db.internal:5432 only.",
    "TODO: update the invoice template and email finance@example.com about the refund.",
    "Can you also migrate the warehouse inventory database before Friday?",
]
ASK = "Can you also migrate the warehouse inventory database before Friday?"
IDS = extract_identifiers(SOURCE)

GOOD = """Progress: order shipping set up, migration pending.

## Decisions
- Carrier DHL for ORD-1042 to the Berlin warehouse (UPS lost parcels).

## Open TODOs
- Update the invoice template; email finance@example.com about the refund.

## Constraints/Rules
- Never ship hazardous batteries by air; deploy to db.internal:5432 only.

## Pending user asks
- Migrate the warehouse inventory database before Friday.

## Exact identifiers
- `ORD-1042`
- `/etc/shipping/routes.conf`
- `db.internal:5432`
- `finance@example.com`
"""


def audit(summary: str, **kwargs: object) -> QualityReport:
    args: dict[str, object] = {
        "identifiers": IDS,
        "latest_ask": ASK,
        "source_texts": SOURCE,
        "tokens_before": 1000,
        "tokens_after": 200,
    }
    args.update(kwargs)
    return audit_summary(summary, **args)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- sections


def test_find_sections_with_varied_heading_styles() -> None:
    summary = """State: half done.
## decisions:
- a
##Open TODOs
- b
### detail stays in the body
#5429 is an issue reference, not a title
## **Constraints / Rules**
- c
```
## Pending user asks
(inside a code fence: not a heading)
```
## 4. pending user ask :
- d
## Exact Identifiers ##
- `x`
# Appendix
ignored
## Notes
- e
"""
    summary = summary.replace("/ Rules**", "/ Rules**  ")  # trailing spaces are tolerated
    sections = find_sections(summary)
    assert list(sections) == [*REQUIRED_SECTIONS, "## Notes"]
    assert sections["## Decisions"] == "- a"
    assert "### detail stays in the body" in sections["## Open TODOs"]
    assert "#5429" in sections["## Open TODOs"]
    assert "(inside a code fence" in sections["## Constraints/Rules"]
    assert sections["## Pending user asks"] == "- d"
    assert sections["## Exact identifiers"] == "- `x`"
    assert sections["## Notes"] == "- e"


def test_third_level_headings_do_not_count() -> None:
    assert find_sections("### Decisions\n- a") == {}


def test_duplicate_headings_are_joined() -> None:
    assert find_sections("## Decisions\n- a\n## Decisions\n- b") == {"## Decisions": "- a\n- b"}


# --------------------------------------------------------------------------- audit


def test_all_good_summary_passes() -> None:
    report = audit(GOOD)
    assert report.passed
    assert report.problems == []
    assert report.sections_present == list(REQUIRED_SECTIONS)
    assert report.sections_missing == []
    assert report.identifiers_total == len(IDS) == 4
    assert report.identifiers_missing == []
    assert report.identifier_retention == 1.0
    assert report.latest_ask_reflected
    assert report.compression_ratio == pytest.approx(0.2)
    assert report.tokens_saved == 800
    assert report.in_ideal_range
    assert report.secrets_in_summary == 0


def test_missing_section_is_a_problem() -> None:
    report = audit(GOOD.replace("## Open TODOs", "## Tasks"))
    assert not report.passed
    assert report.sections_missing == ["## Open TODOs"]
    assert report.problems == ["Missing section: ## Open TODOs"]


def test_missing_identifiers_are_a_problem_to_copy_exactly() -> None:
    summary = GOOD.replace("`ORD-1042`", "the order").replace("ORD-1042", "the order")
    summary = summary.replace("/etc/shipping/routes.conf", "the routes file")
    report = audit(summary)
    assert not report.passed
    assert report.identifiers_missing == ["ORD-1042", "/etc/shipping/routes.conf"]
    assert report.identifier_retention == pytest.approx(0.5)
    assert report.problems == [
        "Missing identifiers (copy exactly): `ORD-1042`, `/etc/shipping/routes.conf`"
    ]


def test_unreflected_ask_is_a_problem_quoting_the_ask() -> None:
    summary = GOOD.replace("- Migrate the warehouse inventory database before Friday.", "- none")
    summary = summary.replace("Berlin warehouse", "Berlin depot")
    report = audit(summary)
    assert not report.latest_ask_reflected
    assert report.problems == [f"The latest user ask is not reflected: '{ASK}'"]


def test_every_failure_at_once() -> None:
    report = audit("Nothing useful.")
    assert report.sections_missing == list(REQUIRED_SECTIONS)
    assert len(report.problems) == len(REQUIRED_SECTIONS) + 2
    assert report.identifier_retention == 0.0


def test_quoted_ask_is_redacted_and_clipped() -> None:
    ask = "rotate password=hunter2 " + "please " * 100
    report = audit(GOOD, latest_ask=ask)
    problem = report.problems[-1]
    assert "hunter2" not in problem
    assert "[REDACTED:password]" in problem
    assert len(problem) < 300


def test_raw_secret_identifier_is_never_shown() -> None:
    secret = Identifier("hunter2", "secret", True)
    marker = Identifier("[REDACTED:password]", "secret", True)
    report = audit(GOOD, identifiers=[secret, marker])
    assert report.identifiers_missing == ["[REDACTED:secret]", "[REDACTED:password]"]
    assert "hunter2" not in " ".join(report.problems)


def test_no_ask_and_no_identifiers() -> None:
    report = audit(GOOD, latest_ask=None, identifiers=[])
    assert report.latest_ask_reflected
    assert report.identifier_retention == 1.0
    assert report.passed


def test_short_ask_needs_one_shared_keyword() -> None:
    assert audit(GOOD, latest_ask="Friday?").latest_ask_reflected
    assert not audit(GOOD, latest_ask="Tuesday?").latest_ask_reflected
    assert audit(GOOD, latest_ask="ok").latest_ask_reflected  # no keywords: nothing to reflect


def test_cjk_ask_reflected_through_bigrams() -> None:
    ask = "请把订单ORD-1042的发货地址改成上海仓库"
    good = GOOD + "\n## Pending user asks\n- 订单 ORD-1042 的发货地址改为上海仓库\n"
    bad = GOOD.replace("ORD-1042", "x")
    assert audit(good, latest_ask=ask).latest_ask_reflected
    assert not audit(bad, latest_ask=ask).latest_ask_reflected
    assert {"订单", "上海", "仓库"} <= keywords(ask)


def test_compression_figures() -> None:
    report = audit(GOOD, tokens_before=1000, tokens_after=1200)
    assert report.compression_ratio == pytest.approx(1.2)
    assert report.tokens_saved == -200
    assert not report.in_ideal_range
    empty = audit(GOOD, tokens_before=0, tokens_after=10)
    assert empty.compression_ratio == 1.0
    assert not empty.in_ideal_range


def test_secrets_in_summary_are_counted() -> None:
    key = "gh" + "p_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY2zA4"
    assert audit(GOOD + f"\nkey {key}\n").secrets_in_summary == 1


def test_to_dict_is_json_ready_and_caller_fields_via_replace() -> None:
    report = replace(audit(GOOD), retries_used=2, fallback="extractive")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["retries_used"] == 2
    assert data["fallback"] == "extractive"
    assert data["passed"] is True
    assert data["compression_ratio"] == 0.2
    with pytest.raises(AttributeError):
        report.passed = False  # type: ignore[misc]


# --------------------------------------------------------------------------- retention, ranking


def test_semantic_retention_faithful_beats_unrelated() -> None:
    faithful = semantic_retention(GOOD, SOURCE)
    unrelated = semantic_retention(
        "## Decisions\n- The team discussed lunch options and the weather in Rome.", SOURCE
    )
    assert faithful > 0.5
    assert unrelated < 0.1
    assert faithful > unrelated
    assert semantic_retention("anything", []) == 1.0


def test_semantic_retention_handles_cjk() -> None:
    source = ["我们决定使用顺丰快递发货到上海仓库。", "下周一之前完成库存数据库迁移。"]
    assert semantic_retention(
        "决定用顺丰快递发货到上海仓库；下周一前完成库存数据库迁移。", source
    ) > (semantic_retention("今天天气很好。", source))


def test_ranking_picks_the_better_attempt() -> None:
    passed = audit(GOOD)
    missing_id = audit(GOOD.replace("ORD-1042", "the order"))
    missing_two = audit(GOOD.replace("ORD-1042", "x").replace("db.internal:5432", "db"))
    missing_section = audit(GOOD.replace("## Decisions", "## Choices"))
    attempts = [missing_two, missing_section, missing_id, passed]
    assert max(attempts, key=score_for_ranking) is passed
    assert max([missing_two, missing_id], key=score_for_ranking) is missing_id
    # fewer missing identifiers beat fewer missing sections
    assert score_for_ranking(missing_section) < score_for_ranking(passed)
    assert max([missing_two, missing_section], key=score_for_ranking) is missing_section


def test_ranking_prefers_higher_retention_among_equals() -> None:
    sparse = audit(GOOD, latest_ask=None, identifiers=[])
    richer = audit(
        GOOD + "\nWe decided last month; the config is unchanged.", latest_ask=None, identifiers=[]
    )
    assert richer.semantic_retention > sparse.semantic_retention
    assert max([sparse, richer], key=score_for_ranking) is richer
