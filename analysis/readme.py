"""Paste the generated tables the README shows from results/tables/ into it (what `make readme` runs).

    python -m analysis.readme        # README.md's claims and Table 2, as `make claims table2` built them

The README shows two generated tables, the claims and Table 2, each between two comment lines that
name its file. This puts each file's text between its lines, so that the front page shows what
the results give after every lease that adds runs; `make check` fails on a README whose tables
differ from their files.
"""

from pathlib import Path

from infopro.cli import ArgumentParser, run
from infopro.errors import InfoProError
from infopro.records import atomic_write

TABLES = ("claims", "table2")


def markers(name: str) -> tuple[str, str]:
    """The comment lines around the table `name` in the README (GitHub does not show them)."""
    return (f"<!-- results/tables/{name}.md, pasted by `make readme` -->",
            f"<!-- end of results/tables/{name}.md -->")


def pasted(readme: str, tables: dict[str, str]) -> str:
    """`readme` with the text between each table's comment lines replaced by that table."""
    for name, table in tables.items():
        begin, end = markers(name)
        if readme.count(begin) != 1 or readme.count(end) != 1 or readme.index(begin) > readme.index(end):
            raise InfoProError(f"the README needs the lines {begin!r} and {end!r} around the {name} table, "
                               "once each and in that order")
        head, rest = readme.split(begin)
        tail = rest.split(end)[1]
        readme = f"{head}{begin}\n\n{table.strip()}\n\n{end}{tail}"  # blank lines: the table ends before the comment
    return readme


def read_tables(tables: Path) -> dict[str, str]:
    missing = [name for name in TABLES if not (tables / f"{name}.md").is_file()]
    if missing:
        raise InfoProError(f"{tables} lacks {', '.join(f'{name}.md' for name in missing)}: "
                           f"`make {' '.join(missing)}` builds them")
    return {name: (tables / f"{name}.md").read_text() for name in TABLES}


def main(argv=None):
    p = ArgumentParser(prog="python -m analysis.readme", description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", default="README.md", help="the page to paste into (default: README.md)")
    p.add_argument("--results", default="results", help="the results folder whose tables/ it reads")
    args = p.parse_args(argv)
    readme = Path(args.readme)
    if not readme.is_file():
        raise InfoProError(f"--readme {readme}: no such file")
    text = readme.read_text()
    new = pasted(text, read_tables(Path(args.results) / "tables"))
    if new == text:
        print(f"{readme}: its tables are those of {args.results}/tables already")
        return
    atomic_write(readme, new)
    print(f"{readme}: pasted {', '.join(f'{name}.md' for name in TABLES)}")


if __name__ == "__main__":
    run(main)
