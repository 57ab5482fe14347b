"""The table that ends ``bench.throughput --runs N``: every run, then the median and range of each column."""

from __future__ import annotations

from rich.console import Console

from bench.runs import RunSummary, runs_table


def rendered(runs: list[RunSummary]) -> list[list[str]]:
    console = Console(width=200, record=True)
    console.print(runs_table(runs))
    lines = console.export_text().splitlines()
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if line.startswith("│")]


def test_each_run_then_the_median_and_the_range_of_every_column() -> None:
    runs = [RunSummary(193.1, 850.0, 1100.0, 1300.4, 165.2, 8.44, 150_321.4, 27_800.4),
            RunSummary(191.0, 1500.0, 2000.0, 2700.0, 181.0, 9.5, 98_000.0, 26_100.0),
            RunSummary(194.2, 800.0, 950.0, 1089.0, 150.0, 7.7, 171_000.0, 28_000.0)]
    rows = rendered(runs)
    assert rows[0] == ["1", "193.1", "850", "1,100", "1,300", "165%", "8.4", "27,800", "150,321"]
    assert rows[3] == ["median", "193.1", "850", "1,100", "1,300", "165%", "8.4", "27,800", "150,321"]
    assert rows[4] == ["min to max", "191.0 to 194.2", "800 to 1,500", "950 to 2,000", "1,089 to 2,700",
                       "150% to 181%", "7.7 to 9.5", "26,100 to 28,000", "98,000 to 171,000"]


def test_no_run_gives_no_summary_rows() -> None:
    assert rendered([]) == []
