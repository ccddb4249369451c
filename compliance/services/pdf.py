"""PDF rendering for compliance documents (the training-content summary, the compliance pack).

Documents are written as a small subset of Markdown, which is also what the summary's hash is
taken of and what the Markdown export holds, so the PDF says the same words:

- ``# ``, ``## ``, ``### `` headings; ``- `` bullets; ``| a | b |`` table rows (a ``|---|`` rule
  line is skipped); blank lines; anything else is a paragraph. ``**bold**`` is kept as bold.

fpdf2 is pure Python; DejaVu Sans (bundled in compliance/fonts, free licence alongside) covers the
characters the core PDF fonts lack (en dashes, arrows, ≥, accented names).
"""

from __future__ import annotations

from pathlib import Path

from fpdf import FPDF
from fpdf.enums import XPos, YPos

FONTS = Path(__file__).resolve().parent.parent / "fonts"
FAMILY = "DejaVu"


class _Document(FPDF):
    def __init__(self, title: str, footer: str) -> None:
        super().__init__(format="A4")
        self.doc_title = title
        self.doc_footer = footer
        self.add_font(FAMILY, "", str(FONTS / "DejaVuSans.ttf"))
        self.add_font(FAMILY, "B", str(FONTS / "DejaVuSans-Bold.ttf"))
        self.set_auto_page_break(auto=True, margin=18)
        self.set_title(title)
        self.set_creator("Goodput")

    def footer(self) -> None:
        self.set_y(-12)
        self.set_font(FAMILY, "", 7)
        self.set_text_color(110)
        self.cell(0, 5, f"{self.doc_footer}    page {self.page_no()}/{{nb}}", align="C")
        self.set_text_color(0)


def _table_row(pdf: _Document, cells: list[str], header: bool) -> None:
    width = (pdf.w - pdf.l_margin - pdf.r_margin) / max(1, len(cells))
    pdf.set_font(FAMILY, "B" if header else "", 8)
    heights = [pdf.multi_cell(width, 4.5, c, dry_run=True, output="LINES") for c in cells]
    rows = max(len(h) for h in heights) if heights else 1
    if pdf.get_y() + rows * 4.5 > pdf.page_break_trigger:
        pdf.add_page()
    y = pdf.get_y()
    for i, c in enumerate(cells):
        pdf.set_xy(pdf.l_margin + i * width, y)
        pdf.multi_cell(width, 4.5, c, border=1, max_line_height=4.5, new_x=XPos.RIGHT, new_y=YPos.TOP)
    pdf.set_xy(pdf.l_margin, y + rows * 4.5)


def render_pdf(markdown: str, *, title: str, footer: str = "") -> bytes:
    """The Markdown subset above as an A4 PDF; ``footer`` goes on every page (e.g. the hash)."""
    pdf = _Document(title, footer or title)
    pdf.alias_nb_pages()
    pdf.add_page()
    width = pdf.w - pdf.l_margin - pdf.r_margin
    table_header = True
    for raw in markdown.splitlines():
        line = raw.rstrip()
        if not line.startswith("|"):
            table_header = True
        if not line:
            pdf.ln(2.5)
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            size = {1: 16, 2: 13, 3: 11}.get(level, 10)
            pdf.ln(2 if level > 1 else 0)
            pdf.set_font(FAMILY, "B", size)
            pdf.multi_cell(width, size * 0.5, line[level:].strip(), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
            pdf.ln(1)
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-: ") for c in cells):
                continue  # the header rule of a Markdown table
            _table_row(pdf, cells, table_header)
            table_header = False
        elif line.lstrip().startswith("- "):
            indent = (len(line) - len(line.lstrip())) // 2
            pdf.set_font(FAMILY, "", 9.5)
            pdf.set_x(pdf.l_margin + 4 + 4 * indent)
            pdf.multi_cell(
                width - 4 - 4 * indent,
                5,
                "• " + line.lstrip()[2:],
                markdown=True,
                new_x=XPos.LMARGIN,
                new_y=YPos.NEXT,
            )
        else:
            pdf.set_font(FAMILY, "", 9.5)
            pdf.multi_cell(width, 5, line, markdown=True, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    return bytes(pdf.output())
