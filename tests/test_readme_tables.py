"""`make readme`: the README's generated tables are pasted between their comment lines, nothing else moves."""

import pytest

from analysis.readme import markers, pasted
from conftest import run_main
from infopro.errors import InfoProError


def page(claims: str, table2: str) -> str:
    (c0, c1), (t0, t1) = markers("claims"), markers("table2")
    return f"# Title\n\nintro\n\n{c0}\n\n{claims}\n\n{c1}\n\nbetween\n\n{t0}\n\n{table2}\n\n{t1}\n\nend\n"


def test_each_table_replaces_only_what_lies_between_its_lines():
    old = page("| a |\n|---|\n| 1 |", "| b |\n|---|\n| 2 |")
    new = pasted(old, {"claims": "| a |\n|---|\n| 3 |\n", "table2": "| b |\n|---|\n| 4 |"})
    assert new == page("| a |\n|---|\n| 3 |", "| b |\n|---|\n| 4 |")
    assert pasted(new, {"claims": "| a |\n|---|\n| 3 |", "table2": "| b |\n|---|\n| 4 |"}) == new


@pytest.mark.parametrize("broken", ["missing", "twice", "reversed"])
def test_a_page_without_its_lines_once_and_in_order_is_refused(broken):
    begin, end = markers("claims")
    text = {"missing": f"{begin}\n| a |\n", "twice": f"{begin}\n{end}\n{begin}\n{end}\n",
            "reversed": f"{end}\n| a |\n{begin}\n"}[broken]
    with pytest.raises(InfoProError, match="around the claims table, once each and in that order"):
        pasted(text, {"claims": "| a |"})


def test_the_command_pastes_the_built_tables_and_refuses_missing_ones_in_one_line(tmp_path):
    readme, tables = tmp_path / "README.md", tmp_path / "results" / "tables"
    readme.write_text(page("old", "old"))
    tables.mkdir(parents=True)
    (tables / "claims.md").write_text("| claims |\n")
    missing = run_main("analysis.readme", "--readme", str(readme), "--results", str(tmp_path / "results"))
    assert missing.returncode == 2 and "lacks table2.md: `make table2` builds them" in missing.stderr
    assert "Traceback" not in missing.stderr and readme.read_text() == page("old", "old")
    (tables / "table2.md").write_text("| table 2 |\n")
    made = run_main("analysis.readme", "--readme", str(readme), "--results", str(tmp_path / "results"))
    assert made.returncode == 0 and readme.read_text() == page("| claims |", "| table 2 |")
