"""The Markdown the reports are made of: tables, figures that may be missing ("n/a"), pass/fail
verdicts, and sections of a document that a script rewrites between its markers."""

import re

_SECTION = re.compile(r"^<!-- ([\w-]+):begin -->$.*?^<!-- \1:end -->$", re.MULTILINE | re.DOTALL)


def table(header, rows, align=None):
    """A Markdown table. `align`: one letter a column, "l" or "r"; by default the first column
    left, the others (numbers) right."""
    align = align or "l" + "r" * (len(header) - 1)
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def figure(value, spec):
    """`value` formatted with `spec`, or "n/a" when it is missing."""
    return "n/a" if value is None else format(value, spec)


def times(value):
    """A ratio as "1.234×", or "n/a"."""
    return "n/a" if value is None else f"{value:.3f}×"


def verdict(value, limit):
    """Whether a ratio meets a target (value ≤ limit), or "n/a"."""
    return "n/a" if value is None else ("pass" if value <= limit else "**fail**")


def write_section(path, name, lines):
    """Replaces the section between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in the document
    at `path` (appending it when absent); the rest of the document is left alone."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = "\n".join([begin, *lines, end])
    text = path.read_text() if path.exists() else "# Reliability\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def marked_sections(path):
    """The sections of the document at `path` that other scripts write between their markers
    (`write_section`), each as its lines, markers included, in the document's order: what a
    script that rewrites the whole document keeps."""
    if not path.exists():
        return []
    return [match.group(0).split("\n") for match in _SECTION.finditer(path.read_text())]
