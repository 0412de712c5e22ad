"""README's family table is the registry's: a family added, or a pair ruled out, shows there or this fails."""

from __future__ import annotations

import re
from pathlib import Path

from maxckpt.families import FAMILIES, family_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_family_table_is_the_registrys():
    text = README.read_text()
    found = re.search(r"<!-- family-table:start -->\n(.*?)\n<!-- family-table:end -->", text, re.S)
    assert found, "README.md lost its family table markers"
    assert found.group(1) == family_table(), (
        "README's family table differs from the registry: paste "
        "`python -c 'from maxckpt.families import family_table; print(family_table())'` between the markers"
    )


def test_the_table_has_one_row_per_family_with_its_reasons():
    rows = family_table().splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == list(FAMILIES)
    gemma2 = next(r for r in rows if r.startswith("| gemma2 |"))
    assert "megatron: Megatron-Core's GPT model has no logit softcapping" in gemma2
