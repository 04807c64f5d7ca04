"""CSV that a spreadsheet never runs as a formula (OWASP "CSV injection").

Every CSV gpuaas writes goes through SafeWriter or SafeDictWriter, which write with Python's csv
module: every text cell quoted (QUOTE_NONNUMERIC), rows ended by CRLF (RFC 4180). Each text cell is
neutralised first:

- every line-breaking character (\r, \n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029: what
  str.splitlines() splits on) becomes a space, so no reader, quoting-aware or not, starts a new row
  or cell inside it (`x\r=1+1` was a second line starting with a formula);
- a cell that starts, after any spaces, with =, +, -, @, a tab or a carriage return is prefixed with a
  single quote, so Excel, LibreOffice and Google Sheets show it as text (a pool named
  `=HYPERLINK(...)` stays a name).

Numbers the system produces are written as numbers, unquoted: a value of a numeric type, or a cell of
a column declared numeric whose text is a plain decimal (a credit of `-12.50` stays a number).

This module lives in billing, the only app that writes CSV today, and imports nothing of gpuaas,
so any app may import it without an upward dependency.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Every character str.splitlines() treats as a line boundary.
LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# A plain decimal as gpuaas writes numbers: optional minus, digits, optional fraction. No exponent,
# no plus sign, nothing after it, so "-1+2" or "-2e3" are text and get neutralised.
PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")
# What the writers pass to csv.writer: text quoted, numbers bare, RFC 4180 line endings.
CSV_FORMAT = {"quoting": csv.QUOTE_NONNUMERIC, "lineterminator": "\r\n"}


def neutralise(text: str) -> str:
    """`text` on one line, prefixed with a single quote when a spreadsheet would read it as a formula."""
    if text.startswith(FORMULA_STARTS):  # before the line breaks go: a leading CR is a formula start
        return "'" + LINE_BREAKS.sub(" ", text)
    text = LINE_BREAKS.sub(" ", text)
    return "'" + text if text.lstrip(" ").startswith(FORMULA_STARTS) else text


def safe_cell(value, *, numeric: bool = False) -> str | int | float | Decimal:
    """One cell: None is empty text, numbers stay numbers (written bare), text neutralised.

    `numeric` says the cell's column holds numbers the system wrote as text (e.g. Decimal
    rendered "-12.50"): such text becomes a number when it is a plain decimal, neutralised text otherwise.
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, Decimal):
        return Decimal(f"{value:f}")  # never an exponent ("1E+2") in the file
    if isinstance(value, int | float):
        return value
    text = str(value)
    if numeric and PLAIN_NUMBER.fullmatch(text):
        return Decimal(text)
    return neutralise(text)


class SafeWriter:
    """csv.writer whose rows go through safe_cell(); `numeric` holds the indexes of numeric columns."""

    def __init__(self, f, *, numeric: Iterable[int] = (), **kwargs):
        self._writer = csv.writer(f, **(kwargs | CSV_FORMAT))
        self.numeric = frozenset(numeric)

    def writerow(self, row: Iterable):
        return self._writer.writerow([safe_cell(v, numeric=i in self.numeric) for i, v in enumerate(row)])

    def writerows(self, rows: Iterable[Iterable]) -> None:
        for row in rows:
            self.writerow(row)


class SafeDictWriter(csv.DictWriter):
    """csv.DictWriter whose cells go through safe_cell(); `numeric` names the numeric columns.

    The header row is written as is (its names are the code's, not anyone's input).
    """

    def __init__(self, f, fieldnames, *, numeric: Iterable[str] = (), **kwargs):
        super().__init__(f, fieldnames, **(kwargs | CSV_FORMAT))
        self.numeric = frozenset(numeric)

    def writerow(self, rowdict: Mapping):
        return super().writerow({k: safe_cell(v, numeric=k in self.numeric) for k, v in rowdict.items()})

    def writerows(self, rowdicts: Iterable[Mapping]) -> None:
        for row in rowdicts:
            self.writerow(row)
