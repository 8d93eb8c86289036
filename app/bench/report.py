"""What every bench hands back: one markdown table (printed and written), the same rows as JSON, and a PNG plot.

    write_report(out_dir, "peers", title, columns, rows, draw=..., extra={...})
        -> OUT/peers.md, OUT/peers.json, OUT/peers.png

Columns are (key, header, format) triples over row dicts of raw values, so the JSON keeps the numbers and the
table shows them rounded. Plots are drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

Column = tuple[str, str, str]
"""(row key, header, format spec such as '.2f'; '' for str())."""


def format_cell(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def markdown_table(columns: Sequence[Column], rows: Sequence[dict]) -> str:
    """A GitHub markdown table: header, separator (numbers right-aligned), one line per row."""
    cells = [[format_cell(row.get(key), spec) for key, _, spec in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(key), (int, float)) or row.get(key) is None for row in rows) and bool(rows)
        for key, _, _ in columns
    ]
    lines = [
        "| " + " | ".join(header for _, header, _ in columns) + " |",
        "|" + "|".join("---:" if right else "---" for right in numeric) + "|",
    ]
    lines += ["| " + " | ".join(line) + " |" for line in cells]
    return "\n".join(lines) + "\n"


def slowest_rank_median(per_rank: Sequence[Sequence[float]]) -> float:
    """Each rank's timings of the same steps: the median over steps of the slowest rank's time."""
    return statistics.median(max(step) for step in zip(*per_rank, strict=False))


def median_spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of a non-empty sample."""
    return statistics.median(values), min(values), max(values)


def write_report(
    out_dir: str | Path,
    name: str,
    title: str,
    columns: Sequence[Column],
    rows: Sequence[dict],
    draw: Callable | None = None,
    extra: dict | None = None,
    notes: Sequence[str] = (),
) -> dict:
    """Writes NAME.md, NAME.json and NAME.png under out_dir, prints the markdown, returns the paths.

    draw(figure) fills a matplotlib figure; without it the PNG is a plain rendering of the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    markdown = f"### {title}\n\n" + markdown_table(columns, rows)
    if notes:
        markdown += "\n" + "\n".join(notes) + "\n"
    paths = {"md": out / f"{name}.md", "json": out / f"{name}.json", "png": out / f"{name}.png"}
    paths["md"].write_text(markdown)
    paths["json"].write_text(
        json.dumps({"bench": name, "title": title, **(extra or {}), "rows": list(rows)}, indent=2) + "\n"
    )
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure = pyplot.figure(figsize=(8, 4.5), dpi=100)
    if draw is not None:
        draw(figure)
    else:
        axes = figure.add_subplot()
        axes.axis("off")
        axes.table(
            cellText=[[format_cell(r.get(k), s) for k, _, s in columns] for r in rows],
            colLabels=[h for _, h, _ in columns],
            loc="center",
        )
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(paths["png"])
    pyplot.close(figure)
    print(markdown, flush=True)
    return paths
