from __future__ import annotations

import os
from pathlib import Path

from memory.agents_md import POST_COMPACTION_HEADER, AgentsFile, extract_sections, parse_sections

DOC = """# Agent

## session startup
- Read MEMORY.md.

### Red Lines
- Never delete data.

```markdown
## Red Lines
- not a real heading
```

## Other
- unrelated

## RED LINES
- a second, case-insensitive match is ignored (first wins)
"""


def test_sections_are_h2_h3_case_insensitive_and_fences_are_ignored() -> None:
    titles = [(s.level, s.title) for s in parse_sections(DOC)]
    assert (2, "session startup") in titles and (3, "Red Lines") in titles
    assert all(t != "- not a real heading" for _l, t in titles)
    out = extract_sections(DOC, ["Session Startup", "Red Lines"])
    assert out.startswith("## session startup\n- Read MEMORY.md.")
    assert "Never delete data." in out
    assert "not a real heading" in out  # the fence is body text of the Red Lines section
    assert "unrelated" not in out


def test_missing_sections_and_cap() -> None:
    assert extract_sections("# nothing here", ["Red Lines"]) == ""
    capped = extract_sections(DOC, ["Session Startup", "Red Lines"], max_chars=20)
    assert len(capped) <= 20 and capped.endswith("…")
    first = extract_sections(DOC, ["Red Lines"])
    assert "Never delete data." in first and "first wins" not in first


def test_agents_file_rereads_on_change(tmp_path: Path) -> None:
    path = tmp_path / "AGENTS.md"
    agents = AgentsFile(path)
    assert agents.red_lines() == "" and agents.refresh_block(["Red Lines"]) is None
    path.write_text("## Red Lines\n- one\n")
    assert "- one" in agents.red_lines()
    path.write_text("## Red Lines\n- two, longer\n")
    os.utime(path, ns=(1, 1))
    assert "- two" in agents.red_lines()
    block = agents.refresh_block(["Session Startup", "Red Lines"])
    assert block is not None and block.startswith(POST_COMPACTION_HEADER)
