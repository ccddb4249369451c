"""PDF rendering for compliance documents (the training-content summary, the compliance pack).

Documents are written as a small subset of Markdown, which is also what the summary's hash is
taken of and what the Markdown export holds, so the PDF says the same words:

- ``# `` to ``#### `` headings; ``- `` bullets (two spaces of indent a level); ``| a | b |``
  table rows (a ``|---|`` rule line is skipped); blank lines; anything else is a paragraph.
  ``**bold**`` is kept as bold; backslash escapes (compliance.services.markdown) are resolved.

Nothing else is markup here: text is written as text (fpdf2's own Markdown, which would make a
link of ``[x](javascript:…)``, is never switched on).

fpdf2 is pure Python; DejaVu Sans (bundled in compliance/fonts, free licence alongside) covers the
characters the core PDF fonts lack (en dashes, arrows, ≥, accented names).
"""

from __future__ import annotations

from pathlib import Path

from fpdf import FPDF
from fpdf.enums import XPos, YPos

from compliance.services import markdown

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


def _runs(pdf: _Document, text: str, *, indent: float, bullet: bool) -> None:
    """One bullet or paragraph: its bold and plain runs written as flowing text, wrapped at the
    right margin back to ``indent``."""
    margin = pdf.l_margin
    pdf.set_left_margin(margin + indent)
    pdf.set_x(margin + indent)
    if bullet:
        pdf.set_font(FAMILY, "", 9.5)
        pdf.write(5, "• ")
    for run, bold in markdown.spans(text):
        pdf.set_font(FAMILY, "B" if bold else "", 9.5)
        pdf.write(5, run)
    pdf.ln(5)
    pdf.set_left_margin(margin)
    pdf.set_x(margin)


def render_pdf(markdown_text: str, *, title: str, footer: str = "") -> bytes:
    """The Markdown subset above as an A4 PDF; ``footer`` goes on every page (e.g. the hash)."""
    pdf = _Document(title, footer or title)
    pdf.alias_nb_pages()
    pdf.add_page()
    width = pdf.w - pdf.l_margin - pdf.r_margin
    table_header = True
    for raw in markdown_text.splitlines():
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
            text = markdown.unescape(line[level:].strip())
            pdf.multi_cell(width, size * 0.5, text, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
            pdf.ln(1)
        elif line.startswith("|"):
            cells = markdown.cells(line)
            if markdown.is_rule(cells):
                continue  # the header rule of a Markdown table
            _table_row(pdf, [markdown.unescape(c) for c in cells], table_header)
            table_header = False
        elif line.lstrip().startswith("- "):
            level = (len(line) - len(line.lstrip())) // 2
            _runs(pdf, line.lstrip()[2:], indent=4 + 4 * level, bullet=True)
        else:
            _runs(pdf, line, indent=0, bullet=False)
    return bytes(pdf.output())
