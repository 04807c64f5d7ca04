"""CSV cells that a spreadsheet never runs as formulas (OWASP "CSV injection").

Every CSV gpuaas writes goes through SafeWriter or SafeDictWriter. A text cell that starts with
=, +, -, @, a tab or a carriage return is prefixed with a single quote, so Excel, LibreOffice and
Google Sheets show it as text instead of evaluating it (a pool named `=HYPERLINK(...)` stays a
name). Numbers the system produces are left alone: a value of a numeric type, or a cell of a
column declared numeric whose text is a plain decimal (a credit of `-12.50` stays a number).

This module lives in billing, the only app that writes CSV today, and imports nothing of gpuaas,
so any app may import it without an upward dependency.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A plain decimal as gpuaas writes numbers: optional minus, digits, optional fraction. No exponent,
# no plus sign, nothing after it, so "-1+2" or "-2e3" are text and get neutralised.
PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def neutralise(text: str) -> str:
    """`text` prefixed with a single quote when a spreadsheet would read it as a formula."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def safe_cell(value, *, numeric: bool = False) -> str:
    """One cell's text: None is empty, numbers as they are, text neutralised.

    `numeric` says the cell's column holds numbers the system wrote as text (e.g. Decimal
    rendered "-12.50"): such text is kept when it is a plain decimal, neutralised otherwise.
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float | Decimal):
        return f"{value:f}" if isinstance(value, Decimal) else str(value)
    text = str(value)
    if numeric and PLAIN_NUMBER.fullmatch(text):
        return text
    return neutralise(text)


class SafeWriter:
    """csv.writer whose rows go through safe_cell(); `numeric` holds the indexes of numeric columns."""

    def __init__(self, f, *, numeric: Iterable[int] = (), **kwargs):
        self._writer = csv.writer(f, **kwargs)
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
        super().__init__(f, fieldnames, **kwargs)
        self.numeric = frozenset(numeric)

    def writerow(self, rowdict: Mapping):
        return super().writerow({k: safe_cell(v, numeric=k in self.numeric) for k, v in rowdict.items()})

    def writerows(self, rowdicts: Iterable[Mapping]) -> None:
        for row in rowdicts:
            self.writerow(row)
